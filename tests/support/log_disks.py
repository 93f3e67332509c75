"""Storages for the partition-log tests: real files and SimDisk behind one face (tests/node)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spate.node.log.storage import FileStorage, Storage
from spate.sim.disk import SimDisk


@dataclass
class DiskUnderTest:
    """A storage plus how to "restart" on it: a new FileStorage on the same directory for
    real files (the OS keeps what was written), a crash for SimDisk (unsynced data is lost)."""

    kind: str
    storage: Storage
    directory: Path
    sim: SimDisk | None = None

    def restart(self) -> Storage:
        if self.sim is not None:
            self.sim.crash()
            return self.sim
        self.storage.close()
        self.storage = FileStorage(self.directory)
        return self.storage
