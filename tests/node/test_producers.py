"""Deduplication state (ADR 0011): producer sections in chunks, the bounded producer table,
its snapshots at segment rolls, and how the log keeps it across reopen, truncation, retention
and a catch-up transfer. Over real files and SimDisk."""

from __future__ import annotations

import random

import pytest
from spate.core.errors import StorageFailure
from spate.core.ids import Offset
from spate.core.streams import Retention
from spate.node.log import LogConfig, PartitionLog
from spate.node.log import chunk as chunk_codec
from spate.node.log.producers import (
    ProducerState,
    ProducerStateError,
    ProducerTable,
    encode_section,
    keep_new,
)
from support.log_disks import DiskUnderTest

SMALL = LogConfig(segment_bytes=1000, index_interval_bytes=200, producer_names_max=3)


def test_keep_new_drops_what_is_not_above_the_last_stored() -> None:
    assert keep_new([5, 6, 7], None).keep == [0, 1, 2]
    assert keep_new([5, 6, 7], 4).keep == [0, 1, 2]
    assert keep_new([5, 6, 7], 6).keep == [2]
    assert keep_new([5, 6, 7], 7).keep == []
    assert keep_new([0], None).keep == [0]  # 0 is a valid first id
    assert keep_new([3, 9], 5).last_id == 9


def test_a_chunk_carries_its_producer_section_and_readers_see_only_records() -> None:
    records = [b"alpha", b"", b"gamma" * 100]
    section = encode_section(b"orders-app", 2**64 - 1)
    data = chunk_codec.encode_chunk(records, Offset(40), 123, 2, 9, producer=section)
    header, views = chunk_codec.decode_chunk(data)
    assert header.flags == chunk_codec.FLAG_PRODUCER and header.record_count == 3
    assert [bytes(v) for v in views] == records
    assert chunk_codec.producer_section(data, 0, header) == (
        b"orders-app",
        2**64 - 1,
        len(section),
    )
    plain = chunk_codec.encode_chunk(records, Offset(40), 123, 2, 9)
    assert chunk_codec.decode_header(plain).flags == 0
    assert len(data) - len(plain) == len(section)


def test_the_table_forgets_the_name_written_least_recently() -> None:
    table = ProducerTable(3)
    for i, name in enumerate([b"a", b"b", b"c", b"a", b"d"]):
        table.note(name, ProducerState(i, i + 1, 1, 1000 + i, i))
    assert [name for name, _ in table] == [b"c", b"a", b"d"]  # b went: written least recently
    assert table.evicted == 1
    decoded, _ = ProducerTable.decode(table.encode(), 3)
    assert list(decoded) == list(table)
    assert [name for name, _ in ProducerTable.decode(table.encode(), 2)[0]] == [b"a", b"d"]


def test_a_damaged_snapshot_is_an_error_not_a_smaller_table() -> None:
    table = ProducerTable(10)
    table.note(b"p", ProducerState(7, 3, 1, 1000, 99))
    data = bytearray(table.encode())
    data[-3] ^= 0x40
    with pytest.raises(ProducerStateError, match="CRC"):
        ProducerTable.decode(bytes(data), 10)
    with pytest.raises(ProducerStateError):
        ProducerTable.decode(bytes(data[:-4]), 10)


def publish(log: PartitionLog, name: bytes, ids: list[int], t: int = 1000) -> None:
    log.append(
        [f"{name.decode()}-{i}".encode().ljust(40, b".") for i in ids], t, producer=(name, ids)
    )


def states(log: PartitionLog) -> dict[bytes, int]:
    return {name: state.last_id for name, state in log.producers}


def test_the_table_survives_rolls_reopen_and_a_crash(disk: DiskUnderTest) -> None:
    log = PartitionLog.open(disk.storage, SMALL)
    for round_ in range(8):  # several segments, each rolled with a snapshot
        publish(log, b"a", [round_ * 10 + k for k in range(5)])
        publish(log, b"b", [round_])
    log.append([b"x" * 40], 2000)  # an unnamed chunk changes nothing
    log.sync()
    assert len(log.segments) > 3
    expected = {b"a": 74, b"b": 7}
    assert states(log) == expected
    names = disk.storage.list()
    assert sum(n.endswith(".producers") for n in names) == len(log.segments) - 1
    log.close()
    reopened = PartitionLog.open(disk.restart(), SMALL)
    assert states(reopened) == expected
    assert [n for n, _ in reopened.producers] == [b"a", b"b"]  # order kept: b wrote last


def test_truncation_rolls_the_table_back(disk: DiskUnderTest) -> None:
    log = PartitionLog.open(disk.storage, SMALL)
    for k in range(6):
        section = encode_section(b"p", k)
        data = chunk_codec.encode_chunk(
            [b"r" * 300], log.end_offset, 1000, 1, k + 1, producer=section
        )
        log.append_chunk_bytes(data)
    log.sync()
    assert states(log) == {b"p": 5} and len(log.segments) >= 3
    log.truncate_from_index(3)  # drops the chunks of ids 2.. (Raft repair)
    assert states(log) == {b"p": 1}
    assert log.producers.get(b"p") == ProducerState(1, 2, 1, 1000, 1)
    log.close()
    assert states(PartitionLog.open(disk.restart(), SMALL)) == {b"p": 1}


def test_retention_keeps_the_state_of_deleted_segments(disk: DiskUnderTest) -> None:
    config = LogConfig(
        segment_bytes=1000,
        index_interval_bytes=200,
        retention=Retention(max_messages=10),
    )
    log = PartitionLog.open(disk.storage, config)
    publish(log, b"early", [41])  # written once, in the first segment only
    for k in range(30):
        publish(log, b"late", [k])
    log.sync()
    assert log.apply_retention(now_ms=10_000) > 0
    assert log.start_offset > 0
    assert states(log) == {b"early": 41, b"late": 29}
    listed = disk.storage.list()
    bases = {n.split(".")[0] for n in listed if n.endswith(".segment")}
    assert {n.split(".")[0] for n in listed if n.endswith(".producers")} <= bases
    log.close()
    assert states(PartitionLog.open(disk.restart(), config)) == {b"early": 41, b"late": 29}


def test_the_transfer_manifest_carries_the_snapshots(disk: DiskUnderTest) -> None:
    log = PartitionLog.open(disk.storage, SMALL)
    for k in range(12):
        data = chunk_codec.encode_chunk(
            [b"r" * 300], log.end_offset, 1000, 1, k + 1, producer=encode_section(b"p", k)
        )
        log.append_chunk_bytes(data)
    log.sync()
    files = log.transfer_manifest(10)
    snapshots = [name for name, _ in files if name.endswith(".producers")]
    assert snapshots and all(log.read_file(n, 0, 4) == b"SPPT" for n in snapshots)
    with pytest.raises(StorageFailure):
        log.read_file("00000000000000000000.producers", 0, 4)  # the first segment has none


def test_a_damaged_snapshot_fails_the_open_loudly(disk: DiskUnderTest) -> None:
    log = PartitionLog.open(disk.storage, SMALL)
    for k in range(20):
        publish(log, b"p", [k])
    log.sync()
    last = sorted(n for n in disk.storage.list() if n.endswith(".producers"))[-1]
    log.close()
    storage = disk.restart()
    size = storage.size(last)
    storage.truncate(last, size - 2)
    storage.fsync(last)
    with pytest.raises(StorageFailure, match="producer snapshot"):
        PartitionLog.open(storage, SMALL)


@pytest.mark.parametrize("seed", range(5))
def test_the_table_equals_a_replay_of_every_chunk(disk: DiskUnderTest, seed: int) -> None:
    """Random names, batches, rolls and reopen: the table is what reading all chunks gives."""
    rng = random.Random(seed)
    log = PartitionLog.open(disk.storage, SMALL)
    model = ProducerTable(SMALL.producer_names_max)
    last: dict[bytes, int] = {}
    for _ in range(60):
        name = rng.choice([b"a", b"b", b"c", b"d", b"e"])
        start = last.get(name, -1) + 1 + rng.randrange(3)
        ids = list(range(start, start + rng.randrange(1, 4)))
        last[name] = ids[-1]
        at = log.end_offset
        publish(log, name, ids)
        model.note(name, ProducerState(ids[-1], 0, 0, 1000, at + len(ids) - 1))
        if rng.random() < 0.1:
            log.sync()
            log.close()
            log = PartitionLog.open(disk.restart(), SMALL)
    assert list(log.producers) == list(model)
