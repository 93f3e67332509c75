"""Suite-wide hooks for running the tests in parallel with pytest-xdist (`make test` runs
`-n 2 --dist loadgroup`, see the Makefile).

- Each worker draws `spate dev up` ports (and the tests' own fixed ports, support.ports) from
  its own slice of the dev port range: two workers bringing up clusters at once would otherwise
  probe the same port free and the second node to bind it would fail, or a node restarted on
  its fixed port would find it taken by the other worker's cluster.
- The simulator sweeps run first (longest first), so they do not end the run on one worker.
- Hypothesis runs without its per-example deadline (tests never fail on timing).
- Tests marked `spark` share one JVM SparkSession per worker: they all go to one worker
  (`xdist_group("spark")`), so only one JVM runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from support.ports import worker_port_range

# Tests never fail on timing: hypothesis's default 200 ms deadline per example and its "too
# slow" health check did, on a loaded 2-core machine (tests/cluster/test_metadata_codec.py).
settings.register_profile(
    "spate", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("spate")

SPARK_GROUP = "spark"
SIM_TESTS = Path(__file__).parent / "sim"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "spark: runs on the Spark stage's shared JVM (all on one xdist worker)"
    )
    low, high = worker_port_range(
        os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    )
    # Child processes (`spate dev up`, test hosts) inherit it; see spate.server.devcluster.
    os.environ["SPATE_DEV_PORTS"] = f"{low}-{high}"


def pytest_itemcollected(item: pytest.Item) -> None:
    # Marked as each item is collected, before any pytest_collection_modifyitems: xdist's
    # worker reads the groups into the node ids in its own.
    if item.get_closest_marker("spark") is not None:
        item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # xdist sends a group to one worker by suffixing its tests' node ids with `@group` on the
    # worker; with pytest 9.2 that stopped taking effect and the groups were silently spread
    # over every worker (pytest-xdist issue 1386; pyproject.toml pins pytest below 9.2). Fail
    # the run rather than start a JVM per worker.
    if getattr(config.option, "loadgroup", False):
        lost = [
            i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid
        ]
        if lost:
            raise pytest.UsageError(f"--dist loadgroup lost the xdist_group of {lost[:3]}")
    # Longest first: the simulator sweeps are the suite's longest tests (10-45 s each, CPU
    # bound). Collected last, they ran as the last tests on one worker while the other sat
    # idle; first, the other worker takes the short tests meanwhile. Stable: order is kept
    # within each part.
    items.sort(key=lambda item: not item.path.is_relative_to(SIM_TESTS))
