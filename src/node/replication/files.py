"""The files of one partition replica, as a port: real directories here, a simulated disk in
spate.sim (`SimReplicaFiles`), so RaftStore, the catch-up and the PartitionLog run unchanged
under the deterministic simulator.

A replica has three places (on real disk, `<data_dir>/partitions/<stream>/<partition>/`):

```
log/          the PartitionLog's segment and index files       -> `log_storage()`
catchup/      segment files being fetched from the leader       -> `staging()`
raft.state    the hard state, two fixed 64-byte slots            -> `open_state()`
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
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def pread(self, position: int, length: int) -> bytes:
        return os.pread(self._fd, length, position)

    def pwrite(self, position: int, data: bytes) -> None:
        os.pwrite(self._fd, data, position)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryFiles:
    """ReplicaFiles on a real directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def name(self) -> str:
        return str(self.directory)

    def log_storage(self) -> Storage:
        return FileStorage(self.directory / "log")

    def staging(self) -> Storage:
        return FileStorage(self.directory / "catchup")

    def open_state(self) -> tuple[SlotFile, bool]:
        path = self.directory / "raft.state"
        existed = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if not existed:
            _fsync_path(self.directory)
        return _FdSlotFile(fd), existed

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
