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
10    CHALLENGE       node str8 | nonce (16 bytes)                 (handshake, server first)
11    HELLO           node str8 | nonce (16 bytes) | mac (32 bytes) (client's answer)
12    WELCOME         mac (32 bytes)                                (server's answer)
```

Raft message = type u8 | term u64 | source str8 | target str8 | fields:

```
type  message            fields
 1    VoteRequest        last_index u64 | last_term u64 | pre_vote u8
 2    VoteResponse       granted u8 | pre_vote u8
 3    Append             prev_index u64 | prev_term u64 | commit u64 | count u32 |
                         (index u64 | term u64 | length u32 | payload)*
 4    AppendResponse     index u64 | rejected u8 (bit 0 rejected, bit 1 lost) | hint_index u64 |
                         hint_term u64
 5    Heartbeat          commit u64
 6    HeartbeatResponse  (nothing)
 7    SnapshotNeeded     snapshot_index u64 | snapshot_term u64
```

An entry's payload is the storage chunk as the leader encoded it (or empty for a barrier): it is
sliced out of the frame once, never decoded here. Decoding failures raise CodecError (the
connection is then closed: a peer that sends garbage is broken or hostile).
"""

from __future__ import annotations

import functools
import struct

from spate.core.ids import NodeId, PartitionId, StreamName, Term
from spate.node.replication.messages import (
    Append,
    AppendResponse,
    Entry,
    Heartbeat,
    HeartbeatResponse,
    Message,
    SnapshotMeta,
    SnapshotNeeded,
    VoteRequest,
    VoteResponse,
)

KIND_RAFT = 1
KIND_FETCH_MANIFEST = 2
KIND_MANIFEST = 3
KIND_FETCH_PIECE = 4
KIND_PIECE = 5
KIND_FETCH_ERROR = 6
KIND_CHALLENGE = 10
KIND_HELLO = 11
KIND_WELCOME = 12

NONCE_BYTES = 16
MAC_BYTES = 32

GroupKey = tuple[StreamName, PartitionId]

FRAME_HEAD = struct.Struct(">IB")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_MSG_HEAD = struct.Struct(">BQ")
_VOTE_REQ = struct.Struct(">QQB")
_VOTE_RESP = struct.Struct(">BB")
_APPEND = struct.Struct(">QQQI")
_ENTRY = struct.Struct(">QQI")
_APPEND_RESP = struct.Struct(">QBQQ")
_SNAP = struct.Struct(">QQ")
_PIECE_REQ = struct.Struct(">QI")
_MANIFEST_ITEM = struct.Struct(">Q")

FRAME_HEAD_BYTES = FRAME_HEAD.size


class CodecError(Exception):
    """Bytes that are not a valid frame body."""


def frame(kind: int, *parts: bytes | memoryview) -> bytes:
    body_length = 1 + sum(len(p) for p in parts)
    return b"".join((FRAME_HEAD.pack(body_length, kind), *parts))


@functools.lru_cache(maxsize=1024)
def _str8(text: str) -> bytes:
    data = text.encode()
    assert len(data) <= 255, text
    return _U8.pack(len(data)) + data


@functools.lru_cache(maxsize=65536)
def _group(key: GroupKey) -> bytes:
    stream = key[0].encode()
    assert len(stream) <= 0xFFFF
    return b"".join((_U16.pack(len(stream)), stream, _U32.pack(key[1])))


class Reader:
    """A cursor over one frame body; every read is bounds-checked (CodecError)."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.view = memoryview(data)
        self.at = 0

    def take(self, count: int) -> memoryview:
        if count < 0 or self.at + count > len(self.view):
            raise CodecError(f"frame ends early: {count} bytes wanted at {self.at}")
        part = self.view[self.at : self.at + count]
        self.at += count
        return part

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        at = self.at
        end = at + layout.size
        if end > len(self.view):
            raise CodecError(f"frame ends early: {layout.size} bytes wanted at {at}")
        self.at = end
        values: tuple[int, ...] = layout.unpack_from(self.view, at)
        return values

    def u8(self) -> int:
        return self.unpack(_U8)[0]

    def u32(self) -> int:
        return self.unpack(_U32)[0]

    def u64(self) -> int:
        return self.unpack(_U64)[0]

    def str8(self) -> str:
        try:
            return str(self.take(self.u8()), "utf-8")
        except UnicodeDecodeError as error:
            raise CodecError(f"bad UTF-8: {error}") from error

    def group(self) -> GroupKey:
        length = self.unpack(_U16)[0]
        try:
            stream = str(self.take(length), "utf-8")
        except UnicodeDecodeError as error:
            raise CodecError(f"bad UTF-8: {error}") from error
        return StreamName(stream), PartitionId(self.u32())

    def rest(self) -> memoryview:
        return self.take(len(self.view) - self.at)

    def done(self) -> None:
        if self.at != len(self.view):
            raise CodecError(f"{len(self.view) - self.at} stray bytes at the end of a frame")


# -- Raft messages


def encode_raft(key: GroupKey, message: Message) -> bytes:
    """One RAFT frame."""
    head = (
        _group(key)
        + _MSG_HEAD.pack(_TYPE_OF[type(message)], message.term)
        + _str8(message.source)
        + _str8(message.target)
    )
    match message:
        case VoteRequest():
            tail: list[bytes] = [
                _VOTE_REQ.pack(message.last_index, message.last_term, message.pre_vote)
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
        case AppendResponse():
            tail = [
                _APPEND_RESP.pack(
                    message.index,
                    int(message.rejected) | int(message.lost) << 1,
                    message.hint_index,
                    message.hint_term,
                )
            ]
        case Heartbeat():
            tail = [_U64.pack(message.commit)]
        case HeartbeatResponse():
            tail = []
        case SnapshotNeeded():
            tail = [_SNAP.pack(message.snapshot.index, message.snapshot.term)]
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
        last_index, last_term, pre_vote = reader.unpack(_VOTE_REQ)
        message = VoteRequest(term, source, target, last_index, Term(last_term), bool(pre_vote))
    elif kind == 2:
        granted, pre_vote = reader.unpack(_VOTE_RESP)
        message = VoteResponse(term, source, target, bool(granted), bool(pre_vote))
    elif kind == 3:
        prev_index, prev_term, commit, count = reader.unpack(_APPEND)
        entries = []
        for _ in range(count):
            index, entry_term, length = reader.unpack(_ENTRY)
            entries.append(Entry(index, Term(entry_term), bytes(reader.take(length))))
        message = Append(term, source, target, prev_index, Term(prev_term), tuple(entries), commit)
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
        )
    elif kind == 5:
        message = Heartbeat(term, source, target, reader.u64())
    elif kind == 6:
        message = HeartbeatResponse(term, source, target)
    elif kind == 7:
        index, snap_term = reader.unpack(_SNAP)
        message = SnapshotNeeded(term, source, target, SnapshotMeta(index, Term(snap_term)))
    else:
        raise CodecError(f"unknown Raft message type {kind}")
    reader.done()
    return key, message


_TYPE_OF: dict[type, int] = {
    VoteRequest: 1,
    VoteResponse: 2,
    Append: 3,
    AppendResponse: 4,
    Heartbeat: 5,
    HeartbeatResponse: 6,
    SnapshotNeeded: 7,
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


def encode_fetch_error(request_id: int, reason: str) -> bytes:
    return frame(KIND_FETCH_ERROR, _U64.pack(request_id), reason.encode())


def decode_reply(body: bytes | memoryview) -> tuple[int, memoryview]:
    """request_id and the rest, for PIECE and FETCH_ERROR."""
    reader = Reader(body)
    return reader.u64(), reader.rest()


# -- handshake


def encode_challenge(node: NodeId, nonce: bytes) -> bytes:
    assert len(nonce) == NONCE_BYTES
    return frame(KIND_CHALLENGE, _str8(node), nonce)


def decode_challenge(body: bytes | memoryview) -> tuple[NodeId, bytes]:
    reader = Reader(body)
    node = NodeId(reader.str8())
    nonce = bytes(reader.take(NONCE_BYTES))
    reader.done()
    return node, nonce


def encode_hello(node: NodeId, nonce: bytes, mac: bytes) -> bytes:
    assert len(nonce) == NONCE_BYTES and len(mac) == MAC_BYTES
    return frame(KIND_HELLO, _str8(node), nonce, mac)


def decode_hello(body: bytes | memoryview) -> tuple[NodeId, bytes, bytes]:
    reader = Reader(body)
    node = NodeId(reader.str8())
    nonce = bytes(reader.take(NONCE_BYTES))
    mac = bytes(reader.take(MAC_BYTES))
    reader.done()
    return node, nonce, mac


def encode_welcome(mac: bytes) -> bytes:
    assert len(mac) == MAC_BYTES
    return frame(KIND_WELCOME, mac)


def decode_welcome(body: bytes | memoryview) -> bytes:
    reader = Reader(body)
    mac = bytes(reader.take(MAC_BYTES))
    reader.done()
    return mac
