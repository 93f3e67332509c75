"""A simulated disk for deterministic tests: spate.node.log.storage.Storage in memory.

It keeps two states of the one directory it models: what a reader sees now, and what would
survive a crash. `crash()` throws the first away and keeps the second, with the faults a real
disk allows after a power cut:

- file content written since the file's last `fsync` is lost;
- each file's last write (an append, or an overwrite in place by `write_at`), if not yet
  synced and if it starts within or right after the file's durable content, may survive in
  part: a prefix of it cut at a byte boundary chosen by the seeded `random.Random` (0 bytes =
  lost, all = fully written); earlier unsynced writes are lost;
- creations, deletions and renames since the last `fsync_dir` are undone.

Faults on demand: `fail_fsync = True` makes every fsync raise OSError(EIO) (after syncing
nothing), like a disk that has gone bad.

Everything is deterministic from the seed. It passes the same conformance suite as FileStorage
(tests/node/test_storage_conformance.py).
"""

from __future__ import annotations

import errno
import random
import threading
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""


@dataclass(frozen=True, slots=True)
class _Write:
    inode: _Inode
    position: int
    length: int


class SimDisk:
    """One simulated directory of files (see the module docstring for the crash model)."""

    def __init__(self, seed: int = 0) -> None:
        self.random = random.Random(seed)
        self._files: dict[str, _Inode] = {}
        self._durable_files: dict[str, _Inode] = {}
        self._last_writes: dict[int, _Write] = {}  # by id(inode), since its last fsync
        self._lock = threading.Lock()  # fsync may come from the partition shell's thread
        self.fail_fsync = False
        self.fsyncs = 0
        self.crashes = 0

    def _inode(self, name: str) -> _Inode:
        inode = self._files.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such simulated file", name)
        return inode

    def list(self) -> list[str]:
        with self._lock:
            return sorted(self._files)

    def create(self, name: str) -> None:
        assert name and "/" not in name, name
        with self._lock:
            if name in self._files:
                raise FileExistsError(errno.EEXIST, "simulated file exists", name)
            self._files[name] = _Inode()

    def append(self, name: str, data: bytes | memoryview) -> None:
        with self._lock:
            inode = self._inode(name)
            position = len(inode.data)
            inode.data += data
            self._last_writes[id(inode)] = _Write(inode, position, len(data))

    def write_at(self, name: str, position: int, data: bytes) -> None:
        """Overwrite (or extend) the file at `position` (not part of the Storage protocol: the
        hard-state file's slots, spate.node.replication.files.SlotFile). Writing past the end
        fills the gap with zeros, as pwrite does; the gap is part of the write."""
        assert position >= 0
        with self._lock:
            inode = self._inode(name)
            start = min(position, len(inode.data))
            data = bytes(position - start) + data
            inode.data[start : start + len(data)] = data
            self._last_writes[id(inode)] = _Write(inode, start, len(data))

    def adopt(self, other: SimDisk, name: str) -> None:
        """Move a file in from another simulated directory (a rename across directories):
        its content keeps its durability; the move itself is durable after both directories'
        `fsync_dir`."""
        assert other is not self
        with other._lock:
            inode = other._inode(name)
            del other._files[name]
        with self._lock:
            self._files[name] = inode

    def durable_copy(self) -> SimDisk:
        """A new disk holding exactly what would survive a crash now, without torn writes (for
        checkers that read a replica's synced state without disturbing it)."""
        copy = SimDisk()
        with self._lock:
            copy._files = {
                name: _Inode(bytearray(i.durable), i.durable)
                for name, i in self._durable_files.items()
            }
            copy._durable_files = dict(copy._files)
        return copy

    def pread(self, name: str, position: int, length: int) -> bytes:
        assert position >= 0 and length >= 0
        with self._lock:
            return bytes(self._inode(name).data[position : position + length])

    def size(self, name: str) -> int:
        with self._lock:
            return len(self._inode(name).data)

    def truncate(self, name: str, size: int) -> None:
        with self._lock:
            inode = self._inode(name)
            assert 0 <= size <= len(inode.data), "truncate never grows a file"
            del inode.data[size:]
            self._last_writes.pop(id(inode), None)

    def fsync(self, name: str) -> None:
        with self._lock:
            inode = self._inode(name)
            if self.fail_fsync:
                raise OSError(errno.EIO, "simulated fsync failure", name)
            self.fsyncs += 1
            inode.durable = bytes(inode.data)
            self._last_writes.pop(id(inode), None)

    def fsync_dir(self) -> None:
        with self._lock:
            if self.fail_fsync:
                raise OSError(errno.EIO, "simulated directory fsync failure")
            self.fsyncs += 1
            self._durable_files = dict(self._files)

    def delete(self, name: str) -> None:
        with self._lock:
            self._inode(name)
            del self._files[name]

    def rename(self, source: str, target: str) -> None:
        with self._lock:
            self._files[target] = self._inode(source)
            del self._files[source]

    def release(self, name: str) -> None:
        """Nothing to release in memory."""

    def close(self) -> None:
        """Nothing to close: the disk outlives its users, like a real one."""

    def crash(self) -> None:
        """Power cut: keep only what was durable, maybe with torn last writes."""
        with self._lock:
            self.crashes += 1
            self._files = dict(self._durable_files)
            for name in sorted(self._files):
                inode = self._files[name]
                torn = self._last_writes.get(id(inode))
                inode_data = inode.data
                inode.data = bytearray(inode.durable)
                if torn is not None and torn.position <= len(inode.durable):
                    kept = self.random.randint(0, torn.length)
                    # What reached the platter is there to stay.
                    start = torn.position
                    inode.data[start : start + kept] = inode_data[start : start + kept]
                    inode.durable = bytes(inode.data)
            self._last_writes = {}
