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

GC_ENV = "SPATE_GC"
THRESHOLDS = (50_000, 20, 20)
"""gen0 net allocations between young collections, then collections of the next generation
between older ones (Python's default: 700, 10, 10)."""


def after_startup() -> None:
    """With `$SPATE_GC=tuned`: freeze what startup built and raise the thresholds."""
    if os.environ.get(GC_ENV) != "tuned":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
