"""spate.client across a node's death on a real three-process cluster (`spate dev up --nodes
3`, issue 7, BRIEF §4): the partition leader is killed with SIGKILL while the asyncio and the
blocking producer publish, and a consumer's node is killed while it reads.

What must hold: every confirmed message is in the log, in confirm order (by first copy); a
message may be stored twice when its `accepted` was lost with the leader and the producer
resent it (at-least-once until producer deduplication, issue 8; counted and printed); the
consumer hands out offsets without a gap or a repeat across its reconnection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proton import symbol
from proton.utils import BlockingConnection
from spate.client import Consumer, Producer
from spate.client.aio import AsyncConsumer, AsyncProducer
from support.amqp_clients import LinkProperties, offset_filter
from support.cluster import Cluster, spate

BATCH = 20


def check_confirmed_in_log(confirmed: list[bytes], log: list[bytes]) -> int:
    """Every confirmed body is in the log, first copies in confirm order; returns how many
    extra copies the log holds (resends of messages whose confirm was lost)."""
    first_seen: dict[bytes, int] = {}
    for position, body in enumerate(log):
        first_seen.setdefault(body, position)
    missing = [body for body in confirmed if body not in first_seen]
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {missing[:3]}"
    positions = [first_seen[body] for body in confirmed]
    assert positions == sorted(positions), "confirmed messages were reordered"
    copies = Counter(log)
    assert max(copies.values()) <= 2, "a message stored more than twice"
    return sum(count - 1 for count in copies.values())


def test_blocking_producer_and_consumer_ride_through_a_leader_kill(cluster3: Cluster) -> None:
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
    duplicates = check_confirmed_in_log(acked, [e.body for e in events])
    print(f"blocking: {len(acked)} confirmed, {duplicates} resent duplicates in the log")
    producer.close()
    consumer.close()


def test_asyncio_producer_resends_what_the_dead_leader_did_not_confirm(cluster3: Cluster) -> None:
    """The asyncio producer keeps every unconfirmed message and resends it after reconnecting:
    every confirm future resolves accepted; an asyncio consumer with a handler reads them
    all back from a survivor."""
    cluster3.cli("stream", "create", "events", "--replicas", "3")
    leader = cluster3.leader_of("events")
    urls = cluster3.urls()
    leader_url = urls[cluster3.index_of(leader)]
    survivors = [u for u in urls if u != leader_url]
    bodies = [b"e%d" % i for i in range(6000)]

    async def publish() -> int:
        producer = await AsyncProducer.connect(
            [leader_url, *urls], "events", window=2000, timeout_s=10, reconnect_timeout_s=60
        )
        futures = []
        for i, body in enumerate(bodies):
            futures.append(await producer.send(body))
            if i == 2000:
                await asyncio.to_thread(cluster3.kill9, cluster3.index_of(leader))
        await asyncio.wait_for(asyncio.gather(*futures), 90)
        reconnects = producer.reconnects
        await producer.close()
        return reconnects

    async def consume() -> list[tuple[int, bytes]]:
        log: list[tuple[int, bytes]] = []
        wanted = set(bodies)
        done = asyncio.Event()

        def handler(offset: int, timestamp_ms: int, message: object) -> None:
            body = bytes(message.body)  # type: ignore[attr-defined]
            log.append((offset, body))
            wanted.discard(body)
            if not wanted:
                done.set()

        consumer = await AsyncConsumer.connect(
            survivors, "events", start="first", handler=handler, decode=True, timeout_s=30
        )
        await asyncio.wait_for(done.wait(), 60)
        await consumer.close()
        return log

    assert asyncio.run(publish()) >= 1
    log = asyncio.run(consume())
    assert [offset for offset, _ in log] == list(range(len(log)))
    duplicates = check_confirmed_in_log(bodies, [body for _, body in log])
    print(f"asyncio: {len(bodies)} confirmed, {duplicates} resent duplicates in the log")


def test_asyncio_consumer_resumes_without_gaps_when_its_node_dies(cluster3: Cluster) -> None:
    """A consumer reading from a follower (any replica serves reads) loses that node mid-way:
    it reconnects to another replica and resumes at the next offset."""
    cluster3.cli("stream", "create", "clicks", "--replicas", "3")
    leader = cluster3.leader_of("clicks")
    urls = cluster3.urls()
    follower = next(u for u in urls if u != urls[cluster3.index_of(leader)])
    count = 3000
    with Producer(urls, "clicks", reconnect_timeout_s=30) as producer:
        producer.send_batch([b"c%d" % i for i in range(count)])

    async def consume() -> tuple[list[int], int]:
        consumer = await AsyncConsumer.connect(
            [follower, *urls], "clicks", start="first", partition=0, credit=200,
            reconnect_timeout_s=60,
        )  # fmt: skip
        offsets = [(await consumer.receive(20)).offset for _ in range(1000)]
        await asyncio.to_thread(cluster3.kill9, urls.index(follower))
        offsets += [(await consumer.receive(30)).offset for _ in range(count - 1000)]
        reconnects = consumer.reconnects
        await consumer.close()
        return offsets, reconnects

    offsets, reconnects = asyncio.run(consume())
    assert reconnects >= 1
    assert offsets == list(range(count)), "a gap or a repeat across the reconnection"


def test_a_named_producer_stores_each_message_once_across_a_leader_kill_and_a_restart(
    cluster3: Cluster,
) -> None:
    """Issue 8's proof of deduplication: the asyncio producer (name "ledger-app", explicit ids)
    rides through a kill -9 of the partition leader, resending what was unconfirmed; then a
    restarted blocking producer with the same name resends everything from id 0. The stream
    holds each message exactly once, in id order."""
    cluster3.cli("stream", "create", "ledger", "--replicas", "3")
    leader = cluster3.leader_of("ledger")
    urls = cluster3.urls()
    leader_url = urls[cluster3.index_of(leader)]
    survivors = [u for u in urls if u != leader_url]
    bodies = [b"l%d" % i for i in range(4000)]

    async def publish() -> tuple[int | None, int]:
        producer = await AsyncProducer.connect(
            [leader_url, *urls], "ledger", window=1000, timeout_s=10, reconnect_timeout_s=60,
            name="ledger-app",
        )  # fmt: skip
        assert producer.last_publishing_id() is None
        futures = []
        for i in range(3000):
            futures.append(await producer.send(bodies[i], publishing_id=i))
            if i == 1500:
                await asyncio.to_thread(cluster3.kill9, cluster3.index_of(leader))
        await asyncio.wait_for(asyncio.gather(*futures), 90)
        last, reconnects = producer.last_publishing_id(), producer.reconnects
        await producer.close()
        return last, reconnects

    last, reconnects = asyncio.run(publish())
    assert (last, reconnects >= 1) == (2999, True)
    with Producer(survivors, "ledger", name="ledger-app", reconnect_timeout_s=30) as producer:
        assert producer.last_publishing_id() == 2999  # 004 getLastPublishingId, on attach
        for i, body in enumerate(bodies):  # a restart that resends everything from id 0
            producer.send_async(body, publishing_id=i)
        producer.flush()
        assert producer.last_publishing_id() == 3999

    async def consume() -> list[bytes]:
        consumer = await AsyncConsumer.connect(survivors, "ledger", start="first", timeout_s=30)
        got = [(await consumer.receive(20)).body for _ in range(len(bodies))]
        with contextlib.suppress(TimeoutError):
            extra = await consumer.receive(1.0)
            raise AssertionError(f"a message stored twice: {extra.body!r}")
        await consumer.close()
        return got

    assert asyncio.run(consume()) == bodies
    cluster3.refresh()  # the admin address of a live node
    listed = cluster3.cli_json("producer", "list", "ledger")
    assert listed["partitions_here"] == [0]
    assert [(p["name"], p["last_publishing_id"]) for p in listed["producers"]] == [
        ("ledger-app", 3999)
    ]
    assert listed["producers"][0]["last_offset"] == 3999
    table = cluster3.cli("producer", "list", "ledger").stdout
    assert "ledger-app" in table and "3999" in table
    missing = cluster3.cli("producer", "list", "nope", check=False)
    assert missing.returncode != 0 and "nope" in missing.stderr


def _named_consumer(
    url: str, name: str, count: int, *, start: str | None = None, hold: bool = False
) -> tuple[list[bytes], object, object]:
    """python-qpid-proton on stream `bills`: a named consumer (start filter `start`, none by
    default) accepts `count` messages; with `hold` the link stays attached (returned), else
    it detaches (the detach is answered once the offset is stored)."""
    conn = BlockingConnection(url, timeout=20)
    options: list[object] = [LinkProperties({symbol("spate:consumer-name"): name})]
    if start is not None:
        options.append(offset_filter(start))
    receiver = conn.create_receiver("bills", credit=20, options=options)
    stored = (receiver.link.remote_properties or {}).get(symbol("spate:stored-offset"))
    got = []
    for _ in range(count):
        message = receiver.receive(timeout=20)
        got.append(bytes(message.body))
        receiver.accept()
    if hold:
        return got, stored, conn
    receiver.close()
    conn.close()
    return got, stored, None


def test_a_named_consumer_resumes_after_its_offset_across_a_leader_kill(cluster3: Cluster) -> None:
    """Issue 8's offset tracking on three processes: offsets stored through the partition's
    Raft group survive a kill -9 of the leader; `spate consumer offset --set` is refused while
    a link of the name is attached, and is relayed to the leader from any node."""
    cluster3.cli("stream", "create", "bills", "--replicas", "3")
    leader = cluster3.leader_of("bills")
    urls = cluster3.urls()
    with Producer(urls, "bills") as producer:
        for i in range(20):
            producer.send(b"b%d" % i)
    leader_url = urls[cluster3.index_of(leader)]
    got, stored, _ = _named_consumer(leader_url, "billing", 5, start="first")
    assert (got, stored) == ([b"b%d" % i for i in range(5)], None)
    got, stored, conn = _named_consumer(leader_url, "billing", 2, hold=True)
    assert (got, stored) == ([b"b5", b"b6"], 4)
    ids = [n["node_id"] for n in cluster3.state["nodes"]]
    follower = cluster3.state["nodes"][next(i for i, n in enumerate(ids) if n != leader)]
    refused = spate(  # asked of a follower: relayed to the leader, refused there
        "consumer", "offset", "bills", "billing", "--set", "0", "--admin", follower["admin"],
        check=False,
    )  # fmt: skip
    assert refused.returncode == 1 and "attached" in refused.stderr, refused
    listed = cluster3.cli_json("consumer", "list", "bills")["consumers"]
    assert [(c["name"], c["offset"]) for c in listed] == [("billing", 4)]
    conn.close()  # the connection goes: the offset of b6 is stored as it goes

    cluster3.kill9(cluster3.index_of(leader))
    cluster3.refresh()
    deadline = time.monotonic() + 30
    while (new := cluster3.leader_of("bills")) == leader:
        assert time.monotonic() < deadline, "no new leader"
        time.sleep(0.2)
    new_url = urls[cluster3.index_of(new)]
    got, stored, _ = _named_consumer(new_url, "billing", 3)
    assert (got, stored) == ([b"b7", b"b8", b"b9"], 6)
    third = cluster3.state["nodes"][next(i for i, n in enumerate(ids) if n not in (leader, new))]
    done = spate(  # the live node that does not lead: relayed
        "consumer", "offset", "bills", "billing", "--set", "1", "--admin", third["admin"]
    )
    assert "resumes at 2" in done.stdout
    got, stored, _ = _named_consumer(new_url, "billing", 1)
    assert (got, stored) == ([b"b2"], 1)
    shown = cluster3.cli_json("consumer", "offset", "bills", "billing")["consumers"]
    assert [(c["name"], c["offset"]) for c in shown] == [("billing", 2)]


class _Member:
    """tests/support/sac_member.py as a process; its JSON lines collected by a thread."""

    def __init__(self, urls: list[str], stream: str, name: str, delay_s: float) -> None:
        script = Path(__file__).resolve().parents[1] / "support" / "sac_member.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), ",".join(urls), stream, name, str(delay_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def events(self) -> list[dict[str, Any]]:
        return [line for line in list(self.lines) if "offset" in line]

    def wait_for(self, what: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not what():
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            assert time.monotonic() < deadline, f"timed out; saw {self.lines[-3:]}"
            time.sleep(0.05)

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()


def test_single_active_consumer_fails_over_between_processes_and_across_a_leader_kill(
    cluster3: Cluster,
) -> None:
    """004 "Single Active Consumer" on three processes: two consumer processes share a name;
    the active one is killed with SIGKILL mid-stream and the other takes over after the
    stored offset — no gap, repeats only within the killed one's credit (10); then the
    partition's leader is killed and the members re-form the group at the new leader, where
    one of them (and only one) receives what is published next."""
    cluster3.cli("stream", "create", "shared", "--replicas", "3")
    urls = cluster3.urls()
    with Producer(urls, "shared") as producer:
        for i in range(40):
            producer.send(b"s%d" % i)
    first = _Member(urls, "shared", "workers", delay_s=0.05)
    members = [first]
    try:
        first.wait_for(lambda: bool(first.lines))
        assert first.lines[0] == {"attached": True, "active": True}
        second = _Member(urls, "shared", "workers", delay_s=0.0)
        members.append(second)
        second.wait_for(lambda: bool(second.lines))
        assert second.lines[0] == {"attached": True, "active": False}
        first.wait_for(lambda: len(first.events()) >= 15)
        assert not second.events(), "a standby received while the active member was there"
        first.kill9()
        second.wait_for(lambda: any(e["offset"] == 39 for e in second.events()))
        had, took = first.events(), second.events()
        assert [e["offset"] for e in had] == list(range(len(had)))
        assert took[0]["active"] and not second.lines[0]["active"]
        offsets = [e["offset"] for e in took]
        assert offsets == list(range(offsets[0], 40)), "the new active member skipped or repeated"
        assert offsets[0] <= len(had), "a gap between the killed member and its successor"
        assert len(had) - offsets[0] <= 10, "more repeats than the killed member's credit"
        assert [e["body"] for e in took] == [f"s{o}" for o in offsets]

        third = _Member(urls, "shared", "workers", delay_s=0.0)
        members.append(third)
        third.wait_for(lambda: bool(third.lines))
        assert third.lines[0] == {"attached": True, "active": False}
        leader = cluster3.leader_of("shared")
        cluster3.kill9(cluster3.index_of(leader))
        cluster3.refresh()
        deadline = time.monotonic() + 30
        while cluster3.leader_of("shared") == leader:
            assert time.monotonic() < deadline, "no new leader"
            time.sleep(0.2)
        before = {id(m): len(m.events()) for m in (second, third)}
        with Producer([u for u in urls if u != urls[cluster3.index_of(leader)]], "shared") as p:
            for i in range(40, 50):
                p.send(b"s%d" % i)
        for member in (second, third):
            member.wait_for(lambda m=member: m.proc.poll() is None)
        deadline = time.monotonic() + 60
        while not any(
            any(e["offset"] == 49 for e in m.events()) for m in (second, third)
        ):  # fmt: skip
            assert time.monotonic() < deadline, "nobody received after the leader change"
            time.sleep(0.1)
        time.sleep(0.5)  # a second receiver, if there were one, would have it by now too
        after = {id(m): m.events()[before[id(m)] :] for m in (second, third)}
        receivers = [m for m in (second, third) if any(e["offset"] >= 40 for e in after[id(m)])]
        assert len(receivers) == 1, "two members received what was published after the change"
        offsets = [e["offset"] for e in after[id(receivers[0])]]
        assert offsets[-10:] == list(range(40, 50))
    finally:
        for member in members:
            member.stop()


def test_a_producer_on_a_paused_leader_gives_it_up_and_publishes_elsewhere(
    cluster3: Cluster,
) -> None:
    """The client asks for an AMQP idle timeout (engine.idle_timeout_s): a leader paused with
    SIGSTOP keeps its TCP connections open but sends nothing, and the client gives it up after
    twice that and reconnects to another node, which redirects it to the new leader. Before,
    the send waited for as long as the pause lasted (found by the chaos suite)."""
    import signal

    from spate.client import engine

    cluster3.cli("stream", "create", "paused", "--replicas", "3")
    leader = cluster3.leader_of("paused")
    urls = cluster3.urls()
    leader_url = urls[cluster3.index_of(leader)]
    producer = Producer(
        [leader_url, *(u for u in urls if u != leader_url)],
        "paused",
        name="pausing",
        timeout_s=5,
        reconnect_timeout_s=60,
    )
    pid = cluster3.node_pid(cluster3.index_of(leader))
    try:
        producer.send(b"before", publishing_id=1)
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        producer.send(b"during", publishing_id=2)  # never returns while paused, without it
        waited = time.monotonic() - started
        assert producer.reconnects >= 1
        print(f"published {waited:.1f} s after the pause (idle timeout {engine.idle_timeout_s} s)")
    finally:
        os.kill(pid, signal.SIGCONT)
        producer.close()
    consumer = Consumer(urls, "paused", start="first", timeout_s=10)
    try:
        got = [consumer.receive(timeout=20).body for _ in range(2)]
    finally:
        consumer.close()
    assert got == [b"before", b"during"]
