"""spate.client.aio against the real AMQP listener (over the in-memory broker): confirms,
window, callbacks, refusals, redirects, and a consumer reading back byte for byte."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from proton import Message
from spate.client import PublishRefused
from spate.client.aio import AsyncConsumer, AsyncProducer, AttachRefused, encode_data
from spate.core.ids import StreamName
from spate.core.streams import StreamConfig
from spate.gateway.server import GatewayServer, ListenerConfig
from support.memory_broker import MemoryBroker, RemoteLeader


def run(scenario: Callable[[MemoryBroker, str], Awaitable[None]], partitions: int = 1) -> None:
    async def main() -> None:
        broker = MemoryBroker("n1")
        broker.create_stream(StreamConfig(StreamName("orders"), partitions=partitions))
        server = GatewayServer(broker, ListenerConfig(node_id="n1"))
        port = await server.start()
        try:
            await asyncio.wait_for(scenario(broker, f"amqp://127.0.0.1:{port}"), 60)
        finally:
            await server.close()

    asyncio.run(main())


def test_data_sections_decode_as_protons_data_bodies() -> None:
    """002 §3.2.6: one data section; proton reads it back as the same binary body."""
    for body in (b"", b"x" * 100, b"y" * 300):
        message = Message()
        message.decode(encode_data(body))
        assert message.body == body


def test_every_message_is_confirmed_and_read_back_in_order() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders", window=500)
        bodies = [b"m%d" % i for i in range(3000)]
        futures = [await producer.send(body) for body in bodies]
        assert producer.unconfirmed <= 500 + 1
        await producer.flush()
        assert all(f.done() and f.exception() is None for f in futures)
        consumer = await AsyncConsumer.connect(url, "orders", start="first", credit=200)
        events = [await consumer.receive(10) for _ in bodies]
        assert [e.offset for e in events] == list(range(len(bodies)))
        assert [e.body for e in events] == bodies
        await producer.close()
        await consumer.close()

    run(scenario)


def test_a_batch_handler_gets_what_a_handler_gets_as_columns() -> None:
    """Bulk readers: one call per burst with offsets, timestamps and the raw messages, the same
    as a per-message handler's, from a start inside the log; an exception stops the consumer."""

    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders")
        for i in range(2000):
            producer.send_nowait(b"m%d" % i)
        await producer.flush()
        one: list[tuple[int, int, bytes]] = []
        many: list[tuple[int, int, bytes]] = []
        calls = []
        done = asyncio.Event()

        def handler(offset: int, stamp: int, raw: Any) -> None:
            one.append((offset, stamp, raw))

        def batch(offsets: list[int], stamps: list[int], raws: list[bytes]) -> None:
            calls.append(len(offsets))
            many.extend(zip(offsets, stamps, raws, strict=True))
            if len(many) >= 1990:
                done.set()

        a = await AsyncConsumer.connect(url, "orders", start=10, handler=handler, credit=500)
        b = await AsyncConsumer.connect(url, "orders", start=10, batch_handler=batch, credit=500)
        await asyncio.wait_for(done.wait(), 20)
        while len(one) < 1990:
            await asyncio.sleep(0.01)
        assert many == one and [o for o, _, _ in many] == list(range(10, 2000))
        assert len(calls) < len(many) / 10, "one call per burst, not per message"
        await a.close()
        await b.close()

        def fail(offsets: list[int], stamps: list[int], raws: list[bytes]) -> None:
            raise RuntimeError("application bug")

        c = await AsyncConsumer.connect(url, "orders", start="first", batch_handler=fail)
        with pytest.raises(RuntimeError, match="application bug"):
            await asyncio.wait_for(c.wait(), 20)
        with pytest.raises(ValueError, match="batch_handler is for unnamed"):
            await AsyncConsumer.connect(url, "orders", batch_handler=fail, name="n")
        await producer.close()

    run(scenario)


def test_callbacks_report_each_outcome_once() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders")
        outcomes: list[Any] = []
        for i in range(50):
            producer.send_nowait(b"c%d" % i, callback=outcomes.append)
        await producer.flush()
        assert outcomes == [None] * 50
        await producer.close()

    run(scenario)


def test_encoded_messages_settle_through_their_callback() -> None:
    """The bulk path (spate perf): one encoded object sent many times, one outcome each."""

    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders")
        # Outcomes by message: the broker settles in any order (a disposition may name any
        # delivery), and the oversized one is refused on arrival while the others wait for
        # their commit (CI saw the refusal first).
        outcomes: dict[int, list[Any]] = {i: [] for i in range(41)}
        data = encode_data(b"same bytes")
        for i in range(40):
            producer.send_encoded_nowait(data, outcomes[i].append)
        producer.send_encoded_nowait(encode_data(b"x" * (1024 * 1024 + 1)), outcomes[40].append)
        await producer.flush()
        assert [outcomes[i] for i in range(40)] == [[None]] * 40
        assert len(outcomes[40]) == 1 and isinstance(outcomes[40][0], PublishRefused)
        consumer = await AsyncConsumer.connect(url, "orders", start="first")
        events = [await consumer.receive(10) for _ in range(40)]
        assert {e.body for e in events} == {b"same bytes"}
        await producer.close()
        await consumer.close()
        named = await AsyncProducer.connect(url, "orders", name="numbered")
        with pytest.raises(ValueError, match="unnamed producers"):
            named.send_encoded_nowait(data, outcomes[0].append)
        await named.close()

    run(scenario)


def test_a_refused_message_fails_its_future_and_the_producer_goes_on() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        producer = await AsyncProducer.connect(url, "orders")
        big = await producer.send(b"x" * (1024 * 1024 + 1))
        small = await producer.send(b"fine")
        with pytest.raises(PublishRefused) as refused:
            await big
        assert refused.value.condition == "amqp:link:message-size-exceeded"
        await small
        await producer.close()

    run(scenario)


def test_attach_to_an_unknown_stream_is_refused_with_the_condition() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        with pytest.raises(AttachRefused) as refused:
            await AsyncProducer.connect(url, "nope")
        assert refused.value.condition == "amqp:not-found"

    run(scenario)


def test_a_redirect_is_followed_to_the_leader() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        # A second listener plays the leader of partition 1; the first redirects there.
        leader_broker = MemoryBroker("n2")
        leader_broker.create_stream(StreamConfig(StreamName("orders"), partitions=2))
        leader = GatewayServer(leader_broker, ListenerConfig(node_id="n2"))
        port = await leader.start()
        try:
            broker.set_remote("orders", 1, RemoteLeader("n2", "127.0.0.1", port))
            producer = await AsyncProducer.connect(url, "orders", partition=1)
            await (await producer.send(b"to the leader"))
            target = leader_broker.partition(StreamName("orders"), 1, write=False)  # type: ignore[arg-type]
            assert target.end_offset() == 1
            await producer.close()
        finally:
            await leader.close()

    run(scenario, partitions=2)


def test_without_reconnecting_a_lost_connection_fails_every_pending_confirm() -> None:
    async def scenario(broker: MemoryBroker, url: str) -> None:
        broker.partitions[(StreamName("orders"), 0)].commit_delay_s = None  # type: ignore[index]
        producer = await AsyncProducer.connect(url, "orders")
        pending = [await producer.send(b"p%d" % i) for i in range(10)]
        await asyncio.sleep(0.05)  # transferred, held by the broker: not confirmed
        assert producer._engine.sock is not None
        producer._engine.sock.abort()  # the connection drops under the producer
        for future in pending:
            with pytest.raises(ConnectionError):
                await future
        with pytest.raises(ConnectionError):
            producer.send_nowait(b"after")

    run(scenario)


def test_an_attach_refused_as_it_is_cancelled_leaves_no_unretrieved_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller's timeout cancels `engine.attach` in the same turn as the broker's refusal
    completes it: the refusal is dropped with the cancellation, silently (a chaos run at load
    ~20 printed asyncio's "Future exception was never retrieved ... AttachRefused")."""
    from spate.client import engine as engine_module

    real_wait = asyncio.wait

    async def wait_then_cancelled(*args: Any, **kwargs: Any) -> Any:
        await real_wait(*args, **kwargs)
        raise asyncio.CancelledError  # the cancellation lands as the attach completes

    async def scenario(broker: MemoryBroker, url: str) -> None:
        host, port = url.removeprefix("amqp://").split(":")
        spec = engine_module.LinkSpec("refused", "nope")
        unretrieved: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, c: unretrieved.append(c))
        monkeypatch.setattr(engine_module.asyncio, "wait", wait_then_cancelled)
        with pytest.raises(asyncio.CancelledError):
            await engine_module.attach(host, int(port), spec, None, None)
        monkeypatch.setattr(engine_module.asyncio, "wait", real_wait)
        gc.collect()
        await asyncio.sleep(0)
        assert not [c for c in unretrieved if "never retrieved" in c.get("message", "")], (
            unretrieved
        )

    run(scenario)
