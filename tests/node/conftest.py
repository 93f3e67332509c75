"""Fixtures shared by the partition-log tests: the same tests over real files and SimDisk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from spate.node.log.storage import FileStorage
from spate.sim.disk import SimDisk
from support.log_disks import DiskUnderTest


@pytest.fixture(params=["file", "sim"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DiskUnderTest]:
    if request.param == "file":
        under_test = DiskUnderTest("file", FileStorage(tmp_path / "log"), tmp_path / "log")
    else:
        sim = SimDisk(seed=7)
        under_test = DiskUnderTest("sim", sim, tmp_path, sim)
    yield under_test
    under_test.storage.close()
