"""The files of one partition replica, as a port: real directories here, a simulated disk in
spate.sim (`SimReplicaFiles`), so RaftStore, the catch-up and the PartitionLog run unchanged
under the deterministic simulator.

A replica has three places (on real disk, `<data_dir>/partitions/<stream>/<partition>/`):

```
log/          the PartitionLog's segment and index files       -> `log_storage()`
catchup/      segment files being fetched from the leader       -> `staging()`
raft.state    the hard state, fixed slots (no descriptor held     -> `open_state()`
              between a sync and the next write)
```

`log/` and `catchup/` are `spate.node.log.storage.Storage` (append-only files by name, with the
durability contract written there). The hard state needs one thing Storage does not offer,
overwriting bytes in place, so it gets its own small port, `SlotFile`: `pwrite` changes the
bytes at once for readers and survives a crash only after `sync()` (an unsynced pwrite may
survive in part, so HardStateFile checksums each slot).

`install_staged(names)` is the one operation spanning two places: with the log closed, replace
every file of `log/` by the named staged files and drop the rest of `catchup/`, durably
(renames, then directory fsyncs). The staged files must be synced first.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Protocol

from spate.node.log import FileStorage, Storage


class SlotFile(Protocol):
    def pread(self, position: int, length: int) -> bytes: ...

    def pwrite(self, position: int, data: bytes) -> None: ...

    def sync(self) -> None:
        """Make every pwrite so far durable. Raises OSError."""
        ...

    def release(self) -> None:
        """Nothing is pending: the file may give back its descriptor until the next pwrite
        (issue 16: 5,000 replicas would otherwise hold 5,000 descriptors for files written only
        at elections and commit points)."""
        ...

    def close(self) -> None: ...


class ReplicaFiles(Protocol):
    @property
    def name(self) -> str:
        """Where the files are, for messages (a path, or a simulated disk's name)."""
        ...

    def log_storage(self) -> Storage:
        """A fresh handle on `log/` (the PartitionLog closes it)."""
        ...

    def staging(self) -> Storage:
        """A fresh handle on `catchup/`, created if missing."""
        ...

    def open_state(self) -> tuple[SlotFile, bool]:
        """The hard-state file, and whether it existed (a new replica has none)."""
        ...

    def install_staged(self, names: list[str]) -> None:
        """Replace the log's files by these staged ones (see the module docstring)."""
        ...

    def remove(self) -> None:
        """Delete the replica's files (the partition was deleted)."""
        ...


class _FdSlotFile:
    """The hard-state file, its descriptor held only from a pwrite to its sync (or release).

    Holding it across that span matters: a writeback error is reported to descriptors open
    when it happens, so a sync through a descriptor opened after the pwrite could miss it.
    Between writes (an idle replica) no descriptor is held; a pwrite reopens the file."""

    def __init__(self, path: Path, fd: int) -> None:
        self._path = path
        self._fd: int | None = fd

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
        return self._fd

    def pread(self, position: int, length: int) -> bytes:
        return os.pread(self._open(), length, position)

    def pwrite(self, position: int, data: bytes) -> None:
        os.pwrite(self._open(), data, position)

    def sync(self) -> None:
        os.fdatasync(self._open())

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def close(self) -> None:
        self.release()


def fsync_path(path: Path) -> None:
    """fsync a directory (or file) by name. Raises OSError."""
    _fsync_path(path)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryFiles:
    """ReplicaFiles on a real directory.

    `defer_syncs=True` (opening many replicas at once, ADR 0031): the directories this object
    creates, and a new `raft.state`, are not fsynced here; `unsynced()` names the directories
    whose entries changed, which the caller fsyncs before the replica is used (before it can
    promise anything: a vote, an acknowledged entry)."""

    def __init__(self, directory: Path, *, defer_syncs: bool = False) -> None:
        self.directory = directory
        self._defer = defer_syncs
        self._unsynced: dict[Path, None] = {}
        missing = directory
        while not missing.exists() and missing.parent != missing:
            self._unsynced[missing.parent] = None  # its entry for `missing` is new
            missing = missing.parent
        directory.mkdir(parents=True, exist_ok=True)
        if not defer_syncs:
            self._unsynced.clear()

    @property
    def name(self) -> str:
        return str(self.directory)

    def log_storage(self) -> Storage:
        if self._defer and not (self.directory / "log").exists():
            self._unsynced[self.directory] = None  # its entry for `log/` is new
        return FileStorage(self.directory / "log")

    def staging(self) -> Storage:
        return FileStorage(self.directory / "catchup")

    def open_state(self) -> tuple[SlotFile, bool]:
        path = self.directory / "raft.state"
        existed = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if not existed:
            if self._defer:
                self._unsynced[self.directory] = None
            else:
                _fsync_path(self.directory)
        return _FdSlotFile(path, fd), existed

    def unsynced(self) -> list[Path]:
        """With `defer_syncs`: the directories to fsync before the replica is used (`log/` is
        the log's own: `PartitionLog.finish_open`); from now on every creation syncs as
        usual."""
        found = list(self._unsynced)
        self._defer = False
        self._unsynced.clear()
        return found

    def install_staged(self, names: list[str]) -> None:
        staging, log_dir = self.directory / "catchup", self.directory / "log"
        for name in os.listdir(log_dir):
            os.unlink(log_dir / name)
        for name in names:
            os.rename(staging / name, log_dir / name)
        _fsync_path(log_dir)
        shutil.rmtree(staging)
        _fsync_path(self.directory)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
