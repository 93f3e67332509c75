"""Bulk deliveries (`spate:bulk-delivery`, ADR 0029): a plain receiver of one partition that
asks is sent many stored messages per transfer, as frames (spate.core.bulk); the rows are the
ones it would get message by message — offsets, timestamps and each message's sections — for
plain, keyed and rich messages, sub-entries plain and compressed, filtered reads, and a start
inside a sub-entry. Against the in-memory broker, the node's broker and the gateway's proxy
mode (tests/gateway/conftest.py). Links that cannot have them (named, unbound over several
partitions) are answered without the property and sent messages one by one."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, symbol
from proton.reactor import Filter
from spate.client import Producer
from spate.client.aio import AsyncConsumer
from spate.client.messages import MessageParts, read_columns
from spate.core import bulk
from spate.gateway import consumer as consumer_part
from support.amqp_clients import (
    AMQP_DOC,
    LinkProperties,
    RunningGateway,
    blocking,
    run_example,
    unique,
)

from tests.gateway.test_filtering import publish, regional

Rows = tuple[list[int], list[int], list[bytes]]


def read(url: str, stream: str, count: int, *, in_bulk: bool, **options: Any) -> tuple[Rows, bool]:
    """`count` rows from one consumer (bulk frames or messages one by one), and whether the
    broker granted bulk deliveries."""

    async def run() -> tuple[Rows, bool]:
        offsets: list[int] = []
        stamps: list[int] = []
        messages: list[bytes] = []

        def frames(got: list[bulk.Frame]) -> None:
            for frame in got:
                offsets.extend(frame.offset_list())
                stamps.extend(frame.timestamp_list())
                messages.extend(frame.messages())

        def batch(o: list[int], t: list[int], m: list[bytes]) -> None:
            offsets.extend(o)
            stamps.extend(t)
            messages.extend(m)

        handler = {"bulk_handler": frames} if in_bulk else {"batch_handler": batch}
        options.setdefault("partition", 0)
        consumer = await AsyncConsumer.connect(url, stream, **handler, **options)
        try:
            deadline = time.monotonic() + 20
            while len(offsets) < count:
                assert time.monotonic() < deadline, f"{len(offsets)} of {count} rows"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # nothing more comes
        finally:
            await consumer.close()
        return (offsets, stamps, messages), consumer.bulk

    return asyncio.run(run())


def same_rows(bulk_rows: Rows, plain_rows: Rows) -> None:
    assert bulk_rows[0] == plain_rows[0]
    assert bulk_rows[1] == plain_rows[1]
    sections = {"properties": True, "application_properties": True}
    assert read_columns(bulk_rows[2], **sections) == read_columns(plain_rows[2], **sections)


def test_bulk_rows_are_the_rows_read_one_by_one(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    producer = Producer(gateway.url, stream)
    try:
        producer.send_batch([b"plain-%d" % i for i in range(40)] + [b"", b"L" * 300])
        producer.send_batch([MessageParts(b"keyed-%d" % i, f"k{i % 3}") for i in range(20)])
        producer.send_batch([MessageParts(b"rich", "k", {"subject": "s"}, {"region": "emea"})] * 3)
        producer.send_batch([b"sub-%d" % i for i in range(30)], sub_entry_size=10)
        producer.send_batch(
            [MessageParts(b"zstd-%d" % i, "z") for i in range(30)],
            sub_entry_size=15,
            compression="zstd",
        )
        producer.send_batch([b"tail-%d" % i for i in range(5)])
    finally:
        producer.close()
    total = 42 + 20 + 3 + 30 + 30 + 5
    in_bulk, granted = read(gateway.url, stream, total, in_bulk=True, start="first")
    one_by_one, _ = read(gateway.url, stream, total, in_bulk=False, start="first")
    assert granted
    assert in_bulk[0] == list(range(total))
    same_rows(in_bulk, one_by_one)
    assert read_columns([in_bulk[2][-30]], properties=False, application_properties=False)[:2] == (
        [b"zstd-5"],
        [b"z"],
    )
    # a start inside a sub-entry (72: the third message of the first plain one)
    inside, _ = read(gateway.url, stream, total - 67, in_bulk=True, start=67)
    assert inside[0] == list(range(67, total))
    same_rows(inside, tuple(column[67:] for column in one_by_one))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"filter_values": ["apac"], "match_unfiltered": True},
        {"sql": "n > 20"},
    ],
)
def test_filtered_bulk_rows_are_the_filtered_rows(
    gateway: RunningGateway, make_stream: Callable[..., str], options: dict[str, Any]
) -> None:
    """A frame carries each row's offset, so a filtered link's gaps cross it unchanged; over
    compressed sub-entries too."""
    stream = make_stream()
    publish(gateway, stream, regional(30, ("emea", "apac", None)))
    producer = Producer(gateway.url, stream)
    try:
        encoded = [bytes(m.encode()) for m in regional(30, ("emea", "apac", None))]
        producer.send_batch(encoded, sub_entry_size=10, compression="zstd")
    finally:
        producer.close()
    want, _ = read(gateway.url, stream, 1, in_bulk=False, start="first", **options)
    in_bulk, granted = read(gateway.url, stream, len(want[0]), in_bulk=True, start="first",
                            **options)  # fmt: skip
    assert granted and len(want[0]) >= 9
    same_rows(in_bulk, want)


def test_only_links_that_ask_and_may_get_bulk_deliveries(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream, spread = make_stream(), make_stream(partitions=3)
    publish(gateway, stream, [Message(body=b"m%d" % i) for i in range(5)])
    ask = {symbol(bulk.PROPERTY): True}
    first = Filter({symbol("rabbitmq:stream-offset-spec"): "first"})
    with blocking(gateway) as conn:
        # a standard AMQP client that asks gets frames as ordinary messages
        receiver = conn.create_receiver(
            stream, name=unique("rx"), options=[LinkProperties(ask), first]
        )
        assert receiver.link.remote_properties[symbol(bulk.PROPERTY)] is True
        message = receiver.receive(timeout=10)
        assert message.annotations[symbol(bulk.ANNOTATION)] is True
        assert message.instructions[symbol("event-streams-offset")] == f"{0:020d}"
        frame = bulk.parse(message.body)
        assert frame.offset_list() == [0, 1, 2, 3, 4]
        receiver.accept()
        # one that does not ask: messages one by one
        plain = conn.create_receiver(stream, name=unique("rx"), options=[first])
        assert symbol(bulk.PROPERTY) not in (plain.link.remote_properties or {})
        assert plain.receive(timeout=10).body == b"m0"
        plain.accept()
        # named, and unbound over three partitions: answered without it
        for name, address, extra in (
            ("named", stream, {symbol("spate:consumer-name"): "c1"}),
            ("spread", spread, {}),
        ):
            other = conn.create_receiver(
                address, name=unique(name), options=[LinkProperties({**ask, **extra})]
            )
            assert symbol(bulk.PROPERTY) not in (other.link.remote_properties or {}), name
            other.close()


@pytest.mark.memory_broker_only
def test_the_documented_example_reads_a_frame(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    publish(gateway, stream, [Message(body=b"m%d" % i) for i in range(7)])
    found = re.findall(r"```python bulk-delivery\n(.*?)```", AMQP_DOC.read_text(), re.DOTALL)
    assert len(found) == 1
    code = found[0].replace("127.0.0.1:5672", f"127.0.0.1:{gateway.port}")
    output = run_example("python", code.replace('"orders"', repr(stream)))
    assert output == "0 7 messages; the first is 0053704500537345005377a0026d30\n"


def test_a_bulk_handler_gets_frames_when_the_broker_sends_messages_one_by_one(
    gateway: RunningGateway, make_stream: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker without bulk deliveries (here: one that never grants them) answers without the
    property; the client then builds the frames itself (messages with delivery annotations)."""
    stream = make_stream()
    publish(gateway, stream, regional(12, ("emea", None)))
    want, _ = read(gateway.url, stream, 12, in_bulk=False, start="first")
    monkeypatch.setattr(consumer_part, "wants_bulk", lambda link, plan: False)
    rows, granted = read(gateway.url, stream, 12, in_bulk=True, start="first")
    assert not granted
    assert rows == want
    with pytest.raises(ValueError, match="a bulk_handler reads one partition"):
        asyncio.run(AsyncConsumer.connect(gateway.url, stream, bulk_handler=print))
