"""Arrow columns from bulk frames (ADR 0029) with vectorised work: no Python per row.

A reading task gets its rows as `spate.core.bulk.Frame`s (offsets, timestamps and message ends
as arrays over the received bytes). `record_batch` turns a list of them into one Arrow record
batch: offsets and timestamps are the frames' arrays; `stream` and `partition` are constants;
`key` and `value` are cut out of the messages by a section walk done for all rows at once
(numpy over the rows' positions, one step per AMQP section):

    header? delivery-annotations? message-annotations? data footer?

with the message annotations either absent or exactly `encode_plain`'s group key (the layout
the connector's writer and most producers send). A batch holding any other row (properties or
application properties present, an amqp-value body, several data sections, other annotations,
another descriptor form) is read the per-row way (`spate.client.messages.read_columns`) for its
key/value/properties columns; offsets and timestamps stay vectorised.

Pure: numpy and pyarrow over bytes, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from spate.client.messages import read_columns
from spate.core.bulk import Frame, FrameError
from spate.core.superstreams import GROUP_KEY_ANNOTATION

I64 = npt.NDArray[np.int64]
_PAD = 16
"""Zero bytes after the data so that reading a few bytes past a row's end needs no bounds."""
_KEY_SYMBOL = b"\xa3" + bytes((len(GROUP_KEY_ANNOTATION),)) + GROUP_KEY_ANNOTATION.encode()
_KEY_PATTERN = np.frombuffer(_KEY_SYMBOL, dtype=np.uint8)
_GAP_MAX = 64
"""Bytes between two kept ranges up to which `binary_array` clears them by index (else by a
running sum over all the data)."""
_SECTIONS_MAX = 8
"""Sections a simple message has at most (header, 3 annotation-like, data, footer, spare)."""
_HEADER, _DA, _MA, _PROPERTIES, _APP, _DATA, _FOOTER = 0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x78


class Gathered:
    """The rows of several frames over one contiguous byte array: `data` (padded), each row's
    `starts` and `ends` in it, `offsets`, `timestamps` (ms)."""

    def __init__(self, frames: Sequence[Frame]) -> None:
        datas: list[npt.NDArray[np.uint8]] = []
        starts: list[I64] = []
        ends: list[I64] = []
        offsets: list[I64] = []
        stamps: list[I64] = []
        base = 0
        for frame in frames:
            lo, hi = frame.first, frame.stop
            row_ends = np.frombuffer(frame.ends, dtype=np.uint32).astype(np.int64)
            first_byte = int(row_ends[lo - 1]) if lo else 0
            last_byte = int(row_ends[hi - 1])
            row_starts = np.empty(hi - lo, dtype=np.int64)
            row_starts[0] = first_byte
            row_starts[1:] = row_ends[lo : hi - 1]
            shift = base - first_byte
            starts.append(row_starts + shift)
            ends.append(row_ends[lo:hi] + shift)
            datas.append(np.frombuffer(frame.data, dtype=np.uint8)[first_byte:last_byte])
            offsets.append(np.frombuffer(frame.offsets, dtype=np.int64)[lo:hi])
            stamps.append(np.frombuffer(frame.timestamps, dtype=np.int64)[lo:hi])
            base += last_byte - first_byte
        datas.append(np.zeros(_PAD, dtype=np.uint8))
        self.data: npt.NDArray[np.uint8] = np.concatenate(datas)
        self.starts: I64 = np.concatenate(starts)
        self.ends: I64 = np.concatenate(ends)
        self.offsets: I64 = np.concatenate(offsets)
        self.timestamps: I64 = np.concatenate(stamps)
        self.frames = frames
        if len(self.offsets) > 1 and not bool(np.all(self.offsets[1:] > self.offsets[:-1])):
            raise FrameError("bulk frames' offsets do not increase")
        if bool(np.any(self.ends < self.starts)):
            raise FrameError("a bulk frame's message ends do not increase")

    def __len__(self) -> int:
        return len(self.offsets)

    def messages(self) -> list[bytes]:
        data = self.data.tobytes()
        return [data[s:e] for s, e in zip(self.starts.tolist(), self.ends.tolist(), strict=True)]


def _be32(data: npt.NDArray[np.uint8], at: I64) -> I64:
    out: I64 = data[at].astype(np.int64) << 24
    out |= data[at + 1].astype(np.int64) << 16
    out |= data[at + 2].astype(np.int64) << 8
    out |= data[at + 3]
    return out


def walk(rows: Gathered) -> tuple[I64, I64, I64, I64] | None:
    """(body start, body end, key start, key end; key start -1: no key) per row, or None when
    some row is not in a simple layout (see the module docstring)."""
    data, end = rows.data, rows.ends
    n = len(rows)
    at = rows.starts.copy()
    body_start = np.full(n, -1, dtype=np.int64)
    body_end = np.full(n, -1, dtype=np.int64)
    ma_at = np.full(n, -1, dtype=np.int64)
    limit = len(data) - _PAD
    for _ in range(_SECTIONS_MAX):
        live = at < end
        if not bool(live.any()):
            break
        p = np.where(live, at, limit)  # finished rows look at the padding
        if not bool(np.all((data[p] == 0) & (data[p + 1] == 0x53) | ~live)):
            return None  # another descriptor form
        code = data[p + 2]
        constructor = data[p + 3]
        short = data[p + 4].astype(np.int64)
        long = _be32(data, np.minimum(p + 4, limit))
        size = np.select(
            [constructor == 0x45, (constructor == 0xC0) | (constructor == 0xC1)
             | (constructor == 0xA0), (constructor == 0xD0) | (constructor == 0xD1)
             | (constructor == 0xB0)],
            [4, 5 + short, 8 + long],
            -1,
        )  # fmt: skip
        is_data = code == _DATA
        allowed = (
            (code == _HEADER) | (code == _DA) | (code == _MA) | (code == _FOOTER)
            | (is_data & ((constructor == 0xA0) | (constructor == 0xB0)))
        )  # fmt: skip
        if not bool(np.all((allowed & (size > 0)) | ~live)):
            return None
        data_now = live & is_data
        if bool(np.any(data_now & (body_start >= 0))):
            return None  # several data sections
        body_start = np.where(data_now, at + np.where(constructor == 0xA0, 5, 8), body_start)
        body_end = np.where(data_now, at + size, body_end)
        ma_at = np.where(live & (code == _MA), at, ma_at)
        at = np.where(live, at + size, at)
    if not bool(np.all(at == end)) or bool(np.any(body_start < 0)):
        return None  # a section runs past the message, too many sections, or no body
    key_start = np.full(n, -1, dtype=np.int64)
    key_end = np.full(n, -1, dtype=np.int64)
    has_ma = ma_at >= 0
    if bool(has_ma.any()):
        m = ma_at[has_ma]
        k = len(_KEY_PATTERN)
        head_ok = (data[m + 3] == 0xC1) & (data[m + 5] == 2)
        symbol_ok = np.all(data[m[:, None] + 6 + np.arange(k)] == _KEY_PATTERN, axis=1)
        value_at = m + 6 + k
        section_end = m + 5 + data[m + 4].astype(np.int64)
        value_ok = (data[value_at] == 0xA1) & (
            value_at + 2 + data[value_at + 1].astype(np.int64) == section_end
        )
        if not bool(np.all(head_ok & symbol_ok & value_ok)):
            return None  # other annotations: the per-row way
        key_start[has_ma] = value_at + 2
        key_end[has_ma] = section_end
    return body_start, body_end, key_start, key_end


def binary_array(data: npt.NDArray[np.uint8], starts: I64, ends: I64) -> pa.Array:
    """An Arrow binary array of data[starts[i]:ends[i]] (null where starts[i] < 0; the ranges
    do not overlap and increase), copied out with one boolean mask over `data`: the bytes
    between the ranges (AMQP section heads: a few bytes a row) are cleared in a 2-D index
    operation when they are short, else by a running sum of +1 at each start and -1 at each
    end. No Python per row."""
    valid = starts >= 0
    if not bool(valid.any()):
        return pa.nulls(len(starts), type=pa.binary())
    lengths = np.where(valid, ends - starts, 0)
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if int(offsets[-1]) >= 2**31:
        raise ValueError("a record batch's binary column passes 2 GiB")
    s, e = starts[valid], ends[valid]
    gap_starts = np.concatenate(([0], e))
    gap_ends = np.concatenate((s, [len(data)]))
    gaps = gap_ends - gap_starts
    inner = gaps[1:-1]
    widest = int(inner.max()) if len(inner) else 0
    if widest <= _GAP_MAX:
        mask = np.zeros(len(data), dtype=np.bool_)
        mask[s[0] : e[-1]] = True
        if widest:
            steps = np.arange(widest)
            index = gap_starts[1:-1, None] + steps
            mask[index[steps < inner[:, None]]] = False
    else:
        delta = np.zeros(len(data) + 1, dtype=np.int8)
        delta[s] = 1
        delta[e] -= 1
        mask = np.cumsum(delta[:-1], dtype=np.int8).view(np.bool_)
    values = data[mask]
    validity = None if bool(valid.all()) else pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(),
        len(starts),
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(values)],
        null_count=-1 if validity is not None else 0,
    )


def record_batch(
    frames: Sequence[Frame],
    schema: pa.Schema,
    stream: str,
    partition: int,
    on_rows: Callable[[Gathered], None] | None = None,
) -> pa.RecordBatch:
    """The rows of `frames` as a record batch of `schema` (a subset of the connector's
    columns, in its order). `on_rows` sees the gathered rows first (the reader's checks)."""
    rows = Gathered(frames)
    if on_rows is not None:
        on_rows(rows)
    n = len(rows)
    names = schema.names
    out: dict[str, Any] = {}
    if "offset" in names:
        out["offset"] = pa.array(rows.offsets, type=pa.int64())
    if "timestamp" in names:
        out["timestamp"] = pa.array(rows.timestamps * 1000, type=schema.field("timestamp").type)
    if "stream" in names:
        out["stream"] = pa.repeat(pa.scalar(stream, pa.string()), n)
    if "partition" in names:
        out["partition"] = pa.repeat(pa.scalar(partition, pa.int32()), n)
    wanted = [c for c in ("key", "value", "properties", "application_properties") if c in names]
    if wanted:
        walked = walk(rows)
        if walked is not None:
            body_start, body_end, key_start, key_end = walked
            if "value" in names:
                out["value"] = binary_array(rows.data, body_start, body_end)
            if "key" in names:
                out["key"] = binary_array(rows.data, key_start, key_end)
            for name in ("properties", "application_properties"):
                if name in names:
                    out[name] = pa.nulls(n, type=schema.field(name).type)
        else:
            values, keys, props, apps = read_columns(
                rows.messages(),
                properties="properties" in names,
                application_properties="application_properties" in names,
            )
            lists = {"key": keys, "value": values, "properties": props,
                     "application_properties": apps}  # fmt: skip
            for name in wanted:
                out[name] = pa.array(lists[name], type=schema.field(name).type)
    return pa.RecordBatch.from_arrays([out[name] for name in names], schema=schema)
