"""003 Unit Tests for rooms (ADR 0018): ring buffer operations, offset calculation, event
ordering, retention policies — over the pure index and record codec — and the Synap request
parsing and error table."""

from __future__ import annotations

import json

import pytest
from spate.core.errors import ErrorCode, InvalidArgument, NotLeader, Unavailable
from spate.core.filtering import filter_value
from spate.gateway import rooms, synap
from spate.gateway.rooms import OffsetOutOfRange, RoomIndex, Window, start_offset
from spate.gateway.synap import SynapError

HOUR_MS = 3600 * 1000


def index(max_events: int = 5, retention_ms: int = HOUR_MS, idle_ms: int = HOUR_MS) -> RoomIndex:
    return RoomIndex(max_events, retention_ms, idle_ms)


def test_offsets_are_per_room_and_follow_log_order() -> None:
    ix = index()
    got = [ix.apply(room, p, 1000 + p, 0) for p, room in enumerate("aabab")]
    assert got == [0, 1, 0, 2, 1]
    assert ix.window("a", 2000) == Window(0, 2)
    assert ix.positions("a", 0, 2) == [(0, 0), (1, 1), (2, 3)]
    assert ix.window("never", 0) == Window(0, -1)


def test_ring_bound_by_count_drops_the_oldest() -> None:
    ix = index(max_events=3)
    for p in range(7):
        ix.apply("r", p, 1000, 0)
    assert ix.window("r", 1000) == Window(4, 6)
    assert ix.positions("r", 0, 100) == [(4, 4), (5, 5), (6, 6)]


def test_ring_bound_by_age_and_hybrid_whichever_first() -> None:
    ix = index(max_events=10, retention_ms=1000)
    for p, t in enumerate([0, 100, 900, 1500]):
        ix.apply("r", p, t, 0)
    assert ix.window("r", 1000) == Window(0, 3)  # nothing older than 1000 ms yet
    assert ix.window("r", 1500) == Window(2, 3)  # at 1500: 0 and 100 aged out
    assert ix.window("r", 10_000) == Window(4, 3)  # all aged out: empty, next stays 4


def test_hint_starts_an_unknown_room_and_is_ignored_after() -> None:
    ix = index()
    assert ix.apply("r", 10, 0, 7) == 7  # first seen (retention removed its past)
    assert ix.apply("r", 11, 1, 0) == 8  # known: the log decides, not the hint
    assert ix.hint("r", 2) == 9
    assert ix.hint("new", 2) == 0


def test_an_inactive_room_is_a_new_room_at_its_next_event() -> None:
    ix = index(idle_ms=1000)
    assert ix.apply("r", 0, 0, 0) == 0
    assert ix.apply("r", 1, 500, 0) == 1
    assert ix.hint("r", 2000) == 0  # the publisher expects a new room
    assert ix.apply("r", 2, 2000, 0) == 0  # by the records' timestamps
    assert ix.window("r", 2000) == Window(0, 0)
    assert ix.positions("r", 0, 5) == [(0, 2)]


def test_cleanup_forgets_idle_rooms_but_not_subscribed_ones() -> None:
    ix = index(idle_ms=1000)
    ix.apply("idle", 0, 0, 0)
    ix.apply("watched", 1, 0, 0)
    ix.apply("busy", 2, 5000, 0)
    assert ix.forget_idle(5000, 1000, keep={"watched"}) == 1
    assert set(ix) == {"watched", "busy"}
    # a gateway that forgot the room and one that did not number its next event alike
    other = index(idle_ms=1000)
    for p, (room, t) in enumerate([("idle", 0), ("watched", 0), ("busy", 5000)]):
        other.apply(room, p, t, 0)
    assert ix.apply("idle", 3, 6000, 0) == other.apply("idle", 3, 6000, 0) == 0


def test_start_offsets_of_003_event_replay() -> None:
    window = Window(10, 19)
    assert start_offset(window, None, True) == 20  # latest: new events only
    assert start_offset(window, 5, False) == 20  # replay false: new events only
    assert start_offset(window, 0, True) == 10  # beginning: all available
    assert start_offset(window, 15, None) == 15  # specific
    assert start_offset(window, -3, True) == 17  # relative
    assert start_offset(window, -100, True) == 10
    assert start_offset(window, 20, True) == 20
    with pytest.raises(OffsetOutOfRange) as raised:
        start_offset(window, 21, True)
    answer = synap.error_of(raised.value).answer()
    assert (answer["error"], answer["requested"], answer["oldest"], answer["newest"]) == (
        "OffsetOutOfRange",
        21,
        10,
        19,
    )


def test_record_codec_round_trip_and_filter_value() -> None:
    record = rooms.encode_event(
        "chat-1",
        event_id="evt_1",
        event_type="message",
        data={"text": "héllo", "n": [1, 2]},
        metadata={"client_version": "1.0.0"},
        hint=4,
    )
    assert filter_value(record) == "chat-1"  # chunks' Bloom filters name the room (ADR 0016)
    event = rooms.decode_event(record)
    assert event == rooms.RoomEvent(
        "chat-1", 4, "evt_1", "message", {"text": "héllo", "n": [1, 2]}, {"client_version": "1.0.0"}
    )
    assert rooms.decode_event(b"\x00\x53\x77\xa1\x02hi") is None  # a plain message: no room
    assert rooms.decode_event(b"garbage") is None


def test_room_names() -> None:
    assert rooms.validate_room("game-lobby-42") == "game-lobby-42"
    for bad in ("", None, 5, "a\nb", "x" * 257):
        with pytest.raises(InvalidArgument):
            rooms.validate_room(bad)
    assert {rooms.room_partition(f"r{i}", 8) for i in range(200)} == set(range(8))


def test_requests_and_the_error_table() -> None:
    assert synap.parse('{"command": "stream.history", "payload": {"room": "r"}}') == (
        "stream.history",
        {"room": "r"},
        None,
    )
    for text, code in (
        ("nope", "InvalidRequest"),
        ("[]", "InvalidRequest"),
        ('{"command": "x"}', "UnknownCommand"),
        ('{"command": "stream.publish", "payload": 3}', "InvalidRequest"),
    ):
        with pytest.raises(SynapError) as raised:
            synap.parse(text)
        assert raised.value.code == code
    for kind in ErrorCode:
        assert kind in synap._BROKER_ERRORS, kind  # every code has its row
    assert synap.error_of(NotLeader("moved")).answer()["retryable"] is True
    assert synap.error_of(Unavailable("x")).status == 503
    assert synap.retention({"retention_policy": {"type": "Time", "retention_secs": 2}}) == (
        2000,
        None,
        None,
    )
    with pytest.raises(SynapError):
        synap.retention({"retention_policy": {"type": "Size"}})
    assert json.dumps(SynapError("RoomNotFound", "m", 404, room="r").answer())
