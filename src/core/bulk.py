"""Bulk deliveries: many stored messages of one partition in one AMQP transfer (ADR 0029).

A receiver link that asks with the link property `spate:bulk-delivery` = true (and may have
it: `spate.gateway.consumer.wants_bulk`) is sent, instead of one delivery per message, one
delivery per burst holding a *frame*: a run of up to `limits.bulk_delivery_messages_max`
stored messages with their offsets and timestamps, laid out as arrays so a reader cuts it into
columns with a few vectorised operations (numpy/pyarrow over the arrays, no Python per row).

The frame, all integers **little-endian** (the byte order of Arrow's buffers and of every
machine a reader runs on; `memoryview.cast` reads them in place):

```
 offset          size      field       meaning
 ------          ----      ----------  ----------------------------------------------------------
      0             1      version     1
      1             3      reserved    0
      4             4      count       n, messages in the frame, 1..bulk_delivery_messages_max
      8           8 n      offsets     int64 per message, strictly increasing (a filtered link's
                                       may have gaps; a plain link's are consecutive)
  8+8n            8 n      timestamps  int64 per message: its chunk's append time, ms since epoch
 8+16n            4 n      ends        uint32 per message: where it ends in `data` (message i is
                                       data[ends[i-1]:ends[i]], ends[-1] read as 0); increasing
 8+20n    ends[n-1]        data        the messages, each the encoded AMQP message as stored
                                       (as a producer sent it, no delivery annotations; a
                                       sub-entry's messages unpacked and decompressed)
```

Nothing follows `data`. The frame travels as the body of an ordinary AMQP message (so any AMQP
1.0 client can receive it): the delivery annotations a plain delivery of the first message
would have (`event-streams-offset` = offsets[0]), the message annotation
`x-opt-spate-bulk` = true, then one data section (vbin32) holding the frame (`HEAD`).

Pure: no I/O, no numpy (the node builds frames with `array`; the client reads them with
`memoryview.cast`; the Spark connector hands the arrays to numpy/pyarrow).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from spate.core import limits

PROPERTY = "spate:bulk-delivery"
"""Receiver link property: true asks for bulk deliveries; the attach reply carries it (true)
when the link gets them."""
ANNOTATION = "x-opt-spate-bulk"
VERSION = 1
_FRAME_HEAD = struct.Struct("<B3xI")
FRAME_HEAD_BYTES = _FRAME_HEAD.size
assert FRAME_HEAD_BYTES == 8
_MA = b"\x00\x53\x72"
_KEY = b"\xa3" + bytes((len(ANNOTATION),)) + ANNOTATION.encode()
MESSAGE_ANNOTATIONS = _MA + b"\xc1" + bytes((len(_KEY) + 2, 2)) + _KEY + b"\x41"
"""The message-annotations section `{x-opt-spate-bulk: true}` (map8, boolean true)."""
DATA32 = b"\x00\x53\x75\xb0"
HEAD = MESSAGE_ANNOTATIONS + DATA32
"""What follows a bulk delivery's delivery annotations: then the frame's length (u32, big-endian
as AMQP is) and the frame."""
_LITTLE = sys.byteorder == "little"


class FrameError(ValueError):
    """Bytes that are not a valid bulk frame; the message says what is wrong, for a person."""


RunLike = tuple[int, int, Sequence[bytes | memoryview]]
"""(first offset, timestamp ms, consecutive records from that offset on)."""


def encode(runs: Sequence[RunLike]) -> bytes:
    """The frame of `runs` (each consecutive records from its first offset; runs in offset
    order, not overlapping)."""
    offsets = array("q")
    stamps = array("q")
    lengths: list[int] = []
    pieces: list[bytes | memoryview] = []
    for first, stamp, records in runs:
        n = len(records)
        offsets.extend(range(first, first + n))
        stamps.extend(array("q", (stamp,)) * n)
        lengths.extend(map(len, records))
        pieces.extend(records)
    count = len(offsets)
    if not 0 < count <= limits.bulk_delivery_messages_max:
        raise FrameError(
            f"a frame holds 1..{limits.bulk_delivery_messages_max} messages, not {count}"
        )
    ends = array("I", accumulate(lengths))
    if not _LITTLE:
        for column in (offsets, stamps, ends):
            column.byteswap()
    return b"".join(
        (
            _FRAME_HEAD.pack(VERSION, count),
            offsets.tobytes(),
            stamps.tobytes(),
            ends.tobytes(),
            *pieces,
        )
    )


def encode_rows(
    offsets: Sequence[int], timestamps: Sequence[int], messages: Sequence[bytes | memoryview]
) -> bytes:
    """The frame of messages given row by row (offsets increasing, not necessarily
    consecutive): what a client builds from deliveries it got one by one."""
    return encode([(o, t, (m,)) for o, t, m in zip(offsets, timestamps, messages, strict=True)])


def wrap(delivery_annotations: bytes, frame: bytes) -> bytes:
    """The AMQP message carrying `frame` after the given delivery-annotations section."""
    return b"".join((delivery_annotations, HEAD, len(frame).to_bytes(4, "big"), frame))


def unwrap(raw: bytes | memoryview) -> memoryview | None:
    """The frame inside a bulk delivery's message (`wrap`), or None when `raw` is no bulk
    delivery (the caller takes it as an ordinary message)."""
    view = memoryview(raw)
    at = bytes(view[:512]).find(HEAD)
    if at < 0:
        return None
    at += len(HEAD)
    size = int.from_bytes(view[at : at + 4], "big")
    at += 4
    if at + size != len(view):
        raise FrameError(
            f"the data section of a bulk delivery says {size} bytes, the message has "
            f"{len(view) - at} after it"
        )
    return view[at:]


@dataclass(frozen=True, slots=True)
class Frame:
    """A parsed frame: the arrays as typed views over the received bytes (no copy), from row
    `first` on (rows before it were dropped: repeats after a reconnect, or before a range)."""

    offsets: memoryview
    """int64 per row (format 'q')."""
    timestamps: memoryview
    """int64 ms per row (format 'q')."""
    ends: memoryview
    """uint32 per row (format 'I'): end of the row in `data`."""
    data: memoryview
    """The data area (bytes, format 'B'); row i is data[start(i):ends[i]]."""
    buffer: memoryview
    """The whole frame, for readers that want the arrays at their byte positions."""
    first: int
    """The first row in use (rows before it were dropped)."""
    stop: int
    """One past the last row in use."""

    def __len__(self) -> int:
        return self.stop - self.first

    def start(self, row: int) -> int:
        """Where row `row` (0-based, over all rows of the frame) begins in `data`."""
        return 0 if row == 0 else self.ends[row - 1]

    def rows(self, first: int, stop: int) -> Frame:
        """The same frame's rows [first, stop) (counted over all rows; within those in use)."""
        assert self.first <= first <= stop <= self.stop, (first, stop, self.first, self.stop)
        return Frame(self.offsets, self.timestamps, self.ends, self.data, self.buffer, first, stop)

    def messages(self) -> list[bytes]:
        """The rows' messages as bytes objects (the per-row way, for tests and fallbacks)."""
        data, ends = self.data, self.ends
        at = self.start(self.first)
        out = []
        for i in range(self.first, self.stop):
            end = ends[i]
            out.append(bytes(data[at:end]))
            at = end
        return out

    def offset_list(self) -> list[int]:
        return self.offsets[self.first : self.stop].tolist()

    def timestamp_list(self) -> list[int]:
        return self.timestamps[self.first : self.stop].tolist()


def parse(frame: bytes | memoryview, *, check: bool = True) -> Frame:
    """View a frame, checking its head and sizes; with `check` also that ends and offsets
    increase (Python per row, ~0.1 µs: a vectorised reader checks those itself, e.g. with
    numpy, and passes False). `FrameError` names what is wrong."""
    view = memoryview(frame).cast("B")
    if len(view) < FRAME_HEAD_BYTES:
        raise FrameError(f"a bulk frame has at least {FRAME_HEAD_BYTES} bytes, not {len(view)}")
    version, count = _FRAME_HEAD.unpack_from(view)
    if version != VERSION:
        raise FrameError(f"unknown bulk frame version {version} (this reader knows {VERSION})")
    if not 0 < count <= limits.bulk_delivery_messages_max:
        raise FrameError(
            f"a bulk frame holds 1..{limits.bulk_delivery_messages_max} messages, not {count}"
        )
    data_at = FRAME_HEAD_BYTES + 20 * count
    if data_at > len(view):
        raise FrameError(f"a bulk frame of {count} messages is cut short ({len(view)} bytes)")
    offsets_at, stamps_at, ends_at = FRAME_HEAD_BYTES, 8 + 8 * count, 8 + 16 * count
    if _LITTLE:
        offsets = view[offsets_at:stamps_at].cast("q")
        stamps = view[stamps_at:ends_at].cast("q")
        ends = view[ends_at:data_at].cast("I")
    else:  # pragma: no cover (no big-endian machine here)
        columns = []
        for code, lo, hi in (("q", offsets_at, stamps_at), ("q", stamps_at, ends_at),
                             ("I", ends_at, data_at)):  # fmt: skip
            column = array(code, bytes(view[lo:hi]))
            column.byteswap()
            columns.append(memoryview(column))
        offsets, stamps, ends = columns
    data = view[data_at:]
    if ends[count - 1] != len(data):
        raise FrameError(
            f"a bulk frame's last message ends at {ends[count - 1]}, its data has {len(data)} bytes"
        )
    if offsets[0] > offsets[count - 1]:
        raise FrameError("a bulk frame's offsets do not increase")
    if not check:
        return Frame(offsets, stamps, ends, data, view, 0, count)
    if count > 1 and not all(ends[i] <= ends[i + 1] for i in range(count - 1)):
        raise FrameError("a bulk frame's message ends do not increase")
    if count > 1 and not all(offsets[i] < offsets[i + 1] for i in range(count - 1)):
        raise FrameError("a bulk frame's offsets do not increase")
    return Frame(offsets, stamps, ends, data, view, 0, count)
