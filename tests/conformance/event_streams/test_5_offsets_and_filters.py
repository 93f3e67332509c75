"""000 §5: the delivery annotations every delivery carries (§5.1, §5.1.1, §5.1.2) and the
delivery filters that choose where a consumer starts (§5.2, §5.2.1, §5.2.2).

Where a test needs timestamps it controls, it runs over the in-memory broker with a clock it
sets (`MemoryPartition.clock_ms`): only the fake lets a test choose append times."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from proton import Delivery, Message, symbol, timestamp, ulong
from proton.reactor import AtMostOnce
from spate.core.ids import PartitionId, StreamName
from support.amqp_clients import (
    LoopThread,
    RunningGateway,
    blocking,
    fill,
    offset_filter,
    publish,
    unique,
)
from support.event_streams import (
    OFFSET,
    PARTITION,
    TIMESTAMP,
    WAIT_S,
    bound,
    outcomes,
    read,
    refused,
    runtime_information,
)
from support.memory_broker import MemoryBroker

SQL = ulong(0x201)


def set_clock(
    loop_thread: LoopThread, broker: MemoryBroker, stream: str, times_ms: list[int]
) -> None:
    """Partition 0 of `stream` stamps its next appends with `times_ms`, in order, then every
    1000 ms after the last."""
    partition = broker.partitions[(StreamName(stream), PartitionId(0))]
    ticks: Iterator[int] = itertools.chain(times_ms, itertools.count(times_ms[-1] + 1_000, 1_000))
    loop_thread.run(lambda: setattr(partition, "clock_ms", lambda: next(ticks)))


def bodies_after(gateway: RunningGateway, stream: str, start: Any, count: int) -> list[Any]:
    """The first `count` bodies a consumer starting at filter value `start` (0x200, or a
    Filter) gets; then a marker is published and must come next, so nothing else was due."""
    with blocking(gateway) as conn:
        option = start if not isinstance(start, dict | str) else offset_filter(start)
        receiver = conn.create_receiver(stream, name=unique("rx"), credit=50, options=[option])
        got = [receiver.receive(timeout=WAIT_S).body for _ in range(count)]
        conn.create_sender(stream, name=unique("tx")).send(Message(body="marker"))
        marker = receiver.receive(timeout=WAIT_S).body
        receiver.accept()
    assert marker == "marker", f"after {got}: {marker!r} was delivered too"
    return got


# -- 5.1 ----------------------------------------------------------------------------------------


@pytest.mark.routing
def test_5_1_offset_and_timestamp_annotations_on_every_delivery(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.1: "For a conforming implementation, these delivery annotations MUST be added by
    the event log node to all messages delivered to consumers." `event-streams-offset` (a
    symbol) and `event-streams-timestamp` (a timestamp) on every delivery: one- and
    three-partition streams, history and live tail, unsettled and pre-settled links."""
    single, partitioned = make_stream(partitions=1), make_stream(partitions=3)
    fill(gateway, single, 2)
    for p in range(3):
        publish(gateway, partitioned, [f"p{p}"], {PARTITION: symbol(str(p))})
    got: list[Message] = []
    stored = {single: 2, partitioned: 3}
    with blocking(gateway) as conn:
        for stream in (single, partitioned):
            for extra in ([], [AtMostOnce()]):
                receiver = conn.create_receiver(
                    stream, name=unique("rx"), credit=10, options=[offset_filter("first"), *extra]
                )
                got += [receiver.receive(timeout=WAIT_S) for _ in range(stored[stream])]
                publish(gateway, stream, ["tail"], {PARTITION: symbol("0")})
                stored[stream] += 1
                got.append(receiver.receive(timeout=WAIT_S))
                if not extra:
                    receiver.accept()
                receiver.close()
    assert len(got) == (2 + 1) + (3 + 1) + (3 + 1) + (4 + 1)
    for message in got:
        annotations = message.instructions or {}
        assert isinstance(annotations.get(OFFSET), symbol), message
        assert isinstance(annotations.get(TIMESTAMP), timestamp), message


# -- 5.1.1 --------------------------------------------------------------------------------------


@pytest.mark.routing
def test_5_1_1_offsets_increase_lexicographically_in_log_order(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.1.1: "the chosen syntax MUST ensure that the lexicographical order of the
    event-streams-offset of any event in the log MUST be greater than the lexicographical order
    of any other event preceding it in the order of the log." Twelve messages (past the ninth,
    where decimal numbers without padding would sort '10' before '9'), one per append and
    pipelined, on each of three partitions: in each partition, as strings, every offset is
    greater than all before it."""
    stream = make_stream(partitions=3)
    for p in range(3):
        publish(gateway, stream, [f"p{p}-{i}" for i in range(6)], {PARTITION: symbol(str(p))})
        with blocking(gateway) as conn:
            sender = conn.create_sender(stream, name=unique("tx"), options=bound(symbol(str(p))))
            pending = [sender.link.send(Message(body=f"p{p}-{i}")) for i in range(6, 12)]
            assert all(d.remote_state == Delivery.ACCEPTED for d in outcomes(conn, pending))
    for p in range(3):
        got = read(gateway, stream, 12, partition=str(p))
        assert [m.body for m in got] == [f"p{p}-{i}" for i in range(12)]
        offsets = [str(m.instructions[OFFSET]) for m in got]
        assert all(a < b for a, b in itertools.pairwise(offsets)), offsets


def test_5_1_1_offsets_work_as_given_without_interpretation(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.1.1: "Receivers MUST NOT interpret or construct offset values." A receiver's
    duty; the node's part is that it never needs to: "Receivers learn about offset values
    either by obtaining the runtime information of a partition, which contains the offset of the
    most recently added event, or by retaining the value of the last event-streams-offset
    delivery annotation property they read". Both, passed back verbatim in a 0x200 filter,
    resume strictly after that event."""
    stream = make_stream()
    fill(gateway, stream, 4)
    retained = read(gateway, stream, 2)[-1].instructions[OFFSET]
    assert bodies_after(gateway, stream, {OFFSET: retained}, 2) == ["m2", "m3"]
    latest = runtime_information(gateway, stream)["partitions"][0]["latest-offset"]
    assert bodies_after(gateway, stream, {OFFSET: latest}, 0) == []


def test_5_1_1_may_use_earliest_and_latest_comparands(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.1.1: "For use with delivery filter expressions, the reserved values MAY be used as
    constants for comparand values: "@earliest" is smaller than all existing offsets in the
    log. "@latest" is greater than all existing offsets in the log." Spate takes both, in the
    0x200 map and in the SQL filter (docs/amqp.md, Consuming)."""
    stream = make_stream()
    fill(gateway, stream, 3)
    assert bodies_after(gateway, stream, {OFFSET: symbol("@earliest")}, 3) == ["m0", "m1", "m2"]
    assert bodies_after(gateway, stream, {OFFSET: symbol("@latest")}, 0) == []
    earliest_sql = offset_filter("d.event-streams-offset > '@earliest'", descriptor=SQL)
    assert bodies_after(gateway, stream, earliest_sql, 4) == ["m0", "m1", "m2", "marker"]
    latest_sql = offset_filter("d.event-streams-offset > '@latest'", descriptor=SQL)
    assert bodies_after(gateway, stream, latest_sql, 0) == []


# -- 5.1.2 --------------------------------------------------------------------------------------


def test_5_1_2_timestamps_do_not_order_events(
    gateway: RunningGateway,
    make_stream: Callable[..., str],
    broker: MemoryBroker,
    loop_thread: LoopThread,
) -> None:
    """000 §5.1.2: "The timestamp only serves as a filter criterion to determine a desired
    offset into the stream, but MUST NOT be used to determine the order of events." With a
    skewed clock (the section's own example: later events with earlier timestamps), events are
    delivered in log order whatever their timestamps; a timestamp filter picks the first event
    stamped after it as the start, and delivery goes on in log order from there."""
    stream = make_stream()
    set_clock(loop_thread, broker, stream, [5_000, 1_000, 3_000, 2_000])
    fill(gateway, stream, 4)
    got = read(gateway, stream, 4)
    assert [m.body for m in got] == ["m0", "m1", "m2", "m3"]
    assert [int(m.instructions[TIMESTAMP]) for m in got] == [5_000, 1_000, 3_000, 2_000]
    assert bodies_after(gateway, stream, {TIMESTAMP: timestamp(4_000)}, 4) == [
        "m0",
        "m1",
        "m2",
        "m3",
    ]


# -- 5.2 ----------------------------------------------------------------------------------------


@pytest.mark.routing
def test_5_2_filter_is_evaluated_over_the_retained_events_from_earliest_to_latest(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.2: "The source filter MUST be evaluated against the retained events in the log
    from earliest to latest. Events matching the source expression are eligible for delivery."
    On eight events, `>= o3` (SQL) and `> o3` (0x200 map) deliver exactly the matching ones,
    in log order, and an empty 0x200 map all retained events from the earliest."""
    stream = make_stream()
    fill(gateway, stream, 8)
    o3 = read(gateway, stream, 4)[3].instructions[OFFSET]
    inclusive = offset_filter(f"d.event-streams-offset >= '{o3}'", descriptor=SQL)
    assert bodies_after(gateway, stream, inclusive, 5) == [f"m{i}" for i in range(3, 8)]
    assert bodies_after(gateway, stream, {OFFSET: o3}, 4) == [f"m{i}" for i in range(4, 8)]
    everything = [f"m{i}" for i in range(8)] + ["marker", "marker"]
    assert bodies_after(gateway, stream, offset_filter({}), 10) == everything


# -- 5.2.1 --------------------------------------------------------------------------------------


@pytest.mark.routing
def test_5_2_1_offset_filter_matches_events_after_the_offset(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.2.1: "The property values match the given values in the filter expression, if the
    value of the property is greater than value given in the filter expression. If the
    application remembered a particular offset after having consumed the message that carried
    it, the filter matches messages added after that offset." On each of three partitions, the
    filter with the offset of that partition's second message starts at its third."""
    stream = make_stream(partitions=3)
    for p in range(3):
        publish(gateway, stream, [f"p{p}-{i}" for i in range(4)], {PARTITION: symbol(str(p))})
    for p in range(3):
        remembered = read(gateway, stream, 2, partition=str(p))[1].instructions[OFFSET]
        got = read(gateway, stream, 2, partition=str(p), start={OFFSET: remembered})
        assert [m.body for m in got] == [f"p{p}-2", f"p{p}-3"]


def test_5_2_1_timestamp_filter_matches_events_stored_later(
    gateway: RunningGateway,
    make_stream: Callable[..., str],
    broker: MemoryBroker,
    loop_thread: LoopThread,
) -> None:
    """000 §5.2.1: "Only the event-streams-offset and/or event-streams-timestamp delivery
    annotation properties are eligible to be used with this filter. The property values match
    the given values in the filter expression, if the value of the property is greater than
    value given in the filter expression." Events stamped 1000..4000 ms: the filter 2000
    starts at the one stamped 3000 (strictly later), as an AMQP timestamp or integer ms."""
    stream = make_stream()
    set_clock(loop_thread, broker, stream, [1_000, 2_000, 3_000, 4_000, 5_000])
    fill(gateway, stream, 4)
    assert bodies_after(gateway, stream, {TIMESTAMP: timestamp(2_000)}, 2) == ["m2", "m3"]
    assert bodies_after(gateway, stream, {TIMESTAMP: 2_000}, 3) == ["m2", "m3", "marker"]


def test_5_2_1_filter_is_true_only_if_all_annotations_match(
    gateway: RunningGateway,
    make_stream: Callable[..., str],
    broker: MemoryBroker,
    loop_thread: LoopThread,
) -> None:
    """000 §5.2.1: "The filter evaluates to true if all annotations enclosed in the filter
    expression match the respective delivery annotation map entries." Offset after m1 and
    timestamp after 3000 ms (m3's is 4000): delivery starts where both hold, whichever is the
    later, in either order of the two conditions."""
    stream = make_stream()
    set_clock(loop_thread, broker, stream, [1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000])
    fill(gateway, stream, 5)
    o1 = read(gateway, stream, 2)[1].instructions[OFFSET]
    both = {OFFSET: o1, TIMESTAMP: timestamp(3_000)}
    assert bodies_after(gateway, stream, both, 2) == ["m3", "m4"]
    o3 = read(gateway, stream, 4)[3].instructions[OFFSET]
    both = {TIMESTAMP: timestamp(1_000), OFFSET: o3}
    assert bodies_after(gateway, stream, both, 2) == ["m4", "marker"]


def test_5_2_1_other_annotations_are_not_eligible(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.2.1: "Only the event-streams-offset and/or event-streams-timestamp delivery
    annotation properties are eligible to be used with this filter." Spate refuses a filter
    naming another one (`amqp:invalid-field`, with the accepted forms) rather than ignore a
    condition the consumer thinks holds (docs/amqp.md, Consuming)."""
    stream = make_stream()
    for other in (symbol("event-streams-source-partition"), symbol("colour")):
        refusal = refused(gateway, stream, sender=False, options=offset_filter({other: "x"}))
        assert refusal.condition.name == "amqp:invalid-field"
        assert "accepted:" in refusal.condition.description


# -- 5.2.2 --------------------------------------------------------------------------------------


def test_5_2_2_sql_filter_compares_offsets(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.2.2: the grammar subset — "Start from event at offset "a4c5" exclusively:
    d.event-streams-offset > 'a4c5'"; "inclusively: d.event-streams-offset >= 'a4c5'"; the
    section names `d` and `delivery_annotations`; `<boolean_constant>` and
    `<binary-logical-operator>` (AND)."""
    stream = make_stream()
    fill(gateway, stream, 5)
    o2 = read(gateway, stream, 3)[2].instructions[OFFSET]
    o3 = read(gateway, stream, 4)[3].instructions[OFFSET]
    cases = [
        (f"d.event-streams-offset > '{o2}'", ["m3", "m4"]),
        (f"d.event-streams-offset >= '{o2}'", ["m2", "m3", "m4"]),
        (f"delivery_annotations.event-streams-offset >= '{o3}'", ["m3", "m4"]),
        (f"d.event-streams-offset > '{o2}' AND d.event-streams-offset >= '{o3}'", ["m3", "m4"]),
    ]
    for sql, expected in cases:
        got = bodies_after(gateway, stream, offset_filter(sql, descriptor=SQL), len(expected))
        assert got == expected, sql
    everything = [f"m{i}" for i in range(5)] + ["marker"] * len(cases)
    got = bodies_after(gateway, stream, offset_filter("TRUE", descriptor=SQL), len(everything))
    assert got == everything


def test_5_2_2_sql_filter_compares_timestamps_in_milliseconds(
    gateway: RunningGateway,
    make_stream: Callable[..., str],
    broker: MemoryBroker,
    loop_thread: LoopThread,
) -> None:
    """000 §5.2.2: "Start from event received after the timestamp:
    d.event-streams-timestamp > 1585672841". Spate's integer constant is milliseconds since the
    epoch, the unit of the event-streams-timestamp annotation (an AMQP timestamp) it is compared
    with (docs/amqp.md, src/gateway/README.md; the example's value reads as seconds, see this
    suite's README)."""
    stream = make_stream()
    set_clock(loop_thread, broker, stream, [1_000, 2_000, 3_000, 4_000])
    fill(gateway, stream, 3)
    sql = offset_filter("d.event-streams-timestamp > 1000", descriptor=SQL)
    assert bodies_after(gateway, stream, sql, 2) == ["m1", "m2"]
    sql = offset_filter("d.event-streams-timestamp >= 3000", descriptor=SQL)
    assert bodies_after(gateway, stream, sql, 2) == ["m2", "marker"]
