"""PartitionLog: one partition's durable log over a Storage, as a synchronous core.

It decides and performs every file operation of the log (the files are its state), but owns no
thread, task or clock: time comes in as `timestamp_ms`/`now_ms`, and fsync can be split into
`begin_sync` / `run_sync` / `finish_sync` so that a shell can run the middle step in a thread
while it keeps appending (spate.node.partition does).

Invariants (asserted where cheap):
- segments are contiguous: each starts where the previous ends; only the last one (the active
  segment) is ever appended to, truncated by recovery, or written unsynced;
- a segment is fsynced whole, with its indexes, before the next one is created, and the
  directory is fsynced after every creation and deletion, so after a crash only the active
  segment can have a torn tail;
- chunk timestamps never decrease (an append stamped earlier than the last chunk is stamped with
  the last chunk's time: a clock that steps back must not break timestamp search or retention);
- durable_end <= end_offset, and everything below durable_end has been fsynced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from spate.core import filtering, limits, subentry
from spate.core.backend import ChunkView, OffsetSpec, OffsetSpecKind
from spate.core.errors import InvalidArgument, StorageFailure
from spate.core.filtering import ChunkFilter
from spate.core.ids import Offset
from spate.core.streams import Retention, StreamConfig
from spate.node.log import chunk
from spate.node.log.chunk import ChunkError, ChunkHeader
from spate.node.log.producers import (
    ProducerState,
    ProducerStateError,
    ProducerTable,
    encode_section,
)
from spate.node.log.segment import (
    INDEX_SUFFIX,
    PRODUCERS_SUFFIX,
    SEGMENT_SUFFIX,
    TIME_INDEX_SUFFIX,
    BlockReader,
    Segment,
    file_name,
    parse_name,
    recover_segment,
    rewrite_indexes,
)
from spate.node.log.storage import Storage
from spate.node.log.tracking import OffsetTable, TrackedOffset, TrackingError

SECTION_BYTES_MAX = 2 + limits.producer_name_bytes_max + 8
"""Longest producer section at the head of a chunk's payload (spate.node.log.producers)."""
READ_BLOCK_BYTES_MIN = 64 * 1024
"""Reads fetch at least this much per pread, so a read of many small chunks is one syscall."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = limits.segment_bytes_default
    retention: Retention = field(default_factory=Retention)
    index_interval_bytes: int = limits.index_interval_bytes
    chunk_records_max: int = limits.chunk_records_max
    chunk_bytes_max: int = limits.chunk_bytes_max
    message_bytes_max: int = limits.message_bytes_max
    producer_names_max: int = limits.producer_names_max
    consumer_names_max: int = limits.consumer_names_max
    filter_size_bytes: int = filtering.SIZE_BYTES_DEFAULT
    """Bytes of a chunk's Bloom filter of its records' filter values (ADR 0016)."""

    def __post_init__(self) -> None:
        # Streams validate user input (StreamConfig.validate); tests may use smaller segments.
        assert self.segment_bytes > chunk.HEADER_BYTES
        assert self.segment_bytes <= limits.segment_bytes_max
        assert 0 < self.chunk_records_max <= limits.chunk_records_max
        assert 0 < self.chunk_bytes_max <= limits.chunk_bytes_max
        assert 0 < self.message_bytes_max <= self.chunk_bytes_max - chunk.RECORD_PREFIX_BYTES
        assert self.index_interval_bytes > 0
        assert self.producer_names_max > 0
        assert self.consumer_names_max > 0

    @classmethod
    def from_stream(cls, config: StreamConfig) -> LogConfig:
        return cls(
            segment_bytes=config.segment_bytes,
            retention=config.retention,
            filter_size_bytes=config.filter_size_bytes,
        )


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """One fsync to run: the active segment as of `begin_sync`, covering offsets < target."""

    segment_name: str
    target: Offset
    generation: int
    chunks: int = 0  # chunks appended when the plan was made (barriers move no offset)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    segments: int
    truncated_bytes: int  # torn or corrupt bytes cut off the active segment
    rebuilt_indexes: list[str]  # segment files whose indexes were rebuilt
    deleted_files: list[str]  # orphan index files removed


@dataclass(frozen=True, slots=True)
class LogInfo:
    """Facts about the committed (durable) part of the log, for PartitionInfo."""

    first_offset: Offset  # log start: the first retained offset (== end when empty)
    end_offset: Offset  # durable end
    first_timestamp_ms: int | None
    last_timestamp_ms: int | None
    messages: int
    bytes: int
    segments: int


@dataclass(slots=True)
class _Counters:
    chunks_appended: int = 0
    fsyncs: int = 0
    segments_rolled: int = 0
    segments_deleted: int = 0


class PartitionLog:
    """See the module docstring; open it with `PartitionLog.open`."""

    def __init__(
        self,
        storage: Storage,
        config: LogConfig,
        segments: list[Segment],
        recovery: RecoveryReport,
        snapshots: set[Offset] | None = None,
    ) -> None:
        assert segments
        self._storage = storage
        self._config = config
        self._segments = segments
        self.recovery = recovery
        self.end_offset = segments[-1].end_offset
        self.durable_end = self.end_offset
        self.counters = _Counters()
        self._generation = 0  # bumped by truncate_from: sync plans from before are void
        self._failure: str | None = None
        self._chunks_synced = 0  # counters.chunks_appended covered by the last fsync
        self._open_sync: str | None = None  # the segment `finish_open` syncs
        self.last_raft_index = self._find_last_raft_index()
        """Raft index of the last chunk written (0 when the log holds none with an index)."""
        self._snapshots: set[Offset] = set() if snapshots is None else snapshots
        """Base offsets of the segments that have a producer-state snapshot."""
        self.producers = ProducerTable(config.producer_names_max)
        """Last publishing id per producer name over every chunk written (spate.node.log.
        producers): stored, not necessarily committed; Raft truncation rolls it back."""
        self.offsets = OffsetTable(config.consumer_names_max)
        """Stored offset per consumer name over every tracking chunk written (spate.node.log.
        tracking); like `producers`, written is not committed."""
        self._rebuild_state()

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, storage: Storage, config: LogConfig, *, defer_sync: bool = False) -> PartitionLog:
        """Recover the log in `storage` (creating an empty one) and make it all durable.

        `defer_sync=True` (opening many replicas at once, ADR 0031): the syncs are left to
        `finish_open`, which the caller runs (on any thread) before the log is used."""
        bases: set[Offset] = set()
        snapshots: set[Offset] = set()
        orphans: list[str] = []
        parsed = [(name, parse_name(name)) for name in storage.list()]
        for _name, meaning in parsed:
            if meaning is not None and meaning[1] == SEGMENT_SUFFIX:
                bases.add(meaning[0])
        for name, meaning in parsed:
            if meaning is not None and meaning[1] != SEGMENT_SUFFIX and meaning[0] not in bases:
                orphans.append(name)
            elif meaning is not None and meaning[1] == PRODUCERS_SUFFIX:
                snapshots.add(meaning[0])
        try:
            for name in orphans:
                storage.delete(name)
            created = not bases
            if created:
                base = Offset(0)
                for suffix in (SEGMENT_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                    storage.create(file_name(base, suffix))
                bases.add(base)
            ordered = sorted(bases)
            segments: list[Segment] = []
            truncated = 0
            rebuilt: list[str] = []
            for i, base in enumerate(ordered):
                recovered = recover_segment(
                    storage,
                    base,
                    active=i == len(ordered) - 1,
                    index_interval_bytes=config.index_interval_bytes,
                )
                segment = recovered.segment
                if segments and segments[-1].end_offset != segment.base_offset:
                    raise StorageFailure(
                        f"segments do not follow on: {segments[-1].name} ends at offset "
                        f"{segments[-1].end_offset} but the next segment is {segment.name}"
                    )
                segments.append(segment)
                truncated += recovered.truncated_bytes
                if recovered.indexes_rebuilt:
                    rebuilt.append(segment.name)
        except OSError as error:
            raise StorageFailure(f"cannot open the partition log: {error}") from error
        opened = cls(
            storage,
            config,
            segments,
            RecoveryReport(len(segments), truncated, rebuilt, orphans),
            snapshots,
        )
        # A log created here has empty files: only their names need syncing.
        opened._open_sync = None if created else segments[-1].name
        if not defer_sync:
            opened.finish_open()
        return opened

    def finish_open(self) -> None:
        """The syncs `open` owes: what a killed process left in the page cache (the active
        segment) and the directory's entries are on disk only after this. Thread-safe against
        nothing else: call it before the log is used."""
        try:
            if self._open_sync is not None:
                self._storage.fsync(self._open_sync)
            self._storage.fsync_dir()
        except OSError as error:
            raise StorageFailure(f"cannot open the partition log: {error}") from error

    # ------------------------------------------------------------------ appending

    @property
    def failure(self) -> str | None:
        """Why the log refuses appends, once a write or sync has failed."""
        return self._failure

    def fail(self, reason: str) -> None:
        """Refuse every later append (a write or fsync failed: the file's state is unknown)."""
        if self._failure is None:
            self._failure = reason

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise StorageFailure(f"the partition log refuses writes since: {self._failure}")

    def append_chunk_bytes(self, data: bytes | memoryview) -> ChunkHeader:
        """Write one already encoded chunk (a Raft entry from the leader, stored byte for byte:
        never re-encoded or copied: a view of the leader's frame on a follower), not synced. Its
        first offset must be the log's end offset and its Raft index the next one. The CRC is
        checked by recovery and reads, not here (the leader computed it once, ADR 0037)."""
        self._check_usable()
        try:
            header = chunk.decode_header(data)
        except ChunkError as error:
            raise InvalidArgument(f"not a chunk: {error}") from error
        if header.chunk_bytes != len(data):
            raise InvalidArgument(f"chunk of {len(data)} bytes says {header.chunk_bytes}")
        assert header.first_offset == self.end_offset, (header.first_offset, self.end_offset)
        assert self.last_raft_index == 0 or header.raft_index == self.last_raft_index + 1, (
            header.raft_index,
            self.last_raft_index,
        )
        self._write_chunk(data, header)
        return header

    @property
    def last_timestamp_ms(self) -> int | None:
        """Timestamp of the newest record chunk written (None when there is none)."""
        return next(
            (
                s.last_timestamp_ms
                for s in reversed(self._segments)
                if s.last_timestamp_ms is not None
            ),
            None,
        )

    def append(
        self,
        records: Sequence[bytes],
        timestamp_ms: int,
        epoch: int = 0,
        producer: tuple[bytes, Sequence[int]] | None = None,
    ) -> Offset:
        """Write the records as one chunk (several if over the chunk limits), not synced; a
        single `SubEntry` as one sub-entry chunk (ADR 0017).

        Returns the first record's offset. Raises MessageSizeExceeded for an oversized record
        and StorageFailure when the disk refuses (after which every append is refused).
        `producer` (name, publishing id per record) gives each chunk a producer section; the
        caller has dropped the duplicates (`producers.keep_new`).
        """
        self._check_usable()
        if not records:
            raise InvalidArgument("an append needs at least one record")
        assert epoch >= 0
        config = self._config
        lengths = chunk.record_lengths(records, config.message_bytes_max)
        last = self._segments[-1].last_timestamp_ms
        if last is None:
            last = next(
                (
                    s.last_timestamp_ms
                    for s in reversed(self._segments)
                    if s.last_timestamp_ms is not None
                ),
                None,
            )
        if last is not None and timestamp_ms < last:
            timestamp_ms = last
        first = self.end_offset
        count = len(records)
        if count == 1 and isinstance(records[0], subentry.SubEntry):
            section = None if producer is None else encode_section(producer[0], producer[1][-1])
            try:
                values = records[0].filter_values
                data, header = chunk.encode_sub_entry_chunk(
                    records[0],
                    first,
                    timestamp_ms,
                    epoch,
                    producer=section,
                    filter_section=None
                    if values is None
                    else filtering.sub_entry_section(values, config.filter_size_bytes),
                )
            except subentry.SubEntryError as error:
                raise InvalidArgument(f"not a sub-entry: {error}") from error
            self._write_chunk(data, header)
            return first
        bounds = chunk.chunk_ranges(lengths, config.chunk_records_max, config.chunk_bytes_max)
        for start, end in bounds:
            section = (
                None if producer is None else encode_section(producer[0], producer[1][end - 1])
            )
            # the usual case: one chunk of every record, the list itself
            part = records if len(bounds) == 1 else records[start:end]
            self._append_chunk(part, timestamp_ms, epoch, section)
        return first

    def _append_chunk(
        self,
        records: Sequence[bytes],
        timestamp_ms: int,
        epoch: int,
        producer: bytes | None = None,
    ) -> None:
        values = filtering.section(records, self._config.filter_size_bytes)
        data, header = chunk.encode_chunk_buffer(
            records, self.end_offset, timestamp_ms, epoch, producer=producer, filter_section=values
        )
        self._write_chunk(data, header)

    def _write_chunk(self, data: bytes | bytearray | memoryview, header: ChunkHeader) -> None:
        try:
            segment = self._segments[-1]
            # A segment holding barriers only is never sealed: its successor would have the
            # same base offset, hence the same file name.
            if (
                segment.size > 0
                and segment.end_offset > segment.base_offset
                and segment.size + len(data) > self._config.segment_bytes
            ):
                segment = self._roll()
            position = segment.size
            self._storage.append(segment.name, memoryview(data))
            entry, time_entry = segment.note_chunk(
                position, header, self._config.index_interval_bytes
            )
            if entry:
                self._storage.append(segment.index_name, entry)
            if time_entry:
                self._storage.append(segment.time_index_name, time_entry)
        except OSError as error:
            self.fail(f"writing offset {self.end_offset} failed: {error}")
            raise StorageFailure(f"the disk refused a write: {error}") from error
        self.end_offset = header.end_offset
        if header.raft_index:
            self.last_raft_index = header.raft_index
        if header.flags & (chunk.FLAG_PRODUCER | chunk.FLAG_TRACKING):
            self._note_state(data, 0, header)
        self.counters.chunks_appended += 1

    def _note_state(
        self, buffer: bytes | bytearray | memoryview, at: int, header: ChunkHeader
    ) -> None:
        """The producer or tracking section of a chunk with flags, into its table."""
        if header.flags & chunk.FLAG_TRACKING:
            for name, offset in chunk.tracking_section(buffer, at, header):
                self.offsets.note(
                    name,
                    TrackedOffset(offset, header.raft_index, header.epoch, header.timestamp_ms),
                )
            return
        name, last_id, _ = chunk.producer_section(buffer, at, header)
        self.producers.note(
            name,
            ProducerState(
                last_id,
                header.raft_index,
                header.epoch,
                header.timestamp_ms,
                header.end_offset - 1,
            ),
        )

    def _roll(self) -> Segment:
        """Seal the active segment (fsynced whole, with its indexes) and start the next."""
        old = self._segments[-1]
        storage = self._storage
        for name in (old.name, old.index_name, old.time_index_name):
            storage.fsync(name)
            storage.release(name)
        self.counters.fsyncs += 3
        self._chunks_synced = self.counters.chunks_appended
        # The old segment is whole on disk; everything below its end is durable.
        self.durable_end = max(self.durable_end, old.end_offset)
        new = Segment(old.end_offset, old.end_offset, 0, None, None)
        # The producer state before the new segment, synced before the segment exists: a log
        # that opens with the segment has its snapshot (an orphan snapshot is deleted).
        snapshot = file_name(new.base_offset, PRODUCERS_SUFFIX)
        storage.create(snapshot)
        storage.append(snapshot, self.producers.encode(self.offsets.encode()))
        storage.fsync(snapshot)
        storage.release(snapshot)
        self._snapshots.add(new.base_offset)
        for name in (new.name, new.index_name, new.time_index_name):
            storage.create(name)
        storage.fsync_dir()
        self._segments.append(new)
        self.counters.segments_rolled += 1
        return new

    # ------------------------------------------------------------------ syncing

    def begin_sync(self) -> SyncPlan | None:
        """What to fsync to make everything written so far durable; None when it already is."""
        self._check_usable()
        if (
            self.durable_end == self.end_offset
            and self._chunks_synced == self.counters.chunks_appended
        ):
            return None
        return SyncPlan(
            self._segments[-1].name,
            self.end_offset,
            self._generation,
            self.counters.chunks_appended,
        )

    def run_sync(self, plan: SyncPlan) -> None:
        """Perform the plan's fsync. Safe to call from another thread while the owner appends
        (but not while it truncates or applies retention). Raises OSError."""
        self._storage.fsync(plan.segment_name)

    def finish_sync(self, plan: SyncPlan) -> Offset:
        """Record the completed plan; returns the new durable end."""
        self.counters.fsyncs += 1
        if plan.generation == self._generation:
            if plan.target > self.durable_end:
                assert plan.target <= self.end_offset
                self.durable_end = plan.target
            self._chunks_synced = max(self._chunks_synced, plan.chunks)
        return self.durable_end

    def sync(self) -> Offset:
        """fsync what was written; returns the new durable end."""
        plan = self.begin_sync()
        if plan is None:
            return self.durable_end
        try:
            self.run_sync(plan)
        except OSError as error:
            self.fail(f"fsync failed: {error}")
            raise StorageFailure(f"the disk refused an fsync: {error}") from error
        return self.finish_sync(plan)

    # ------------------------------------------------------------------ reading

    @property
    def start_offset(self) -> Offset:
        """The first retained offset (equal to the end when the log is empty)."""
        return self._segments[0].base_offset

    def _segment_index(self, offset: Offset) -> int:
        """Index of the segment holding `offset` (the last one if it is at or past the end)."""
        lo, hi = 0, len(self._segments) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._segments[mid].base_offset <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def read(
        self,
        start: Offset,
        max_bytes: int,
        end: Offset | None = None,
        where: Callable[[ChunkFilter | None], bool] | None = None,
    ) -> list[ChunkView]:
        """Whole chunks from the one holding `start` (the first retained one if `start` is
        older), up to `max_bytes` of chunk bytes but at least one chunk, and only chunks that
        end at or before `end` (default: the durable end). Records are memoryviews into one
        buffer read per call; nothing is decoded. A chunk that fails its CRC is a
        StorageFailure. `where` (ADR 0016) passes over chunks whose filter section it rules
        out without slicing their records (their bytes count against `max_bytes`); when the
        read ends with such chunks, a skip mark (a view with no records) says where they end."""
        limit = self.durable_end if end is None else min(end, self.end_offset)
        start = max(start, self.start_offset)
        if start >= limit:
            return []
        views: list[ChunkView] = []
        total = 0
        skipped_to: tuple[Offset, int] | None = None
        block = max(READ_BLOCK_BYTES_MIN, max_bytes + chunk.HEADER_BYTES)
        i = self._segment_index(start)
        while i < len(self._segments):
            segment = self._segments[i]
            expected, position = segment.position_near(start)
            reader = BlockReader(self._storage, segment.name, segment.size, block)
            while position < segment.size:
                header = self._header_at(reader, segment, position, expected)
                if header.end_offset <= start:
                    position += header.chunk_bytes
                    expected = header.end_offset
                    continue
                if header.end_offset > limit or (
                    (views or skipped_to) and total + header.chunk_bytes > max_bytes
                ):
                    return self._marked(views, skipped_to)
                got = reader.get(position, header.chunk_bytes)
                if got is None:
                    raise StorageFailure(
                        f"segment {segment.name} ends inside the chunk at "
                        f"offset {header.first_offset}"
                    )
                buffer, at = got
                try:
                    chunk.check_crc(buffer, at, header)
                    section = chunk.chunk_filter(buffer, at, header)
                    wanted = (
                        where is None
                        or not header.record_count
                        or (section is None and header.chunk_type == chunk.CHUNK_TYPE_SUB_ENTRY)
                        or where(section)
                    )
                    records = chunk.slice_records(buffer, at, header) if wanted else []
                except ChunkError as error:
                    raise StorageFailure(
                        f"segment {segment.name} byte {position}: {error}"
                    ) from error
                if records:  # barriers hold none
                    views.append(
                        ChunkView(header.first_offset, header.timestamp_ms, records, section)
                    )
                    skipped_to = None
                elif not wanted:
                    skipped_to = (header.end_offset, header.timestamp_ms)
                total += header.chunk_bytes
                position += header.chunk_bytes
                expected = header.end_offset
            i += 1
        return self._marked(views, skipped_to)

    @staticmethod
    def _marked(views: list[ChunkView], skipped_to: tuple[Offset, int] | None) -> list[ChunkView]:
        if skipped_to is not None:
            views.append(ChunkView(skipped_to[0], skipped_to[1], ()))
        return views

    def _header_at(
        self, reader: BlockReader, segment: Segment, position: int, expected: Offset
    ) -> ChunkHeader:
        got = reader.get(position, chunk.HEADER_BYTES)
        try:
            if got is None:
                raise ChunkError("file ends inside a chunk header")
            header = chunk.decode_header(got[0], got[1])
        except ChunkError as error:
            raise StorageFailure(f"segment {segment.name} byte {position}: {error}") from error
        if header.first_offset != expected:
            raise StorageFailure(
                f"segment {segment.name} byte {position}: chunk has offset "
                f"{header.first_offset}, expected {expected}"
            )
        return header

    def _locate(self, offset: Offset) -> tuple[int, int, ChunkHeader]:
        """(segment index, byte position, header) of the chunk holding written `offset`."""
        assert self.start_offset <= offset < self.end_offset, offset
        i = self._segment_index(offset)
        segment = self._segments[i]
        expected, position = segment.position_near(offset)
        reader = BlockReader(self._storage, segment.name, segment.size, READ_BLOCK_BYTES_MIN)
        while True:
            header = self._header_at(reader, segment, position, expected)
            if header.end_offset > offset:
                return i, position, header
            position += header.chunk_bytes
            expected = header.end_offset

    def _chunk_holding(self, offset: Offset) -> ChunkHeader:
        return self._locate(offset)[2]

    def _first_at_or_after(self, timestamp_ms: int) -> Offset:
        """Offset of the first record stamped at or after `timestamp_ms`; the end if none."""
        for segment in self._segments:
            if segment.last_timestamp_ms is None or segment.last_timestamp_ms < timestamp_ms:
                continue
            entry = segment.time_index.below(timestamp_ms)
            start = segment.base_offset if entry is None else Offset(segment.base_offset + entry[1])
            expected, position = segment.position_near(start)
            reader = BlockReader(self._storage, segment.name, segment.size, READ_BLOCK_BYTES_MIN)
            while position < segment.size:
                header = self._header_at(reader, segment, position, expected)
                if header.timestamp_ms >= timestamp_ms:
                    return header.first_offset
                position += header.chunk_bytes
                expected = header.end_offset
            raise AssertionError("segment.last_timestamp_ms promised a later chunk")
        return self.end_offset

    def resolve(self, spec: OffsetSpec, end: Offset | None = None) -> Offset:
        """Where a consumer attaching now with `spec` starts (within the durable log, or below
        `end` when given: a replica serves up to its commit point)."""
        first = self.start_offset
        end = self.durable_end if end is None else min(end, self.durable_end)
        end = max(end, first)
        kind = spec.kind
        if kind is OffsetSpecKind.FIRST:
            return first
        if kind is OffsetSpecKind.NEXT:
            return end
        if kind is OffsetSpecKind.LAST:
            return first if end == first else self._chunk_holding(Offset(end - 1)).first_offset
        if kind is OffsetSpecKind.OFFSET:
            return Offset(min(max(spec.value, first), end))
        if kind is OffsetSpecKind.RELATIVE:
            return Offset(max(first, end - spec.value))
        assert kind is OffsetSpecKind.TIMESTAMP, kind
        return Offset(min(self._first_at_or_after(spec.value), end))

    # ------------------------------------------------------------------ retention, truncation

    def apply_retention(self, now_ms: int, index_floor: int | None = None) -> int:
        """Delete the oldest sealed segments while any retention limit is passed: all their
        records are older than max_age_ms, or the log holds more than max_bytes or
        max_messages. Never deletes the active segment. Returns the segments deleted.

        With `index_floor` (a replica's durable commit index), never deletes the chunk with
        that Raft index nor any chunk after it: a restart needs its term."""
        retention = self._config.retention
        if retention.infinite:
            return 0
        total_bytes = sum(s.size for s in self._segments)
        total_messages = self.end_offset - self.start_offset
        deleted = 0
        while len(self._segments) > 1:
            oldest = self._segments[0]
            expired = (
                retention.max_age_ms is not None
                and oldest.last_timestamp_ms is not None
                and oldest.last_timestamp_ms < now_ms - retention.max_age_ms
            )
            too_big = retention.max_bytes is not None and total_bytes > retention.max_bytes
            too_many = (
                retention.max_messages is not None and total_messages > retention.max_messages
            )
            if not (expired or too_big or too_many):
                break
            if index_floor is not None:
                following = self._first_raft_index(self._segments[1])
                if following is None or following > index_floor:
                    break
            self._delete_segment(oldest)
            self._segments.pop(0)
            total_bytes -= oldest.size
            total_messages -= oldest.messages
            deleted += 1
        if deleted:
            self._sync_dir()
            self.counters.segments_deleted += deleted
        return deleted

    def _delete_segment(self, segment: Segment) -> None:
        # The segment first: if a crash interrupts, orphan indexes are cleaned up by `open`.
        names = [segment.name, segment.index_name, segment.time_index_name]
        if segment.base_offset in self._snapshots:
            self._snapshots.discard(segment.base_offset)
            names.append(file_name(segment.base_offset, PRODUCERS_SUFFIX))
        try:
            for name in names:
                self._storage.delete(name)
        except OSError as error:
            self.fail(f"deleting {segment.name} failed: {error}")
            raise StorageFailure(f"the disk refused a delete: {error}") from error

    def _sync_dir(self) -> None:
        try:
            self._storage.fsync_dir()
        except OSError as error:
            self.fail(f"directory fsync failed: {error}")
            raise StorageFailure(f"the disk refused a directory fsync: {error}") from error

    def truncate_from(self, offset: Offset) -> None:
        """Drop every record at and after `offset`, durably (for Raft log repair).

        Cutting inside a chunk keeps the chunk's earlier records, rewritten as a new chunk with
        the same timestamp and epoch. Cutting below the log start empties the log and starts
        it again at `offset`.
        """
        self._check_usable()
        if offset >= self.end_offset:
            return
        assert offset >= 0
        self._generation += 1
        storage = self._storage
        try:
            if offset <= self.start_offset:
                for segment in reversed(self._segments):
                    self._delete_segment(segment)
                fresh = Segment(offset, offset, 0, None, None)
                for name in (fresh.name, fresh.index_name, fresh.time_index_name):
                    storage.create(name)
                storage.fsync_dir()
                self._segments = [fresh]
                self.end_offset = self.durable_end = offset
                self.producers = ProducerTable(self._config.producer_names_max)
                self.offsets = OffsetTable(self._config.consumer_names_max)
                return
            i = self._segment_index(offset)
            _, position, header = self._locate(offset)
            keep: list[bytes] = []
            if header.first_offset < offset:
                view = self.read(header.first_offset, 0, end=header.end_offset)[0]
                keep = [bytes(r) for r in view.records[: offset - header.first_offset]]
            previous_timestamp_ms = (
                None
                if position == 0
                else self._chunk_holding(Offset(header.first_offset - 1)).timestamp_ms
            )
            segment = self._cut_tail(i, position, header)
            segment.last_timestamp_ms = previous_timestamp_ms
            if position == 0:
                segment.first_timestamp_ms = None
            self.end_offset = self.durable_end = header.first_offset
            if keep:
                self._append_chunk(keep, header.timestamp_ms, header.epoch)
            storage.fsync(segment.name)
            self.durable_end = self.end_offset
            self._rebuild_state()
        except OSError as error:
            self.fail(f"truncating at offset {offset} failed: {error}")
            raise StorageFailure(f"the disk refused a truncation: {error}") from error

    # ------------------------------------------------------------------ Raft indexes

    def _first_raft_index(self, segment: Segment) -> int | None:
        """Raft index of the segment's first chunk (one pread, cached in the segment)."""
        if segment.first_raft_index is None and segment.size > 0:
            try:
                segment.first_raft_index = (
                    chunk.decode_header(
                        self._storage.pread(segment.name, 0, chunk.HEADER_BYTES)
                    ).raft_index
                    or None
                )
            except ChunkError as error:
                raise StorageFailure(f"segment {segment.name}: {error}") from error
        return segment.first_raft_index

    def _scan_headers(self, i: int, position: int) -> list[tuple[int, ChunkHeader]]:
        """(position, header) of every chunk of segment `i` from `position` on."""
        return [(at, header) for at, header, _ in self._walk_headers(i, position)]

    def _walk_headers(
        self, i: int, position: int
    ) -> Iterator[tuple[int, ChunkHeader, BlockReader]]:
        """(position, header, the reader holding it) of each chunk of segment `i` from
        `position` on; StorageFailure where the headers stop making sense."""
        segment = self._segments[i]
        reader = BlockReader(self._storage, segment.name, segment.size, READ_BLOCK_BYTES_MIN)
        while position < segment.size:
            got = reader.get(position, chunk.HEADER_BYTES)
            try:
                if got is None:
                    raise ChunkError("file ends inside a chunk header")
                header = chunk.decode_header(got[0], got[1])
            except ChunkError as error:
                raise StorageFailure(f"segment {segment.name} byte {position}: {error}") from error
            yield position, header, reader
            position += header.chunk_bytes

    def first_raft_index(self) -> int | None:
        """Raft index of the first retained chunk; None when the log holds none."""
        for segment in self._segments:
            first = self._first_raft_index(segment)
            if first is not None:
                return first
        return None

    def _find_last_raft_index(self) -> int:
        for i in range(len(self._segments) - 1, -1, -1):
            segment = self._segments[i]
            if segment.last_raft_index is not None:
                return segment.last_raft_index
            if segment.size:
                indexed = segment.offset_index.last()
                headers = self._scan_headers(i, 0 if indexed is None else indexed[1])
                segment.last_raft_index = headers[-1][1].raft_index or None
                return headers[-1][1].raft_index
        return 0

    def locate_index(self, raft_index: int) -> tuple[int, int, ChunkHeader] | None:
        """(segment number, byte position, header) of the chunk with `raft_index`; None when
        it is not in the log (retained chunks only). Scans one segment's headers."""
        if raft_index <= 0 or raft_index > self.last_raft_index:
            return None
        i = len(self._segments) - 1
        while i >= 0:
            first = self._first_raft_index(self._segments[i])
            if first is not None and first <= raft_index:
                break
            i -= 1
        if i < 0:
            return None
        for position, header in self._scan_headers(i, 0):
            if header.raft_index == raft_index:
                return i, position, header
        return None

    def header_at_index(self, raft_index: int) -> ChunkHeader | None:
        found = self.locate_index(raft_index)
        return None if found is None else found[2]

    def chunks_from_index(self, raft_index: int, bytes_max: int) -> list[bytes]:
        """Raw bytes of the chunks from `raft_index` to the last written one, at most
        `bytes_max` of them (at least one); [] when `raft_index` is past the end. For handing
        a restarted Raft core its uncommitted entries. Raises StorageFailure when missing."""
        if raft_index > self.last_raft_index:
            return []
        found = self.locate_index(raft_index)
        if found is None:
            raise StorageFailure(f"Raft index {raft_index} is not in the partition log")
        i, position, _ = found
        out: list[bytes] = []
        total = 0
        while i < len(self._segments):
            segment = self._segments[i]
            for at, header in self._scan_headers(i, position):
                if out and total + header.chunk_bytes > bytes_max:
                    return out
                data = self._storage.pread(segment.name, at, header.chunk_bytes)
                try:
                    chunk.check_crc(data, 0, header)
                except ChunkError as error:
                    raise StorageFailure(f"segment {segment.name} byte {at}: {error}") from error
                out.append(data)
                total += header.chunk_bytes
            i += 1
            position = 0
        return out

    def _cut_tail(self, i: int, position: int, header: ChunkHeader) -> Segment:
        """Delete the segments after segment i and cut segment i at `position`, where the chunk
        `header` starts: file, offset index and time index. Timestamps are the caller's."""
        storage = self._storage
        for later in reversed(self._segments[i + 1 :]):
            self._delete_segment(later)
        del self._segments[i + 1 :]
        storage.fsync_dir()
        segment = self._segments[i]
        relative = header.first_offset - segment.base_offset
        segment.offset_index.cut(relative)
        time_index = segment.time_index
        while len(time_index) and time_index.values[-1] >= relative:
            time_index.keys.pop()
            time_index.values.pop()
        storage.truncate(segment.name, position)
        rewrite_indexes(storage, segment)
        segment.size = position
        segment.end_offset = header.first_offset
        return segment

    def truncate_from_index(self, raft_index: int) -> None:
        """Drop the chunk with `raft_index` and every later one, durably (Raft log repair)."""
        self._check_usable()
        found = self.locate_index(raft_index)
        if found is None:
            assert raft_index > self.last_raft_index, f"Raft index {raft_index} not retained"
            return
        i, position, header = found
        self._generation += 1
        storage = self._storage
        try:
            kept = [(at, h) for at, h in self._scan_headers(i, 0) if at < position]
            segment = self._cut_tail(i, position, header)
            records = [h for _, h in kept if h.record_count]
            segment.last_timestamp_ms = records[-1].timestamp_ms if records else None
            if not records:
                segment.first_timestamp_ms = None
            segment.last_raft_index = kept[-1][1].raft_index if kept else None
            if not kept:
                segment.first_raft_index = None
            storage.fsync(segment.name)
            self.end_offset = self.durable_end = header.first_offset
            self.last_raft_index = raft_index - 1
            self._chunks_synced = self.counters.chunks_appended
            self._rebuild_state()
        except OSError as error:
            self.fail(f"truncating at Raft index {raft_index} failed: {error}")
            raise StorageFailure(f"the disk refused a truncation: {error}") from error

    def transfer_manifest(self, raft_index: int) -> list[tuple[str, int]]:
        """The segment files (name, bytes) that hold every retained chunk up to and including
        `raft_index`, the last one cut just after it: what a wiped replica fetches. Durable
        data only; StorageFailure when `raft_index` is not retained."""
        found = self.locate_index(raft_index)
        if found is None:
            raise StorageFailure(f"Raft index {raft_index} is not retained here")
        i, position, header = found
        end = position + header.chunk_bytes
        assert header.end_offset <= self.durable_end or i < len(self._segments) - 1
        files = [(s.name, s.size) for s in self._segments[:i]] + [(self._segments[i].name, end)]
        for segment in self._segments[: i + 1]:
            if segment.base_offset in self._snapshots:
                snapshot = file_name(segment.base_offset, PRODUCERS_SUFFIX)
                files.append((snapshot, self._storage.size(snapshot)))
        return files

    def retains_file(self, name: str) -> bool:
        """Whether `name` is one of the log's segment or producer-snapshot files (retention
        deletes the oldest; a catch-up transfer asks for files a manifest named earlier)."""
        meaning = parse_name(name)
        return (
            meaning is not None
            and meaning[1] in (SEGMENT_SUFFIX, PRODUCERS_SUFFIX)
            and any(s.base_offset == meaning[0] for s in self._segments)
            and (meaning[1] != PRODUCERS_SUFFIX or meaning[0] in self._snapshots)
        )

    def read_file(self, name: str, position: int, length: int) -> bytes:
        """Bytes of one of the log's segment or producer-snapshot files (catch-up transfer);
        b"" past its end."""
        if not self.retains_file(name):
            raise StorageFailure(f"file {name} is no longer retained")
        return self._storage.pread(name, position, length)

    # ------------------------------------------------------------------ producers

    def _rebuild_state(self) -> None:
        """The producer and offset tables over every written chunk: the newest segment's
        snapshot (the state before it), then that segment's chunks and any after it. Without a
        snapshot (a log that has never rolled) every segment is replayed, from empty tables."""
        storage = self._storage
        table = ProducerTable(self._config.producer_names_max)
        offsets = OffsetTable(self._config.consumer_names_max)
        start = 0
        for i in range(len(self._segments) - 1, -1, -1):
            base = self._segments[i].base_offset
            if base in self._snapshots:
                name = file_name(base, PRODUCERS_SUFFIX)
                try:
                    data = storage.pread(name, 0, storage.size(name))
                    table, trailer = ProducerTable.decode(data, self._config.producer_names_max)
                    offsets = OffsetTable.decode(trailer, self._config.consumer_names_max)
                except (OSError, ProducerStateError, TrackingError) as error:
                    raise StorageFailure(f"partition-state snapshot {name}: {error}") from error
                start = i
                break
        self.producers = table
        self.offsets = offsets
        for i in range(start, len(self._segments)):
            self._replay_state(i)

    def _replay_state(self, i: int) -> None:
        """Note the producer or tracking section of every chunk of segment `i` that has one."""
        for position, header, reader in self._walk_headers(i, 0):
            if not header.flags & (chunk.FLAG_PRODUCER | chunk.FLAG_TRACKING):
                continue
            length = header.payload_length
            if not header.flags & chunk.FLAG_TRACKING:
                length = min(length, SECTION_BYTES_MAX)  # the section, not the records
            got = reader.get(position, chunk.HEADER_BYTES + length)
            try:
                if got is None:
                    raise ChunkError("file ends inside a producer or tracking section")
                self._note_state(got[0], got[1], header)
            except ChunkError as error:
                name = self._segments[i].name
                raise StorageFailure(f"segment {name} byte {position}: {error}") from error

    # ------------------------------------------------------------------ facts

    def info(self, end: Offset | None = None) -> LogInfo:
        first = self.start_offset
        end = self.durable_end if end is None else max(first, min(end, self.durable_end))
        first_ts = last_ts = None
        if end > first:
            first_ts = next(
                s.first_timestamp_ms for s in self._segments if s.first_timestamp_ms is not None
            )
            last_ts = self._chunk_holding(Offset(end - 1)).timestamp_ms
        return LogInfo(
            first,
            end,
            first_ts,
            last_ts,
            end - first,
            sum(s.size for s in self._segments),
            len(self._segments),
        )

    @property
    def segments(self) -> list[Segment]:
        """The segments, oldest first (read-only view for tests and stats)."""
        return list(self._segments)

    @property
    def config(self) -> LogConfig:
        return self._config

    def close(self) -> None:
        """Release the storage. Unsynced appends are not synced: call `sync` first."""
        self._storage.close()
