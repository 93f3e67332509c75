"""The Storage contract (spate.node.log.storage), run over FileStorage and SimDisk alike."""

from __future__ import annotations

import pytest
from spate.node.log.storage import Storage
from support.log_disks import DiskUnderTest


def durable_file(storage: Storage, name: str, data: bytes) -> None:
    storage.create(name)
    storage.append(name, data)
    storage.fsync(name)
    storage.fsync_dir()


def test_create_append_read(disk: DiskUnderTest) -> None:
    s = disk.storage
    assert s.list() == []
    s.create("a")
    assert s.list() == ["a"]
    assert s.size("a") == 0
    s.append("a", b"hello ")
    s.append("a", memoryview(b"xworld")[1:])
    assert s.size("a") == 11
    assert s.pread("a", 0, 11) == b"hello world"
    assert s.pread("a", 6, 100) == b"world"
    assert s.pread("a", 11, 10) == b""
    assert s.pread("a", 50, 10) == b""


def test_list_is_sorted(disk: DiskUnderTest) -> None:
    for name in ("c", "a", "b"):
        disk.storage.create(name)
    assert disk.storage.list() == ["a", "b", "c"]


def test_create_existing_fails(disk: DiskUnderTest) -> None:
    disk.storage.create("a")
    with pytest.raises(FileExistsError):
        disk.storage.create("a")


def test_missing_files_fail(disk: DiskUnderTest) -> None:
    s = disk.storage
    with pytest.raises(FileNotFoundError):
        s.pread("nope", 0, 1)
    with pytest.raises(FileNotFoundError):
        s.size("nope")
    with pytest.raises(FileNotFoundError):
        s.append("nope", b"x")
    with pytest.raises(FileNotFoundError):
        s.delete("nope")
    with pytest.raises(FileNotFoundError):
        s.fsync("nope")


def test_truncate(disk: DiskUnderTest) -> None:
    s = disk.storage
    s.create("a")
    s.append("a", b"0123456789")
    s.truncate("a", 4)
    assert s.size("a") == 4
    s.append("a", b"xy")
    assert s.pread("a", 0, 100) == b"0123xy"
    s.truncate("a", 0)
    assert s.pread("a", 0, 100) == b""


def test_delete_and_rename(disk: DiskUnderTest) -> None:
    s = disk.storage
    s.create("a")
    s.append("a", b"A")
    s.create("b")
    s.append("b", b"B")
    s.rename("a", "b")
    assert s.list() == ["b"]
    assert s.pread("b", 0, 10) == b"A"
    s.rename("b", "c")
    s.append("c", b"C")
    assert s.pread("c", 0, 10) == b"AC"
    s.delete("c")
    assert s.list() == []


def test_synced_files_survive_a_restart(disk: DiskUnderTest) -> None:
    durable_file(disk.storage, "a", b"kept")
    storage = disk.restart()
    assert storage.list() == ["a"]
    assert storage.pread("a", 0, 10) == b"kept"
    storage.append("a", b"+more")
    assert storage.pread("a", 0, 20) == b"kept+more"


def test_synced_truncate_and_delete_survive_a_restart(disk: DiskUnderTest) -> None:
    durable_file(disk.storage, "a", b"0123456789")
    durable_file(disk.storage, "b", b"gone")
    disk.storage.truncate("a", 3)
    disk.storage.fsync("a")
    disk.storage.delete("b")
    disk.storage.fsync_dir()
    storage = disk.restart()
    assert storage.list() == ["a"]
    assert storage.pread("a", 0, 10) == b"012"


def test_synced_rename_survives_a_restart(disk: DiskUnderTest) -> None:
    durable_file(disk.storage, "tmp", b"new")
    durable_file(disk.storage, "final", b"old")
    disk.storage.rename("tmp", "final")
    disk.storage.fsync_dir()
    storage = disk.restart()
    assert storage.list() == ["final"]
    assert storage.pread("final", 0, 10) == b"new"


def test_large_write_and_read(disk: DiskUnderTest) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB
    disk.storage.create("big")
    disk.storage.append("big", data)
    assert disk.storage.pread("big", 0, len(data)) == data
    assert disk.storage.pread("big", 1_000_000, 5) == data[1_000_000:1_000_005]
