"""Publish and consume through real proton clients (BlockingConnection and Container)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proton import Described, Message, symbol, timestamp, ulong
from proton.reactor import AtMostOnce, Filter
from spate.core.ids import offset_to_symbol
from support.amqp_clients import (
    RawExchange,
    RunningGateway,
    blocking,
    da,
    offset_filter,
    partition_option,
    publish,
    receive,
    unique,
)


def bodies_of(messages: list[Message]) -> list[Any]:
    return [m.body for m in messages]


def consume(
    gateway: RunningGateway, stream: str, count: int, *options: Any, credit: int = 100
) -> list[Message]:
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=credit, options=list(options) or None
        )
        return receive(receiver, count)


def test_publish_is_accepted_and_consumed_from_first(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """Accepted only after append resolves; default consumer with `first` reads them back."""
    stream = make_stream()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for i in range(5):
            delivery = sender.send(Message(body=f"m{i}"))
            assert delivery.remote_state == delivery.ACCEPTED
    got = consume(gateway, stream, 5, offset_filter("first"))
    assert bodies_of(got) == [f"m{i}" for i in range(5)]


def test_every_delivery_carries_offset_and_timestamp_in_log_order(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.1: offset (symbol) and timestamp (AMQP timestamp) on every delivery; lexicographic
    order of offsets is log order (§5.1.1)."""
    stream = make_stream()
    publish(gateway, stream, [f"m{i}" for i in range(12)])
    got = consume(gateway, stream, 12, offset_filter("first"))
    offsets = [da(m, "event-streams-offset") for m in got]
    assert all(isinstance(o, symbol) for o in offsets)
    assert offsets == sorted(offsets) and len(set(offsets)) == 12
    assert all(isinstance(da(m, "event-streams-timestamp"), timestamp) for m in got)
    assert all(da(m, "event-streams-source-partition") is None for m in got)


def test_default_start_is_next_and_consumers_follow_the_tail(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §3.2: without a filter a consumer gets only messages accepted after it attached."""
    stream = make_stream()
    publish(gateway, stream, ["old-1", "old-2"])
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(stream, name=unique("rx"), credit=10)
        sender = conn.create_sender(stream, name=unique("tx"))
        for body in ("new-1", "new-2", "new-3"):
            sender.send(Message(body=body))
        assert bodies_of(receive(receiver, 3)) == ["new-1", "new-2", "new-3"]
        sender.send(Message(body="new-4"))  # live tail: delivered as it is appended
        assert bodies_of(receive(receiver, 1)) == ["new-4"]


def test_start_positions_first_last_next_offset_relative(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """Simple forms of the 0x200 filter value (first, last, next, N, -N)."""
    stream = make_stream()
    publish(gateway, stream, [f"m{i}" for i in range(6)])  # one chunk per message
    assert bodies_of(consume(gateway, stream, 1, offset_filter("first"))) == ["m0"]
    assert bodies_of(consume(gateway, stream, 1, offset_filter("last"))) == ["m5"]
    assert bodies_of(consume(gateway, stream, 2, offset_filter(3))) == ["m3", "m4"]
    assert bodies_of(consume(gateway, stream, 2, offset_filter(-2))) == ["m4", "m5"]
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), options=offset_filter(symbol("next"))
        )
        conn.create_sender(stream, name=unique("tx")).send(Message(body="after"))
        assert bodies_of(receive(receiver, 1)) == ["after"]


def test_timestamp_start(gateway: RunningGateway, make_stream: Callable[..., str]) -> None:
    """An AMQP timestamp as the filter value starts at the first message stored at or after it;
    the 0x200 map form with event-streams-timestamp is strictly later (000 §5.2.1)."""
    stream = make_stream()
    publish(gateway, stream, ["a0", "a1"])
    first_two = consume(gateway, stream, 2, offset_filter("first"))
    last_ts = int(da(first_two[-1], "event-streams-timestamp"))
    while time.time() * 1000 <= last_ts + 1:  # the broker's clock must move past batch A
        time.sleep(0.001)
    publish(gateway, stream, ["b0", "b1"])
    b = consume(gateway, stream, 2, offset_filter(-2))
    b_ts = int(da(b[0], "event-streams-timestamp"))
    assert bodies_of(consume(gateway, stream, 2, offset_filter(timestamp(b_ts)))) == ["b0", "b1"]
    map_form = offset_filter({symbol("event-streams-timestamp"): timestamp(last_ts)})
    assert bodies_of(consume(gateway, stream, 2, map_form)) == ["b0", "b1"]


def test_offset_map_filter_with_numeric_and_symbolic_descriptors(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.2.1: {event-streams-offset: o} matches offsets strictly greater than o, under
    0x00000000:0x00000200 and amqp:event-streams-delivery-annotations-filter."""
    stream = make_stream()
    publish(gateway, stream, [f"m{i}" for i in range(5)])
    after_1 = {symbol("event-streams-offset"): symbol(offset_to_symbol(1))}  # type: ignore[arg-type]
    numeric = consume(gateway, stream, 3, offset_filter(after_1))
    symbolic = consume(
        gateway,
        stream,
        3,
        offset_filter(after_1, descriptor=symbol("amqp:event-streams-delivery-annotations-filter")),
    )
    assert bodies_of(numeric) == bodies_of(symbolic) == ["m2", "m3", "m4"]
    earliest = {symbol("event-streams-offset"): symbol("@earliest")}
    assert bodies_of(consume(gateway, stream, 1, offset_filter(earliest))) == ["m0"]


def test_sql_filter(gateway: RunningGateway, make_stream: Callable[..., str]) -> None:
    """000 §5.2.2: `d.event-streams-offset > 'o'` (exclusive), `>=` (inclusive), TRUE."""
    stream = make_stream()
    publish(gateway, stream, [f"m{i}" for i in range(5)])
    o2 = offset_to_symbol(2)  # type: ignore[arg-type]
    gt = consume(
        gateway,
        stream,
        2,
        offset_filter(f"d.event-streams-offset > '{o2}'", descriptor=ulong(0x201)),
    )
    ge = consume(
        gateway,
        stream,
        3,
        offset_filter(
            f"delivery_annotations.event-streams-offset >= '{o2}'",
            descriptor=symbol("amqp:event-streams-sql-filter"),
        ),
    )
    everything = consume(gateway, stream, 1, offset_filter("TRUE", descriptor=ulong(0x201)))
    assert bodies_of(gt) == ["m3", "m4"]
    assert bodies_of(ge) == ["m2", "m3", "m4"]
    assert bodies_of(everything) == ["m0"]


def test_rabbitmq_offset_spec_and_filter_echo(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """Filters in force are echoed in the attach answer; unknown ones are ignored, not echoed
    (AMQP 1.0 §3.5.1)."""
    stream = make_stream()
    publish(gateway, stream, ["m0", "m1", "m2"])
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream,
            name=unique("rx"),
            options=Filter(
                {
                    symbol("rabbitmq:stream-offset-spec"): Described(
                        symbol("rabbitmq:stream-offset-spec"), 1
                    ),
                    symbol("x-selector"): Described(
                        symbol("com.example:selector"), "colour = 'red'"
                    ),
                }
            ),
        )
        assert bodies_of(receive(receiver, 2)) == ["m1", "m2"]
        echoed = receiver.link.remote_source.filter
        echoed.rewind()
        echoed.next()
        assert set(echoed.get_object()) == {symbol("rabbitmq:stream-offset-spec")}


def test_byte_exact_round_trip(gateway: RunningGateway, make_stream: Callable[..., str]) -> None:
    """002 §3.2: the bare message is immutable. Bytes in == bytes out minus the DA sections;
    the producer's own delivery annotations are hop-by-hop and not stored."""
    stream = make_stream()
    message = Message(
        body={"k": [1, 2.5, "x"]},
        subject="subj",
        id="id-1",
        properties={"colour": "red"},
        annotations={symbol("x-opt-k"): "v"},
    )
    plain = message.encode()
    message.instructions = {symbol("x-producer-da"): 7}
    with_da = message.encode()
    assert with_da != plain
    exchange = RawExchange(gateway.url, stream, [plain, with_da], expect=2).run()
    assert [state for state, _ in exchange.outcomes] == [36, 36]  # accepted
    for received in exchange.received:
        stripped = Message()
        stripped.decode(received)
        assert set(stripped.instructions) == {
            symbol("event-streams-offset"),
            symbol("event-streams-timestamp"),
        }
        header_len = 0
        if received[:3] == b"\x00\x53\x70":
            header_len = len(received) - len(received[received.index(b"\x00\x53\x71") :])
        da_start = received.index(b"\x00\x53\x71")
        from spate.gateway import codec

        da_end = codec.skip(received, da_start)
        assert da_start == header_len
        assert received[:da_start] + received[da_end:] == plain


def test_partitioned_stream_routing(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.1/§4.3 bound links; §4.2/§4.6.6 target-partition annotation; §4.4/§4.6.4
    source-partition annotation on deliveries from a partitioned stream."""
    stream = make_stream(partitions=3)
    with blocking(gateway) as conn:
        bound = conn.create_sender(stream, name=unique("tx"), options=partition_option("2"))
        properties = bound.link.remote_properties
        assert properties[symbol("event-streams-partition")] == symbol("2")
        # a replicated partition also answers its leader epoch; the in-memory one has none
        assert set(properties) <= {symbol("event-streams-partition"), symbol("spate:leader-epoch")}
        bound.send(Message(body="to-2"))
        agnostic = conn.create_sender(stream, name=unique("tx"))
        hinted = Message(body="hint-1")
        hinted.instructions = {symbol("event-streams-target-partition"): symbol("1")}
        agnostic.send(hinted)
        for i in range(3):
            agnostic.send(Message(body=f"rr{i}"))  # one per batch: round-robin over partitions
        rx1 = conn.create_receiver(
            stream, name=unique("rx"), options=[partition_option("1"), offset_filter("first")]
        )
        first_on_1 = receive(rx1, 1)[0]
        assert first_on_1.body == "hint-1"
        assert da(first_on_1, "event-streams-source-partition") == "1"
        everything = conn.create_receiver(stream, name=unique("rx"), options=offset_filter("first"))
        got = receive(everything, 5)
    assert sorted(m.body for m in got) == sorted(["to-2", "hint-1", "rr0", "rr1", "rr2"])
    by_partition: dict[str, list[Any]] = {}
    for m in got:
        by_partition.setdefault(str(da(m, "event-streams-source-partition")), []).append(m.body)
    assert set(by_partition) == {"0", "1", "2"}
    assert by_partition["2"][0] == "to-2" and by_partition["1"][0] == "hint-1"


def test_target_partition_must_match_a_bound_link(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.2: a mismatching target-partition annotation on a bound link is rejected."""
    stream = make_stream(partitions=2)
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=partition_option("0"))
        wrong = Message(body="x")
        wrong.instructions = {symbol("event-streams-target-partition"): symbol("1")}
        delivery = sender.link.send(wrong)
        conn.wait(lambda: delivery.settled, timeout=5)
        assert delivery.remote_state == delivery.REJECTED
        assert delivery.remote.condition.name == "amqp:invalid-field"
        assert sender.send(Message(body="fine")).remote_state == delivery.ACCEPTED


def test_presettled_producer_is_stored(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=AtMostOnce())
        for i in range(3):
            delivery = sender.link.send(Message(body=f"p{i}"))
            delivery.settle()
        receiver = conn.create_receiver(stream, name=unique("rx"), options=offset_filter("first"))
        assert bodies_of(receive(receiver, 3)) == ["p0", "p1", "p2"]
