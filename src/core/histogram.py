"""A latency histogram with fixed buckets, pure (ADR 0023).

The node's hot paths (an fsync batch, a committed append) record into one of these: a bisect
and two additions, about 0.3 us, and no lock (everything runs on the process's loop thread, or
is handed back to it). The Prometheus adapter (spate.server.metrics) reads `buckets()` at scrape
time and exports them as a cumulative histogram; nothing here knows Prometheus.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Upper bounds in seconds: fsyncs on this machine's disk take 0.2-5 ms, appends committed by a
majority 1-20 ms, and anything past 5 s is a stall (the +Inf bucket)."""


class Histogram:
    """Counts of observations at or below each bound (not cumulative), then +Inf."""

    __slots__ = ("_bounds", "_counts", "count", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        assert list(bounds) == sorted(set(bounds)) and bounds, "bounds must increase"
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self.count += 1
        self.sum += value

    def buckets(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs ending with (inf, count), Prometheus' shape."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, count in zip((*self._bounds, float("inf")), self._counts, strict=True):
            total += count
            out.append((bound, total))
        assert total == self.count
        return out
