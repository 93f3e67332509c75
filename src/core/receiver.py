"""A framed connection's receive side: frames read by the kernel into our buffers (ADR 0039).

Spate's own links carry `length u32 | kind u8 | body` frames (spate.core.frames): a node's
replication links from its peers and the gateway wire's sessions, on the node's side and on
the gateway's (ADR 0045). Once a connection's handshake is done, its transport is handed from
the handshake's `asyncio.StreamReader` to a `FrameReceiver` (an `asyncio.BufferedProtocol`),
which lets the kernel write straight into buffers this module owns, split by a `FrameSplitter`
with no I/O of its own:

```
recv(2) ─► staging (buffer_bytes, reused) ─► a frame complete here: body copied once
                        │
                        └─ a frame of in_place_bytes_min or more not complete yet:
                           its head and first bytes copied to a new buffer of its exact size,
                           the rest recv(2)'d straight into that buffer (no copy at all)
```

A StreamReader copied every byte three times before a frame reached its handler (the event
loop's read buffer into a `bytes` per read, that into the reader's buffer, then the frame out
of it: `readexactly`), and handed it over a loop turn later (it wakes the reading task); here
a large frame is copied by nobody but the kernel, a small one once, and every frame goes to
its handler in the read's own callback.

A large frame's buffer is handed on as a read-only view and this module keeps no reference to
it, so nothing can change it afterwards: `codec.decode_raft` keeps the entries of an Append as
views of it (ADR 0037), and the follower writes them to its log as they came. A small frame is
a `bytes` copy (the staging buffer is reused for the next read).

A frame whose length is out of bounds (larger than `bytes_max`, or empty) is refused with
CodecError and the connection closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from spate.core import frames, limits

log = logging.getLogger(__name__)

FrameCallback = Callable[[int, memoryview], None]
"""(kind, body) for every whole frame, in order."""

_HEAD = frames.FRAME_HEAD
_HEAD_BYTES = frames.FRAME_HEAD_BYTES
_EMPTY = memoryview(b"")


class FrameSplitter:
    """Splits a byte stream into frames, given the bytes where `buffer()` says (no I/O: the
    caller, or the kernel through `FrameReceiver`, writes into the view and calls `wrote`).

    Staging layout: `[0, start)` parsed, `[start, end)` received and not yet a whole frame,
    `[end, len)` free. While a large frame is read in place, staging is empty and `_body` is
    that frame's body, filled up to `_body_at`.
    """

    def __init__(
        self,
        on_frame: FrameCallback,
        *,
        bytes_max: int,
        buffer_bytes: int = limits.frame_receive_buffer_bytes,
        in_place_bytes_min: int = limits.frame_in_place_bytes_min,
    ) -> None:
        assert in_place_bytes_min > _HEAD_BYTES, "a frame read in place has its head already"
        assert in_place_bytes_min + _HEAD_BYTES <= buffer_bytes, "a smaller frame fits staging"
        self._on_frame = on_frame
        self._bytes_max = bytes_max
        self._in_place_min = in_place_bytes_min
        self._staging = bytearray(buffer_bytes)
        self._view = memoryview(self._staging)
        self._start = 0
        self._end = 0
        self._body: bytearray | None = None
        self._body_view = _EMPTY
        self._body_at = 0
        self._body_kind = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes received of a frame not whole yet (head included): what a connection closed
        now would lose mid-frame."""
        if self._body is not None:
            return _HEAD_BYTES + self._body_at
        return self._end - self._start

    def buffer(self) -> memoryview:
        """Where the next bytes go: the rest of a large frame's own buffer, or staging's free
        space (never empty)."""
        if self._body is not None:
            return self._body_view[self._body_at :]
        return self._view[self._end :]

    def wrote(self, count: int) -> None:
        """`count` bytes were written at the start of the last `buffer()`: hand on every frame
        they complete. CodecError for a frame whose length is out of bounds (the frames before
        it are handed on first; the splitter is unusable afterwards)."""
        body = self._body
        if body is not None:
            assert 0 < count <= len(body) - self._body_at
            self._body_at += count
            if self._body_at < len(body):
                return
            # Handed on read-only, and no longer referenced here: nothing can change it.
            self._body = None
            self._body_view = _EMPTY
            self._on_frame(self._body_kind, memoryview(body).toreadonly())
            return
        assert 0 < count <= len(self._staging) - self._end
        self._end += count
        self._split()

    def _split(self) -> None:
        view, end = self._view, self._end
        at = self._start
        while end - at >= _HEAD_BYTES:
            length, kind = _HEAD.unpack_from(view, at)
            if length < 1 or length > self._bytes_max:
                raise frames.CodecError(f"frame of {length} bytes (limit {self._bytes_max})")
            body_at = at + _HEAD_BYTES
            frame_end = body_at + length - 1
            if frame_end <= end:
                body = bytes(view[body_at:frame_end])
                at = self._start = frame_end
                self._on_frame(kind, memoryview(body))
                continue
            if length - 1 >= self._in_place_min:
                # The rest of this frame is read into its own buffer.
                body_buffer = bytearray(length - 1)
                body_view = memoryview(body_buffer)
                # Through a memoryview: a bytearray's slice assignment from a view copies
                # the view into a temporary bytearray first (a second copy and allocation).
                body_view[: end - body_at] = view[body_at:end]
                self._body = body_buffer
                self._body_view = body_view
                self._body_at = end - body_at
                self._body_kind = kind
                self._start = self._end = 0
                return
            break
        if at == end:
            self._start = self._end = 0
        elif len(view) - at < self._in_place_min + _HEAD_BYTES:
            # A frame under in_place_bytes_min might not fit after `at`: move it to the front.
            tail = bytes(view[at:end])
            view[: len(tail)] = tail
            self._start, self._end = 0, len(tail)
        assert self._end < len(self._staging), "staging always has room for the next read"


class FrameReceiver(asyncio.BufferedProtocol):
    """The protocol of a framed connection after its handshake (a peer's replication link, a
    gateway session at a node or at the gateway): frames to `on_frame` as the loop reads them,
    then `after_read()` once per read (what they queued is written then, ADR 0045); `closed`
    resolves when the connection is lost (None for the peer's end of stream or a close here,
    else the error), `error` holds the CodecError of a frame out of bounds (the connection is
    then closed)."""

    def __init__(
        self,
        transport: asyncio.BaseTransport,
        on_frame: FrameCallback,
        *,
        bytes_max: int,
        buffer_bytes: int = limits.frame_receive_buffer_bytes,
        in_place_bytes_min: int = limits.frame_in_place_bytes_min,
        after_read: Callable[[], None] | None = None,
    ) -> None:
        self._transport = transport
        self._after_read = after_read
        self.splitter = FrameSplitter(
            on_frame,
            bytes_max=bytes_max,
            buffer_bytes=buffer_bytes,
            in_place_bytes_min=in_place_bytes_min,
        )
        self.closed: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.error: frames.CodecError | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.splitter.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self.error is not None:
            return  # closing: what still arrives is not read
        try:
            self.splitter.wrote(nbytes)
        except frames.CodecError as error:
            self.error = error
            self._transport.close()
            return
        if self._after_read is not None:
            self._after_read()

    def eof_received(self) -> bool:
        if self.splitter.pending_bytes:
            log.debug("a framed link ended %d bytes into a frame", self.splitter.pending_bytes)
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
