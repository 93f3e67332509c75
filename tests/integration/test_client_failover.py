"""spate.client across a leader's death (issue 7's client part, BRIEF §4): one long-lived
Producer and one Consumer with reconnecting on, on a real three-process cluster, while the
partition's leader is killed with SIGKILL. Every confirmed message is consumed, in order; the
consumer's offsets run without a gap or a repeat across its reconnection."""

from __future__ import annotations

import threading
import time

from spate.client import Consumer, Producer
from support.cluster import Cluster

BATCH = 20


def test_producer_and_consumer_ride_through_a_leader_kill(cluster3: Cluster) -> None:
    cluster3.cli("stream", "create", "orders", "--replicas", "3")
    leader = cluster3.leader_of("orders")
    urls = cluster3.urls()
    leader_url = urls[cluster3.index_of(leader)]
    others = [u for u in urls if u != leader_url]
    acked: list[bytes] = []
    stop = threading.Event()
    failure: list[BaseException] = []
    producer = Producer(urls, "orders", timeout_s=5, reconnect_timeout_s=60)
    # The consumer starts on the leader, the node about to die.
    consumer = Consumer(
        [leader_url, *others], "orders", start="first", partition=0, reconnect_timeout_s=60
    )

    def publish() -> None:
        batch = 0
        try:
            while not stop.is_set():
                bodies = [f"m{batch}-{i}".encode() for i in range(BATCH)]
                assert producer.send_batch(bodies) == BATCH
                acked.extend(bodies)
                batch += 1
        except BaseException as error:  # reported to the test thread below
            failure.append(error)

    thread = threading.Thread(target=publish)
    thread.start()
    events = []
    try:
        while len(acked) < 10 * BATCH and not failure:
            time.sleep(0.02)
        for _ in range(5 * BATCH):  # the consumer is reading when its node dies
            events.append(consumer.receive(timeout=20))
        cluster3.kill9(cluster3.index_of(leader))
        before = len(acked)
        deadline = time.monotonic() + 60
        while len(acked) < before + 10 * BATCH and not failure:
            assert time.monotonic() < deadline, "publishing did not resume after the leader died"
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(90)
    assert not failure, failure
    assert producer.reconnects >= 1
    wanted = set(acked)
    deadline = time.monotonic() + 60
    while wanted - {e.body for e in events}:
        assert time.monotonic() < deadline, "confirmed messages missing"
        events.append(consumer.receive(timeout=20))
    assert consumer.reconnects >= 1
    offsets = [e.offset for e in events]
    assert offsets == list(range(len(offsets))), "a gap or a repeat across the reconnection"
    first_seen: dict[bytes, int] = {}
    for event in events:
        first_seen.setdefault(event.body, event.offset)
    positions = [first_seen[body] for body in acked]
    assert positions == sorted(positions), "confirmed messages were reordered"
    producer.close()
    consumer.close()


def test_async_producer_resends_what_the_dead_leader_did_not_confirm(cluster3: Cluster) -> None:
    """The asyncio producer keeps every unconfirmed message and resends it after reconnecting:
    every confirm future resolves accepted, and every confirmed message is in the log."""
    import asyncio

    from spate.client.aio import AsyncProducer

    cluster3.cli("stream", "create", "events", "--replicas", "3")
    leader = cluster3.leader_of("events")
    urls = cluster3.urls()
    leader_url = urls[cluster3.index_of(leader)]

    async def publish() -> tuple[list[bytes], int]:
        producer = await AsyncProducer.connect(
            [leader_url, *urls], "events", window=2000, timeout_s=10, reconnect_timeout_s=60
        )
        bodies = [b"e%d" % i for i in range(6000)]
        futures = []
        for i, body in enumerate(bodies):
            futures.append(await producer.send(body))
            if i == 2000:
                await asyncio.to_thread(cluster3.kill9, cluster3.index_of(leader))
        await asyncio.wait_for(asyncio.gather(*futures), 90)
        reconnects = producer.reconnects
        await producer.close()
        return bodies, reconnects

    bodies, reconnects = asyncio.run(publish())
    assert reconnects >= 1
    survivor = next(u for u in urls if u != leader_url)
    with Consumer(survivor, "events", start="first", timeout_s=30) as consumer:
        seen: dict[bytes, int] = {}
        while len(seen) < len(bodies):
            event = consumer.receive(timeout=30)
            seen.setdefault(event.body, event.offset)
    positions = [seen[body] for body in bodies]
    assert positions == sorted(positions), "confirmed messages were reordered"
