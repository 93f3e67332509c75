"""spate.core.wire (ADR 0008): every frame round-trips; truncated or padded bodies are
CodecErrors, never a wrong value."""

from __future__ import annotations

import json

import pytest
from spate.core import frames, wire
from spate.core.backend import (
    Attached,
    ConsumerOffset,
    OffsetSpec,
    PartitionInfo,
    ProducerInfo,
    PublishingIds,
)
from spate.core.coordinator import Assignment, GroupSettings, GroupState, GroupView, MemberView
from spate.core.errors import NotFound, NotLeader, StorageFailure, Unavailable
from spate.core.filtering import ValueFilter
from spate.core.ids import (
    Generation,
    LeaderEpoch,
    MemberId,
    NodeId,
    Offset,
    PartitionId,
    StreamName,
)
from spate.core.streams import Retention, StreamConfig

KEY = (StreamName("orders"), PartitionId(3))


def body(data: bytes) -> memoryview:
    length, _ = frames.FRAME_HEAD.unpack_from(data)
    assert length == len(data) - 4
    return memoryview(data)[frames.FRAME_HEAD_BYTES :]


def kind(data: bytes) -> int:
    return frames.FRAME_HEAD.unpack_from(data)[1]


def test_requests_round_trip() -> None:
    records = [b"", b"x", bytes(range(256)) * 40]
    data = wire.encode_append(7, KEY, 12, records)
    assert kind(data) == wire.APPEND
    assert wire.decode_append(body(data)) == (7, KEY, 12, records, None)
    named = PublishingIds(b"orders-app", (5, 6, 2**64 - 1))
    data = wire.encode_append(8, KEY, 0, records, named)
    assert wire.decode_append(body(data)) == (8, KEY, 0, records, named)
    data = wire.encode_producer(4, KEY, "Ünïcode".encode())
    assert kind(data) == wire.PRODUCER
    assert wire.decode_producer(body(data)) == (4, KEY, "Ünïcode".encode())
    specs = [OffsetSpec.first(), OffsetSpec.timestamp(1_700_000_000_000), OffsetSpec.relative(5)]
    data = wire.encode_subscribe(9, KEY, 4096, specs)
    assert wire.decode_subscribe(body(data)) == (9, KEY, 4096, specs, None)
    values = ValueFilter(frozenset({"emea", "apac"}), match_unfiltered=True)
    data = wire.encode_subscribe(9, KEY, 4096, specs, values)
    assert wire.decode_subscribe(body(data)) == (9, KEY, 4096, specs, values)
    empty = wire.decode_records(body(wire.encode_records(3, 700, 5, [])))
    assert empty == (3, 700, 5, [])  # a skip mark (ADR 0016)
    assert wire.decode_ping(body(wire.encode_ping(7))) == 7
    assert wire.decode_ping(body(wire.encode_ping(7, pong=True))) == 7
    assert wire.decode_credit(body(wire.encode_credit(9, 100))) == (9, 100)
    assert wire.decode_unsubscribe(body(wire.encode_unsubscribe(9))) == 9
    assert wire.decode_info(body(wire.encode_info(5, KEY))) == (5, KEY)
    assert wire.decode_stream(body(wire.encode_stream(6, "événements"))) == (6, "événements")


def test_producer_replies_round_trip() -> None:
    info = ProducerInfo("orders-app", 41, Offset(9000), 1_700_000_000_000)
    assert wire.producer_from_json(wire.producer_to_json(info)) == info
    assert wire.producer_from_json(wire.producer_to_json(None)) is None
    with pytest.raises(frames.CodecError):
        wire.producer_from_json({"producer": {"name": "x"}})


def test_answers_round_trip() -> None:
    assert wire.decode_appended(body(wire.encode_appended(7, 2**40))) == (7, 2**40)
    assert wire.decode_started(body(wire.encode_started(9, 55))) == (9, 55)
    records = [b"a" * 100, b"b"]
    data = wire.encode_records(9, 55, 1_700_000_000_123, records)
    assert wire.decode_records(body(data)) == (9, 55, 1_700_000_000_123, records)
    error = NotLeader("not me", leader_host="h", leader_port=5672, leader_node="n2")
    request, decoded, stored = wire.decode_failed(body(wire.encode_failed(3, error, stored=True)))
    assert (request, stored, type(decoded)) == (3, True, NotLeader)
    assert isinstance(decoded, NotLeader)
    assert (decoded.leader_node, decoded.leader_host, decoded.leader_port) == ("n2", "h", 5672)
    assert decoded.message == "not me"
    for error in (NotFound("no"), Unavailable("later"), StorageFailure("disk")):
        _, decoded, stored = wire.decode_failed(body(wire.encode_failed(1, error)))
        assert type(decoded) is type(error) and decoded.message == error.message and not stored
    sub, ended = wire.decode_ended(body(wire.encode_ended(4, Unavailable("closing"))))
    assert sub == 4 and isinstance(ended, Unavailable) and ended.retryable


def test_info_and_config_round_trip_through_json() -> None:
    info = PartitionInfo(
        StreamName("orders"), PartitionId(1), Offset(0), Offset(9), Offset(10), 1, 2, 10, 999,
        1, NodeId("n1"), LeaderEpoch(4),
    )  # fmt: skip
    request, value = wire.decode_reply(body(wire.encode_reply(2, wire.info_to_json(info))))
    assert request == 2 and wire.info_from_json(value) == info
    config = StreamConfig(StreamName("orders"), 6, 3, Retention(max_age_ms=1000))
    _, value = wire.decode_reply(body(wire.encode_reply(2, wire.config_to_json(config))))
    assert wire.config_from_json(value) == config


@pytest.mark.parametrize(
    "encoded, decode",
    [
        (wire.encode_append(1, KEY, 0, [b"abc", b"de"]), wire.decode_append),
        (
            wire.encode_append(1, KEY, 0, [b"abc", b"de"], PublishingIds(b"p", (1, 2))),
            wire.decode_append,
        ),
        (wire.encode_producer(1, KEY, b"p"), wire.decode_producer),
        (wire.encode_consumer(1, KEY, wire.CONSUMER_WAIT, b"c", 2, 3), wire.decode_consumer),
        (wire.encode_records(1, 2, 3, [b"abc"]), wire.decode_records),
        (wire.encode_subscribe(1, KEY, 2, [OffsetSpec.next()]), wire.decode_subscribe),
        (wire.encode_appended(1, 2), wire.decode_appended),
        (wire.encode_credit(1, 2), wire.decode_credit),
        (wire.encode_group(1, wire.GroupCall("leave", StreamName("s"), "g")), wire.decode_group),
    ],
)
def test_truncated_or_padded_bodies_are_codec_errors(encoded: bytes, decode: object) -> None:
    full = bytes(body(encoded))
    for cut in range(len(full)):
        with pytest.raises(frames.CodecError):
            decode(memoryview(full[:cut]))  # type: ignore[operator]
    with pytest.raises(frames.CodecError):
        decode(memoryview(full + b"\x00"))  # type: ignore[operator]


@pytest.mark.parametrize("op", wire.CONSUMER_OPS)
def test_consumer_requests_and_answers_round_trip(op: int) -> None:
    """Named consumers (ADR 0012) and single-active-consumer groups (ADR 0013) at the leader."""
    data = wire.encode_consumer(5, KEY, op, "bïlling".encode(), wire.NO_OFFSET, 2**64 - 1)
    assert kind(data) == wire.CONSUMER
    assert wire.decode_consumer(body(data)) == (5, KEY, op, "bïlling".encode(), -2, 2**64 - 1)
    stored = ConsumerOffset("bïlling", 41, 1_700_000_000_000, attached=3, group=2)
    for answer in (Attached(stored, 7, True), Attached(None, 9, False), Attached(None)):
        assert wire.consumer_from_json(wire.consumer_to_json(answer)) == answer
    assert wire.consumer_from_json(wire.consumer_to_json(None)) == Attached(None)


def test_a_consumer_request_with_an_unknown_op_is_refused() -> None:
    data = bytearray(body(wire.encode_consumer(1, KEY, wire.CONSUMER_STORE, b"c", 4)))
    data[8 + 2 + len(KEY[0]) + 4] = 99  # request u64 | group (str16 + u32) | op
    with pytest.raises(frames.CodecError, match="op 99"):
        wire.decode_consumer(memoryview(bytes(data)))


def test_an_unknown_offset_spec_kind_is_refused() -> None:
    data = bytearray(body(wire.encode_subscribe(1, KEY, 2, [OffsetSpec.next()])))
    data[-9] = 200
    with pytest.raises(frames.CodecError, match="offset specification"):
        wire.decode_subscribe(memoryview(bytes(data)))


ASSIGNMENT = Assignment(
    Generation(7), frozenset({PartitionId(0), PartitionId(2)}), frozenset({PartitionId(3)})
)
SETTINGS = GroupSettings("sticky", session_timeout_ms=10_000, rebalance_delay_ms=0)
SETTINGS_JSON = {
    "strategy": "sticky",
    "session_timeout_ms": 10_000,
    "rebalance_delay_ms": 0,
    "pending_max": 16,
}


@pytest.mark.parametrize(
    "call",
    [
        wire.GroupCall("join", StreamName("événements"), "bïlling", settings=SETTINGS),
        wire.GroupCall("sync", StreamName("s"), "g", MemberId(3), timeout_ms=5000),
        wire.GroupCall("sync", StreamName("s"), "g", MemberId(3), known=ASSIGNMENT),
        wire.GroupCall(
            "released",
            StreamName("s"),
            "g",
            MemberId(2),
            partitions=frozenset({PartitionId(1), PartitionId(5)}),
            generation=9,
        ),
        wire.GroupCall("leave", StreamName("s"), "g", MemberId(2**53)),
        wire.GroupCall("describe", StreamName("s"), "g"),
    ],
)
def test_group_requests_round_trip(call: wire.GroupCall) -> None:
    """A member's coordinator calls (ADR 0015) and their answers."""
    data = wire.encode_group(11, call)
    assert kind(data) == wire.GROUP
    assert wire.decode_group(body(data)) == (11, call)


def test_group_answers_round_trip() -> None:
    assert wire.assignment_from_json(wire.assignment_to_json(ASSIGNMENT)) == ASSIGNMENT
    empty = Assignment(Generation(0), frozenset(), frozenset())
    assert wire.assignment_from_json(wire.assignment_to_json(empty)) == empty
    assert wire.member_from_json({"member": 4}) == 4
    request, value = wire.decode_reply(body(wire.encode_reply(3, {"member": 4})))
    assert (request, wire.member_from_json(value)) == (3, 4)
    for bad in ({}, {"member": -1}, {"member": True}, {"member": "4"}):
        with pytest.raises(frames.CodecError):
            wire.member_from_json(bad)
    for bad_assignment in (
        {"generation": 1, "partitions": [0]},
        {"generation": 1, "partitions": [-1], "release": []},
        {"generation": 1, "partitions": "0", "release": []},
        [1, [0], []],
    ):
        with pytest.raises(frames.CodecError):
            wire.assignment_from_json(bad_assignment)


VIEW = GroupView(
    "sticky",
    4,
    Generation(7),
    GroupState.REBALANCING,
    (
        MemberView(
            MemberId(1), frozenset({PartitionId(0)}), frozenset({PartitionId(2)}), 900, 30_000
        ),
        MemberView(MemberId(3), frozenset({PartitionId(1)}), frozenset(), 1_250, 10_000),
    ),
    awaiting_release=frozenset({PartitionId(2)}),
    unassigned=frozenset({PartitionId(3)}),
    storing=Generation(8),
    rebalance_due_ms=4_000,
    now_ms=1_300,
)


def test_group_views_round_trip() -> None:
    """A describe's reply (`spate group describe`): the coordinator's view, or null."""
    quiet = GroupView(
        "round-robin", 1, Generation(0), GroupState.STABLE, (), frozenset(), frozenset(), None, None
    )
    for view in (VIEW, quiet, None):
        request, value = wire.decode_reply(
            body(wire.encode_reply(5, wire.group_view_to_json(view)))
        )
        assert (request, wire.group_view_from_json(value)) == (5, view)
    assert wire.group_view_to_json(None) == {"group": None}
    good = wire.group_view_to_json(VIEW)["group"]
    member = good["members"][0]
    for bad in (
        {},
        {"group": good | {"strategy": "random"}},
        {"group": good | {"state": "Empty"}},
        {"group": good | {"generation": -1}},
        {"group": good | {"storing": "8"}},
        {"group": good | {"members": [member | {"partitions": [-1]}]}},
        {"group": good | {"members": [{k: v for k, v in member.items() if k != "release"}]}},
        {"group": good | {"members": [member] * 70_000}},
        {"group": {k: v for k, v in good.items() if k != "now_ms"}},
        {"group": [1, 2]},
    ):
        with pytest.raises(frames.CodecError):
            wire.group_view_from_json(bad)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"op": "rejoin"}, "op 'rejoin'"),
        ({"stream": 5}, "stream 5"),
        ({"member": -1}, "member -1"),
        ({"timeout_ms": 10**9}, "at most"),
        ({"settings": {"strategy": "random"}}, "exactly"),
        ({"settings": SETTINGS_JSON | {"strategy": "random"}}, "one of"),
        ({"settings": SETTINGS_JSON | {"pending_max": 1.5}}, "pending_max"),
        ({"partitions": list(range(5000))}, "at most"),
        ({"known": {"generation": 1}}, "assignment"),
        ({"generation": None}, "generation"),
    ],
)
def test_a_malformed_group_request_is_a_codec_error(change: dict[str, object], says: str) -> None:
    data = body(wire.encode_group(1, wire.GroupCall("leave", StreamName("s"), "g")))
    value = json.loads(bytes(data[8:])) | change
    with pytest.raises(frames.CodecError, match=says):
        wire.decode_group(memoryview(bytes(data[:8]) + json.dumps(value).encode()))
    missing = {k: v for k, v in value.items() if k != "group"}
    with pytest.raises(frames.CodecError, match="'group'"):
        wire.decode_group(memoryview(bytes(data[:8]) + json.dumps(missing).encode()))
