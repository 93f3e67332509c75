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
