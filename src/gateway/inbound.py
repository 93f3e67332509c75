"""A guard on the AMQP frames a client sends, read before proton sees them (pure; no I/O).

proton's engine API (0.40) tells the listener neither a transfer's `message-format` nor that a
client transferred on a link where it is the receiver, and on an undecodable performative it
stops reading without a close frame. `InboundGuard` walks the frame headers of the byte stream
(after SASL, starting with the AMQP protocol header) and decodes only the first fields of the
performatives that matter:

- attach (core §2.7.3): name, handle, role — which (channel, handle) is which link;
- detach / end: forget those handles;
- transfer (core §2.7.5): handle and message-format;
- anything that is not a frame of a known performative.

`feed(data)` returns the problems found in `data`, each with `cut`: the position in `data`
before which everything may go to proton; the driver acts on the problem before pushing the
rest. Spate stores AMQP messages (message-format 0, core §2.7.5 / 002 §3.2); a transfer with
another format is refused by ending its link with `amqp:not-implemented` (docs/amqp.md).

Cost: one header unpack per frame, a few bytes more per transfer; the head of a frame split
across reads is kept (at most `head_bytes`: the frame header with any extended header, then
`HEAD_BYTES` of the performative), its body skipped, never copied.

Every decision about a frame reads its head and nothing else: not the bytes past the frame's
end (the next frame's), not more than the head of a long one. So where the reads are cut never
changes what is found, and a read past the head is the frame's fault (a performative cut short
by its frame's size: `amqp:connection:framing-error`), never an exception out of `feed`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

PROTOCOL_HEADER = b"AMQP\x00\x01\x00\x00"
HEAD_BYTES = 1024
"""Bytes of a frame's body (its performative) decoded at most, after the frame header and any
extended header (an attach's name beyond it is not needed)."""
ATTACH, DETACH, END, TRANSFER = 0x12, 0x16, 0x17, 0x14
IDEMPOTENT_PRODUCER = b"com.microsoft:idempotent-producer"
"""The Event Hubs capability an idempotent sender desires (in its attach's head: its
desired-capabilities, after source and target)."""
IDEMPOTENT_NOTED_MAX = 1024
"""Links noted as idempotent and not taken yet, at most (the driver takes each at attach)."""
PERFORMATIVES = range(0x10, 0x19)
SENDER_CHANNELS = 16
"""Sessions whose producer transfers the C scan passes over (clients use the first few);
transfers on higher channels take the Python step, which answers the same."""


_HEADER = struct.Struct(">IBBH")
_U32 = struct.Struct(">I")


def head_bytes(size: int, doff: int) -> int:
    """The bytes of a frame that the guard reads, its head: the 8-byte header, the extended
    header (core §2.3.1: data offset `doff` in 4-byte words, up to 1020 bytes, which the
    receiver ignores) and `HEAD_BYTES` of the body; the whole frame when it is shorter, and
    never fewer than the 8 bytes of the header. At most 2044 bytes. The C scan's
    `head_bytes` (_fastsend.c) is the same."""
    return max(min(size, 4 * doff + HEAD_BYTES), 8)


def _head_bytes_of(head: bytes) -> int:
    """`head_bytes` of a frame whose first bytes are `head`; 8 until its header is all there."""
    if len(head) < 8:
        return 8
    return head_bytes(int.from_bytes(head[:4], "big"), head[4])


class _Malformed(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Problem:
    cut: int
    kind: str
    """"frame" (close the connection), "format" or "role" (end the link)."""
    description: str
    link_name: str | None = None
    client_receives: bool = False
    """The link's role at the client: True when the client is its receiver."""


def _uint(data: bytes, at: int) -> tuple[int | None, int]:
    code = data[at]
    if code == 0x43:
        return 0, at + 1
    if code == 0x52:
        return data[at + 1], at + 2
    if code == 0x70:
        return _U32.unpack_from(data, at + 1)[0], at + 5
    if code == 0x40:
        return None, at + 1
    raise _Malformed(f"expected a uint, found type 0x{code:02x}")


def _skip(data: bytes, at: int) -> int:
    """Past one value of the simple types a transfer's first fields hold."""
    code = data[at]
    if code in (0x40, 0x41, 0x42, 0x43, 0x44):
        return at + 1
    if code in (0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56):
        return at + 2
    if code in (0x60, 0x61):
        return at + 3
    if code in (0x70, 0x71, 0x72, 0x73):
        return at + 5
    if code in (0x80, 0x81, 0x82, 0x83, 0x84):
        return at + 9
    if code in (0xA0, 0xA1, 0xA3):
        return at + 2 + data[at + 1]
    if code in (0xB0, 0xB1, 0xB3):
        return at + 5 + int.from_bytes(data[at + 1 : at + 5], "big")
    raise _Malformed(f"unexpected type 0x{code:02x}")


def _list(data: bytes, at: int) -> tuple[int, int]:
    """(count, position of the first element)."""
    code = data[at]
    if code == 0x45:
        return 0, at + 1
    if code == 0xC0:
        return data[at + 2], at + 3
    if code == 0xD0:
        return _U32.unpack_from(data, at + 5)[0], at + 9
    raise _Malformed(f"a performative's fields are a list, found type 0x{code:02x}")


def _text(data: bytes, at: int) -> tuple[str | None, int]:
    code = data[at]
    if code in (0xA1, 0xA3):
        end = at + 2 + data[at + 1]
        return data[at + 2 : end].decode("utf-8", "replace"), end
    if code in (0xB1, 0xB3):
        end = at + 5 + int.from_bytes(data[at + 1 : at + 5], "big")
        return data[at + 5 : end].decode("utf-8", "replace"), end
    if code == 0x40:
        return None, at + 1
    raise _Malformed(f"expected a string, found type 0x{code:02x}")


class InboundGuard:
    def __init__(
        self,
        batch_format: int | None = None,
        scan: Callable[[bytes | memoryview, int, bytearray], tuple[int, int]] | None = None,
    ) -> None:
        self.scan = scan
        """`_fastsend.scan_transfers` when the driver has it (ADR 0038): this pure module does
        not import the extension's proton side; None reads every frame in Python."""
        self.batch_format = batch_format
        """A message-format taken on producer links besides 0 (the Event Hubs dialect's batch,
        0x80013700): such transfers are noted in `batches` for the producer to split."""
        self.batches: set[tuple[str | None, bytes]] = set()
        """(link name, delivery tag) of transfers in `batch_format` not read yet."""
        self.header_left = len(PROTOCOL_HEADER)
        self.head = b""
        """The start of a frame whose head has not fully arrived."""
        self.skip = 0
        """Bytes of the current frame's body still to pass over."""
        self.links: dict[tuple[int, int], tuple[str | None, bool]] = {}
        """(channel, handle) -> (link name, whether the client receives on it); changed only
        through `_note_link` and `_forget_links`, which keep `senders` in step."""
        self.senders = bytearray(SENDER_CHANNELS * 256)
        """`senders[channel * 256 + handle]` is 1 for a link the client sends on (channels
        below SENDER_CHANNELS): what the C scan of transfers looks links up in (ADR 0038)."""
        self.idempotent: set[str] = set()
        """With `batch_format` (the Event Hubs dialect): names of links whose attach desires
        `com.microsoft:idempotent-producer` (proton 0.40 does not show a link's capabilities),
        until the driver takes them."""
        self.failed = False

    def feed(self, data: bytes | memoryview) -> list[Problem]:
        """The problems in `data` (the next bytes of the connection's input, a view of a read
        or the read itself: only the frames' heads are read, a frame's head split across reads
        is kept as bytes)."""
        if self.failed:
            return []
        problems: list[Problem] = []
        at, n = 0, len(data)
        if self.header_left:
            taken = min(self.header_left, n)
            self.header_left -= taken
            at = taken
        scan = self.scan
        while at < n:
            if self.skip:
                step = min(self.skip, n - at)
                self.skip -= step
                at += step
                continue
            if scan is not None and not self.head:
                # the hot path in C: every format-0 transfer on a producer link at once; it
                # stops before any other frame, which the steps below read (ADR 0038)
                at, self.skip = scan(data, at, self.senders)
                if at >= n:
                    break
            start = at
            if self.head:
                take = max(_head_bytes_of(self.head) - len(self.head), 0)
                self.head += bytes(data[at : at + take])
                at += take
                if len(self.head) < _head_bytes_of(self.head):
                    continue  # the header told how long the head is: take the rest
                frame, start = self.head, 0
                self.head = b""
            else:
                if n - at < 8:
                    self.head = bytes(data[at:])
                    break
                size, doff, kind, channel = _HEADER.unpack_from(data, at)
                window = head_bytes(size, doff)
                if n - at < window:
                    self.head = bytes(data[at:])
                    break
                if kind == 0 and self._plain_transfer(data, at + 4 * doff, at + window, channel):
                    # the hot path: a format-0 transfer on a producer link
                    if size <= n - at:
                        at += size
                    else:
                        self.skip, at = size - (n - at), n
                    continue
                frame = bytes(data[at : at + window])  # a control frame: its head
                at += window
            consumed = len(frame)
            size = int.from_bytes(frame[:4], "big")
            try:
                problem = self._frame(frame, size, start)
            except _Malformed as error:
                problem = Problem(start, "frame", f"malformed frame: {error}")
            except (IndexError, struct.error):  # a read past the head
                problem = Problem(
                    start,
                    "frame",
                    f"malformed frame: its performative runs past the frame's end (frame size "
                    f"{size}, data offset {frame[4]}; the guard reads {HEAD_BYTES} bytes of a "
                    "frame's body, and a transfer's first fields take a few dozen)",
                )
            if size > consumed:
                self.skip = size - consumed
            if problem is not None:
                problems.append(problem)
                if problem.kind == "frame":
                    self.failed = True
                    return problems
        return problems

    def _plain_transfer(self, data: bytes | memoryview, body: int, end: int, channel: int) -> bool:
        """A transfer on a link the client sends on, with message-format 0, in the encodings
        clients use (list8 or list32; small handle, delivery-id and tag): True means nothing
        to report. False sends the frame through the full decoder, which answers the same for
        such a transfer; so does a read at or past `end`, the end of the frame's head (the C
        scan's `plain_transfer` bounds its reads the same way)."""
        if end - body < 12 or data[body] != 0 or data[body + 1] != 0x53:
            return False
        if data[body + 2] != TRANSFER:
            return False
        kind = data[body + 3]
        if kind == 0xC0:
            count, at = data[body + 5], body + 6
        elif kind == 0xD0:
            count, at = _U32.unpack_from(data, body + 8)[0], body + 12
        else:
            return False
        if count < 4 or at + 2 > end:
            return False
        code = data[at]
        if code == 0x43:
            handle, at = 0, at + 1
        elif code == 0x52:
            handle, at = data[at + 1], at + 2
        else:
            return False
        link = self.links.get((channel, handle))
        if link is None or link[1] or at >= end:
            return False
        code = data[at]  # the delivery-id: uint0, smalluint or uint
        if code == 0x52:
            at += 2
        elif code == 0x43:
            at += 1
        elif code == 0x70:
            at += 5
        else:
            return False
        if at + 2 > end or data[at] != 0xA0:  # the delivery-tag, a vbin8
            return False
        at += 2 + data[at + 1]
        return at < end and data[at] == 0x43

    def _frame(self, data: bytes, size: int, start: int) -> Problem | None:
        """The problem in a frame whose head is `data` (`head_bytes` of it, or the whole frame
        when it is shorter); IndexError or struct.error when its performative runs past that
        (every read of a performative's list and uints is an index or an unpack, which
        raise, not a slice, which would read short)."""
        doff, kind = data[4], data[5]
        if size < 8 or doff < 2 or doff * 4 > size:
            raise _Malformed(f"frame size {size}, data offset {doff}")
        if kind != 0:
            raise _Malformed(f"frame type {kind} after SASL (only AMQP frames, type 0)")
        if size == doff * 4:
            return None  # an empty frame (heartbeat)
        channel = int.from_bytes(data[6:8], "big")
        limit = len(data)
        at = doff * 4
        if data[at] != 0x00:
            raise _Malformed("the frame body is not a described performative")
        if data[at + 1] == 0x53:
            code, at = data[at + 2], at + 3
        elif data[at + 1] == 0x80 and data[at + 2 : at + 9] == b"\x00" * 7:
            code, at = data[at + 9], at + 10
        else:
            raise _Malformed("the performative's descriptor is not a small ulong")
        if code not in PERFORMATIVES:
            raise _Malformed(f"unknown performative 0x{code:02x}")
        if code == TRANSFER:
            return self._transfer(data, at, channel, start)
        if code == ATTACH:
            self._attach(data, at, channel, limit)
        elif code == DETACH:
            count, at = _list(data, at)
            if count >= 1:
                handle, _ = _uint(data, at)
                if handle is not None:
                    self._forget_links([(channel, handle)])
        elif code == END:
            self._forget_links([k for k in self.links if k[0] == channel])
        return None

    def _note_link(self, channel: int, handle: int, name: str | None, receives: bool) -> None:
        self.links[(channel, handle)] = (name, receives)
        if channel < SENDER_CHANNELS and handle < 256:
            self.senders[channel * 256 + handle] = 0 if receives else 1

    def _forget_links(self, keys: list[tuple[int, int]]) -> None:
        for channel, handle in keys:
            self.links.pop((channel, handle), None)
            if channel < SENDER_CHANNELS and handle < 256:
                self.senders[channel * 256 + handle] = 0

    def _attach(self, data: bytes, at: int, channel: int, limit: int) -> None:
        """Track the link; an attach the guard cannot read within its head (a name longer
        than HEAD_BYTES) is left to proton, and its transfers go unchecked."""
        try:
            count, at = _list(data, at)
            if count < 3:
                return
            name, at = _text(data, at)
            handle, at = _uint(data, at)
            role = data[at] == 0x41 or (data[at] == 0x56 and data[at + 1] == 1)
        except (_Malformed, IndexError, struct.error):
            return
        if handle is not None and at < limit:
            self._note_link(channel, handle, name, role)
            if (
                self.batch_format is not None
                and name is not None
                and IDEMPOTENT_PRODUCER in data[at:limit]
                and len(self.idempotent) < IDEMPOTENT_NOTED_MAX
            ):
                self.idempotent.add(name)

    def _transfer(self, data: bytes, at: int, channel: int, start: int) -> Problem | None:
        count, at = _list(data, at)
        if count < 1:
            return None  # proton refuses a transfer without a handle
        handle, at = _uint(data, at)
        link = self.links.get((channel, handle)) if handle is not None else None
        if link is None:
            return None  # an unattached handle: proton ends the connection
        name, client_receives = link
        if client_receives:
            return Problem(
                start,
                "role",
                f"a transfer on link {name!r}, where the client is the receiver "
                "(core §2.6: only the sender transfers)",
                name,
                True,
            )
        if count < 4:
            return None
        at = _skip(data, at)  # delivery-id
        tag_at = at
        at = _skip(data, at)  # delivery-tag
        message_format, _ = _uint(data, at)
        if message_format and message_format == self.batch_format:
            if data[tag_at] in (0xA0, 0xB0):
                head = 2 if data[tag_at] == 0xA0 else 5
                self.batches.add((name, bytes(data[tag_at + head : at])))
            return None
        if message_format:
            return Problem(
                start,
                "format",
                f"message-format 0x{message_format:08x} on link {name!r}: Spate stores AMQP "
                "messages (message-format 0) and would deliver yours with another meaning "
                "(core §2.7.5); send each message as its own transfer",
                name,
                False,
            )
        return None
