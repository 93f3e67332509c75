"""`spate dev up` gives every listener of a plan its own port (CI once met two listeners of
one node drawn the same free port: `address already in use` at start-up), from $SPATE_DEV_PORTS
when set."""

from __future__ import annotations

import itertools

import pytest
from spate.core.errors import InvalidArgument, Unavailable
from spate.server import devcluster
from support.ports import worker_port_range


def test_a_port_already_in_the_plan_is_never_drawn_again() -> None:
    taken: set[int] = set()
    for _ in range(500):
        port = devcluster._free_port(taken)
        assert port not in taken
        taken.add(port)


def test_no_free_port_left_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(devcluster.DEV_PORTS_ENV, raising=False)  # the suite sets it
    monkeypatch.setattr(devcluster, "dev_port_min", 20_000)
    monkeypatch.setattr(devcluster, "dev_port_max", 20_003)
    monkeypatch.setattr(devcluster, "_ephemeral_range", lambda: (32768, 60999))
    with pytest.raises(Unavailable, match="no free port"):
        devcluster._free_port({20_000, 20_001, 20_002})


def test_spate_dev_ports_bounds_every_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two clusters started at once (two xdist workers) each draw from a range of their own."""
    monkeypatch.setenv(devcluster.DEV_PORTS_ENV, "21000-21050")
    taken: set[int] = set()
    for _ in range(20):
        port = devcluster._free_port(taken)
        assert 21000 <= port < 21050
        taken.add(port)


@pytest.mark.parametrize("spec", ["21000", "21050-21000", "low-high", "0-10", "21000-70000"])
def test_a_malformed_spate_dev_ports_is_refused(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv(devcluster.DEV_PORTS_ENV, spec)
    with pytest.raises(InvalidArgument, match="SPATE_DEV_PORTS"):
        devcluster._free_port()


def test_each_xdist_worker_gets_its_own_slice_of_the_dev_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(devcluster.DEV_PORTS_ENV, raising=False)  # tests/conftest.py sets it
    slices = [worker_port_range(f"gw{i}", "4") for i in range(4)]
    assert slices[0][0] == devcluster.dev_port_min and slices[-1][1] <= devcluster.dev_port_max
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(slices))
    assert worker_port_range("", "") == (devcluster.dev_port_min, devcluster.dev_port_max)
    # two test runs side by side (worktrees) each give their own range: it is split instead
    monkeypatch.setenv(devcluster.DEV_PORTS_ENV, "24000-26000")
    assert [worker_port_range(f"gw{i}", "2") for i in range(2)] == [
        (24000, 25000),
        (25000, 26000),
    ]
