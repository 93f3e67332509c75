"""Framing and the cluster-secret handshake shared by Spate's two binary TCP wires.

Node-to-node replication (spate.node.replication.codec) and gateway-to-node (spate.core.wire,
ADR 0008) speak the same frames and authenticate the same way. All integers big-endian:

```
frame   = length u32 | kind u8 | body          -- length counts kind + body
str8    = length u8 | UTF-8 bytes
str16   = length u16 | UTF-8 bytes
group   = stream str16 | partition u32         -- one partition
```

Handshake, both sides proving they hold the cluster secret (kinds 10-13):

```
server -> client  CHALLENGE(server_id, nonce_s)
client -> server  HELLO(client_id, nonce_c, HMAC-SHA256(secret, "c" | nonce_s | client | server))
                  (SESSION instead of HELLO: a gateway opening a request/response session)
server -> client  WELCOME(HMAC-SHA256(secret, "s" | nonce_c | server | client))
```

Decoding failures raise CodecError: the connection is then closed (a peer that sends garbage is
broken or hostile).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct

from spate.core.ids import PartitionId, StreamName

KIND_CHALLENGE = 10
KIND_HELLO = 11
KIND_WELCOME = 12
KIND_SESSION = 13

NONCE_BYTES = 16
MAC_BYTES = 32

GroupKey = tuple[StreamName, PartitionId]

FRAME_HEAD = struct.Struct(">IB")
FRAME_HEAD_BYTES = FRAME_HEAD.size
U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")


class CodecError(Exception):
    """Bytes that are not a valid frame body."""


def frame(kind: int, *parts: bytes | memoryview) -> bytes:
    body_length = 1 + sum(len(p) for p in parts)
    return b"".join((FRAME_HEAD.pack(body_length, kind), *parts))


FrameParts = tuple[bytes | memoryview, ...]
"""One frame as its pieces in order, the first starting with the frame head: a frame that
carries large payloads (an Append's chunks) is written with one vectored write, never joined
(RESULTS §41: every join was a copy of every byte, per follower)."""
Frame = bytes | FrameParts
"""An encoded frame, whole or in pieces (`frame_bytes` joins it)."""


def frame_size(data: Frame) -> int:
    return len(data) if isinstance(data, bytes) else sum(map(len, data))


def frame_bytes(data: Frame) -> bytes:
    """The frame in one piece (tests and the simulator)."""
    return data if isinstance(data, bytes) else b"".join(data)


@functools.lru_cache(maxsize=1024)
def str8(text: str) -> bytes:
    data = text.encode()
    assert len(data) <= 255, text
    return U8.pack(len(data)) + data


def str16(text: str) -> bytes:
    data = text.encode()
    if len(data) > 0xFFFF:
        raise CodecError(f"text of {len(data)} bytes does not fit a str16")
    return U16.pack(len(data)) + data


@functools.lru_cache(maxsize=65536)
def group(key: GroupKey) -> bytes:
    stream = key[0].encode()
    assert len(stream) <= 0xFFFF
    return b"".join((U16.pack(len(stream)), stream, U32.pack(key[1])))


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
        return self.unpack(U8)[0]

    def u32(self) -> int:
        return self.unpack(U32)[0]

    def u64(self) -> int:
        return self.unpack(U64)[0]

    def _text(self, length: int) -> str:
        try:
            return str(self.take(length), "utf-8")
        except UnicodeDecodeError as error:
            raise CodecError(f"bad UTF-8: {error}") from error

    def str8(self) -> str:
        return self._text(self.u8())

    def str16(self) -> str:
        return self._text(self.unpack(U16)[0])

    def group(self) -> GroupKey:
        stream = self.str16()
        return StreamName(stream), PartitionId(self.u32())

    def rest(self) -> memoryview:
        return self.take(len(self.view) - self.at)

    def done(self) -> None:
        if self.at != len(self.view):
            raise CodecError(f"{len(self.view) - self.at} stray bytes at the end of a frame")


# -- handshake


def mac(secret: bytes, role: bytes, nonce: bytes, first: str, second: str) -> bytes:
    message = b"|".join((role, nonce, first.encode(), second.encode()))
    return hmac.new(secret, message, hashlib.sha256).digest()


def encode_challenge(node: str, nonce: bytes) -> bytes:
    assert len(nonce) == NONCE_BYTES
    return frame(KIND_CHALLENGE, str8(node), nonce)


def decode_challenge(body: bytes | memoryview) -> tuple[str, bytes]:
    reader = Reader(body)
    node = reader.str8()
    nonce = bytes(reader.take(NONCE_BYTES))
    reader.done()
    return node, nonce


def encode_hello(node: str, nonce: bytes, mac: bytes, *, kind: int = KIND_HELLO) -> bytes:
    assert len(nonce) == NONCE_BYTES and len(mac) == MAC_BYTES
    assert kind in (KIND_HELLO, KIND_SESSION)
    return frame(kind, str8(node), nonce, mac)


def decode_hello(body: bytes | memoryview) -> tuple[str, bytes, bytes]:
    reader = Reader(body)
    node = reader.str8()
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
