"""Planted-bug sweeps of the simulators: a bug is caught when any seed of a range reports it."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def until_caught(failures: Iterable[str], caught: Callable[[str], bool]) -> list[str]:
    """The failures of a lazy sweep (one per seed, "" for a clean seed) up to and including the
    first that `caught` accepts, or all of them when none does. `assert any(caught(f) for f in
    ...)` over the result asserts exactly what it asserts over the whole sweep; the seeds after
    the first catch would only cost time (a sweep is 20-100 seeds of 0.2-1 s each)."""
    seen: list[str] = []
    for failure in failures:
        seen.append(failure)
        if caught(failure):
            break
    return seen
