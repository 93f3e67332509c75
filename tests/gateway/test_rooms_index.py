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


def test_an_amqp_readers_seeded_index_numbers_events_as_the_tail_does() -> None:
    """The soundness of `$rooms/<room>` readers (ADR 0018): a one-room index seeded where the
    tail's index stands — at any kept event, or live at the tail's position — gives every
    later event of the room the tail's room offset, across other rooms' records, hints of
    new rooms and the inactive-timeout restart at 0."""
    import random

    rng = random.Random(7)
    records = []
    now = 1_000_000
    for p in range(400):
        now += rng.choice((1, 5, 50)) if rng.random() > 0.02 else 2 * HOUR_MS
        records.append((p, rng.choice("aab c"), now, rng.choice((0, 0, 3))))
    tail = index(max_events=1000)
    numbered = []
    for p, room, ts, hint in records:
        numbered.append(tail.apply(room, p, ts, hint))
    for cut in range(0, 400, 7):
        # live: the tail has applied records [0, cut)
        before = index(max_events=1000)
        for p, room, ts, hint in records[:cut]:
            before.apply(room, p, ts, hint)
        mine = index(max_events=1)
        state = before.state("a")
        if state is not None:
            mine.seed("a", state[0], state[1], cut)
        elif cut:
            mine.skip(cut - 1)
        for (p, room, ts, hint), expected in zip(records[cut:], numbered[cut:], strict=True):
            if room == "a":
                assert mine.apply("a", p, ts, hint) == expected, (cut, p)
            else:
                mine.skip(p)
    # from a kept event: seeded with its offset and timestamp
    kept = [
        (p, ts, n) for (p, room, ts, _), n in zip(records, numbered, strict=True) if room == "a"
    ]
    for p0, ts0, n0 in kept[::5]:
        mine = index(max_events=1)
        mine.seed("a", n0, ts0, p0)
        for (p, room, ts, hint), expected in zip(records[p0:], numbered[p0:], strict=True):
            if room == "a":
                assert mine.apply("a", p, ts, hint) == expected


def test_amqp_start_specs_resolve_in_room_offsets_within_the_ring() -> None:
    from spate.core.backend import OffsetSpec

    ix = index(max_events=5, retention_ms=HOUR_MS)
    for p in range(10):
        ix.apply("r", p, 1000 + 10 * p, 0)
    now = 2000

    def start(*specs: OffsetSpec) -> int:
        return rooms.amqp_start(ix, "r", specs, now)

    assert start(OffsetSpec.first()) == 5
    assert start(OffsetSpec.last()) == 9
    assert start(OffsetSpec.next()) == start() == 10
    assert start(OffsetSpec.offset(2)) == 5 and start(OffsetSpec.offset(99)) == 10
    assert start(OffsetSpec.relative(2)) == 8 and start(OffsetSpec.relative(50)) == 5
    assert start(OffsetSpec.timestamp(1071)) == 8
    assert start(OffsetSpec.first(), OffsetSpec.offset(7)) == 7  # the largest wins
    assert rooms.amqp_start(ix, "r", (OffsetSpec.first(),), 1090 + HOUR_MS + 1) == 10
    assert rooms.amqp_start(ix, "new", (OffsetSpec.first(),), now) == 0


def test_amqp_event_keeps_the_message_and_adds_the_room() -> None:
    from spate.gateway import codec
    from spate.gateway.codec import Described, Symbol, ULong

    message = b"".join(
        codec.encode(Described(ULong(code), value))
        for code, value in (
            (0x72, {Symbol("mine"): 1}),
            (0x73, ["id-7"]),
            (0x74, {"event_type": "chat"}),
            (0x77, "hello"),
        )
    )
    record = rooms.amqp_event("lobby", message, hint=4, event_id="evt_x")
    assert rooms.room_of(record) == ("lobby", 4)
    event = rooms.decode_event(record)
    assert event is not None
    assert (event.room, event.hint, event.event_id, event.event_type, event.data) == (
        "lobby",
        4,
        "id-7",
        "chat",
        "hello",
    )
    assert rooms.decode_sections(record).annotations[Symbol("mine")] == 1
    assert rooms.room_of(message) is None
    with pytest.raises(codec.DecodeError):
        rooms.amqp_event("lobby", codec.encode(Described(ULong(0x74), {})), hint=0, event_id="e")
