from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster import Cluster, running_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path / "cluster", nodes=1) as c:
        yield c


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path / "cluster3", nodes=3) as c:
        yield c
