"""Ports for tests that must name a listener's port before it binds (Raft peers, restarts).

Port 0 is always preferred; where a test needs a port known in advance it draws one the way
`spate dev up` does (spate.server.devcluster._free_port: outside the kernel's ephemeral range,
from $SPATE_DEV_PORTS), and under pytest-xdist each worker has its own slice of that range
(tests/conftest.py), so two workers never draw the same port.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from spate.server.devcluster import _dev_port_range, _free_port


def worker_port_range(worker: str, count: str) -> tuple[int, int]:
    """[low, high) for xdist worker `gwN` of `count` workers; the whole range outside xdist.

    The range split is $SPATE_DEV_PORTS when set (two test runs side by side on one machine,
    e.g. in two worktrees, each set their own), else the default dev range."""
    dev_low, dev_high = _dev_port_range()
    if not worker.startswith("gw") or not count:
        return dev_low, dev_high
    index, workers = int(worker.removeprefix("gw")), int(count)
    assert 0 <= index < workers, (worker, count)
    width = (dev_high - dev_low) // workers
    assert width >= 500, f"{workers} workers leave too few ports each ({width})"
    low = dev_low + index * width
    return low, low + width


def free_port(taken: Collection[int] = ()) -> int:
    """A port free now, not one of `taken`, that only this worker draws (a worker runs one test
    at a time)."""
    return _free_port(taken)


def port_picker() -> Callable[[], int]:
    """Draws ports that are free now and distinct from every port it drew before: a test that
    names several listeners before any binds must not get one port twice."""
    drawn: set[int] = set()

    def pick() -> int:
        port = free_port(drawn)
        drawn.add(port)
        return port

    return pick
