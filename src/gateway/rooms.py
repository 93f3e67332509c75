"""Rooms (ADR 0018; 003 first half): a room event's record and the per-room index. Pure.

Rooms share the partitions of one stream, `spate.rooms`: a room hashes onto one partition
(`room_partition`), and each event is one record there (`encode_event`). The index of a
partition (`RoomIndex`) is a function of that partition's records in log order: every
gateway that tails the partition computes the same room offsets.

Record layout (an AMQP 1.0 message; AMQP clients can read `spate.rooms` like any stream):

    message-annotations  {x-stream-filter-value: ROOM (string),       ADR 0016: chunk Bloom
                          x-opt-spate-room-offset: HINT (long)}        filters name the room
    application-properties {event_type: str, event_id: str, [metadata: JSON text]}
    data                 the event's `data` as JSON (UTF-8)

Room offsets. Room offset = the room's own counter. `RoomIndex.apply` gives an event the
room's next offset; a room the index has not seen starts at the record's HINT (what the
publishing gateway expected: 0 for a new room, more when this index starts after the
partition's retention removed the room's earlier events); a room whose last event is older
than `inactive_timeout_ms` *by the records' own timestamps* starts again at 0 (a new room of
the same name, 003 "AUTO-CREATE" / "Room Cleanup").

Ring bound (003 "Bounded Retention", hybrid): the index keeps, per room, the partition offset
and timestamp of its last `max_events` events, and answers only those younger than
`retention_ms` (`window`). The partition's own retention removes the bytes.

Memory per room: one `_Room` (slots) + one `array('q')` of (partition offset, timestamp)
pairs + the dict entry and the name; measured in benchmarks/rooms.py (ADR 0018 numbers).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from spate.core import limits
from spate.core.backend import OffsetSpec, OffsetSpecKind
from spate.core.errors import InvalidArgument, ResourceLimitExceeded
from spate.core.superstreams import hash_partition
from spate.gateway import codec
from spate.gateway.codec import Described, Symbol, ULong

ROOMS_STREAM = "spate.rooms"
"""The internal stream rooms live on (ADR 0018)."""
FILTER_KEY = Symbol("x-stream-filter-value")
HINT_KEY = Symbol("x-opt-spate-room-offset")

SECTION_MESSAGE_ANNOTATIONS = 0x72
SECTION_PROPERTIES = 0x73
SECTION_APPLICATION_PROPERTIES = 0x74
SECTION_DATA = 0x75
SECTION_SEQUENCE = 0x76
SECTION_VALUE = 0x77
SECTIONS_MAX = 16
"""Sections a record may have (AMQP defines 9 kinds): a loop over outside input is capped."""


@dataclass(frozen=True, slots=True)
class RoomsConfig:
    """003 "Configuration" (event_stream), with Spate's names and units."""

    stream: str = ROOMS_STREAM
    partitions: int = limits.rooms_partitions_default
    retention_ms: int = limits.room_retention_ms_default
    max_events: int = limits.room_events_max_default
    max_rooms: int = limits.rooms_max_default
    inactive_timeout_ms: int = limits.room_inactive_timeout_ms_default
    cleanup_interval_ms: int = limits.room_cleanup_interval_ms_default
    max_subscribers: int = limits.room_subscribers_max_default

    def check(self) -> None:
        for label, value in (
            ("rooms partitions", self.partitions),
            ("room retention", self.retention_ms),
            ("room max events", self.max_events),
            ("max rooms", self.max_rooms),
            ("room inactive timeout", self.inactive_timeout_ms),
            ("room cleanup interval", self.cleanup_interval_ms),
            ("room max subscribers", self.max_subscribers),
        ):
            if value <= 0:
                raise InvalidArgument(f"{label} must be positive, got {value}")
        if self.partitions > limits.partitions_max:
            raise InvalidArgument(f"rooms partitions must be at most {limits.partitions_max}")


def validate_room(room: object) -> str:
    """A room name: a non-empty string of at most `room_name_bytes_max` UTF-8 bytes without
    control characters."""
    if not isinstance(room, str) or not room:
        raise InvalidArgument("'room' must be a non-empty string")
    if len(room.encode()) > limits.room_name_bytes_max:
        raise InvalidArgument(f"'room' must be at most {limits.room_name_bytes_max} UTF-8 bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in room):
        raise InvalidArgument("'room' must not contain control characters")
    return room


def room_partition(room: str, partitions: int) -> int:
    """The `spate.rooms` partition a room lives on (MurmurHash3, as super streams)."""
    return hash_partition(room, partitions)


# -- the record codec


@dataclass(frozen=True, slots=True)
class RoomEvent:
    room: str
    hint: int
    event_id: str
    event_type: str
    data: Any
    metadata: dict[str, Any] | None


def encode_event(
    room: str,
    *,
    event_id: str,
    event_type: str,
    data: Any,
    metadata: dict[str, Any] | None,
    hint: int,
) -> bytes:
    """The record of one room event (layout in the module docstring)."""
    assert hint >= 0
    properties: dict[str, Any] = {"event_type": event_type, "event_id": event_id}
    if metadata is not None:
        properties["metadata"] = json.dumps(metadata, separators=(",", ":"))
    return b"".join(
        (
            codec.encode(
                Described(ULong(SECTION_MESSAGE_ANNOTATIONS), {FILTER_KEY: room, HINT_KEY: hint})
            ),
            codec.encode(Described(ULong(SECTION_APPLICATION_PROPERTIES), properties)),
            codec.encode(
                Described(
                    ULong(SECTION_DATA),
                    json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode(),
                )
            ),
        )
    )


@dataclass(frozen=True, slots=True)
class Sections:
    """A stored AMQP message's sections, decoded (`decode_sections`)."""

    annotations: dict[Any, Any]
    properties: list[Any]
    application: dict[Any, Any]
    body: Any
    """The data sections joined (bytes), the amqp-value, or the amqp-sequences' items."""


def decode_sections(record: bytes | memoryview) -> Sections:
    """Raises codec.DecodeError for bytes that are not a message's sections."""
    annotations: dict[Any, Any] = {}
    properties: list[Any] = []
    application: dict[Any, Any] = {}
    data: list[bytes] = []
    sequence: list[Any] = []
    value: Any = None
    i = 0
    for _ in range(SECTIONS_MAX):
        if i >= len(record):
            break
        section, i = codec.decode_at(record, i)
        if not isinstance(section, Described):
            raise codec.DecodeError("a message section must be a described value")
        code = section.descriptor
        if code == SECTION_MESSAGE_ANNOTATIONS and isinstance(section.value, dict):
            annotations = section.value
        elif code == SECTION_PROPERTIES and isinstance(section.value, list):
            properties = section.value
        elif code == SECTION_APPLICATION_PROPERTIES and isinstance(section.value, dict):
            application = section.value
        elif code == SECTION_DATA:
            data.append(bytes(section.value))
        elif code == SECTION_SEQUENCE:
            sequence.extend(section.value)
        elif code == SECTION_VALUE:
            value = section.value
    else:
        if i < len(record):
            raise codec.DecodeError(f"more than {SECTIONS_MAX} sections")
    body: Any = b"".join(data) if data else (sequence if sequence else value)
    return Sections(annotations, properties, application, body)


def decode_event(record: bytes | memoryview) -> RoomEvent | None:
    """A room event, or None for a record that is not one (a client wrote `spate.rooms`
    through AMQP without the room annotation: not part of any room)."""
    try:
        sections = decode_sections(record)
    except codec.DecodeError:
        return None
    room = sections.annotations.get(FILTER_KEY)
    hint = sections.annotations.get(HINT_KEY, 0)
    if not isinstance(room, str) or not room or not isinstance(hint, int) or hint < 0:
        return None
    app = sections.application
    metadata: dict[str, Any] | None = None
    if isinstance(app.get("metadata"), str):
        try:
            loaded = json.loads(app["metadata"])
        except ValueError:
            loaded = None
        metadata = loaded if isinstance(loaded, dict) else None
    return RoomEvent(
        room,
        hint,
        str(app.get("event_id", "")),
        str(app.get("event_type", "")),
        body_json(sections.body),
        metadata,
    )


SECTION_HEADER = 0x70
SECTION_DELIVERY_ANNOTATIONS = 0x71


def room_of(record: bytes | memoryview) -> tuple[str, int] | None:
    """(room, hint) of a stored room event, reading only the sections up to its message
    annotations (the AMQP consumer's per-record test); None for any other record."""
    i = 0
    try:
        for _ in range(3):  # header, delivery annotations, message annotations
            if i >= len(record):
                return None
            section, i = codec.decode_at(record, i)
            if not isinstance(section, Described):
                return None
            if section.descriptor == SECTION_MESSAGE_ANNOTATIONS:
                annotations = section.value
                if not isinstance(annotations, dict):
                    return None
                room = annotations.get(FILTER_KEY)
                hint = annotations.get(HINT_KEY, 0)
                if not isinstance(room, str) or not room or not isinstance(hint, int) or hint < 0:
                    return None
                return room, hint
            if section.descriptor not in (SECTION_HEADER, SECTION_DELIVERY_ANNOTATIONS):
                return None
    except codec.DecodeError:
        return None
    return None


def amqp_event(room: str, message: bytes, *, hint: int, event_id: str) -> bytes:
    """The record of a room event an AMQP client sent to `$rooms/<room>`: its message as
    sent (delivery annotations already cut by the gateway), with the room and the HINT set in
    its message annotations (its own annotations kept) and `event_id` added to its
    application properties unless it has one (the message-id when that is a string, else
    `event_id`). Synap reads it like its own: `event_type` is the application property of
    that name ("" without), `data` the body (data sections holding JSON are that JSON).
    Raises codec.DecodeError for bytes that are not a message's sections."""
    assert hint >= 0
    parts: list[tuple[int, Any, bytes | memoryview]] = []
    i = 0
    for _ in range(SECTIONS_MAX):
        if i >= len(message):
            break
        start = i
        section, i = codec.decode_at(message, i)
        if not isinstance(section, Described) or not isinstance(section.descriptor, int):
            raise codec.DecodeError("a message section must be a described value")
        parts.append((int(section.descriptor), section.value, message[start:i]))
    else:
        if i < len(message):
            raise codec.DecodeError(f"more than {SECTIONS_MAX} sections")
    codes = [code for code, _, _ in parts]
    annotations: dict[Any, Any] = {}
    application: dict[Any, Any] = {}
    message_id: Any = None
    for code, value, _ in parts:
        if code == SECTION_MESSAGE_ANNOTATIONS and isinstance(value, dict):
            annotations = dict(value)
        elif code == SECTION_APPLICATION_PROPERTIES and isinstance(value, dict):
            application = dict(value)
        elif code == SECTION_PROPERTIES and isinstance(value, list) and value:
            message_id = value[0]
    annotations[FILTER_KEY] = room
    annotations[HINT_KEY] = hint
    if "event_id" not in application:
        application["event_id"] = message_id if isinstance(message_id, str) else event_id
    out: list[bytes | memoryview] = []
    for code, _, raw in parts:
        if code == SECTION_HEADER:
            out.append(raw)
    out.append(codec.encode(Described(ULong(SECTION_MESSAGE_ANNOTATIONS), annotations)))
    for code, _, raw in parts:
        if code == SECTION_PROPERTIES:
            out.append(raw)
    out.append(codec.encode(Described(ULong(SECTION_APPLICATION_PROPERTIES), application)))
    for code, _, raw in parts:
        if code not in (
            SECTION_HEADER,
            SECTION_DELIVERY_ANNOTATIONS,
            SECTION_MESSAGE_ANNOTATIONS,
            SECTION_PROPERTIES,
            SECTION_APPLICATION_PROPERTIES,
        ):
            out.append(raw)
    if not any(c in (SECTION_DATA, SECTION_SEQUENCE, SECTION_VALUE) for c in codes):
        raise codec.DecodeError("a message needs a body (data, amqp-sequence or amqp-value)")
    return b"".join(out)


def body_json(body: Any) -> Any:
    """A stored body as JSON: data sections holding JSON are that JSON, other bytes text (or
    a list of byte values when not UTF-8); AMQP values as they are, made JSON-safe."""
    if isinstance(body, bytes):
        try:
            text = body.decode()
        except UnicodeDecodeError:
            return list(body)
        try:
            return json.loads(text)
        except ValueError:
            return text
    return jsonable(body)


def jsonable(value: Any, depth: int = 0) -> Any:
    if depth > codec.DEPTH_MAX:
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return body_json(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, Described):
        return jsonable(value.value, depth + 1)
    return str(value)


# -- the index


class _Room:
    __slots__ = ("entries", "first", "last_ms", "next")

    def __init__(self, start: int, timestamp_ms: int) -> None:
        self.entries = array("q")
        """(partition offset, timestamp ms) pairs of the events kept, oldest first."""
        self.first = start
        """Room offset of the first pair."""
        self.next = start
        """Room offset the next event gets."""
        self.last_ms = timestamp_ms


@dataclass(frozen=True, slots=True)
class Window:
    oldest: int
    """Oldest room offset history can serve (== newest + 1 when it holds none)."""
    newest: int
    """Newest room offset (-1 when the room never had an event)."""


class RoomIndex:
    """The rooms of one `spate.rooms` partition, fed its records in log order."""

    def __init__(self, max_events: int, retention_ms: int, inactive_timeout_ms: int) -> None:
        assert max_events > 0 and retention_ms > 0 and inactive_timeout_ms > 0
        self.max_events = max_events
        self.retention_ms = retention_ms
        self.inactive_timeout_ms = inactive_timeout_ms
        self.rooms: dict[str, _Room] = {}
        self.applied = 0
        """The partition offset after the last record applied."""

    def apply(self, room: str, offset: int, timestamp_ms: int, hint: int) -> int:
        """The room offset of the event stored at partition `offset`."""
        assert offset >= self.applied, (offset, self.applied)
        self.applied = offset + 1
        state = self.rooms.get(room)
        if state is None:
            state = self.rooms[room] = _Room(hint, timestamp_ms)
        elif timestamp_ms - state.last_ms > self.inactive_timeout_ms:
            state.entries = array("q")
            state.first = state.next = 0  # a new room of the same name
        room_offset = state.next
        state.entries.append(offset)
        state.entries.append(timestamp_ms)
        state.next += 1
        state.last_ms = max(state.last_ms, timestamp_ms)
        excess = len(state.entries) // 2 - self.max_events
        if excess > 0:
            del state.entries[: 2 * excess]
            state.first += excess
        return room_offset

    def skip(self, offset: int) -> None:
        """A record at `offset` that is no room event (or a gap the reader passed over)."""
        self.applied = max(self.applied, offset + 1)

    def known(self, room: str) -> bool:
        return room in self.rooms

    def expired(self, room: str, now_ms: int) -> bool:
        state = self.rooms.get(room)
        return state is None or now_ms - state.last_ms > self.inactive_timeout_ms

    def hint(self, room: str, now_ms: int) -> int:
        """The offset a publisher expects its event to get (the record's HINT)."""
        state = self.rooms.get(room)
        if state is None or now_ms - state.last_ms > self.inactive_timeout_ms:
            return 0
        return state.next

    def window(self, room: str, now_ms: int) -> Window:
        """Oldest and newest offsets within the ring bound now (aged-out events dropped)."""
        state = self.rooms.get(room)
        if state is None:
            return Window(0, -1)
        self._age(state, now_ms)
        return Window(state.first, state.next - 1)

    def positions(self, room: str, first: int, last: int) -> list[tuple[int, int]]:
        """(room offset, partition offset) of the kept events from `first` to `last`
        (inclusive), oldest first; call `window` first to drop aged ones."""
        state = self.rooms.get(room)
        if state is None:
            return []
        first = max(first, state.first)
        last = min(last, state.next - 1)
        entries = state.entries
        return [
            (room_offset, entries[2 * (room_offset - state.first)])
            for room_offset in range(first, last + 1)
        ]

    def state(self, room: str) -> tuple[int, int] | None:
        """(next room offset, last event's timestamp) of a room the index holds."""
        state = self.rooms.get(room)
        return None if state is None else (state.next, state.last_ms)

    def seed(self, room: str, next_offset: int, last_ms: int, applied: int) -> None:
        """Start a one-room index where another index stands: the room's next event gets
        `next_offset` unless it comes more than the inactive timeout after `last_ms`; records
        before partition offset `applied` are behind it (an AMQP reader's own index, which
        then numbers the room's events as the tail's does: the same function of the log)."""
        assert next_offset >= 0 and applied >= 0
        state = self.rooms[room] = _Room(next_offset, last_ms)
        state.first = next_offset
        self.applied = applied

    def position(self, room: str, room_offset: int) -> tuple[int, int]:
        """(partition offset, timestamp ms) of a kept event."""
        state = self.rooms[room]
        k = room_offset - state.first
        assert 0 <= k < len(state.entries) // 2, (room_offset, state.first)
        return state.entries[2 * k], state.entries[2 * k + 1]

    def first_at(self, room: str, timestamp_ms: int, now_ms: int) -> int:
        """The room offset of the first kept event stored at or after `timestamp_ms` (the
        next offset when none is)."""
        window = self.window(room, now_ms)
        for room_offset in range(window.oldest, window.newest + 1):
            if self.position(room, room_offset)[1] >= timestamp_ms:
                return room_offset
        return window.newest + 1

    def forget_idle(self, now_ms: int, idle_ms: int, keep: set[str]) -> int:
        """Drop rooms idle longer than `idle_ms` that are not in `keep` (003 "Room
        Cleanup"); how many were dropped."""
        idle = [
            name
            for name, state in self.rooms.items()
            if now_ms - state.last_ms > idle_ms and name not in keep
        ]
        for name in idle:
            del self.rooms[name]
        return len(idle)

    def __len__(self) -> int:
        return len(self.rooms)

    def __iter__(self) -> Iterator[str]:
        return iter(self.rooms)

    def _age(self, state: _Room, now_ms: int) -> None:
        entries = state.entries
        cutoff = now_ms - self.retention_ms
        gone = 0
        while 2 * gone < len(entries) and entries[2 * gone + 1] < cutoff:
            gone += 1
        if gone:
            del entries[: 2 * gone]
            state.first += gone


def start_offset(window: Window, from_offset: int | None, replay: bool | None) -> int:
    """Where a subscriber starts (003 "Event Replay"): `from_offset` None or `replay` False:
    new events only; 0 or below the oldest kept: the oldest kept; -N: N before the end;
    N: N. Raises OffsetOutOfRange past the next offset."""
    end = window.newest + 1
    if from_offset is None or replay is False:
        return end
    if from_offset < 0:
        return max(window.oldest, end + from_offset)
    if from_offset > end:
        raise OffsetOutOfRange(from_offset, window)
    return max(from_offset, window.oldest)


def amqp_start(index: RoomIndex, room: str, specs: tuple[OffsetSpec, ...], now_ms: int) -> int:
    """Where an AMQP reader of `$rooms/<room>` starts, in room offsets: as for streams
    (docs/amqp.md "Consuming"), within the room's ring (max events, max age): `first` the
    oldest kept event, `last` the newest, `next` (also with no spec) the next one, an offset
    clamped to the kept range, `-N` N before the end, a timestamp the first kept event stored
    at or after it; several specs: the largest (all must hold, 000 §5.2.1)."""
    window = index.window(room, now_ms)
    end = window.newest + 1
    starts = []
    for spec in specs or (OffsetSpec.next(),):
        kind = spec.kind
        if kind is OffsetSpecKind.FIRST:
            starts.append(window.oldest)
        elif kind is OffsetSpecKind.LAST:
            starts.append(window.newest if window.newest >= window.oldest else end)
        elif kind is OffsetSpecKind.NEXT:
            starts.append(end)
        elif kind is OffsetSpecKind.OFFSET:
            starts.append(min(max(spec.value, window.oldest), end))
        elif kind is OffsetSpecKind.RELATIVE:
            starts.append(max(window.oldest, end - spec.value))
        else:
            assert kind is OffsetSpecKind.TIMESTAMP
            starts.append(index.first_at(room, spec.value, now_ms))
    return max(starts)


class OffsetOutOfRange(InvalidArgument):
    """003 `OffsetOutOfRange { requested, oldest, newest }`."""

    def __init__(self, requested: int, window: Window) -> None:
        super().__init__(
            f"offset {requested} is out of range: the room holds {window.oldest}.."
            f"{window.newest} (next {window.newest + 1})"
        )
        self.requested = requested
        self.window = window


class RoomLimitExceeded(ResourceLimitExceeded):
    """003 `RoomLimitExceeded`: a new room past `max_rooms` (Synap 429; AMQP
    amqp:resource-limit-exceeded)."""
