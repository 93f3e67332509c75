"""SimReplicaFiles: spate.node.replication.files.ReplicaFiles on simulated disks, so RaftStore,
the PartitionLog and the catch-up run in the simulator exactly as on a node.

One replica is three SimDisk directories (log, staging, state), each with the crash model of
disk.py: unsynced content lost, the last unsynced write possibly torn, directory changes undone
unless the directory was synced. A wiped replica is a new SimReplicaFiles (a replaced disk).

Every handle handed out (`log_storage()`, `staging()`, `open_state()`) is its own object that
refuses use once closed: invariant `closed-files-untouched` (a replica's files are closed by
the host once the syncs in flight have returned, `ReplicationHost.close_partition`; a batch
that still writes or syncs them touches files another replica object may own by then).
"""

from __future__ import annotations

import random
from typing import Any, cast

from spate.node.log import Storage
from spate.node.replication.files import SlotFile
from spate.sim.checker import InvariantViolation
from spate.sim.disk import SimDisk

STATE_FILE = "raft.state"


def _closed(name: str, what: str) -> InvariantViolation:
    return InvariantViolation("closed-files-untouched", f"{name}: {what} after its handle closed")


class _Handle:
    """A Storage handle on a SimDisk: the disk's methods until `close()`, then none."""

    def __init__(self, disk: SimDisk, name: str) -> None:
        self._disk = disk
        self._name = name
        self.closed = False

    def __getattr__(self, attribute: str) -> Any:
        if self.closed:
            raise _closed(self._name, attribute)
        return getattr(self._disk, attribute)

    def close(self) -> None:
        self.closed = True  # the simulated disk outlives its users


class _SimSlotFile:
    def __init__(self, disk: SimDisk, name: str) -> None:
        self._disk = disk
        self._name = name
        self.closed = False

    def _check(self, what: str) -> None:
        if self.closed:
            raise _closed(self._name, what)

    def pread(self, position: int, length: int) -> bytes:
        self._check("pread")
        return self._disk.pread(STATE_FILE, position, length)

    def pwrite(self, position: int, data: bytes) -> None:
        self._check("pwrite")
        self._disk.write_at(STATE_FILE, position, data)

    def sync(self) -> None:
        self._check("sync")
        self._disk.fsync(STATE_FILE)

    def release(self) -> None:
        """No descriptors to give back."""

    def close(self) -> None:
        self.closed = True  # the simulated disk outlives its users


class SimReplicaFiles:
    def __init__(self, name: str, rng: random.Random) -> None:
        self._name = name
        self.log = SimDisk(rng.getrandbits(64))
        self.staging_disk = SimDisk(rng.getrandbits(64))
        self.state = SimDisk(rng.getrandbits(64))

    @property
    def disks(self) -> tuple[SimDisk, SimDisk, SimDisk]:
        return self.log, self.staging_disk, self.state

    @property
    def name(self) -> str:
        return self._name

    def log_storage(self) -> Storage:
        return cast(Storage, _Handle(self.log, f"{self._name}/log"))

    def staging(self) -> Storage:
        return cast(Storage, _Handle(self.staging_disk, f"{self._name}/catchup"))

    def open_state(self) -> tuple[SlotFile, bool]:
        existed = STATE_FILE in self.state.list()
        if not existed:
            self.state.create(STATE_FILE)
            self.state.fsync_dir()
        return _SimSlotFile(self.state, f"{self._name}/raft.state"), existed

    def install_staged(self, names: list[str]) -> None:
        for name in self.log.list():
            self.log.delete(name)
        for name in names:
            self.log.adopt(self.staging_disk, name)
        self.log.fsync_dir()
        for name in self.staging_disk.list():
            self.staging_disk.delete(name)
        self.staging_disk.fsync_dir()

    def remove(self) -> None:
        for disk in self.disks:
            for name in disk.list():
                disk.delete(name)
            disk.fsync_dir()

    def crash(self) -> None:
        for disk in self.disks:
            disk.crash()

    def set_fail_fsync(self, failing: bool) -> None:
        for disk in self.disks:
            disk.fail_fsync = failing
