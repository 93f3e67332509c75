"""The Storage port: flat files by name in one directory, and its real implementation.

The partition log does all its I/O through this protocol, so the same log code runs on real
files (`FileStorage`) and on the simulated disk (`spate.sim.disk.SimDisk`), and both must pass
tests/node/test_storage_conformance.py.

Durability contract (what every implementation promises, and what the log relies on):
- `append` and `truncate` change the file at once for readers, but survive a crash only after
  `fsync(name)` returns. An unsynced append may survive partly (a torn write).
- `create`, `delete` and `rename` change the directory at once, but survive a crash only after
  `fsync_dir()` returns.
- Failures are OSError subclasses: FileNotFoundError for a missing file, FileExistsError when
  `create` finds the name taken, any other OSError (EIO, ENOSPC) from the disk.

Thread safety: `fsync` may be called from another thread while the owner appends (the partition
shell runs fsync in an executor); every other call comes from the owner's thread.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Protocol


class Storage(Protocol):
    def list(self) -> list[str]:
        """Names of the files in the directory, sorted."""
        ...

    def create(self, name: str) -> None:
        """Create an empty file; FileExistsError when it exists."""
        ...

    def append(self, name: str, data: bytes | memoryview) -> None:
        """Write `data` at the end of the file."""
        ...

    def pread(self, name: str, position: int, length: int) -> bytes:
        """Up to `length` bytes from `position`; shorter only at the end of the file."""
        ...

    def size(self, name: str) -> int: ...

    def truncate(self, name: str, size: int) -> None:
        """Cut the file to `size` bytes (never grows it)."""
        ...

    def fsync(self, name: str) -> None:
        """Make the file's content durable."""
        ...

    def fsync_dir(self) -> None:
        """Make creations, deletions and renames so far durable."""
        ...

    def delete(self, name: str) -> None: ...

    def rename(self, source: str, target: str) -> None:
        """Atomically rename, replacing `target` if it exists."""
        ...

    def release(self, name: str) -> None:
        """Drop any handle kept for the file (a hint; the next use reopens it)."""
        ...

    def close(self) -> None:
        """Release handles; the storage is not used afterwards."""
        ...


class FileStorage:
    """Storage on a real directory with os.open/os.write/os.pread/os.fdatasync.

    One O_RDWR|O_APPEND descriptor per file is opened on first use and kept until the file is
    deleted or renamed or the storage is closed (a partition has a handful of segments open at
    a time; sealed segments are closed by the log through `release`).
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()  # guards _fds against the fsync thread
        self._closed = False

    @property
    def directory(self) -> Path:
        return self._directory

    def _path(self, name: str) -> str:
        assert name and "/" not in name and name not in (".", ".."), name
        return os.path.join(self._directory, name)

    def _fd(self, name: str) -> int:
        assert not self._closed, "storage used after close"
        with self._lock:
            fd = self._fds.get(name)
            if fd is None:
                fd = os.open(self._path(name), os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
                self._fds[name] = fd
            return fd

    def _forget(self, name: str) -> None:
        with self._lock:
            fd = self._fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def list(self) -> list[str]:
        return sorted(entry.name for entry in os.scandir(self._directory) if entry.is_file())

    def create(self, name: str) -> None:
        fd = os.open(
            self._path(name), os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644
        )
        with self._lock:
            self._fds[name] = fd

    def append(self, name: str, data: bytes | memoryview) -> None:
        fd = self._fd(name)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def pread(self, name: str, position: int, length: int) -> bytes:
        assert position >= 0 and length >= 0
        fd = self._fd(name)
        data = os.pread(fd, length, position)
        if len(data) == length or not data:
            return data
        parts = [data]  # a short read before the end of the file: keep reading
        got = len(data)
        while got < length:
            more = os.pread(fd, length - got, position + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def size(self, name: str) -> int:
        return os.fstat(self._fd(name)).st_size

    def truncate(self, name: str, size: int) -> None:
        assert size >= 0
        fd = self._fd(name)
        assert size <= os.fstat(fd).st_size, "truncate never grows a file"
        os.ftruncate(fd, size)

    def fsync(self, name: str) -> None:
        # A private duplicate so that a concurrent delete/rename/close cannot pull the
        # descriptor away while this thread syncs it.
        with self._lock:
            shared = self._fds.get(name)
            fd = os.dup(shared) if shared is not None else None
        if fd is None:
            fd = os.open(self._path(name), os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def fsync_dir(self) -> None:
        fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        self._forget(name)
        os.unlink(self._path(name))

    def rename(self, source: str, target: str) -> None:
        self._forget(source)
        self._forget(target)
        os.rename(self._path(source), self._path(target))

    def release(self, name: str) -> None:
        """Close the file's descriptor (it is reopened on next use)."""
        self._forget(name)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
            self._closed = True
        for fd in fds:
            os.close(fd)
