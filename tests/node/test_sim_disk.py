"""SimDisk's crash model, beyond the Storage conformance suite it shares with FileStorage."""

from __future__ import annotations

import pytest
from spate.sim.disk import SimDisk


def synced(disk: SimDisk, name: str, data: bytes) -> None:
    disk.create(name)
    disk.append(name, data)
    disk.fsync(name)
    disk.fsync_dir()


def test_unsynced_appends_are_lost_but_the_last_may_tear() -> None:
    sizes = set()
    for seed in range(30):
        disk = SimDisk(seed)
        synced(disk, "f", b"durable|")
        disk.append("f", b"lost|")
        disk.append("f", b"maybe-torn")
        disk.crash()
        data = disk.pread("f", 0, 100)
        assert data == b"durable|", "the last write does not follow the durable content"
        disk = SimDisk(seed)
        synced(disk, "f", b"durable|")
        disk.append("f", b"0123456789")
        disk.crash()
        data = disk.pread("f", 0, 100)
        assert data == b"durable|" + b"0123456789"[: len(data) - 8]
        sizes.add(len(data))
    assert len(sizes) > 5, "tears land at many byte boundaries"


def test_the_same_seed_tears_the_same_way() -> None:
    def run(seed: int) -> bytes:
        disk = SimDisk(seed)
        synced(disk, "f", b"")
        disk.append("f", bytes(range(200)))
        disk.crash()
        return disk.pread("f", 0, 1000)

    assert [run(s) for s in range(10)] == [run(s) for s in range(10)]


def test_directory_changes_need_a_directory_fsync() -> None:
    disk = SimDisk(1)
    synced(disk, "kept", b"k")
    synced(disk, "doomed", b"d")
    disk.create("new")
    disk.fsync("new")
    disk.delete("doomed")
    disk.rename("kept", "renamed")
    disk.crash()
    assert disk.list() == ["doomed", "kept"]
    assert disk.pread("doomed", 0, 10) == b"d"


def test_a_synced_truncation_survives_and_an_unsynced_one_does_not() -> None:
    disk = SimDisk(2)
    synced(disk, "f", b"0123456789")
    disk.truncate("f", 5)
    disk.crash()
    assert disk.pread("f", 0, 100) == b"0123456789"
    disk.truncate("f", 5)
    disk.fsync("f")
    disk.crash()
    assert disk.pread("f", 0, 100) == b"01234"


def test_failing_fsync() -> None:
    disk = SimDisk(3)
    synced(disk, "f", b"x")
    disk.fail_fsync = True
    disk.append("f", b"y")
    with pytest.raises(OSError, match="simulated"):
        disk.fsync("f")
    with pytest.raises(OSError, match="simulated"):
        disk.fsync_dir()
