from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster import Cluster, running_cluster


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    """`spate dev up --nodes 3` (real processes); `spate dev down` afterwards."""
    with running_cluster(tmp_path / "cluster3", nodes=3) as c:
        yield c
