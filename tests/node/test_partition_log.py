"""PartitionLog over real files and SimDisk: appends, segments, indexes, reads, specs, retention."""

from __future__ import annotations

import pytest
from spate.core.backend import ChunkView, OffsetSpec
from spate.core.errors import InvalidArgument, MessageSizeExceeded, StorageFailure
from spate.core.filtering import ValueFilter
from spate.core.ids import Offset
from spate.core.streams import Retention
from spate.node.log import LogConfig, PartitionLog
from spate.node.log import chunk as chunk_codec
from support.log_disks import DiskUnderTest

SMALL = LogConfig(segment_bytes=1000, index_interval_bytes=200)
"""10 records of 40 bytes make a 496-byte chunk: two chunks per segment."""


def record(offset: int) -> bytes:
    return f"{offset:08d}".encode() * 5  # 40 bytes, tells its own offset


def fill(
    log: PartitionLog, chunks: int, per_chunk: int = 10, *, t0: int = 1000, step_ms: int = 1000
) -> None:
    """Append `chunks` chunks; chunk k (from 1) is stamped t0 + (k - 1) * step_ms."""
    for k in range(chunks):
        start = log.end_offset
        log.append([record(start + i) for i in range(per_chunk)], t0 + k * step_ms)
    log.sync()


def flatten(views: list[ChunkView]) -> list[tuple[int, bytes]]:
    return [(v.first_offset + i, bytes(r)) for v in views for i, r in enumerate(v.records)]


def read_all(log: PartitionLog, start: int = 0) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = Offset(start)
    while True:
        views = log.read(offset, 10_000)
        if not views:
            return out
        got = [(o, r) for o, r in flatten(views) if o >= offset]
        out.extend(got)
        offset = Offset(got[-1][0] + 1)


def open_log(disk: DiskUnderTest, config: LogConfig = SMALL) -> PartitionLog:
    return PartitionLog.open(disk.storage, config)


def test_empty_log(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    assert log.end_offset == log.durable_end == 0
    assert log.read(Offset(0), 1000) == []
    for spec in (
        OffsetSpec.first(),
        OffsetSpec.last(),
        OffsetSpec.next(),
        OffsetSpec.timestamp(5),
        OffsetSpec.relative(3),
        OffsetSpec.offset(9),
    ):
        assert log.resolve(spec) == 0
    info = log.info()
    assert (info.messages, info.segments, info.first_timestamp_ms) == (0, 1, None)
    assert disk.storage.list() == [
        "00000000000000000000.index",
        "00000000000000000000.segment",
        "00000000000000000000.timeindex",
    ]


def test_append_returns_first_offset_and_reads_back(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    assert log.append([b"a", b"bb"], 10) == 0
    assert log.append([b"c"], 11) == 2
    assert log.end_offset == 3 and log.durable_end == 0
    assert log.read(Offset(0), 1000) == [], "unsynced chunks are not readable by default"
    assert len(log.read(Offset(0), 1000, end=log.end_offset)) == 2
    assert log.sync() == 3
    views = log.read(Offset(0), 1000)
    assert [(v.first_offset, v.timestamp_ms) for v in views] == [(0, 10), (2, 11)]
    assert flatten(views) == [(0, b"a"), (1, b"bb"), (2, b"c")]


def test_segments_roll_when_the_next_chunk_would_not_fit(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 5)
    segments = log.segments
    assert [s.base_offset for s in segments] == [0, 20, 40]
    assert [s.size for s in segments] == [992, 992, 496]
    assert all(s.size <= SMALL.segment_bytes for s in segments)
    assert "00000000000000000020.segment" in disk.storage.list()
    assert read_all(log) == [(i, record(i)) for i in range(50)]


def test_a_chunk_larger_than_a_segment_gets_a_segment_of_its_own(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    log.append([b"x" * 3000], 1)
    log.append([b"y"], 2)
    log.sync()
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert flatten(log.read(Offset(0), 10**6)) == [(0, b"x" * 3000), (1, b"y")]


def test_big_appends_are_split_at_the_chunk_limits(disk: DiskUnderTest) -> None:
    config = LogConfig(
        segment_bytes=1 << 20, chunk_records_max=7, chunk_bytes_max=1000, message_bytes_max=400
    )
    log = open_log(disk, config)
    assert log.append([record(i) for i in range(20)], 5) == 0
    assert log.append([b"z" * 400] * 3, 6) == 20
    log.sync()
    views = log.read(Offset(0), 10**6)
    assert [len(v.records) for v in views] == [7, 7, 6, 2, 1]
    assert all(chunk_codec.payload_bytes(v.records) <= 1000 for v in views)
    with pytest.raises(MessageSizeExceeded):
        log.append([b"z" * 401], 7)
    with pytest.raises(InvalidArgument):
        log.append([], 7)


def test_read_from_the_middle_of_a_chunk_starts_with_that_chunk(disk: DiskUnderTest) -> None:
    """The first chunk may begin before `start` (spate.core.backend.Partition.read)."""
    log = open_log(disk)
    fill(log, 5)
    views = log.read(Offset(23), 1)
    assert len(views) == 1 and views[0].first_offset == 20
    assert bytes(views[0].records[3]) == record(23)
    views = log.read(Offset(23), 2000)
    assert [v.first_offset for v in views] == [20, 30, 40]
    assert log.read(Offset(50), 2000) == []


def test_read_stops_at_max_bytes_but_returns_at_least_one_chunk(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 5)
    assert len(log.read(Offset(0), 0)) == 1
    assert len(log.read(Offset(0), 496 * 2)) == 2
    assert len(log.read(Offset(0), 496 * 2 - 1)) == 1


def test_read_end_bound_excludes_later_chunks(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 4)
    assert [v.first_offset for v in log.read(Offset(0), 10**6, end=Offset(25))] == [0, 10]


def test_offset_specs(disk: DiskUnderTest) -> None:
    """FIRST / LAST / NEXT / OFFSET / TIMESTAMP / RELATIVE as core/backend.py defines them."""
    log = open_log(disk)
    fill(log, 5, t0=1000, step_ms=1000)  # chunks at 0,10,..,40 stamped 1000..5000
    log.append([b"unsynced"], 9000)
    resolve = log.resolve
    assert resolve(OffsetSpec.first()) == 0
    assert resolve(OffsetSpec.last()) == 40, "first offset of the last committed chunk"
    assert resolve(OffsetSpec.next()) == 50, "the durable end, not the written end"
    assert resolve(OffsetSpec.offset(17)) == 17
    assert resolve(OffsetSpec.offset(10**9)) == 50
    assert resolve(OffsetSpec.timestamp(0)) == 0
    assert resolve(OffsetSpec.timestamp(1000)) == 0
    assert resolve(OffsetSpec.timestamp(1001)) == 10
    assert resolve(OffsetSpec.timestamp(3000)) == 20
    assert resolve(OffsetSpec.timestamp(4500)) == 40
    assert resolve(OffsetSpec.timestamp(5001)) == 50
    assert resolve(OffsetSpec.timestamp(9000)) == 50, "unsynced chunks are invisible"
    assert resolve(OffsetSpec.relative(5)) == 45
    assert resolve(OffsetSpec.relative(500)) == 0
    log.sync()
    assert resolve(OffsetSpec.timestamp(9000)) == 50
    assert resolve(OffsetSpec.last()) == 50


def test_timestamp_search_with_many_small_chunks(disk: DiskUnderTest) -> None:
    """Sparse time index plus a scan: every timestamp resolves to its exact chunk."""
    log = open_log(disk, LogConfig(segment_bytes=2000, index_interval_bytes=300))
    for k in range(200):
        log.append([b"m%d" % k], 10 * k)
    log.sync()
    for k in range(200):
        assert log.resolve(OffsetSpec.timestamp(10 * k)) == k
        assert log.resolve(OffsetSpec.timestamp(10 * k - 3)) == k


def test_timestamps_never_go_backwards(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    log.append([b"a"], 5000)
    log.append([b"b"], 4000)  # the clock stepped back
    log.sync()
    assert [v.timestamp_ms for v in log.read(Offset(0), 1000)] == [5000, 5000]


def test_indexes_are_rebuilt_when_deleted(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 9)
    storage = disk.storage
    indexes = {n: storage.pread(n, 0, 10**6) for n in storage.list() if "index" in n}
    assert len(indexes) == 10
    log.close()
    storage = disk.restart()
    for name in indexes:
        storage.delete(name)
    storage.fsync_dir()
    log = PartitionLog.open(storage, SMALL)
    assert len(log.recovery.rebuilt_indexes) == 5
    assert {n: storage.pread(n, 0, 10**6) for n in storage.list() if "index" in n} == indexes
    assert read_all(log) == [(i, record(i)) for i in range(90)]
    assert log.resolve(OffsetSpec.timestamp(7000)) == 60


def test_garbage_indexes_are_rebuilt(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 9)
    log.close()
    storage = disk.restart()
    for name in ("00000000000000000020.index", "00000000000000000040.timeindex"):
        storage.append(name, b"\xff" * 7)
        storage.fsync(name)
    storage.truncate("00000000000000000060.index", 0)
    storage.fsync("00000000000000000060.index")
    log = PartitionLog.open(storage, SMALL)
    assert {
        "00000000000000000020.segment",
        "00000000000000000040.segment",
        "00000000000000000060.segment",
    } <= set(log.recovery.rebuilt_indexes)
    assert read_all(log) == [(i, record(i)) for i in range(90)]


def test_orphan_index_files_are_removed(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 1)
    disk.storage.create("00000000000000000500.index")
    disk.storage.fsync_dir()
    log.close()
    log = PartitionLog.open(disk.restart(), SMALL)
    assert log.recovery.deleted_files == ["00000000000000000500.index"]


def test_reading_a_corrupt_chunk_is_a_storage_failure(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 5)
    name = "00000000000000000000.segment"
    data = bytearray(disk.storage.pread(name, 0, 10**6))
    data[600] ^= 0x40  # inside the second chunk's payload
    disk.storage.truncate(name, 0)
    disk.storage.append(name, bytes(data))
    assert len(log.read(Offset(0), 0)) == 1
    with pytest.raises(StorageFailure, match="CRC"):
        log.read(Offset(10), 0)


# ---------------------------------------------------------------- retention


def retained(log: PartitionLog) -> tuple[int, int]:
    return log.start_offset, len(log.segments)


def test_retention_infinite_keeps_everything(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 10)
    assert log.apply_retention(now_ms=10**15) == 0
    assert retained(log) == (0, 5)


def test_retention_by_message_count(disk: DiskUnderTest) -> None:
    """Whole segments go while the log holds more than max_messages (003 retention)."""
    log = open_log(disk, LogConfig(segment_bytes=1000, retention=Retention(max_messages=50)))
    fill(log, 10)  # 100 messages in 5 segments of 20
    assert log.apply_retention(now_ms=0) == 3
    assert retained(log) == (60, 2)
    assert log.resolve(OffsetSpec.first()) == 60
    assert read_all(log)[0] == (60, record(60))
    assert read_all(log, 0)[0][0] == 60, "reads below the log start begin at the first retained"


def test_retention_by_bytes(disk: DiskUnderTest) -> None:
    log = open_log(disk, LogConfig(segment_bytes=1000, retention=Retention(max_bytes=2000)))
    fill(log, 10)  # 4960 bytes: 992 per full segment
    assert log.apply_retention(now_ms=0) == 3
    assert log.info().bytes == 1984
    assert retained(log) == (60, 2)


def test_retention_by_age(disk: DiskUnderTest) -> None:
    """A segment goes once its newest record is older than max_age."""
    log = open_log(disk, LogConfig(segment_bytes=1000, retention=Retention(max_age_ms=5500)))
    fill(log, 10, t0=1000, step_ms=1000)  # segment i's newest chunk at 2000 * (i + 1)
    assert log.apply_retention(now_ms=9499) == 1  # 2000 < 3999
    assert log.apply_retention(now_ms=9500) == 0  # 4000 is not < 4000
    assert log.apply_retention(now_ms=9501) == 1
    assert log.apply_retention(now_ms=10**9) == 2, "never the active segment"
    assert retained(log) == (80, 1)


def test_retention_combined_whichever_limit_is_reached_first(disk: DiskUnderTest) -> None:
    both = Retention(max_age_ms=5500, max_messages=90)
    log = open_log(disk, LogConfig(segment_bytes=1000, retention=both))
    fill(log, 10, t0=1000, step_ms=1000)
    assert log.apply_retention(now_ms=0) == 1, "the count limit bites first"
    assert log.apply_retention(now_ms=12_000) == 2, "then the age limit"
    assert retained(log) == (60, 2)
    log.close()


def test_retention_survives_restart(disk: DiskUnderTest) -> None:
    log = open_log(disk, LogConfig(segment_bytes=1000, retention=Retention(max_messages=30)))
    fill(log, 10)
    log.apply_retention(now_ms=0)
    log.close()
    log = PartitionLog.open(disk.restart(), SMALL)
    assert retained(log) == (80, 1)
    assert read_all(log) == [(i, record(i)) for i in range(80, 100)]
    assert log.append([b"next"], 99_000) == 100


# ---------------------------------------------------------------- truncation


def test_truncate_at_a_chunk_boundary(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 9)
    log.truncate_from(Offset(30))
    assert log.end_offset == log.durable_end == 30
    assert [s.base_offset for s in log.segments] == [0, 20]
    assert read_all(log) == [(i, record(i)) for i in range(30)]
    assert log.append([b"new"], 1) == 30
    log.sync()
    log.close()
    log = PartitionLog.open(disk.restart(), SMALL)
    assert log.recovery.truncated_bytes == 0
    assert read_all(log)[-2:] == [(29, record(29)), (30, b"new")]


def test_truncate_inside_a_chunk_keeps_its_head(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 3, t0=1000)
    log.truncate_from(Offset(14))
    assert log.end_offset == 14
    views = log.read(Offset(10), 10**6)
    assert [(v.first_offset, v.timestamp_ms, len(v.records)) for v in views] == [(10, 2000, 4)]
    log.close()
    log = PartitionLog.open(disk.restart(), SMALL)
    assert read_all(log) == [(i, record(i)) for i in range(14)]


def test_truncate_at_a_segment_base_and_below_the_start(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 9)
    log.truncate_from(Offset(40))
    assert [s.base_offset for s in log.segments] == [0, 20, 40]
    assert log.segments[-1].size == 0
    assert log.resolve(OffsetSpec.last()) == 30
    log.truncate_from(Offset(0))
    assert log.end_offset == 0 and len(log.segments) == 1
    assert log.read(Offset(0), 100) == []
    log.close()
    log = PartitionLog.open(disk.restart(), SMALL)
    assert log.end_offset == 0


def test_info(disk: DiskUnderTest) -> None:
    log = open_log(disk)
    fill(log, 5, t0=100, step_ms=10)
    log.append([b"unsynced"], 1000)
    info = log.info()
    assert (info.first_offset, info.end_offset, info.messages, info.segments) == (0, 50, 50, 3)
    assert (info.first_timestamp_ms, info.last_timestamp_ms) == (100, 140)
    assert info.bytes == 5 * 496 + chunk_codec.HEADER_BYTES + 4 + len(b"unsynced")


def test_a_filtered_read_passes_over_chunks_without_the_values_and_marks_where(
    disk: DiskUnderTest,
) -> None:
    """ADR 0016: chunks carry a Bloom filter of their records' filter values; a read with
    `where` slices only the chunks it may want and ends with a skip mark past the others."""
    from proton import Message, symbol

    log = open_log(disk, LogConfig(segment_bytes=100_000))

    def tagged(value: str, k: int) -> bytes:
        message = Message(body=k, annotations={symbol("x-stream-filter-value"): value})
        return bytes(message.encode())

    for k in range(6):  # chunk k holds values "c<k>" only
        log.append([tagged(f"c{k}", 10 * k + i) for i in range(10)], 1000 + k)
    log.append([record(60 + i) for i in range(10)], 2000)  # no values: no section
    log.sync()
    views = log.read(Offset(0), 1 << 20)
    assert [v.filter is not None for v in views] == [True] * 6 + [False]
    wants = ValueFilter(frozenset({"c2"}))
    got = log.read(Offset(0), 1 << 20, where=wants.chunk_may_match)
    assert [(int(v.first_offset), len(v.records)) for v in got] == [(20, 10), (70, 0)]
    assert log.read(Offset(30), 1 << 20, where=wants.chunk_may_match) == [
        ChunkView(Offset(70), 2000, ())
    ]  # nothing but a mark: the reader moves on without records
    unfiltered = ValueFilter(frozenset({"c2"}), match_unfiltered=True)
    got = log.read(Offset(30), 1 << 20, where=unfiltered.chunk_may_match)
    assert [(int(v.first_offset), len(v.records)) for v in got] == [(60, 10)]
