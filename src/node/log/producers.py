"""Producer deduplication state: the last publishing id stored per producer name (pure).

Contract (issue 8, docs/amqp.md "Deduplication"): a sender link named `spate:producer-name`
tags each message with a publishing id (`x-opt-publishing-id`, strictly increasing per name);
a message whose id is not above the last *stored* id of its name is accepted and not stored
again. This module is the state behind that rule, as the log sees it (ADR 0011):

- A chunk appended for a named producer carries a **producer section** at the head of its
  payload (chunk flag `FLAG_PRODUCER`): `u16 name_length | name (UTF-8) | u64 last_id`, the id
  of the chunk's last record. Every replica stores the same chunks, so every replica rebuilds
  the same table by reading them in log order (`ProducerTable.note`).
- The table is bounded (`LogConfig.producer_names_max`): past the limit, the name written least
  recently is forgotten (a later message of that name is then stored whatever its id). "Least
  recently" is log order, so every replica evicts the same name at the same chunk.
- At every segment roll the table is written beside the new segment (`<base>.producers`, the
  state after every chunk before `base`, with the consumer offsets of spate.node.log.tracking
  as its trailer) and fsynced with it, like Kafka's producer-state
  snapshots: opening a log reads the last segment's snapshot and replays that segment's
  chunks only; retention deletes a snapshot with its segment; a wiped replica fetches the
  snapshots with the segments.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import crc32c
from spate.core import limits

SECTION_HEAD = struct.Struct(">H")
SECTION_ID = struct.Struct(">Q")
NAME_BYTES_MAX = limits.producer_name_bytes_max
"""Longest producer name (UTF-8 bytes)."""
PUBLISHING_ID_MAX = 2**64 - 1

SNAPSHOT_MAGIC = b"SPPT"
SNAPSHOT_VERSION = 2
"""Version 2 adds a trailer after the producer entries: the consumer offsets (ADR 0012,
spate.node.log.tracking.OffsetTable.encode). Version 1 files (no trailer) still decode."""
_SNAPSHOT_HEAD = struct.Struct(">4sIBI")  # magic, crc32c of what follows the crc, version, count
_SNAPSHOT_ENTRY = struct.Struct(">QQQqQ")  # last_id, raft_index, epoch, timestamp_ms, last_offset


S = TypeVar("S")


class ProducerStateError(ValueError):
    """A producer section or snapshot that does not decode (damage, or not ours)."""


def encode_section(name: bytes, last_id: int) -> bytes:
    """The producer section of a chunk whose last record has publishing id `last_id`."""
    assert 0 < len(name) <= NAME_BYTES_MAX and 0 <= last_id <= PUBLISHING_ID_MAX
    return b"".join((SECTION_HEAD.pack(len(name)), name, SECTION_ID.pack(last_id)))


def decode_section(
    buffer: bytes | bytearray | memoryview, position: int, limit: int
) -> tuple[bytes, int, int]:
    """(name, last_id, section bytes) of the section at `position`, not reaching `limit`."""
    if position + SECTION_HEAD.size > limit:
        raise ProducerStateError("producer section overruns the chunk")
    (length,) = SECTION_HEAD.unpack_from(buffer, position)
    end = position + SECTION_HEAD.size + length + SECTION_ID.size
    if length == 0 or length > NAME_BYTES_MAX or end > limit:
        raise ProducerStateError(f"producer section with a name of {length} bytes")
    start = position + SECTION_HEAD.size
    name = bytes(buffer[start : start + length])
    (last_id,) = SECTION_ID.unpack_from(buffer, start + length)
    return name, last_id, end - position


@dataclass(frozen=True, slots=True)
class ProducerState:
    last_id: int
    """Publishing id of the producer's last stored message."""
    raft_index: int
    """Raft index of the chunk that stored it (0 without replication)."""
    epoch: int
    """That chunk's epoch (the Raft term of its writer): with raft_index, names the entry."""
    timestamp_ms: int
    """That chunk's timestamp: when the producer last stored a message."""
    last_offset: int
    """Offset of that chunk's last record."""


class NameTable(Generic[S]):
    """Name -> state, oldest write first; at most `names_max` names: past that the name
    written least recently is forgotten. Log order decides "least recently", so every replica
    forgets the same name at the same chunk. (Producer states here; consumer offsets in
    spate.node.log.tracking.)"""

    def __init__(self, names_max: int) -> None:
        assert names_max > 0
        self.names_max = names_max
        self._states: OrderedDict[bytes, S] = OrderedDict()
        self.evicted = 0
        """Names forgotten to keep within names_max since this table was built."""

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[tuple[bytes, S]]:
        return iter(self._states.items())

    def get(self, name: bytes) -> S | None:
        return self._states.get(name)

    def note(self, name: bytes, state: S) -> None:
        """A chunk stored `name`'s state: it becomes the most recently written name."""
        states = self._states
        states[name] = state
        states.move_to_end(name)
        while len(states) > self.names_max:
            states.popitem(last=False)
            self.evicted += 1


class ProducerTable(NameTable[ProducerState]):
    """Producer name -> ProducerState, with its snapshot codec."""

    def encode(self, trailer: bytes = b"") -> bytes:
        """The snapshot file's bytes (oldest write first, so decoding keeps the order), with
        `trailer` (the other partition state: consumer offsets) after the entries."""
        parts: list[bytes] = []
        for name, s in self._states.items():
            parts.append(SECTION_HEAD.pack(len(name)))
            parts.append(name)
            parts.append(
                _SNAPSHOT_ENTRY.pack(
                    s.last_id, s.raft_index, s.epoch, s.timestamp_ms, s.last_offset
                )
            )
        body = struct.pack(">BI", SNAPSHOT_VERSION, len(self._states)) + b"".join(parts) + trailer
        return SNAPSHOT_MAGIC + struct.pack(">I", crc32c.crc32c(body)) + body

    @classmethod
    def decode(cls, data: bytes, names_max: int) -> tuple[ProducerTable, memoryview]:
        """A table from a snapshot, and the trailer after it; at most `names_max` names are
        kept (the newest)."""
        if len(data) < _SNAPSHOT_HEAD.size or data[:4] != SNAPSHOT_MAGIC:
            raise ProducerStateError("not a producer snapshot")
        _, crc, version, count = _SNAPSHOT_HEAD.unpack_from(data, 0)
        if crc32c.crc32c(memoryview(data)[8:]) != crc:
            raise ProducerStateError("producer snapshot CRC mismatch")
        if version not in (1, SNAPSHOT_VERSION):
            raise ProducerStateError(f"unknown producer snapshot version {version}")
        table = cls(names_max)
        at = _SNAPSHOT_HEAD.size
        for _ in range(count):
            if at + SECTION_HEAD.size > len(data):
                raise ProducerStateError("producer snapshot is cut short")
            (length,) = SECTION_HEAD.unpack_from(data, at)
            at += SECTION_HEAD.size
            if at + length + _SNAPSHOT_ENTRY.size > len(data):
                raise ProducerStateError("producer snapshot is cut short")
            name = data[at : at + length]
            at += length
            table.note(name, ProducerState(*_SNAPSHOT_ENTRY.unpack_from(data, at)))
            at += _SNAPSHOT_ENTRY.size
        if version == 1 and at != len(data):
            raise ProducerStateError(f"{len(data) - at} stray bytes after the producer snapshot")
        return table, memoryview(data)[at:]


@dataclass(frozen=True, slots=True)
class Filtered:
    """What `keep_new` decided for one batch of a named producer."""

    keep: list[int]
    """Indexes of the records to store, in order."""
    last_id: int
    """Publishing id of the last record to store (meaningless when `keep` is empty)."""


def keep_new(ids: list[int], last_stored: int | None) -> Filtered:
    """The records whose id is above everything stored or kept before them: ids at or below
    `last_stored` (None: the name never stored anything) are duplicates. The ids of one batch
    come from one link, strictly increasing (the listener refuses others): when the first is
    new, all are (no loop per record on the usual path)."""
    top = -1 if last_stored is None else last_stored
    if ids and ids[0] > top:
        return Filtered(list(range(len(ids))), ids[-1])
    keep: list[int] = []
    for i, publishing_id in enumerate(ids):
        if publishing_id > top:
            keep.append(i)
            top = publishing_id
    return Filtered(keep, top)
