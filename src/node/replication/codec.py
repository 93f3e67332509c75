"""Wire codec for node-to-node replication frames: Raft messages and catch-up requests.

Our own binary format (never pickle). All integers big-endian. A frame on the socket is

```
frame   = length u32 | kind u8 | body          -- length counts kind + body
```

Kinds and bodies (`str8` = length u8 + UTF-8 bytes; `group` = stream str16 + partition u32,
with `str16` = length u16 + UTF-8 bytes):

```
kind  name            body
 1    RAFT            group | message
 2    FETCH_MANIFEST  group | request_id u64 | raft_index u64
 3    MANIFEST        request_id u64 | count u32 | (name str8 | bytes u64)*
 4    FETCH_PIECE     group | request_id u64 | name str8 | position u64 | length u32
 5    PIECE           request_id u64 | data (rest of the frame)
 6    FETCH_ERROR     request_id u64 | reason (UTF-8, rest of the frame)
 7    PIECE_GONE      request_id u64   (retention deleted the file since the manifest)
 8    PING            (nothing: node liveness, one per peer per tick; ADR 0026)
10-13             the handshake, spate.core.frames (shared with the gateway wire)
```

Framing, `str8`, `group`, the bounds-checked Reader and CodecError are spate.core.frames'.

Raft message = type u8 | term u64 | source str8 | target str8 | fields:

```
type  message            fields
 1    VoteRequest        last_index u64 | last_term u64 | flags u8 (bit 0 pre_vote,
                         bit 1 transfer: sent on the leader's TimeoutNow)
 2    VoteResponse       granted u8 | pre_vote u8
 3    Append             prev_index u64 | prev_term u64 | commit u64 | count u32 |
                         (index u64 | term u64 | length u32 | payload)*
                         [| flags u8 (bit 0 quiet: an accepted commit update is not
                         answered, ADR 0042, only on an Append without entries; bit 1:
                         commit_with_you follows, ADR 0050; absent: 0)
                         [| commit_with_you u64]]
 4    AppendResponse     index u64 | rejected u8 (bit 0 rejected, bit 1 lost, bit 2 readers:
                         ADR 0044) | hint_index u64 |
                         hint_term u64
 5    Heartbeat          commit u64 [| flags u8 (bit 0 quiesce; ADR 0026; absent: 0)
                         [| round u64 (Raft.confirm_leadership; absent: 0)]]
 6    HeartbeatResponse  [round u64 (the Heartbeat's; absent: 0)]
 7    SnapshotNeeded     snapshot_index u64 | snapshot_term u64 | membership length u16 |
                         membership (messages.Membership.encode(); length 0: unknown)
 8    TimeoutNow         (nothing; ADR 0022)
```

An entry's payload is the storage chunk as the leader encoded it (or empty for a barrier): it is
a view of the frame (a copy only when the frame's buffer is writable), never decoded here. An
Append with entries is encoded in pieces (`frames.FrameParts`: the heads joined, each payload
as it is), which the transport writes with one vectored write: the leader never copies a chunk
to send it, to any follower (ADR 0037).
Decoding failures raise CodecError (the connection is then closed: a peer that sends garbage is
broken or hostile).
"""

from __future__ import annotations

import struct

from spate.core.frames import (
    FRAME_HEAD,
    U8,
    U16,
    U32,
    U64,
    CodecError,
    Frame,
    FrameParts,
    GroupKey,
    Reader,
    frame,
    group,
    str8,
)
from spate.core.ids import NodeId, Term
from spate.node.replication.messages import (
    Append,
    AppendResponse,
    Entry,
    Heartbeat,
    HeartbeatResponse,
    Membership,
    Message,
    SnapshotMeta,
    SnapshotNeeded,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

KIND_RAFT = 1
KIND_FETCH_MANIFEST = 2
KIND_MANIFEST = 3
KIND_FETCH_PIECE = 4
KIND_PIECE = 5
KIND_FETCH_ERROR = 6
KIND_PIECE_GONE = 7
KIND_PING = 8

_U8, _U16, _U32, _U64 = U8, U16, U32, U64
_str8, _group = str8, group
_MSG_HEAD = struct.Struct(">BQ")
_VOTE_REQ = struct.Struct(">QQB")
_VOTE_RESP = struct.Struct(">BB")
_APPEND = struct.Struct(">QQQI")
_ENTRY = struct.Struct(">QQI")
_APPEND_RESP = struct.Struct(">QBQQ")
_SNAP = struct.Struct(">QQ")
_WITH = struct.Struct(">BQ")  # an Append's flags and commit_with_you (ADR 0050)
_PIECE_REQ = struct.Struct(">QI")
_MANIFEST_ITEM = struct.Struct(">Q")

# -- Raft messages


def _append_parts(key: GroupKey, message: Append) -> FrameParts:
    """An Append frame as pieces: the small heads joined (the frame's, the message's, each
    entry's), each payload as it is, never copied."""
    body = [
        _group(key),
        _MSG_HEAD.pack(_TYPE_OF[Append], message.term),
        _str8(message.source),
        _str8(message.target),
        _APPEND.pack(message.prev_index, message.prev_term, message.commit, len(message.entries)),
    ]
    size = 1 + sum(map(len, body))
    parts: list[bytes | memoryview] = []
    for entry in message.entries:
        payload = entry.payload
        body.append(_ENTRY.pack(entry.index, entry.term, len(payload)))
        size += _ENTRY.size + len(payload)
        if payload:
            parts.append(b"".join(body))
            parts.append(payload)
            body = []
    if message.commit_with_you:
        body.append(_WITH.pack(2, message.commit_with_you))
        size += _WITH.size
    if body:
        parts.append(b"".join(body))
    parts[0] = FRAME_HEAD.pack(size, KIND_RAFT) + parts[0]
    return tuple(parts)


def encode_raft(key: GroupKey, message: Message) -> Frame:
    """One RAFT frame; in pieces for an Append with entries (`_append_parts`)."""
    if type(message) is Append and message.entries:
        return _append_parts(key, message)
    head = (
        _group(key)
        + _MSG_HEAD.pack(_TYPE_OF[type(message)], message.term)
        + _str8(message.source)
        + _str8(message.target)
    )
    tail: list[bytes | memoryview]
    match message:
        case VoteRequest():
            tail = [
                _VOTE_REQ.pack(
                    message.last_index,
                    message.last_term,
                    int(message.pre_vote) | int(message.transfer) << 1,
                )
            ]
        case VoteResponse():
            tail = [_VOTE_RESP.pack(message.granted, message.pre_vote)]
        case Append():
            tail = [
                _APPEND.pack(
                    message.prev_index, message.prev_term, message.commit, len(message.entries)
                )
            ]
            for entry in message.entries:
                tail.append(_ENTRY.pack(entry.index, entry.term, len(entry.payload)))
                tail.append(entry.payload)
            if message.commit_with_you:
                tail.append(_WITH.pack(int(message.quiet) | 2, message.commit_with_you))
            elif message.quiet:
                tail.append(_U8.pack(1))
        case AppendResponse():
            tail = [
                _APPEND_RESP.pack(
                    message.index,
                    int(message.rejected) | int(message.lost) << 1 | int(message.readers) << 2,
                    message.hint_index,
                    message.hint_term,
                )
            ]
        case Heartbeat():
            tail = [_U64.pack(message.commit)]
            if message.quiesce or message.round:
                tail.append(_U8.pack(int(message.quiesce)))
            if message.round:
                tail.append(_U64.pack(message.round))
        case HeartbeatResponse():
            tail = [_U64.pack(message.round)] if message.round else []
        case SnapshotNeeded():
            membership = message.snapshot.membership
            encoded = b"" if membership is None else membership.encode()
            tail = [
                _SNAP.pack(message.snapshot.index, message.snapshot.term),
                _U16.pack(len(encoded)),
                encoded,
            ]
        case TimeoutNow():
            tail = []
    return frame(KIND_RAFT, head, *tail)


def decode_raft(body: bytes | memoryview) -> tuple[GroupKey, Message]:
    reader = Reader(body)
    key = reader.group()
    kind, term_value = reader.unpack(_MSG_HEAD)
    term = Term(term_value)
    source = NodeId(reader.str8())
    target = NodeId(reader.str8())
    message: Message
    if kind == 1:
        last_index, last_term, flags = reader.unpack(_VOTE_REQ)
        message = VoteRequest(
            term, source, target, last_index, Term(last_term), bool(flags & 1), bool(flags & 2)
        )
    elif kind == 2:
        granted, pre_vote = reader.unpack(_VOTE_RESP)
        message = VoteResponse(term, source, target, bool(granted), bool(pre_vote))
    elif kind == 3:
        prev_index, prev_term, commit, count = reader.unpack(_APPEND)
        entries = []
        # Views of the frame, not copies, when it cannot change (a frame read off the socket
        # is bytes): a follower writes them to its log as they came (ADR 0037).
        keep = reader.view.readonly
        for _ in range(count):
            index, entry_term, length = reader.unpack(_ENTRY)
            payload = reader.take(length)
            entries.append(Entry(index, Term(entry_term), payload if keep else bytes(payload)))
        quiet, commit_with = False, 0
        if reader.at < len(reader.view):
            flags = reader.unpack(_U8)[0]
            if not flags or flags & ~3 or (count and flags & 1):
                raise CodecError(f"bad Append flags {flags:#x}")
            quiet = bool(flags & 1)
            if flags & 2:
                commit_with = reader.u64()
        message = Append(
            term,
            source,
            target,
            prev_index,
            Term(prev_term),
            tuple(entries),
            commit,
            quiet,
            commit_with,
        )
    elif kind == 4:
        index, rejected, hint_index, hint_term = reader.unpack(_APPEND_RESP)
        message = AppendResponse(
            term,
            source,
            target,
            index,
            bool(rejected & 1),
            hint_index,
            Term(hint_term),
            bool(rejected & 2),
            bool(rejected & 4),
        )
    elif kind == 5:
        commit = reader.u64()
        quiesce = reader.at < len(reader.view) and bool(reader.unpack(_U8)[0] & 1)
        read_round = reader.u64() if reader.at < len(reader.view) else 0
        message = Heartbeat(term, source, target, commit, quiesce, read_round)
    elif kind == 6:
        read_round = reader.u64() if reader.at < len(reader.view) else 0
        message = HeartbeatResponse(term, source, target, read_round)
    elif kind == 7:
        index, snap_term = reader.unpack(_SNAP)
        encoded = bytes(reader.take(reader.unpack(_U16)[0]))
        membership = _membership(encoded) if encoded else None
        message = SnapshotNeeded(
            term, source, target, SnapshotMeta(index, Term(snap_term), membership)
        )
    elif kind == 8:
        message = TimeoutNow(term, source, target)
    else:
        raise CodecError(f"unknown Raft message type {kind}")
    reader.done()
    return key, message


PING_FRAME = frame(KIND_PING)


def _membership(encoded: bytes) -> Membership:
    try:
        membership = Membership.decode(encoded)
    except (AssertionError, IndexError, UnicodeDecodeError, struct.error) as error:
        raise CodecError(f"bad membership in SnapshotNeeded: {error!r}") from error
    if membership is None:
        raise CodecError("bad membership in SnapshotNeeded: no magic")
    return membership


_TYPE_OF: dict[type, int] = {
    VoteRequest: 1,
    VoteResponse: 2,
    Append: 3,
    AppendResponse: 4,
    Heartbeat: 5,
    HeartbeatResponse: 6,
    SnapshotNeeded: 7,
    TimeoutNow: 8,
}


# -- catch-up


def encode_fetch_manifest(key: GroupKey, request_id: int, raft_index: int) -> bytes:
    return frame(KIND_FETCH_MANIFEST, _group(key), _U64.pack(request_id), _U64.pack(raft_index))


def decode_fetch_manifest(body: bytes | memoryview) -> tuple[GroupKey, int, int]:
    reader = Reader(body)
    key = reader.group()
    request_id, raft_index = reader.u64(), reader.u64()
    reader.done()
    return key, request_id, raft_index


def encode_manifest(request_id: int, files: list[tuple[str, int]]) -> bytes:
    parts = [_U64.pack(request_id), _U32.pack(len(files))]
    for name, size in files:
        parts += [_str8(name), _MANIFEST_ITEM.pack(size)]
    return frame(KIND_MANIFEST, *parts)


def decode_manifest(body: bytes | memoryview) -> tuple[int, list[tuple[str, int]]]:
    reader = Reader(body)
    request_id = reader.u64()
    files = []
    for _ in range(reader.u32()):
        name = reader.str8()
        files.append((name, reader.u64()))
    reader.done()
    return request_id, files


def encode_fetch_piece(
    key: GroupKey, request_id: int, name: str, position: int, length: int
) -> bytes:
    return frame(
        KIND_FETCH_PIECE,
        _group(key),
        _U64.pack(request_id),
        _str8(name),
        _PIECE_REQ.pack(position, length),
    )


def decode_fetch_piece(body: bytes | memoryview) -> tuple[GroupKey, int, str, int, int]:
    reader = Reader(body)
    key = reader.group()
    request_id = reader.u64()
    name = reader.str8()
    position, length = reader.unpack(_PIECE_REQ)
    reader.done()
    return key, request_id, name, position, length


def encode_piece(request_id: int, data: bytes) -> bytes:
    return frame(KIND_PIECE, _U64.pack(request_id), data)


def encode_piece_gone(request_id: int) -> bytes:
    return frame(KIND_PIECE_GONE, _U64.pack(request_id))


def encode_fetch_error(request_id: int, reason: str) -> bytes:
    return frame(KIND_FETCH_ERROR, _U64.pack(request_id), reason.encode())


def decode_reply(body: bytes | memoryview) -> tuple[int, memoryview]:
    """request_id and the rest, for PIECE and FETCH_ERROR."""
    reader = Reader(body)
    return reader.u64(), reader.rest()
