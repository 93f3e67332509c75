"""The shells over the real AMQP listener (in-memory broker): the blocking clients on their
background loop, the consumer's handler and credit, reconnecting with in-order resend after a
cut connection and after a retryable refusal, and the one-adapter rule."""

from __future__ import annotations

import ast
import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message, symbol
from spate.client import ConnectionLost, Consumer, Producer, PublishRefused
from spate.client.aio import AsyncConsumer, AsyncProducer
from spate.core.errors import NotLeader
from spate.core.ids import PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.gateway.server import GatewayServer, ListenerConfig
from support.memory_broker import MemoryBroker

CLIENT = Path(__file__).resolve().parents[2] / "src" / "client"


def run(scenario: Callable[[MemoryBroker, str], Awaitable[None]]) -> None:
    async def main() -> None:
        broker = MemoryBroker("n1")
        broker.create_stream(StreamConfig(StreamName("orders"), partitions=1))
        server = GatewayServer(broker, ListenerConfig(node_id="n1"))
        port = await server.start()
        try:
            await asyncio.wait_for(scenario(broker, f"amqp://127.0.0.1:{port}"), 60)
        finally:
            await server.close()

    asyncio.run(main())


@pytest.fixture
def node() -> Iterator[tuple[MemoryBroker, str]]:
    """A listener on its own loop thread, for the blocking clients (which have theirs)."""
    ready: list[Any] = []
    loop = asyncio.new_event_loop()
    broker = MemoryBroker("n1")
    broker.create_stream(StreamConfig(StreamName("orders"), partitions=1))
    server = GatewayServer(broker, ListenerConfig(node_id="n1"))

    def serve() -> None:
        asyncio.set_event_loop(loop)
        ready.append(loop.run_until_complete(server.start()))
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    while not ready:
        thread.join(0.01)
    yield broker, f"amqp://127.0.0.1:{ready[0]}"
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def log_of(broker: MemoryBroker) -> list[bytes]:
    partition = broker.partitions[(StreamName("orders"), 0)]  # type: ignore[index]
    return [record for chunk in partition.chunks for record in chunk.records]


def test_only_the_engine_imports_proton() -> None:
    """ADR 0010: one adapter module; the cores import neither proton nor asyncio."""
    for path in CLIENT.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        if path.name != "engine.py":
            assert not names & {"proton", "cproton_ffi"}, path.name
        if path.name in ("core.py", "errors.py"):
            assert not names & {"asyncio", "socket", "threading"}, path.name


def test_blocking_send_send_async_batch_and_flush(node: tuple[MemoryBroker, str]) -> None:
    broker, url = node
    outcomes: list[BaseException | None] = []
    with Producer(url, "orders", window=50) as producer:
        producer.send(b"one")
        futures = [producer.send_async(b"a%d" % i, callback=outcomes.append) for i in range(200)]
        producer.flush(timeout_s=10)
        assert all(f.done() and f.exception() is None for f in futures)
        assert producer.send_batch([b"b%d" % i for i in range(300)]) == 300
        assert producer.unconfirmed == 0
    assert outcomes == [None] * 200
    assert log_of(broker)[0].endswith(b"one") and len(log_of(broker)) == 501
    with Consumer(url, "orders", start="first", credit=64) as consumer:
        events = [consumer.receive(timeout=10) for _ in range(501)]
    assert [e.offset for e in events] == list(range(501))
    assert events[0].body == b"one" and events[-1].body == b"b299"


def test_a_proton_message_is_sent_as_it_is(node: tuple[MemoryBroker, str]) -> None:
    """A `proton.Message` body (properties, annotations) goes out whole, with and without a
    producer name (proton encodes into a bytearray; the link takes bytes)."""
    _, url = node
    key = symbol("event-streams-group-key")
    with Producer(url, "orders") as producer:
        producer.send(Message(id="m-1", body="plain", annotations={key: "k"}))
    with Producer(url, "orders", name="p") as producer:
        producer.send(Message(subject="s", body="named"))
    with Consumer(url, "orders", start="first") as consumer:
        first, second = consumer.receive(timeout=10), consumer.receive(timeout=10)
    assert (first.message.id, first.body, first.message.annotations) == ("m-1", "plain", {key: "k"})
    assert (second.message.subject, second.body) == ("s", "named")


def test_blocking_refusal_raises_with_its_condition(node: tuple[MemoryBroker, str]) -> None:
    _, url = node
    with Producer(url, "orders") as producer:
        with pytest.raises(PublishRefused) as refused:
            producer.send(b"x" * (1024 * 1024 + 1))
        assert refused.value.condition == "amqp:link:message-size-exceeded"
        with pytest.raises(PublishRefused):
            producer.send_batch([b"fine", b"y" * (1024 * 1024 + 1), b"also fine"])
        producer.send(b"the producer goes on")


def test_blocking_consumer_with_a_handler_and_iteration(node: tuple[MemoryBroker, str]) -> None:
    _, url = node
    with Producer(url, "orders") as producer:
        producer.send_batch([b"h%d" % i for i in range(100)])
    seen: list[tuple[int, int, bytes]] = []
    done = threading.Event()

    def handler(offset: int, timestamp_ms: int, raw: bytes) -> None:
        seen.append((offset, timestamp_ms, raw))
        if offset == 99:
            done.set()

    consumer = Consumer(url, "orders", start=-100, credit=10, handler=handler)
    assert done.wait(10)
    consumer.close()
    consumer.wait(5)
    assert [offset for offset, _, _ in seen] == list(range(100))
    assert all(stamp > 0 and raw.endswith(b"h%d" % i) for i, (_, stamp, raw) in enumerate(seen))
    with Consumer(url, "orders", start=95) as consumer:
        got = []
        for event in consumer:
            got.append(event.body)
            if len(got) == 5:
                consumer.close()
    assert got == [b"h%d" % i for i in range(95, 100)]


def test_a_handler_exception_stops_the_consumer_and_comes_out_of_wait() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders")
        for i in range(5):
            await producer.send(b"x%d" % i)
        await producer.flush()

        def handler(offset: int, timestamp_ms: int, message: Any) -> None:
            assert message.body == b"x%d" % offset  # decode=True: a proton Message
            if offset == 2:
                raise ValueError("the application failed on offset 2")

        consumer = await AsyncConsumer.connect(
            url, "orders", start="first", handler=handler, decode=True
        )
        with pytest.raises(ValueError, match="offset 2"):
            await asyncio.wait_for(consumer.wait(), 10)
        assert consumer.last_offset == 2
        await producer.close()

    run(scenario)


def test_the_consumer_keeps_credit_plus_buffered_within_its_window() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders")
        for i in range(500):
            producer.send_nowait(b"c%d" % i)
        await producer.flush()
        consumer = await AsyncConsumer.connect(url, "orders", start="first", credit=40)
        await asyncio.sleep(0.3)  # nobody reads: the broker may send only the window
        assert len(consumer._events) == 40
        offsets = [(await consumer.receive(5)).offset for _ in range(500)]
        assert offsets == list(range(500))
        await consumer.close()
        await producer.close()

    run(scenario)


def test_a_cut_connection_reconnects_and_resends_every_unconfirmed_message_in_order() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        partition = broker.partitions[(StreamName("orders"), 0)]  # type: ignore[index]
        partition.commit_delay_s = None  # hold every append: nothing is confirmed
        producer = await AsyncProducer.connect(url, "orders", reconnect_timeout_s=10)
        futures = [producer.send_nowait(b"r%d" % i) for i in range(10)]

        def held() -> int:
            return sum(len(chunk.records) for chunk, _ in partition.held)

        while held() < 10:
            await asyncio.sleep(0.01)
        producer._engine.abort()  # the connection drops under the producer
        while held() < 20:  # the resends arrive on the new connection
            await asyncio.sleep(0.01)
        partition.release()
        await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert producer.reconnects == 1
        # at-least-once: the orphaned first copies were stored too (no deduplication yet)
        assert len(log_of(broker)) == 20
        bodies = [record[-2:] for record in log_of(broker)]
        assert bodies[10:] == [b"r%d" % i for i in range(10)]
        await producer.close()

    run(scenario)


def test_a_retryable_refusal_reattaches_and_resends_from_the_refused_message() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders", reconnect_timeout_s=10)
        await (await producer.send(b"before"))
        broker.fail_appends("orders", 0, NotLeader("a new leader is being elected"))
        futures = [await producer.send(b"after %d" % i) for i in range(5)]
        await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert producer.reconnects == 1
        log = log_of(broker)
        assert log[0].endswith(b"before")
        confirmed_order = [r for r in log if b"after" in r]
        assert [r[-7:] for r in confirmed_order[-5:]] == [b"after %d" % i for i in range(5)]
        await producer.close()

    run(scenario)


def test_a_consumer_whose_connection_is_cut_resumes_without_gap_or_repeat() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders")
        for i in range(300):
            producer.send_nowait(b"k%d" % i)
        await producer.flush()
        consumer = await AsyncConsumer.connect(
            url, "orders", start="first", credit=50, reconnect_timeout_s=10
        )
        offsets = [(await consumer.receive(5)).offset for _ in range(120)]
        consumer._engine.abort()
        offsets += [(await consumer.receive(10)).offset for _ in range(180)]
        assert offsets == list(range(300))
        assert consumer.reconnects == 1
        await consumer.close()
        with pytest.raises(ConnectionLost):
            await consumer.receive(1)
        await producer.close()

    run(scenario)


def test_a_group_member_s_repeats_after_a_cut_are_not_committed_before_its_commit() -> None:
    """003 "Committing Offsets", `commit="manual"`: after a cut, a partition-agnostic member's
    new link starts at the group's stored offsets, so events the application took or had
    buffered (not committed) on the old link come again as repeats. They are dropped, and
    left unsettled until the application commits a later event of the same partition:
    accepting them at once stored offsets the application never committed (a crash then lost
    those events for the group), and accepting them with another partition's event would."""

    async def scenario(broker: MemoryBroker, url: str) -> None:
        broker.create_stream(StreamConfig(StreamName("two"), partitions=2))
        producers = [await AsyncProducer.connect(url, "two", partition=p) for p in (0, 1)]
        for p, producer in enumerate(producers):
            for i in range(6):
                producer.send_nowait(b"p%d-%d" % (p, i))
            await producer.flush()
        consumer = await AsyncConsumer.connect(
            url, "two", group="billing", strategy="range", start="first",
            commit="manual", credit=20, reconnect_timeout_s=10,
        )  # fmt: skip

        async def take(count: int) -> list[tuple[str | None, int]]:
            return [((e := await consumer.receive(10)).partition, e.offset) for _ in range(count)]

        def stored() -> dict[int, int]:
            return {
                p: o.offset
                for p in (0, 1)
                for o in broker.partition(
                    StreamName("two"), PartitionId(p), write=False
                ).offsets.values()
            }

        first = await take(4)
        assert await consumer.commit() == first[-1][1]
        committed = stored()
        seen = set(first) | set(await take(4))  # taken, not committed
        consumer._engine.abort()
        seen |= set(await take(4))  # the rest, buffered from the old link; the new one repeats
        assert seen == {(str(p), o) for p in (0, 1) for o in range(6)}
        # the new link delivers its repeats: the 8 events not committed
        for _ in range(200):
            if sum(map(len, consumer._link._repeats.values())) == 8:
                break
            await asyncio.sleep(0.05)
        assert sum(map(len, consumer._link._repeats.values())) == 8
        await asyncio.sleep(0.5)  # past the store interval (limits.offset_commit_interval_ms)
        assert stored() == committed  # before: every repeat's offset, committed by no one
        producers[0].send_nowait(b"p0-6")
        await producers[0].flush()
        assert await take(1) == [("0", 6)]  # the new link's first event
        assert await consumer.commit() == 6  # with partition 0's repeats before it
        assert stored()[0] == 6
        assert stored().get(1) == committed.get(1)  # partition 1's repeats: still not accepted
        producers[1].send_nowait(b"p1-6")
        await producers[1].flush()
        assert await take(1) == [("1", 6)]
        assert await consumer.commit() == 6
        assert stored() == {0: 6, 1: 6}
        await consumer.close()
        for producer in producers:
            await producer.close()

    run(scenario)
