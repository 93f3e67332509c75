"""Offset-tracking state (ADR 0012): tracking chunks, the bounded offset table, its place in
the partition-state snapshot at segment rolls, and how the log keeps it across reopen,
truncation and retention. Over real files and SimDisk."""

from __future__ import annotations

import random

import crc32c
import pytest
from spate.core.ids import Offset
from spate.core.streams import Retention
from spate.node.log import LogConfig, PartitionLog
from spate.node.log import chunk as chunk_codec
from spate.node.log.producers import ProducerState, ProducerTable
from spate.node.log.tracking import (
    OffsetTable,
    TrackedOffset,
    TrackingError,
    decode_section,
    encode_section,
)
from support.log_disks import DiskUnderTest

SMALL = LogConfig(segment_bytes=1000, index_interval_bytes=200, consumer_names_max=3)


def offsets(log: PartitionLog) -> dict[bytes, int]:
    return {name: state.offset for name, state in log.offsets}


def track(log: PartitionLog, entries: list[tuple[bytes, int]], t: int = 1000) -> None:
    """A tracking chunk as the leader proposes it (the next Raft index)."""
    data = chunk_codec.encode_tracking(entries, log.end_offset, t, 1, log.last_raft_index + 1)
    log.append_chunk_bytes(data)


def records(log: PartitionLog, count: int, t: int = 1000) -> None:
    data = chunk_codec.encode_chunk(
        [b"m" * 60] * count, log.end_offset, t, 1, log.last_raft_index + 1
    )
    log.append_chunk_bytes(data)


def test_a_tracking_chunk_holds_offsets_and_no_record() -> None:
    entries = [(b"billing", 41), (b"audit", -1), (b"x" * 256, 2**62)]
    data = chunk_codec.encode_tracking(entries, Offset(42), 1234, 3, 17)
    header, views = chunk_codec.decode_chunk(data)
    assert header.flags == chunk_codec.FLAG_TRACKING and header.record_count == 0
    assert header.end_offset == 42 and views == []
    assert not chunk_codec.is_barrier(header)
    assert chunk_codec.tracking_section(data, 0, header) == entries
    section = encode_section(entries)
    assert decode_section(section, 0, len(section)) == entries
    for bad in (section[:-1], section + b"\x00", b"\x00\x00"):
        with pytest.raises(TrackingError):
            decode_section(bad, 0, len(bad))


def test_the_table_forgets_the_name_stored_least_recently() -> None:
    table = OffsetTable(2)
    for i, name in enumerate([b"a", b"b", b"a", b"c"]):
        table.note(name, TrackedOffset(i * 10, i + 1, 1, 1000 + i))
    assert [n for n, _ in table] == [b"a", b"c"] and table.evicted == 1
    assert list(OffsetTable.decode(table.encode(), 2)) == list(table)
    assert len(OffsetTable.decode(b"", 2)) == 0
    with pytest.raises(TrackingError):
        OffsetTable.decode(table.encode()[:-1], 2)


def test_the_snapshot_carries_producers_and_offsets_and_reads_version_1() -> None:
    producers = ProducerTable(4)
    producers.note(b"p", ProducerState(7, 3, 1, 1000, 99))
    table = OffsetTable(4)
    table.note(b"c", TrackedOffset(12, 4, 1, 1001))
    decoded, trailer = ProducerTable.decode(producers.encode(table.encode()), 4)
    assert list(decoded) == list(producers)
    assert list(OffsetTable.decode(trailer, 4)) == list(table)
    version_1 = bytearray(producers.encode())
    version_1[8] = 1  # the version byte; a version-1 file has no trailer
    body = bytes(version_1[8:])
    version_1[4:8] = crc32c.crc32c(body).to_bytes(4, "big")
    old, rest = ProducerTable.decode(bytes(version_1), 4)
    assert list(old) == list(producers) and len(rest) == 0


def test_offsets_survive_rolls_reopen_and_reads_skip_tracking_chunks(disk: DiskUnderTest) -> None:
    log = PartitionLog.open(disk.storage, SMALL)
    for round_ in range(8):  # several segments, each rolled with a snapshot
        records(log, 5)
        track(log, [(b"a", round_ * 5 + 4), (b"b", round_)])
    log.sync()
    assert len(log.segments) > 3
    expected = {b"a": 39, b"b": 7}
    assert offsets(log) == expected
    views = log.read(Offset(0), 1 << 20)
    assert [v.first_offset for v in views] == [5 * r for r in range(8)]
    assert sum(len(v.records) for v in views) == 40
    assert log.read(Offset(40), 1 << 20) == []  # a tracking chunk at the end holds no record
    log.close()
    reopened = PartitionLog.open(disk.restart(), SMALL)
    assert offsets(reopened) == expected
    assert reopened.offsets.get(b"b") == TrackedOffset(7, 16, 1, 1000)


def test_truncation_rolls_the_offsets_back(disk: DiskUnderTest) -> None:
    log = PartitionLog.open(disk.storage, SMALL)
    for k in range(6):
        records(log, 3)
        track(log, [(b"c", 3 * k + 2)])
    log.sync()
    assert offsets(log) == {b"c": 17}
    log.truncate_from_index(6)  # drops the tracking chunk of offset 8 and all after
    assert offsets(log) == {b"c": 5}
    log.close()
    assert offsets(PartitionLog.open(disk.restart(), SMALL)) == {b"c": 5}


def test_retention_keeps_the_offsets_of_deleted_segments(disk: DiskUnderTest) -> None:
    config = LogConfig(
        segment_bytes=1000, index_interval_bytes=200, retention=Retention(max_messages=10)
    )
    log = PartitionLog.open(disk.storage, config)
    records(log, 2)
    track(log, [(b"early", 1)])  # stored once, in the first segment only
    for _ in range(20):
        records(log, 3)
        track(log, [(b"late", log.end_offset - 1)])
    log.sync()
    assert log.apply_retention(now_ms=10_000) > 0 and log.start_offset > 2
    expected = {b"early": 1, b"late": log.end_offset - 1}
    assert offsets(log) == expected
    log.close()
    assert offsets(PartitionLog.open(disk.restart(), config)) == expected


@pytest.mark.parametrize("seed", range(6))
def test_the_table_equals_a_replay_of_every_tracking_chunk(disk: DiskUnderTest, seed: int) -> None:
    """Random names, flushes, rolls and reopen: the table is what reading all chunks gives."""
    rng = random.Random(seed)
    log = PartitionLog.open(disk.storage, SMALL)
    model = OffsetTable(SMALL.consumer_names_max)
    for step in range(60):
        if rng.random() < 0.5:
            records(log, rng.randint(1, 4))
        else:
            names = rng.sample([b"a", b"b", b"c", b"d", b"e"], rng.randint(1, 3))
            entries = [(n, rng.randint(-1, max(0, log.end_offset - 1))) for n in names]
            track(log, entries)
            for name, offset in entries:
                model.note(name, TrackedOffset(offset, log.last_raft_index, 1, 1000))
        if step % 17 == 16:
            log.sync()
            log.close()
            log = PartitionLog.open(disk.restart(), SMALL)
    assert list(log.offsets) == list(model)
