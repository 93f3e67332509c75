"""One replica process (tests/replication/replica_process.py) with the replication driver's
entry points timed: each call's loop-thread CPU (`time.thread_time_ns`, system time included)
is added to its entry point's total. At exit it writes `{node}.json` into `$SPATE_ENTRY_POINTS`:
the loop thread's and the process's CPU since start, and per entry point its calls and CPU ns.

Started by `replica_group(..., entry_points=DIR)` in place of replica_process.py (same
arguments); `replication_latency.py --entry-points DIR` prints the table (RESULTS §44). The
wrapping costs ~1 µs per call, counted inside the totals.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "replication"))

import replica_process  # noqa: E402
from spate.node.replication import driver, replica, storage, transport  # noqa: E402

ENTRY_POINTS: list[tuple[type, str, str]] = [
    (driver.ReplicationDriver, "receive", "driver.receive"),
    (driver.ReplicationDriver, "begin_batch", "driver.begin_batch"),
    (storage.RaftStore, "persist", "RaftStore.persist (in begin_batch)"),
    (driver.ReplicationDriver, "finish_batch", "driver.finish_batch"),
    (storage.RaftStore, "finish_sync", "RaftStore.finish_sync (in finish_batch)"),
    (driver.ReplicationDriver, "send_early", "driver.send_early"),
    (driver.ReplicationDriver, "tick", "driver.tick"),
    (transport.Transport, "flush", "transport.flush"),
    (replica.Replica, "propose", "Replica.propose"),
]

cpu_ns: Counter[str] = Counter()
calls: Counter[str] = Counter()


def timed(function: Callable[..., Any], label: str) -> Callable[..., Any]:
    clock = time.thread_time_ns

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return function(*args, **kwargs)
        finally:
            cpu_ns[label] += clock() - started
            calls[label] += 1

    return wrapper


def main() -> None:
    out_dir = Path(os.environ["SPATE_ENTRY_POINTS"])
    node = sys.argv[1]
    for owner, name, label in ENTRY_POINTS:
        setattr(owner, name, timed(getattr(owner, name), label))
    thread_started, process_started = time.thread_time_ns(), time.process_time_ns()

    def dump() -> None:
        report = {
            "node": node,
            "loop_thread_ns": time.thread_time_ns() - thread_started,
            "process_ns": time.process_time_ns() - process_started,
            "entry_points": {k: {"calls": calls[k], "cpu_ns": cpu_ns[k]} for k in cpu_ns},
        }
        (out_dir / f"{node}.json").write_text(json.dumps(report))

    atexit.register(dump)
    asyncio.run(replica_process.main())


if __name__ == "__main__":
    main()
