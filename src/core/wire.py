"""The gateway-to-node wire (ADR 0008): spate.core.backend's contract, remote.

A gateway opens one session per node on the node's replication port (the frames and the
cluster-secret handshake of spate.core.frames, with SESSION in place of HELLO) and sends
requests; the node answers and pushes records. All integers big-endian; `group` is a partition
(stream str16 | partition u32); `spec` is an offset specification (kind u8 | value u64, kinds
in SPEC_KINDS).

```
kind  name        direction  body
 20   APPEND      g -> n     request u64 | group | epoch u64 (0: any) | count u32 |
                             producer str16 ("": none) | (id u64)* if producer |
                             (length u32 | record)*   (count bit 31 set: one record, a
                             sub-entry, ADR 0017; count is then 1 | SUB_ENTRY_FLAG; with
                             bit 30 too, its filter values follow: count u16 | (0 u8 |
                             1 u8 value str16)*, the chunk's Bloom filter's, ADR 0016)
 21   APPENDED    n -> g     request u64 | first_offset u64
 22   SUBSCRIBE   g -> n     sub u32 | group | credit u32 | count u8 | spec* |
                             [unfiltered u8 | count u16 | value str16 * count] (the link's
                             filter values, ADR 0016: the node skips chunks holding none, and
                             says where with a RECORDS of no record)
 23   STARTED     n -> g     sub u32 | start u64
 24   RECORDS     n -> g     sub u32 | first_offset u64 | timestamp_ms u64 | count u32 |
                             (length u32 | record)*
 25   CREDIT      g -> n     sub u32 | records u32
 26   UNSUBSCRIBE g -> n     sub u32
 27   ENDED       n -> g     sub u32 | error
 28   INFO        g -> n     request u64 | group
 29   STREAM      g -> n     request u64 | name str16
 30   REPLY       n -> g     request u64 | JSON (PartitionInfo or StreamConfig fields)
 31   FAILED      n -> g     request u64 | error
 32   PRODUCER    g -> n     request u64 | group | name str16   (REPLY: {"producer": ... | null})
 33   CONSUMER    g -> n     request u64 | group | op u8 | name str16 | offset i64 | member u64
                             (REPLY: {"consumer": ... | null, "member": m, "active": b,
                             "epoch": e | null}; ops in CONSUMER_OPS)
 34   GROUP       g -> n     request u64 | JSON {"op": "join" | "sync" | "released" | "leave" |
                             "describe", "stream", "group", "member", "settings": {"strategy",
                             "session_timeout_ms", "rebalance_delay_ms", "pending_max"} | null,
                             "known": assignment | null, "timeout_ms", "partitions": [p...],
                             "generation"}   (REPLY: join {"member": m}; sync the assignment
                             {"generation", "partitions", "release"}; released, leave {};
                             describe {"group": view | null}, view below)
 35   PING        g -> n     token u64   (the node answers PONG with the token at once)
 36   PONG        n -> g     token u64
 37   SUB_ENTRY   n -> g     sub u32 | first_offset u64 | timestamp_ms u64 | sub-entry (the rest)
                             (a stored sub-entry whole, as RECORDS of its record_count
                             messages would carry them; ADR 0017)
error = code str8 (ErrorCode value) | stored u8 | leader str8 | host str8 | port u16 |
        message (UTF-8, rest of the frame)
```

`stored` on a failed APPEND: 0 when the node refused it before proposing (nothing was written:
the gateway may send it to the new leader), 1 when its outcome is unknown (it may commit).
Records are the producers' encoded AMQP messages, carried byte for byte; an APPEND flagged
SUB_ENTRY_FLAG carries one sub-entry (spate.core.subentry), stored as one sub-entry chunk.

GROUP carries a member's call to its stream's consumer-group coordinator (ADR 0015,
spate.core.coordination) at the leader of the stream's partition 0: `settings` on a join,
`known` and `timeout_ms` on a sync (the node answers when the assignment differs from `known`,
or after `timeout_ms`, at most `limits.group_sync_wait_ms_max`: the gateway waits that long
plus its request timeout), `partitions` and `generation` on a released. JSON because it is rare
(a join, a poll per member every few seconds, a release per rebalance), not on the data path.

`describe` (an operator's `spate group describe`, from any process: it needs no joined member)
answers the coordinator's `GroupView`, or null when it has no such group now:

```
view = {"strategy", "partitions": n, "generation", "state": "Stable" | "Rebalancing",
        "members": [{"member", "partitions": [p...], "release": [p...], "last_heartbeat_ms",
                     "session_timeout_ms"}...] (joining order), "awaiting_release": [p...],
        "unassigned": [p...], "storing": g | null, "rebalance_due_ms": t | null, "now_ms"}
```

Times are on the coordinator's clock (its event loop's, in ms): only differences (`now_ms -
last_heartbeat_ms`, a heartbeat's age) mean anything elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from spate.core import errors, filtering, limits
from spate.core.backend import (
    Attached,
    ConsumerOffset,
    OffsetSpec,
    OffsetSpecKind,
    PartitionInfo,
    ProducerInfo,
    PublishingIds,
)
from spate.core.coordinator import (
    STRATEGIES,
    Assignment,
    GroupSettings,
    GroupState,
    GroupView,
    MemberView,
)
from spate.core.filtering import ValueFilter
from spate.core.frames import U32, CodecError, GroupKey, Reader, frame, group, str8, str16
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
from spate.core.subentry import SubEntry, SubEntryError, SubEntryRecords, parse_header

APPEND, APPENDED, SUBSCRIBE, STARTED, RECORDS = 20, 21, 22, 23, 24
SUB_ENTRY_FLAG = 1 << 31
"""APPEND's count with this bit: the one record is a sub-entry (ADR 0017)."""
SUB_ENTRY_VALUES_FLAG = 1 << 30
"""With SUB_ENTRY_FLAG: the sub-entry's filter values follow its bytes (`SubEntry.filter_values`:
u16 count, then per value u8 0 (none) or u8 1 and a str16)."""
CREDIT, UNSUBSCRIBE, ENDED, INFO, STREAM, REPLY, FAILED = 25, 26, 27, 28, 29, 30, 31
PRODUCER = 32
CONSUMER = 33
GROUP = 34
PING, PONG = 35, 36
SUB_ENTRY = 37
KEEPALIVE_S = 1.0
"""A gateway pings each node session this often, so that an idle session still carries a
frame each way; silence then means a dead, paused or cut-off peer (ADR 0008, "Liveness")."""
GATEWAY_SILENCE_S = 5.0
"""A gateway closes a node session that sent nothing for this long: its appends in flight fail
as unknown, its readers move to another replica, and the consumer-group partitions held through
that node are dropped (they stop sending) before the node lets go of them."""
NODE_SILENCE_S = 8.0
"""A node closes a gateway session that sent nothing for this long (pings included), which
leaves that gateway's group members and releases their claims: later than the gateway gives
them up (GATEWAY_SILENCE_S), so that a claim is never granted to another member while the
gateway cut off from this node may still be sending for the previous holder."""
CONSUMER_ATTACH, CONSUMER_STORE, CONSUMER_DETACH, CONSUMER_RESET = 0, 1, 2, 3
CONSUMER_JOIN, CONSUMER_WAIT, CONSUMER_DEPOSED, CONSUMER_STEP_DOWN = 4, 5, 6, 7
CONSUMER_CLAIM = 8
"""A consumer group's link claims the partition (ADR 0015); the offset field carries the
requested epoch (NO_OFFSET: none), the member field the coordinator's generation (0: none)."""
CONSUMER_OPS = (
    CONSUMER_CLAIM,
    CONSUMER_ATTACH,
    CONSUMER_STORE,
    CONSUMER_DETACH,
    CONSUMER_RESET,
    CONSUMER_JOIN,
    CONSUMER_WAIT,
    CONSUMER_DEPOSED,
    CONSUMER_STEP_DOWN,
)
"""Named-consumer operations at the leader (ADR 0012): attach (count the link, answer the
stored offset), store, detach (store `offset` unless NO_OFFSET, stop counting a link this
session counted — with NO_OFFSET also at a node that no longer leads — and leave the group of
`member`), an operator's reset (refused while a link is attached); single active consumer
(ADR 0013): join (attach into the name's group, `offset` = the partition's index in its super
stream or NO_OFFSET; answer the member and whether it is active), wait (answered when
`member` becomes active, or has left), deposed (answered with active = false when the active
`member` must step down, true when it left), step down (store `offset` unless NO_OFFSET, then
hand over)."""
NO_OFFSET = -2

SPEC_KINDS: tuple[OffsetSpecKind, ...] = tuple(OffsetSpecKind)
_APPEND_HEAD = struct.Struct(">QQI")
_APPENDED = struct.Struct(">QQ")
_SUB_HEAD = struct.Struct(">I")
_SPEC = struct.Struct(">BQ")
_STARTED = struct.Struct(">IQ")
_RECORDS_HEAD = struct.Struct(">IQQI")
_CREDIT = struct.Struct(">II")
_REQUEST = struct.Struct(">Q")
_TOKEN = struct.Struct(">Q")
_COUNT16 = struct.Struct(">H")
_PORT = struct.Struct(">H")
_U16 = _PORT

_ERRORS: dict[errors.ErrorCode, type[errors.BrokerError]] = {
    cls.code: cls
    for cls in (
        errors.NotFound,
        errors.AlreadyExists,
        errors.InvalidArgument,
        errors.MessageSizeExceeded,
        errors.Unauthorized,
        errors.Unauthenticated,
        errors.NotImplementedFeature,
        errors.ResourceLimitExceeded,
        errors.NoPartitionFree,
        errors.FailedPrecondition,
        errors.Unavailable,
        errors.NotLeader,
        errors.StorageFailure,
        errors.BrokerError,
    )
}
assert set(_ERRORS) == set(errors.ErrorCode), "every ErrorCode needs a class on the wire"


def _records(records: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    parts: list[bytes | memoryview] = []
    pack = U32.pack
    for record in records:
        parts.append(pack(len(record)))
        parts.append(record)
    return parts


def _unrecords(reader: Reader, count: int) -> list[bytes]:
    view, at, end = reader.view, reader.at, len(reader.view)
    out = []
    unpack = U32.unpack_from
    for _ in range(count):
        if at + 4 > end:
            raise CodecError("records end early")
        (length,) = unpack(view, at)
        at += 4
        if at + length > end:
            raise CodecError("a record runs past the end of its frame")
        out.append(bytes(view[at : at + length]))
        at += length
    reader.at = at
    return out


# -- requests


def encode_append(
    request: int,
    key: GroupKey,
    epoch: int,
    records: Sequence[bytes | memoryview],
    producer: PublishingIds | None = None,
) -> bytes:
    count = len(records)
    trailer = b""
    if count == 1 and isinstance(records[0], SubEntry):
        count |= SUB_ENTRY_FLAG
        if records[0].filter_values is not None:
            count |= SUB_ENTRY_VALUES_FLAG
            trailer = _encode_values(records[0].filter_values)
    head = _APPEND_HEAD.pack(request, epoch, count)
    if producer is None:
        return frame(APPEND, group(key), head, b"\0\0", *_records(records), trailer)
    assert len(producer.ids) == len(records)
    name = _U16.pack(len(producer.name)) + producer.name
    ids = struct.pack(f">{len(records)}Q", *producer.ids)
    return frame(APPEND, group(key), head, name, ids, *_records(records), trailer)


def _encode_values(values: Sequence[str | None]) -> bytes:
    parts = [_U16.pack(len(values))]
    for value in values:
        parts.append(b"\0" if value is None else b"\1" + str16(value))
    return b"".join(parts)


def _decode_values(reader: Reader) -> tuple[str | None, ...]:
    (count,) = reader.unpack(_U16)
    values: list[str | None] = []
    for _ in range(count):
        if not reader.take(1)[0]:
            values.append(None)
            continue
        (length,) = reader.unpack(_U16)
        try:
            values.append(bytes(reader.take(length)).decode())
        except UnicodeDecodeError as error:
            raise CodecError(f"a filter value is not UTF-8: {error}") from error
    return tuple(values)


def decode_append(
    body: memoryview,
) -> tuple[int, GroupKey, int, list[bytes], PublishingIds | None]:
    reader = Reader(body)
    key = reader.group()
    request, epoch, count = reader.unpack(_APPEND_HEAD)
    sub_entry = count & SUB_ENTRY_FLAG
    with_values = count & SUB_ENTRY_VALUES_FLAG
    if sub_entry:
        if count & ~(SUB_ENTRY_FLAG | SUB_ENTRY_VALUES_FLAG) != 1:
            raise CodecError("a sub-entry append holds exactly one record")
        count = 1
    elif with_values:
        raise CodecError("filter values without a sub-entry")
    (length,) = reader.unpack(_U16)
    producer = None
    if length:
        name = bytes(reader.take(length))
        ids = struct.unpack(f">{count}Q", reader.take(8 * count))
        producer = PublishingIds(name, ids)
    records = _unrecords(reader, count)
    if sub_entry:
        values = _decode_values(reader) if with_values else None
        records = [SubEntry.with_values(records[0], values)]
    reader.done()
    return request, key, epoch, records, producer


def encode_producer(request: int, key: GroupKey, name: bytes) -> bytes:
    return frame(PRODUCER, _REQUEST.pack(request), group(key), _U16.pack(len(name)), name)


def decode_producer(body: memoryview) -> tuple[int, GroupKey, bytes]:
    reader = Reader(body)
    (request,) = reader.unpack(_REQUEST)
    key = reader.group()
    (length,) = reader.unpack(_U16)
    name = bytes(reader.take(length))
    reader.done()
    return request, key, name


_CONSUMER_TAIL = struct.Struct(">qQ")


def encode_consumer(  # noqa: PLR0917 (the frame's fields, in order)
    request: int, key: GroupKey, op: int, name: bytes, offset: int, member: int = 0
) -> bytes:
    assert op in CONSUMER_OPS and offset >= NO_OFFSET and member >= 0
    return frame(
        CONSUMER,
        _REQUEST.pack(request),
        group(key),
        bytes([op]),
        _U16.pack(len(name)),
        name,
        _CONSUMER_TAIL.pack(offset, member),
    )


def decode_consumer(body: memoryview) -> tuple[int, GroupKey, int, bytes, int, int]:
    reader = Reader(body)
    (request,) = reader.unpack(_REQUEST)
    key = reader.group()
    op = reader.take(1)[0]
    (length,) = reader.unpack(_U16)
    name = bytes(reader.take(length))
    offset, member = reader.unpack(_CONSUMER_TAIL)
    reader.done()
    if op not in CONSUMER_OPS or offset < NO_OFFSET:
        raise CodecError(f"consumer request with op {op} and offset {offset}")
    return request, key, op, name, offset, member


def consumer_to_json(value: Attached | None) -> dict[str, Any]:
    if value is None:
        return {"consumer": None}
    stored = None if value.stored is None else dataclasses.asdict(value.stored)
    return {
        "consumer": stored,
        "member": value.member,
        "active": value.active,
        "epoch": value.epoch,
    }


def consumer_from_json(value: dict[str, Any]) -> Attached:
    try:
        fields = value["consumer"]
        stored = None
        if fields is not None:
            stored = ConsumerOffset(
                str(fields["name"]),
                int(fields["offset"]),
                int(fields["timestamp_ms"]),
                int(fields.get("attached", 0)),
                int(fields.get("group", 0)),
            )
        epoch = value.get("epoch")
        return Attached(
            stored,
            int(value.get("member", 0)),
            bool(value.get("active", True)),
            None if epoch is None else int(epoch),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise CodecError(f"a consumer reply without its fields: {error}") from error


def producer_to_json(info: ProducerInfo | None) -> dict[str, Any]:
    return {"producer": None if info is None else dataclasses.asdict(info)}


def producer_from_json(value: dict[str, Any]) -> ProducerInfo | None:
    try:
        fields = value["producer"]
        if fields is None:
            return None
        return ProducerInfo(
            str(fields["name"]),
            int(fields["last_publishing_id"]),
            Offset(int(fields["last_offset"])),
            int(fields["timestamp_ms"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise CodecError(f"a producer reply without its fields: {error}") from error


def encode_subscribe(
    sub: int,
    key: GroupKey,
    credit: int,
    specs: Sequence[OffsetSpec],
    values: ValueFilter | None = None,
) -> bytes:
    parts = [_SPEC.pack(SPEC_KINDS.index(s.kind), s.value) for s in specs]
    if values is not None:
        parts.append(bytes([int(values.match_unfiltered)]))
        parts.append(_COUNT16.pack(len(values.values)))
        parts += [str16(v) for v in sorted(values.values)]
    return frame(
        SUBSCRIBE, _SUB_HEAD.pack(sub), group(key), U32.pack(credit), bytes([len(specs)]), *parts
    )


def decode_subscribe(
    body: memoryview,
) -> tuple[int, GroupKey, int, list[OffsetSpec], ValueFilter | None]:
    reader = Reader(body)
    (sub,) = reader.unpack(_SUB_HEAD)
    key = reader.group()
    credit = reader.u32()
    specs = []
    for _ in range(reader.u8()):
        kind, value = reader.unpack(_SPEC)
        if kind >= len(SPEC_KINDS):
            raise CodecError(f"unknown offset specification kind {kind}")
        specs.append(OffsetSpec(SPEC_KINDS[kind], value))
    values = None
    if reader.at < len(reader.view):  # the link's filter values (ADR 0016)
        unfiltered = reader.u8()
        (count,) = reader.unpack(_COUNT16)
        if unfiltered > 1 or not 0 < count <= filtering.VALUES_PER_LINK_MAX:
            raise CodecError(f"impossible value filter ({count} values)")
        values = ValueFilter(frozenset(reader.str16() for _ in range(count)), bool(unfiltered))
    reader.done()
    return sub, key, credit, specs, values


def encode_credit(sub: int, records: int) -> bytes:
    return frame(CREDIT, _CREDIT.pack(sub, records))


def decode_credit(body: memoryview) -> tuple[int, int]:
    reader = Reader(body)
    sub, records = reader.unpack(_CREDIT)
    reader.done()
    return sub, records


def encode_unsubscribe(sub: int) -> bytes:
    return frame(UNSUBSCRIBE, _SUB_HEAD.pack(sub))


def decode_unsubscribe(body: memoryview) -> int:
    reader = Reader(body)
    (sub,) = reader.unpack(_SUB_HEAD)
    reader.done()
    return sub


def encode_ping(token: int, *, pong: bool = False) -> bytes:
    return frame(PONG if pong else PING, _TOKEN.pack(token))


def decode_ping(body: memoryview) -> int:
    """The token of a PING or a PONG."""
    reader = Reader(body)
    (token,) = reader.unpack(_TOKEN)
    reader.done()
    return token


def encode_info(request: int, key: GroupKey) -> bytes:
    return frame(INFO, _REQUEST.pack(request), group(key))


def decode_info(body: memoryview) -> tuple[int, GroupKey]:
    reader = Reader(body)
    (request,) = reader.unpack(_REQUEST)
    key = reader.group()
    reader.done()
    return request, key


def encode_stream(request: int, name: str) -> bytes:
    return frame(STREAM, _REQUEST.pack(request), str16(name))


def decode_stream(body: memoryview) -> tuple[int, StreamName]:
    reader = Reader(body)
    (request,) = reader.unpack(_REQUEST)
    name = reader.str16()
    reader.done()
    return request, StreamName(name)


# -- answers


def encode_appended(request: int, first_offset: int) -> bytes:
    return frame(APPENDED, _APPENDED.pack(request, first_offset))


def decode_appended(body: memoryview) -> tuple[int, int]:
    reader = Reader(body)
    request, first = reader.unpack(_APPENDED)
    reader.done()
    return request, first


def encode_started(sub: int, start: int) -> bytes:
    return frame(STARTED, _STARTED.pack(sub, start))


def decode_started(body: memoryview) -> tuple[int, int]:
    reader = Reader(body)
    sub, start = reader.unpack(_STARTED)
    reader.done()
    return sub, start


def encode_records(
    sub: int, first_offset: int, timestamp_ms: int, records: Sequence[bytes | memoryview]
) -> bytes:
    head = _RECORDS_HEAD.pack(sub, first_offset, timestamp_ms, len(records))
    return frame(RECORDS, head, *_records(records))


def decode_records(body: memoryview) -> tuple[int, int, int, list[bytes]]:
    reader = Reader(body)
    sub, first, timestamp_ms, count = reader.unpack(_RECORDS_HEAD)
    records = _unrecords(reader, count)
    reader.done()
    return sub, first, timestamp_ms, records


_SUB_ENTRY_HEAD = struct.Struct(">IQQ")


def encode_sub_entry(
    sub: int, first_offset: int, timestamp_ms: int, blob: bytes | memoryview
) -> bytes:
    return frame(SUB_ENTRY, _SUB_ENTRY_HEAD.pack(sub, first_offset, timestamp_ms), blob)


def decode_sub_entry(body: memoryview) -> tuple[int, int, int, SubEntryRecords]:
    """The pushed sub-entry as the records it holds (its header checked, nothing unpacked)."""
    reader = Reader(body)
    sub, first, timestamp_ms = reader.unpack(_SUB_ENTRY_HEAD)
    blob = bytes(reader.rest())
    reader.done()
    try:
        count = parse_header(blob).count
    except SubEntryError as error:
        raise CodecError(f"SUB_ENTRY: {error}") from error
    return sub, first, timestamp_ms, SubEntryRecords(blob, count)


def _error(error: errors.BrokerError, stored: bool) -> list[bytes]:
    leader = host = ""
    port = 0
    if isinstance(error, errors.NotLeader):
        leader, host, port = (
            error.leader_node or "",
            error.leader_host or "",
            error.leader_port or 0,
        )
    return [
        str8(error.code.value),
        bytes([int(stored)]),
        str8(leader),
        str8(host),
        _PORT.pack(port),
        error.message.encode(),
    ]


def _unerror(reader: Reader) -> tuple[errors.BrokerError, bool]:
    code = reader.str8()
    stored = bool(reader.u8())
    leader, host = reader.str8(), reader.str8()
    (port,) = reader.unpack(_PORT)
    message = str(reader.rest(), "utf-8", errors="replace")
    try:
        cls = _ERRORS[errors.ErrorCode(code)]
    except ValueError:
        cls = errors.BrokerError
    if cls is errors.NotLeader:
        error: errors.BrokerError = errors.NotLeader(
            message,
            leader_host=host or None,
            leader_port=port or None,
            leader_node=leader or None,
        )
    else:
        error = cls(message)
    return error, stored


def encode_failed(request: int, error: errors.BrokerError, *, stored: bool = False) -> bytes:
    return frame(FAILED, _REQUEST.pack(request), *_error(error, stored))


def decode_failed(body: memoryview) -> tuple[int, errors.BrokerError, bool]:
    reader = Reader(body)
    (request,) = reader.unpack(_REQUEST)
    error, stored = _unerror(reader)
    return request, error, stored


def encode_ended(sub: int, error: errors.BrokerError) -> bytes:
    return frame(ENDED, _SUB_HEAD.pack(sub), *_error(error, False))


def decode_ended(body: memoryview) -> tuple[int, errors.BrokerError]:
    reader = Reader(body)
    (sub,) = reader.unpack(_SUB_HEAD)
    error, _ = _unerror(reader)
    return sub, error


def encode_reply(request: int, value: dict[str, Any]) -> bytes:
    return frame(REPLY, _REQUEST.pack(request), json.dumps(value).encode())


def decode_reply(body: memoryview) -> tuple[int, dict[str, Any]]:
    reader = Reader(body)
    (request,) = reader.unpack(_REQUEST)
    try:
        value = json.loads(bytes(reader.rest()))
    except ValueError as error:
        raise CodecError(f"a reply that is not JSON: {error}") from error
    if not isinstance(value, dict):
        raise CodecError("a reply that is not a JSON object")
    return request, value


def info_to_json(info: PartitionInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


def info_from_json(value: dict[str, Any]) -> PartitionInfo:
    try:
        value = dict(value)
        value["stream"] = StreamName(value["stream"])
        value["partition"] = PartitionId(value["partition"])
        if value.get("leader") is not None:
            value["leader"] = NodeId(value["leader"])
        if value.get("leader_epoch") is not None:
            value["leader_epoch"] = LeaderEpoch(value["leader_epoch"])
        for key in ("first_offset", "last_offset"):
            if value.get(key) is not None:
                value[key] = Offset(value[key])
        value["end_offset"] = Offset(value["end_offset"])
        return PartitionInfo(**value)
    except (KeyError, TypeError) as error:
        raise CodecError(f"a partition info reply without its fields: {error}") from error


def config_to_json(config: StreamConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_json(value: dict[str, Any]) -> StreamConfig:
    try:
        value = dict(value)
        value["name"] = StreamName(value["name"])
        value["retention"] = Retention(**value["retention"])
        return StreamConfig(**value)
    except (KeyError, TypeError) as error:
        raise CodecError(f"a stream reply without its fields: {error}") from error


# -- consumer-group coordinator calls (GROUP, ADR 0015)

GroupOp = Literal["join", "sync", "released", "leave", "describe"]
GROUP_OPS: tuple[GroupOp, ...] = ("join", "sync", "released", "leave", "describe")
NO_MEMBER = MemberId(0)
"""A join's member field (members are numbered from 1)."""
GROUP_SETTINGS = tuple(f.name for f in dataclasses.fields(GroupSettings))
"""A join's settings: GroupSettings' fields."""


@dataclass(frozen=True, slots=True)
class GroupCall:
    """One GROUP request: a member's call to the coordinator (the fields its op uses)."""

    op: GroupOp
    stream: StreamName
    group: str
    member: MemberId = NO_MEMBER
    settings: GroupSettings | None = None
    """join: the group's settings."""
    known: Assignment | None = None
    """sync: the assignment the member has (None: answer at once)."""
    timeout_ms: int = 0
    """sync: answer after this long when nothing changed."""
    partitions: frozenset[PartitionId] = frozenset()
    """released: the partitions the member gave up, under `generation`."""
    generation: int = 0


def encode_group(request: int, call: GroupCall) -> bytes:
    assert call.op in GROUP_OPS and call.member >= 0
    assert 0 <= call.timeout_ms <= limits.group_sync_wait_ms_max
    value = {
        "op": call.op,
        "stream": call.stream,
        "group": call.group,
        "member": call.member,
        "settings": None if call.settings is None else dataclasses.asdict(call.settings),
        "known": None if call.known is None else assignment_to_json(call.known),
        "timeout_ms": call.timeout_ms,
        "partitions": sorted(call.partitions),
        "generation": call.generation,
    }
    return frame(GROUP, _REQUEST.pack(request), json.dumps(value).encode())


def decode_group(body: memoryview) -> tuple[int, GroupCall]:
    reader = Reader(body)
    (request,) = reader.unpack(_REQUEST)
    try:
        value = json.loads(bytes(reader.rest()))
    except ValueError as error:
        raise CodecError(f"a group request that is not JSON: {error}") from error
    if not isinstance(value, dict):
        raise CodecError("a group request that is not a JSON object")
    try:
        op, stream, name = value["op"], value["stream"], value["group"]
        if op not in GROUP_OPS or not isinstance(stream, str) or not isinstance(name, str):
            raise CodecError(f"a group request with op {op!r}, stream {stream!r}, group {name!r}")
        timeout_ms = _natural(value["timeout_ms"], "timeout_ms")
        if timeout_ms > limits.group_sync_wait_ms_max:
            raise CodecError(
                f"a group sync waiting {timeout_ms} ms (at most {limits.group_sync_wait_ms_max})"
            )
        known = value["known"]
        return request, GroupCall(
            op,
            StreamName(stream),
            name,
            MemberId(_natural(value["member"], "member")),
            _settings(value["settings"]),
            None if known is None else assignment_from_json(known),
            timeout_ms,
            _partitions(value["partitions"]),
            _natural(value["generation"], "generation"),
        )
    except (KeyError, TypeError) as error:
        raise CodecError(f"a group request without its fields: {error!r}") from error


def _natural(value: Any, field: str) -> int:
    if type(value) is not int or value < 0:
        raise CodecError(f"{field} {value!r} is not a natural number")
    return value


def _partitions(value: Any) -> frozenset[PartitionId]:
    if not isinstance(value, list) or len(value) > limits.partitions_max:
        raise CodecError(f"partitions {value!r:.80}: a list of at most {limits.partitions_max}")
    return frozenset(PartitionId(_natural(p, "partition")) for p in value)


def _settings(value: Any) -> GroupSettings | None:
    if value is None:
        return None
    if not isinstance(value, dict) or sorted(value) != sorted(GROUP_SETTINGS):
        raise CodecError(f"group settings {value!r:.200}: exactly {', '.join(GROUP_SETTINGS)}")
    if value["strategy"] not in STRATEGIES:
        raise CodecError(f"strategy {value['strategy']!r}: one of {', '.join(STRATEGIES)}")
    return GroupSettings(
        value["strategy"],
        _natural(value["session_timeout_ms"], "session_timeout_ms"),
        _natural(value["rebalance_delay_ms"], "rebalance_delay_ms"),
        _natural(value["pending_max"], "pending_max"),
    )


def assignment_to_json(assignment: Assignment) -> dict[str, Any]:
    return {
        "generation": assignment.generation,
        "partitions": sorted(assignment.partitions),
        "release": sorted(assignment.release),
    }


def assignment_from_json(value: Any) -> Assignment:
    try:
        return Assignment(
            Generation(_natural(value["generation"], "generation")),
            _partitions(value["partitions"]),
            _partitions(value["release"]),
        )
    except (KeyError, TypeError) as error:
        raise CodecError(f"an assignment without its fields: {error!r}") from error


def member_from_json(value: dict[str, Any]) -> MemberId:
    try:
        return MemberId(_natural(value["member"], "member"))
    except KeyError as error:
        raise CodecError("a join reply without its member") from error


def group_view_to_json(view: GroupView | None) -> dict[str, Any]:
    """A describe's reply (see the module docstring)."""
    if view is None:
        return {"group": None}
    return {
        "group": {
            "strategy": view.strategy,
            "partitions": view.partitions,
            "generation": view.generation,
            "state": view.state.value,
            "members": [
                {
                    "member": m.member,
                    "partitions": sorted(m.partitions),
                    "release": sorted(m.release),
                    "last_heartbeat_ms": m.last_heartbeat_ms,
                    "session_timeout_ms": m.session_timeout_ms,
                }
                for m in view.members
            ],
            "awaiting_release": sorted(view.awaiting_release),
            "unassigned": sorted(view.unassigned),
            "storing": view.storing,
            "rebalance_due_ms": view.rebalance_due_ms,
            "now_ms": view.now_ms,
        }
    }


def group_view_from_json(value: dict[str, Any]) -> GroupView | None:
    try:
        fields = value["group"]
        if fields is None:
            return None
        strategy, state, members = fields["strategy"], fields["state"], fields["members"]
        if strategy not in STRATEGIES:
            raise CodecError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
        if not isinstance(members, list) or len(members) > limits.group_members_max:
            raise CodecError(f"members {members!r:.80}: a list of at most the group limit")
        storing, due = fields["storing"], fields["rebalance_due_ms"]
        return GroupView(
            strategy,
            _natural(fields["partitions"], "partitions"),
            Generation(_natural(fields["generation"], "generation")),
            GroupState(state),
            tuple(
                MemberView(
                    MemberId(_natural(m["member"], "member")),
                    _partitions(m["partitions"]),
                    _partitions(m["release"]),
                    _natural(m["last_heartbeat_ms"], "last_heartbeat_ms"),
                    _natural(m["session_timeout_ms"], "session_timeout_ms"),
                )
                for m in members
            ),
            _partitions(fields["awaiting_release"]),
            _partitions(fields["unassigned"]),
            None if storing is None else Generation(_natural(storing, "storing")),
            None if due is None else _natural(due, "rebalance_due_ms"),
            _natural(fields["now_ms"], "now_ms"),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise CodecError(f"a group view without its fields: {error!r}") from error
