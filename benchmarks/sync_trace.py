#!/usr/bin/env python3
"""Where a replication batch spends its time (ADR 0036): reads the rows the node processes
wrote with $SPATE_SYNC_TRACE set (spate.node.replication.synctrace) and prints p50/p99 of each
step, leaders' batches and followers' batches apart.

  SPATE_SYNC_TRACE=/tmp/tr .venv/bin/python benchmarks/offset_commits.py --runs 1
  python benchmarks/sync_trace.py /tmp/tr [/tmp/tr2 ...] [--json]   (several: rows pooled)

Steps (milliseconds), for leaders' and followers' batches, those that synced and those that
did not (a follower applying a commit, a leader's commit-only batch) apart:

  wait      woken -> begin: from the first wake-up (a frame, a proposal) to the batch's start
            (a running batch's fsync, then the loop's turn)
  write     begin -> begun: `begin_batch` (writes, applies, a leader's Appends encoded)
  send      begun -> sent: the first flush (Appends on the sockets)
  hop_in    sent -> job_start: the hand-off to the fsync thread (0 inline)
  sync      job_start -> job_end: the fdatasyncs (and their Python)
  hop_out   job_end -> resumed: back to the driver loop (0 inline)
  finish    resumed -> finished: `finish_batch` (acks and votes queued, advance)
  ack       finished -> flushed: the second flush (acks on the sockets)
  batch     begin -> flushed
  woken_ack woken -> flushed: a frame that woke an idle driver to its batch's ack written
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spate.node.replication.synctrace import FIELDS

STEPS = (
    ("wait", "woken", "begin"),
    ("write", "begin", "begun"),
    ("send", "begun", "sent"),
    ("hop_in", "sent", "job_start"),
    ("sync", "job_start", "job_end"),
    ("hop_out", "job_end", "resumed"),
    ("finish", "resumed", "finished"),
    ("ack", "finished", "flushed"),
    ("batch", "begin", "flushed"),
    ("woken_ack", "woken", "flushed"),
)


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def read(directory: Path) -> list[dict[str, int]]:
    rows = []
    for path in sorted(directory.glob("sync-trace-*.tsv")):
        with path.open() as f:
            header = f.readline().rstrip("\n").split("\t")
            if tuple(header) != FIELDS:
                raise SystemExit(f"{path}: unexpected header {header}")
            for line in f:
                values = line.rstrip("\n").split("\t")
                if len(values) == len(FIELDS):  # a line cut by a kill is skipped
                    rows.append(dict(zip(FIELDS, map(int, values), strict=True)))
    return rows


def summarize(rows: list[dict[str, int]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "batches": len(rows),
        "inline_share": round(sum(r["inline"] for r in rows) / len(rows), 3) if rows else 0,
        "syncs_mean": round(sum(r["syncs"] for r in rows) / len(rows), 2) if rows else 0,
        "bytes_mean": round(sum(r["bytes"] for r in rows) / len(rows)) if rows else 0,
        "busy_p50": round(percentile(sorted(r["busy"] / 1000 for r in rows), 0.5), 2)
        if rows
        else 0,
    }
    for name, start, end in STEPS:
        values = sorted(
            (r[end] - r[start]) / 1e6 for r in rows if r[start] and r[end] and r[end] >= r[start]
        )
        if values:
            out[name] = {
                "p50": round(percentile(values, 0.5), 3),
                "p99": round(percentile(values, 0.99), 3),
                "mean": round(sum(values) / len(values), 3),
            }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("directory", type=Path, nargs="+")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    a = p.parse_args()
    rows = [row for directory in a.directory for row in read(directory)]
    if not rows:
        print(f"no trace rows in {a.directory}", file=sys.stderr)
        return 1
    result = {
        f"{role} {kind}": summarize(
            [
                r
                for r in rows
                if bool(r["leaders"]) == (role == "leader")
                and bool(r["syncs"]) == (kind == "synced")
            ]
        )
        for role in ("leader", "follower")
        for kind in ("synced", "no sync")
    }
    if a.json:
        print(json.dumps(result))
        return 0
    names = [name for name, _, _ in STEPS]
    print("| batches | n | inline | loop busy | " + " | ".join(names) + " |")
    print("|---" * (4 + len(names)) + "|")
    for kind, s in result.items():
        if not s["batches"]:
            continue
        cells = [
            f"{s[n]['p50']:.2f} / {s[n]['p99']:.2f} / {s[n]['mean']:.2f}" if n in s else "-"
            for n in names
        ]
        print(
            f"| {kind} | {s['batches']} | {s['inline_share']:.2f} | {s['busy_p50']:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    print("(ms, p50 / p99 / mean; leader = batches with a replica that leads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
