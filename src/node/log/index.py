"""Sparse offset index and time index of one segment: entry codecs and in-memory search.

Both are caches: recovery rebuilds them from the segment whenever they are missing or do not
agree with it, and they are never fsynced on the append path. An entry is written for the
first chunk of a segment and then for the first chunk that starts at least
`index_interval_bytes` after the previously indexed chunk, so a lookup lands at most that many
bytes (plus one chunk) before the chunk it wants.

Offset index file (`<base>.index`), 8-byte entries, big-endian:

```
 offset size field
      0    4 relative_offset  chunk first_offset - segment base offset (u32)
      4    4 position         byte position of the chunk in the segment file (u32)
```

Time index file (`<base>.timeindex`), 12-byte entries, big-endian, written with an offset-index
entry whenever the chunk's timestamp is greater than the last time-index entry's:

```
 offset size field
      0    8 timestamp_ms     signed; the chunk's timestamp
      8    4 relative_offset  chunk first_offset - segment base offset (u32)
```

Keys strictly increase in both files (chunk timestamps never decrease within a partition: the
log clamps them), so lookups are binary searches over the in-memory copies.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
U32_MAX = 2**32 - 1


class SparseIndex:
    """Entries (key, value) with strictly increasing keys, as two parallel arrays."""

    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.keys: array[int] = array("q")
        self.values: array[int] = array("q")

    def __len__(self) -> int:
        return len(self.keys)

    def same_as(self, other: SparseIndex | None) -> bool:
        return other is not None and self.keys == other.keys and self.values == other.values

    def add(self, key: int, value: int) -> None:
        assert not self.keys or key > self.keys[-1], (key, self.keys[-1])
        self.keys.append(key)
        self.values.append(value)

    def floor(self, key: int) -> tuple[int, int] | None:
        """The entry with the greatest key <= `key`."""
        i = bisect_right(self.keys, key) - 1
        return None if i < 0 else (self.keys[i], self.values[i])

    def below(self, key: int) -> tuple[int, int] | None:
        """The entry with the greatest key < `key`."""
        i = bisect_left(self.keys, key) - 1
        return None if i < 0 else (self.keys[i], self.values[i])

    def last(self) -> tuple[int, int] | None:
        return (self.keys[-1], self.values[-1]) if self.keys else None

    def cut(self, key: int) -> None:
        """Drop entries with key >= `key`."""
        i = bisect_left(self.keys, key)
        del self.keys[i:]
        del self.values[i:]


def encode_offset_entry(relative_offset: int, position: int) -> bytes:
    assert 0 <= relative_offset <= U32_MAX and 0 <= position <= U32_MAX
    return OFFSET_ENTRY.pack(relative_offset, position)


def encode_time_entry(timestamp_ms: int, relative_offset: int) -> bytes:
    assert 0 <= relative_offset <= U32_MAX
    return TIME_ENTRY.pack(timestamp_ms, relative_offset)


def encode_offset_index(index: SparseIndex) -> bytes:
    return b"".join(
        encode_offset_entry(k, v) for k, v in zip(index.keys, index.values, strict=True)
    )


def encode_time_index(index: SparseIndex) -> bytes:
    return b"".join(encode_time_entry(k, v) for k, v in zip(index.keys, index.values, strict=True))


def decode_offset_index(data: bytes) -> SparseIndex | None:
    """The entries, or None when the bytes are not a well-formed index (torn, unordered)."""
    if len(data) % OFFSET_ENTRY.size:
        return None
    index = SparseIndex()
    for relative_offset, position in OFFSET_ENTRY.iter_unpack(data):
        if index.keys and (relative_offset <= index.keys[-1] or position <= index.values[-1]):
            return None
        index.add(relative_offset, position)
    return index


def decode_time_index(data: bytes) -> SparseIndex | None:
    """The entries, or None when the bytes are not a well-formed index (torn, unordered)."""
    if len(data) % TIME_ENTRY.size:
        return None
    index = SparseIndex()
    for timestamp_ms, relative_offset in TIME_ENTRY.iter_unpack(data):
        if index.keys and (timestamp_ms <= index.keys[-1] or relative_offset < index.values[-1]):
            return None
        index.add(timestamp_ms, relative_offset)
    return index
