"""One segment: its file names, its in-memory state, and how it is scanned and recovered.

A segment is three files named by the offset of its first record, zero-padded to 20 digits so
that `ls` sorts them in log order (Kafka's naming):

```
00000000000000000000.segment     chunks end to end (spate.node.log.chunk)
00000000000000000000.index       sparse offset index (spate.node.log.index), a cache
00000000000000000000.timeindex   sparse time index, a cache
00000000000000000000.producers   producer state before the segment (only once a producer
                                 name has written; spate.node.log.producers), not a cache
```
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from spate.core.errors import StorageFailure
from spate.core.ids import Offset
from spate.node.log import chunk
from spate.node.log.chunk import ChunkError, ChunkHeader
from spate.node.log.index import (
    SparseIndex,
    decode_offset_index,
    decode_time_index,
    encode_offset_entry,
    encode_offset_index,
    encode_time_entry,
    encode_time_index,
)
from spate.node.log.storage import Storage

SEGMENT_SUFFIX = ".segment"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
PRODUCERS_SUFFIX = ".producers"
"""Producer-state snapshot written at the segment's creation (spate.node.log.producers)."""
NAME_DIGITS = 20
SCAN_BLOCK_BYTES = 1024 * 1024
"""Recovery and reads fetch the file in blocks of this size (one pread per block, not per
chunk: a segment of 150-byte chunks would otherwise cost two syscalls per message)."""


def file_name(base_offset: Offset, suffix: str) -> str:
    assert 0 <= base_offset < 10**NAME_DIGITS
    return f"{base_offset:0{NAME_DIGITS}d}{suffix}"


def parse_name(name: str) -> tuple[Offset, str] | None:
    """(base offset, suffix) of one of our file names, None for any other name."""
    stem, dot, suffix = name.partition(".")
    if (
        not dot
        or len(stem) != NAME_DIGITS
        or not stem.isdigit()
        or "." + suffix not in (SEGMENT_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, PRODUCERS_SUFFIX)
    ):
        return None
    return Offset(int(stem)), "." + suffix


@dataclass(slots=True)
class Segment:
    """What the log keeps in memory about one segment file."""

    base_offset: Offset
    end_offset: Offset  # offset after the last record written to it
    size: int  # bytes of chunks written to it
    first_timestamp_ms: int | None  # None while empty
    last_timestamp_ms: int | None
    offset_index: SparseIndex = field(default_factory=SparseIndex)  # relative offset -> position
    time_index: SparseIndex = field(default_factory=SparseIndex)  # timestamp -> relative offset
    first_raft_index: int | None = None  # of its first / last chunk, when known (see log)
    last_raft_index: int | None = None
    name: str = field(init=False)
    index_name: str = field(init=False)
    time_index_name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = file_name(self.base_offset, SEGMENT_SUFFIX)
        self.index_name = file_name(self.base_offset, INDEX_SUFFIX)
        self.time_index_name = file_name(self.base_offset, TIME_INDEX_SUFFIX)

    @property
    def messages(self) -> int:
        return int(self.end_offset - self.base_offset)

    def note_chunk(
        self, position: int, header: ChunkHeader, index_interval_bytes: int
    ) -> tuple[bytes, bytes]:
        """Account for the chunk just written at `position`; returns the index bytes to append
        to the offset index and the time index (either may be empty)."""
        assert header.first_offset == self.end_offset and position == self.size
        if header.raft_index:
            if self.first_raft_index is None:
                self.first_raft_index = header.raft_index
            self.last_raft_index = header.raft_index
        self.size = position + header.chunk_bytes
        if header.record_count == 0:
            return b"", b""  # a barrier: no record to index, no time to account for
        if self.first_timestamp_ms is None:
            self.first_timestamp_ms = header.timestamp_ms
        self.last_timestamp_ms = header.timestamp_ms
        self.end_offset = header.end_offset
        last = self.offset_index.last()
        if last is not None and position - last[1] < index_interval_bytes:
            return b"", b""
        relative = header.first_offset - self.base_offset
        self.offset_index.add(relative, position)
        offset_entry = encode_offset_entry(relative, position)
        last_time = self.time_index.last()
        if last_time is not None and header.timestamp_ms <= last_time[0]:
            return offset_entry, b""
        self.time_index.add(header.timestamp_ms, relative)
        return offset_entry, encode_time_entry(header.timestamp_ms, relative)

    def position_near(self, offset: Offset) -> tuple[Offset, int]:
        """(first offset, position) of an indexed chunk at or before `offset`."""
        entry = self.offset_index.floor(offset - self.base_offset)
        if entry is None:
            return self.base_offset, 0
        return Offset(self.base_offset + entry[0]), entry[1]


class BlockReader:
    """Reads a file through a window of at least SCAN_BLOCK_BYTES, one pread per window."""

    def __init__(
        self, storage: Storage, name: str, file_size: int, block_bytes: int = SCAN_BLOCK_BYTES
    ) -> None:
        self._storage = storage
        self._name = name
        self._file_size = file_size
        self._block_bytes = block_bytes
        self._buffer = b""
        self._start = 0

    def get(self, position: int, length: int) -> tuple[bytes, int] | None:
        """(buffer, index) with buffer[index:index + length] the file's bytes at `position`;
        None when the file ends first."""
        if position + length > self._file_size:
            return None
        start = self._start
        if start <= position and position + length <= start + len(self._buffer):
            return self._buffer, position - start
        want = min(max(length, self._block_bytes), self._file_size - position)
        self._buffer = self._storage.pread(self._name, position, want)
        self._start = position
        if len(self._buffer) < length:
            return None
        return self._buffer, 0


def scan_chunks(
    storage: Storage,
    name: str,
    file_size: int,
    position: int,
    expected_offset: Offset,
    *,
    check_crc: bool,
) -> Iterator[tuple[int, ChunkHeader]]:
    """The chunks from `position` on, in order, while they are whole and valid (CRC included
    when `check_crc`) and their offsets follow on from `expected_offset`. Stops silently at the
    first one that is not: the caller compares where it stopped with the file size."""
    reader = BlockReader(storage, name, file_size)
    while position < file_size:
        got = reader.get(position, chunk.HEADER_BYTES)
        if got is None:
            return
        buffer, at = got
        try:
            header = chunk.decode_header(buffer, at)
        except ChunkError:
            return
        if header.first_offset != expected_offset:
            return
        if check_crc:
            got = reader.get(position, header.chunk_bytes)
            if got is None:
                return
            buffer, at = got
            try:
                chunk.check_crc(buffer, at, header)
                chunk.slice_records(buffer, at, header)
            except ChunkError:
                return
        elif position + header.chunk_bytes > file_size:
            return
        yield position, header
        position += header.chunk_bytes
        expected_offset = header.end_offset


@dataclass(frozen=True, slots=True)
class Recovered:
    segment: Segment
    truncated_bytes: int  # bytes cut off the segment's tail (torn or corrupt)
    indexes_rebuilt: bool


def recover_segment(
    storage: Storage, base_offset: Offset, *, active: bool, index_interval_bytes: int
) -> Recovered:
    """Bring one segment back after a restart.

    The active (last) segment is scanned whole with CRC checks; its tail after the last valid
    chunk is cut off (synced, so the cut survives a later crash) and its indexes are rebuilt.
    A sealed segment was fsynced whole before the next one was created, so only its indexes
    are checked: the last offset-index entry must lead, through valid chunks, exactly to the
    end of the file; otherwise the indexes are rebuilt by a full scan. A sealed segment whose
    chunks do not all check out is damage no crash explains: StorageFailure.
    """
    name = file_name(base_offset, SEGMENT_SUFFIX)
    index_name = file_name(base_offset, INDEX_SUFFIX)
    time_index_name = file_name(base_offset, TIME_INDEX_SUFFIX)
    names = set(storage.list())
    for missing in (index_name, time_index_name):
        if missing not in names:
            storage.create(missing)
    file_size = storage.size(name)
    offset_index = decode_offset_index(storage.pread(index_name, 0, storage.size(index_name)))
    time_index = decode_time_index(storage.pread(time_index_name, 0, storage.size(time_index_name)))
    if not active and offset_index is not None and time_index is not None:
        segment = _trust_indexes(storage, base_offset, file_size, offset_index, time_index)
        if segment is not None:
            return Recovered(segment, 0, False)
    segment = Segment(base_offset, base_offset, 0, None, None)
    offset_bytes: list[bytes] = []
    time_bytes: list[bytes] = []
    for position, header in scan_chunks(storage, name, file_size, 0, base_offset, check_crc=True):
        entry, time_entry = segment.note_chunk(position, header, index_interval_bytes)
        offset_bytes.append(entry)
        time_bytes.append(time_entry)
    truncated = file_size - segment.size
    if truncated and not active:
        raise StorageFailure(
            f"segment {name} is damaged at byte {segment.size} of {file_size} (offset "
            f"{segment.end_offset}); it is not the last segment, so no crash explains it. "
            "Restore this replica from another one."
        )
    if truncated:
        storage.truncate(name, segment.size)
        storage.fsync(name)
    rebuilt = not (
        segment.offset_index.same_as(offset_index) and segment.time_index.same_as(time_index)
    )
    if rebuilt:
        for file, data in (
            (index_name, b"".join(offset_bytes)),
            (time_index_name, b"".join(time_bytes)),
        ):
            storage.truncate(file, 0)
            storage.append(file, data)
    return Recovered(segment, truncated, rebuilt)


def _trust_indexes(
    storage: Storage,
    base_offset: Offset,
    file_size: int,
    offset_index: SparseIndex,
    time_index: SparseIndex,
) -> Segment | None:
    """The sealed segment described by its indexes, or None when they disagree with it."""
    name = file_name(base_offset, SEGMENT_SUFFIX)
    last = offset_index.last()
    if last is None or offset_index.keys[0] != 0 or offset_index.values[0] != 0:
        return None
    relative, position = last
    end_position = position
    end_offset = Offset(base_offset + relative)
    last_timestamp_ms: int | None = None
    for chunk_position, header in scan_chunks(
        storage, name, file_size, position, end_offset, check_crc=True
    ):
        end_position = chunk_position + header.chunk_bytes
        end_offset = header.end_offset
        if header.record_count:
            last_timestamp_ms = header.timestamp_ms
    if end_position != file_size or last_timestamp_ms is None:
        return None
    first = storage.pread(name, 0, chunk.HEADER_BYTES)
    try:
        first_timestamp_ms = chunk.decode_header(first).timestamp_ms
    except ChunkError:
        return None
    last_time = time_index.last()
    if last_time is None or time_index.keys[0] != first_timestamp_ms or time_index.values[0] != 0:
        return None
    if last_time[0] > last_timestamp_ms or last_time[1] >= end_offset - base_offset:
        return None
    return Segment(
        base_offset,
        end_offset,
        file_size,
        first_timestamp_ms,
        last_timestamp_ms,
        offset_index,
        time_index,
    )


def rewrite_indexes(storage: Storage, segment: Segment) -> None:
    """Replace both index files with the in-memory entries (after a truncation)."""
    for file, data in (
        (segment.index_name, encode_offset_index(segment.offset_index)),
        (segment.time_index_name, encode_time_index(segment.time_index)),
    ):
        storage.truncate(file, 0)
        storage.append(file, data)
