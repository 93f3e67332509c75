#!/usr/bin/env python3
"""The cost of the stream features of issue 8 on a three-node cluster (3-replica streams,
majority fsync before `accepted`), each against the plain path measured in the same run.

  dedup   W1 (200,000 x 100 B, 10,000 unsettled, native C client straight to the leader) as an
          unnamed producer, as a named one (link property spate:producer-name, an
          x-opt-publishing-id per message; ADR 0011), and as a control an unnamed producer
          whose messages carry the same annotation (same bytes, no deduplication), which splits
          the cost into the 36 bytes per message and the deduplication itself.
          Target: named within 10% of unnamed.

  python benchmarks/stream_features.py [--runs 3] [--count 200000] [--only dedup] [--out F]

Each run takes the cases in turn on fresh streams, alternating which goes first, so that a drift
in the machine's load does not favour one. Prints one JSON line per case and run, then medians
with the ratios named / unnamed and named / annotated and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import workload
from loadclient import BenchError, build_client, emit, loadavg, log

from cluster import Cluster

CASES = ("unnamed", "annotated", "named")


def dedup_run(c: Cluster, binary: Path, a: argparse.Namespace, run: int) -> list[dict[str, Any]]:
    turn = run % len(CASES)
    order = CASES[turn:] + CASES[:turn]  # each case leads in turn
    rows = []
    for case in order:
        stream = f"sf-{case}-{run}"
        c.create_stream(stream, replicas=3)
        host, port = c.amqp(c.leaders(stream)[0])
        w = workload.Workload(
            stream=stream, count=a.count, label=f"spate/cluster3/dedup-{case}/run{run}",
            producer_name="bench-producer" if case == "named" else None,
            annotate=case == "annotated",
        )  # fmt: skip
        r = workload.w1(binary, workload.Target(host=host, port=port, peer="spate"), w)
        r.update(case=case, run=run)
        emit(r, a.out)
        rows.append(r)
    return rows


def median(rows: list[dict[str, Any]], case: str, key: str) -> float | None:
    values = [
        float(r[key])
        for r in rows
        if r.get("case") == case and r.get(key) is not None and not r.get("error")
    ]
    return round(statistics.median(values), 2) if values else None


def dedup_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    s: dict[str, Any] = {"workload": "dedup_summary", "loadavg": loadavg()}
    for case in CASES:
        s[case] = {
            "w1_msgs_per_s": median(rows, case, "msgs_per_s"),
            "w1_confirm_p50_ms": median(rows, case, "confirm_p50_ms"),
            "w1_confirm_p99_ms": median(rows, case, "confirm_p99_ms"),
            "runs": sum(1 for r in rows if r.get("case") == case and not r.get("error")),
            "errors": [r["error"] for r in rows if r.get("case") == case and r.get("error")],
        }
    named, unnamed = s["named"]["w1_msgs_per_s"], s["unnamed"]["w1_msgs_per_s"]
    annotated = s["annotated"]["w1_msgs_per_s"]
    s["named_vs_unnamed"] = round(named / unnamed, 3) if named and unnamed else None
    s["named_vs_annotated"] = round(named / annotated, 3) if named and annotated else None
    return s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--count", type=int, default=workload.COUNT)
    p.add_argument("--only", choices=("dedup",), help="one benchmark (default: all)")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    binary = build_client()
    with Cluster(3) as c:
        rows: list[dict[str, Any]] = []
        for run in range(1, a.runs + 1):
            rows += dedup_run(c, binary, a, run)
        s = dedup_summary(rows)
        emit(s, a.out)
        log(
            f"dedup W1 medians of {a.runs}: unnamed {s['unnamed']['w1_msgs_per_s']} msgs/s "
            f"(p99 {s['unnamed']['w1_confirm_p99_ms']} ms), named "
            f"{s['named']['w1_msgs_per_s']} msgs/s (p99 {s['named']['w1_confirm_p99_ms']} ms), "
            f"annotated {s['annotated']['w1_msgs_per_s']} msgs/s; named/unnamed "
            f"{s['named_vs_unnamed']}, named/annotated {s['named_vs_annotated']}; "
            f"load {s['loadavg']}"
        )
    return 0


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent.parent)
    try:
        sys.exit(main())
    except BenchError as e:
        log(f"FAILED: {e}")
        sys.exit(1)
