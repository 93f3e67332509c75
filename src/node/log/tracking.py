"""Server-side offset tracking: the stored offset per consumer name of a partition (pure).

Contract (issue 8, docs/amqp.md "Offset tracking"): a receiver link named `spate:consumer-name`
stores the offset of what it accepted; a later link of that name with no start filter resumes
right after it. This module is the state behind that rule, as the log sees it (ADR 0012):

- A **tracking chunk** (chunk flag `FLAG_TRACKING`, no records, first offset = the log's end
  offset, like a barrier) carries a tracking section: `u16 count`, then per entry
  `u16 name_length | name (UTF-8) | i64 offset`. One chunk may carry the offsets of many names
  (the leader batches what its consumers settled). It is a Raft entry like any chunk, so every
  replica holds the same chunks and rebuilds the same table in log order (`OffsetTable.note`).
  Offset -1 means "before the first message" (an operator's reset to the start).
- The table is bounded (`LogConfig.consumer_names_max`): past the limit, the name stored least
  recently (log order: every replica evicts the same one) is forgotten; it then resumes as a
  consumer that never stored (`next`).
- The table is part of the partition-state snapshot written at every segment roll
  (`<base>.producers`, spate.node.log.producers: the producer table, then this table as its
  trailer), so opening a log replays one segment at most and retention keeps what it needs.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from spate.core import limits
from spate.node.log.producers import NameTable

COUNT = struct.Struct(">H")
NAME_LENGTH = struct.Struct(">H")
OFFSET = struct.Struct(">q")
_ENTRY = struct.Struct(">qQQq")  # offset, raft_index, epoch, timestamp_ms
NAME_BYTES_MAX = limits.tracked_name_bytes_max
"""Consumer names and the reserved names of consumer groups (`$group/<g>`, ADR 0015)."""
ENTRIES_PER_CHUNK_MAX = 1024
"""Names in one tracking chunk (a flush of more is split)."""
OFFSET_MIN = -1


class TrackingError(ValueError):
    """A tracking section or table that does not decode (damage, or not ours)."""


@dataclass(frozen=True, slots=True)
class TrackedOffset:
    offset: int
    """The consumer's stored offset: the last message it is done with (-1: none yet)."""
    raft_index: int
    """Raft index of the tracking chunk that stored it (0 without replication)."""
    epoch: int
    """That chunk's epoch (the Raft term of its writer): with raft_index, names the entry."""
    timestamp_ms: int
    """That chunk's timestamp: when the offset was stored."""


def encode_section(entries: Sequence[tuple[bytes, int]]) -> bytes:
    """The tracking section of a chunk storing `offset` for each `name`."""
    assert 0 < len(entries) <= ENTRIES_PER_CHUNK_MAX
    parts = [COUNT.pack(len(entries))]
    for name, offset in entries:
        assert 0 < len(name) <= NAME_BYTES_MAX and offset >= OFFSET_MIN
        parts += (NAME_LENGTH.pack(len(name)), name, OFFSET.pack(offset))
    return b"".join(parts)


def decode_section(
    buffer: bytes | bytearray | memoryview, position: int, limit: int
) -> list[tuple[bytes, int]]:
    """(name, offset) pairs of the tracking section filling [position, limit)."""
    if position + COUNT.size > limit:
        raise TrackingError("tracking section overruns the chunk")
    (count,) = COUNT.unpack_from(buffer, position)
    at = position + COUNT.size
    out: list[tuple[bytes, int]] = []
    for _ in range(count):
        if at + NAME_LENGTH.size > limit:
            raise TrackingError("tracking section overruns the chunk")
        (length,) = NAME_LENGTH.unpack_from(buffer, at)
        at += NAME_LENGTH.size
        if length == 0 or length > NAME_BYTES_MAX or at + length + OFFSET.size > limit:
            raise TrackingError(f"tracking entry with a name of {length} bytes")
        name = bytes(buffer[at : at + length])
        (offset,) = OFFSET.unpack_from(buffer, at + length)
        if offset < OFFSET_MIN:
            raise TrackingError(f"tracking entry with offset {offset}")
        out.append((name, offset))
        at += length + OFFSET.size
    if count == 0 or at != limit:
        raise TrackingError(f"tracking section of {count} entries and {limit - at} stray bytes")
    return out


class OffsetTable(NameTable[TrackedOffset]):
    """Consumer name -> TrackedOffset (NameTable: oldest store first, bounded)."""

    def encode(self) -> bytes:
        """The table as the snapshot's trailer (oldest first, so decoding keeps the order)."""
        parts = [struct.pack(">I", len(self._states))]
        for name, s in self._states.items():
            parts += (
                NAME_LENGTH.pack(len(name)),
                name,
                _ENTRY.pack(s.offset, s.raft_index, s.epoch, s.timestamp_ms),
            )
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes | memoryview, names_max: int) -> OffsetTable:
        """A table from a snapshot's trailer (empty bytes: an empty table); at most
        `names_max` names are kept (the newest)."""
        table = cls(names_max)
        if not len(data):
            return table
        if len(data) < 4:
            raise TrackingError("offset table is cut short")
        (count,) = struct.unpack_from(">I", data, 0)
        at = 4
        for _ in range(count):
            if at + NAME_LENGTH.size > len(data):
                raise TrackingError("offset table is cut short")
            (length,) = NAME_LENGTH.unpack_from(data, at)
            at += NAME_LENGTH.size
            if at + length + _ENTRY.size > len(data):
                raise TrackingError("offset table is cut short")
            name = bytes(data[at : at + length])
            at += length
            table.note(name, TrackedOffset(*_ENTRY.unpack_from(data, at)))
            at += _ENTRY.size
        if at != len(data):
            raise TrackingError(f"{len(data) - at} stray bytes after the offset table")
        return table
