"""Crash recovery: torn and corrupt tails, SimDisk crashes, and a writer killed with SIGKILL."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from spate.core.errors import StorageFailure
from spate.core.ids import Offset
from spate.node.log import FileStorage, LogConfig, PartitionLog
from spate.node.log import chunk as chunk_codec
from spate.node.log.storage import Storage
from spate.sim.disk import SimDisk
from support.log_disks import DiskUnderTest

CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=200)
ACTIVE = "00000000000000000040.segment"
CHUNK_BYTES = 496


def record(offset: int) -> bytes:
    return f"{offset:08d}".encode() * 5


def write_log(storage: Storage, chunks: int = 5) -> PartitionLog:
    """Chunks of 10 records, 496 bytes each; with 5 chunks the active segment starts at 40."""
    log = PartitionLog.open(storage, CONFIG)
    for _ in range(chunks):
        start = log.end_offset
        log.append([record(start + i) for i in range(10)], 1000 + start)
    log.sync()
    return log


def all_records(log: PartitionLog) -> list[tuple[int, bytes]]:
    views = log.read(Offset(0), 10**9, end=log.end_offset)
    return [(v.first_offset + i, bytes(r)) for v in views for i, r in enumerate(v.records)]


def rewrite(storage: Storage, name: str, data: bytes) -> None:
    storage.truncate(name, 0)
    storage.append(name, data)
    storage.fsync(name)


def damage(storage: Storage, how: str) -> int:
    """Damage the active segment's last chunk (or tail); returns the bytes recovery must cut."""
    data = bytearray(storage.pread(ACTIVE, 0, 10**6))
    assert len(data) == CHUNK_BYTES
    if how == "flip-payload":
        data[300] ^= 0x01
    elif how == "flip-header":
        data[20] ^= 0x80  # first_offset, covered by the CRC
    elif how == "flip-crc":
        data[5] ^= 0xFF
    elif how == "cut-mid-header":
        del data[30:]
    elif how == "cut-mid-payload":
        del data[200:]
    elif how == "garbage":
        data += random.Random(3).randbytes(333)
        rewrite(storage, ACTIVE, bytes(data))
        return 333
    elif how == "next-chunk-torn":
        data += chunk_codec.encode_chunk([b"x" * 100], Offset(50), 1, 0)[:-1]
        rewrite(storage, ACTIVE, bytes(data))
        return chunk_codec.HEADER_BYTES + 100 + 4 - 1
    elif how == "wrong-offset":
        data += chunk_codec.encode_chunk([b"x"], Offset(99), 1, 0)
        rewrite(storage, ACTIVE, bytes(data))
        return chunk_codec.HEADER_BYTES + 5
    else:
        raise AssertionError(how)
    rewrite(storage, ACTIVE, bytes(data))
    return len(data)


@pytest.mark.parametrize(
    "how",
    [
        "flip-payload",
        "flip-header",
        "flip-crc",
        "cut-mid-header",
        "cut-mid-payload",
        "garbage",
        "next-chunk-torn",
        "wrong-offset",
    ],
)
def test_damaged_tail_is_cut_to_the_last_valid_chunk(disk: DiskUnderTest, how: str) -> None:
    write_log(disk.storage).close()
    storage = disk.restart()
    cut = damage(storage, how)
    log = PartitionLog.open(storage, CONFIG)
    intact = 50 if how in ("garbage", "next-chunk-torn", "wrong-offset") else 40
    assert log.recovery.truncated_bytes == cut
    assert log.end_offset == log.durable_end == intact
    assert all_records(log) == [(i, record(i)) for i in range(intact)]
    assert log.append([b"after"], 1) == intact
    log.sync()
    log.close()
    again = PartitionLog.open(disk.restart(), CONFIG)
    assert again.recovery.truncated_bytes == 0, "the cut itself was made durable"
    assert all_records(again)[-1] == (intact, b"after")


def test_damage_in_a_sealed_segment_refuses_to_open(disk: DiskUnderTest) -> None:
    """Sealed segments are fsynced whole before the next exists: no crash tears them."""
    write_log(disk.storage).close()
    storage = disk.restart()
    name = "00000000000000000020.segment"
    data = bytearray(storage.pread(name, 0, 10**6))
    data[-10] ^= 1
    rewrite(storage, name, bytes(data))
    with pytest.raises(StorageFailure, match="damaged"):
        PartitionLog.open(storage, CONFIG)


def test_a_lost_segment_in_the_middle_refuses_to_open(disk: DiskUnderTest) -> None:
    write_log(disk.storage).close()
    storage = disk.restart()
    storage.delete("00000000000000000020.segment")
    with pytest.raises(StorageFailure, match="do not follow on"):
        PartitionLog.open(storage, CONFIG)


@pytest.mark.parametrize("seed", range(40))
def test_simdisk_crash_loses_nothing_synced(seed: int) -> None:
    """Random appends, syncs, rolls and truncations, then a power cut at a random moment:
    everything below the durable end survives byte for byte; what survives beyond it is a
    prefix of what was written; the log then works on."""
    rng = random.Random(seed)
    disk = SimDisk(seed)
    config = LogConfig(
        segment_bytes=rng.choice([600, 1500, 10_000]), index_interval_bytes=rng.choice([100, 400])
    )
    written: dict[int, bytes] = {}
    for _round in range(3):
        log = PartitionLog.open(disk, config)
        assert all(written[o] == r for o, r in all_records(log)), "survivors are what we wrote"
        durable_before = log.end_offset
        for o in [o for o in written if o >= durable_before]:
            del written[o]
        for _step in range(rng.randint(1, 60)):
            action = rng.random()
            if action < 0.7:
                start = log.end_offset
                batch = [rng.randbytes(rng.randint(0, 120)) for _ in range(rng.randint(1, 8))]
                log.append(batch, 1000 + _step)
                written.update((start + i, r) for i, r in enumerate(batch))
            elif action < 0.95:
                log.sync()
            elif log.end_offset > log.start_offset:
                cut = rng.randint(log.start_offset, log.end_offset - 1)
                log.truncate_from(Offset(cut))
                for o in [o for o in written if o >= cut]:
                    del written[o]
        durable = log.durable_end
        disk.crash()
        recovered = PartitionLog.open(disk, config)
        survivors = all_records(recovered)
        assert [o for o, _ in survivors] == list(
            range(recovered.start_offset, recovered.end_offset)
        )
        assert recovered.end_offset >= durable
        assert all(written[o] == r for o, r in survivors)
        recovered.close()


def test_simdisk_tears_the_last_write() -> None:
    """A seed that tears the unsynced chunk mid-way: recovery cuts exactly the torn bytes."""
    for seed in range(50):
        disk = SimDisk(seed)
        write_log(disk, 2).close()
        log = PartitionLog.open(disk, CONFIG)
        log.append([b"torn?" * 50], 5)
        disk.crash()
        size = disk.size("00000000000000000020.segment")  # the chunk did not fit in segment 0
        if 0 < size < 56 + 254:
            recovered = PartitionLog.open(disk, CONFIG)
            assert recovered.recovery.truncated_bytes == size
            assert recovered.end_offset == 20
            return
    raise AssertionError("no seed tore the write")


# ---------------------------------------------------------------- kill -9

WRITER = Path(__file__).with_name("log_writer_process.py")


def load_writer_module() -> object:
    spec = importlib.util.spec_from_file_location("log_writer_process", WRITER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_writer_until_killed(directory: Path, acks_wanted: int) -> list[int]:
    """Start the writer, read acknowledged offsets until `acks_wanted`, then SIGKILL it."""
    process = subprocess.Popen(
        [sys.executable, str(WRITER), str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    acked: list[int] = []
    try:
        assert process.stdout is not None
        while len(acked) < acks_wanted:
            line = process.stdout.readline()
            if not line:
                raise AssertionError(
                    f"writer died: {process.stderr.read().decode()}"
                    if process.stderr
                    else "writer died"
                )
            acked.append(int(line))
        os.kill(process.pid, signal.SIGKILL)
        rest, _ = process.communicate(timeout=30)
        acked.extend(int(line) for line in rest.split())  # acks printed before the kill landed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    return acked


def test_kill_9_mid_append_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """A writer process appending in a loop is SIGKILLed three times; after each kill every
    offset it acknowledged (printed only after fsync returned) is there with its bytes,
    exactly once, in order."""
    writer = load_writer_module()
    record_at = writer.record  # type: ignore[attr-defined]
    config = writer.CONFIG  # type: ignore[attr-defined]
    directory = tmp_path / "partition"
    all_acked: list[int] = []
    for round_ in range(3):
        acked = run_writer_until_killed(directory, 400 * (round_ + 1))
        assert acked == sorted(acked) and len(set(acked)) == len(acked)
        all_acked.extend(acked)
        log = PartitionLog.open(FileStorage(directory), config)
        try:
            stored = all_records(log)
            assert [o for o, _ in stored] == list(range(log.end_offset)), "once each, in order"
            assert all(r == record_at(o) for o, r in stored), "each with its own bytes"
            assert max(all_acked) < log.end_offset, "every acknowledged offset is there"
            segments = len(log.segments)
        finally:
            log.close()
    assert segments > 3, "the writer rolled segments, so recovery saw sealed ones too"
