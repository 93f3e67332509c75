"""The cyclic garbage collector's policy in the server processes (issue 16, RESULTS §26).

The data path allocates and drops many short-lived container objects per message (record views,
runs, join tuples); almost none of them are in cycles and all are freed by reference counting,
but every 700 net allocations of tracked objects Python runs a young-generation collection, and
the older generations' collections traverse everything the process built at startup (modules,
proton, gRPC, the metadata state). After startup the server processes therefore move what they
hold into the permanent generation (`gc.freeze`) and collect the young generation less often.
Cycles are still collected, just later. `$SPATE_GC=default` keeps Python's own settings (for
A/B measurements).
"""

from __future__ import annotations

import gc
import os

GC_ENV = "SPATE_GC"
THRESHOLDS = (50_000, 20, 20)
"""gen0 net allocations between young collections, then collections of the next generation
between older ones (Python's default: 700, 10, 10)."""


def after_startup() -> None:
    """Freeze what startup built and raise the thresholds (unless `$SPATE_GC=default`)."""
    if os.environ.get(GC_ENV) == "default":
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
