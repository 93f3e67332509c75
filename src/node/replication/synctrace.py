"""An opt-in trace of the driver loop's batches (ADR 0036): where one group commit spends its
time, for benchmarks (`benchmarks/sync_trace.py` reads it). Off unless $SPATE_SYNC_TRACE names
a directory; then each node process appends one line per batch that synced to
`<dir>/sync-trace-<node>.tsv` (the rows are kept in memory, at most `ROWS_MAX`, and written
every `DUMP_TICKS` ticks and on stop).

One row, tab-separated, `time.perf_counter_ns()` stamps (CLOCK_MONOTONIC: comparable between
the processes of one machine), 0 when a step did not happen:

| field | stamped |
|---|---|
| woken | first wake-up of the driver since the last batch began (a frame, a proposal, a tick) |
| begin | the driver loop takes the batch (`begin_batch` called) |
| begun | `begin_batch` returned (writes, a leader's Appends queued, commits applied) |
| sent | the first `Transport.flush` returned (the Appends on their sockets) |
| job_start | the syncs start: the fsync thread's job began, or inline on the loop thread |
| job_end | the syncs returned (on that thread) |
| resumed | the driver loop runs again after the syncs (the same as job_end inline) |
| finished | `finish_batch` returned (acks and votes queued, Readies advanced) |
| flushed | the second `Transport.flush` returned (the acks on their sockets) |
| syncs | SyncWorks in the batch (files to sync, one per replica) |
| bytes | entry bytes the batch wrote (`Batch.bytes_written`) |
| leaders | replicas in the batch that lead their group |
| inline | 1 when the syncs ran on the loop thread (ADR 0036), 0 on the fsync thread |
| busy | the loop thread's CPU share of the last tick (`ReplicationHost.loop_busy`), per mille |
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

TRACE_ENV = "SPATE_SYNC_TRACE"
"""A directory for the trace files; unset (production): no trace, no cost."""
FIELDS = (
    "woken",
    "begin",
    "begun",
    "sent",
    "job_start",
    "job_end",
    "resumed",
    "finished",
    "flushed",
    "syncs",
    "bytes",
    "leaders",
    "inline",
    "busy",
)
(
    WOKEN,
    BEGIN,
    BEGUN,
    SENT,
    JOB_START,
    JOB_END,
    RESUMED,
    FINISHED,
    FLUSHED,
    SYNCS,
    BYTES,
    LEADERS,
    INLINE,
    BUSY,
) = range(len(FIELDS))
ROWS_MAX = 200_000
"""Rows kept between two dumps; more are counted as dropped (a bounded buffer)."""
DUMP_TICKS = 20
"""Ticks between two dumps (one second at the default tick)."""

now_ns = time.perf_counter_ns


class SyncTrace:
    """Rows of one node process (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[tuple[int, ...]] = []
        self.dropped = 0
        self.row = [0] * len(FIELDS)
        """The batch being traced: the driver loop fills it in, then `end()`."""

    @classmethod
    def from_env(cls, node: str) -> SyncTrace | None:
        directory = os.environ.get(TRACE_ENV, "").strip()
        if not directory:
            return None
        Path(directory).mkdir(parents=True, exist_ok=True)
        path = Path(directory) / f"sync-trace-{node}.tsv"
        log.warning("tracing the replication batches of %s into %s ($%s)", node, path, TRACE_ENV)
        return cls(path)

    def end(self) -> None:
        """The current batch is done: keep its row, start a fresh one."""
        if len(self.rows) < ROWS_MAX:
            self.rows.append(tuple(self.row))
        else:
            self.dropped += 1
        self.row = [0] * len(FIELDS)

    def dump(self) -> None:
        rows, self.rows = self.rows, []
        if not rows:
            return
        new = not self.path.exists()
        with self.path.open("a") as out:
            if new:
                out.write("\t".join(FIELDS) + "\n")
            out.writelines("\t".join(map(str, row)) + "\n" for row in rows)
