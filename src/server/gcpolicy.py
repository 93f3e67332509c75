"""The cyclic garbage collector's policy in the server processes (issue 16, RESULTS §26).

The data path allocates and drops many short-lived container objects per message (record views,
runs, join tuples); almost none of them are in cycles and all are freed by reference counting,
but every 700 net allocations of tracked objects Python runs a young-generation collection, and
the older generations' collections traverse everything the process built at startup (modules,
proton, gRPC, the metadata state). After startup the server processes therefore move what they
hold into the permanent generation (`gc.freeze`) and collect the young generation less often.
Cycles are still collected, just later.

Opt-in (`$SPATE_GC=tuned`): measured at load 9-18 (RESULTS §26) it made no difference at 100 B
and cost ~6% CPU per delivered message at 1 KiB (16.3 vs 15.4 µs), so Python's own settings stay
the default until a quiet machine says otherwise.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from spate.core.histogram import Histogram

GC_ENV = "SPATE_GC"
THRESHOLDS = (50_000, 20, 20)
"""gen0 net allocations between young collections, then collections of the next generation
between older ones (Python's default: 700, 10, 10)."""


class Pauses:
    """The wall time of the older generations' collections (issue 16, RESULTS §42): a
    collection holds the GIL from start to end, so the loop (and with it the node's liveness
    PINGs) stops for that long; with 5,000 replicas a full one is the loop's longest pause
    candidate. Young collections (every 700 net allocations) are not timed: one callback per
    collection is all they cost here."""

    __slots__ = ("_started", "seconds")

    def __init__(self) -> None:
        self.seconds = (Histogram(), Histogram())
        """Pauses of generation 1 and generation 2 collections."""
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = info["generation"]
        if generation == 0:
            return
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        else:
            self.seconds[generation - 1].observe(now - self._started)


PAUSES = Pauses()


def record_pauses() -> None:
    """Time the older generations' collections into `PAUSES` (idempotent)."""
    if PAUSES not in gc.callbacks:
        gc.callbacks.append(PAUSES)


FREEZE_GROWTH_REPLICAS = 256
"""Replicas opened since the last freeze after which the node freezes again (`after_opening`)."""


class Freezer:
    """Moves what a node holds once it has opened many replicas into the permanent generation
    (issue 16, RESULTS §42): at 5,000 replicas per node a full collection traversed them all,
    1-2 s under load, 3-5 times a minute, and each such stall of the loop was a node its peers
    heard nothing from. A collection first, so no garbage is frozen; frozen objects are still
    freed by reference counting, only cycles among them are not (a closed replica's)."""

    __slots__ = ("frozen_at",)

    def __init__(self) -> None:
        self.frozen_at = 0

    def after_opening(self, replicas: int) -> bool:
        """The node now hosts `replicas`; True when it froze."""
        if replicas - self.frozen_at < FREEZE_GROWTH_REPLICAS:
            self.frozen_at = min(self.frozen_at, replicas)
            return False
        gc.collect()
        gc.freeze()
        self.frozen_at = replicas
        return True


def after_startup() -> None:
    """With `$SPATE_GC=tuned`: freeze what startup built and raise the thresholds."""
    if os.environ.get(GC_ENV) != "tuned":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
