#!/usr/bin/env python3
"""The cost of the stream features of issue 8 on a three-node cluster (3-replica streams,
majority fsync before `accepted`), each against the plain path measured in the same run.

  dedup   W1 (200,000 x 100 B, 10,000 unsettled, native C client straight to the leader) as an
          unnamed producer, as a named one (link property spate:producer-name, an
          x-opt-publishing-id per message; ADR 0011), and as a control an unnamed producer
          whose messages carry the same annotation (same bytes, no deduplication), which splits
          the cost into the 36 bytes per message and the deduplication itself.
          Target: named within 10% of unnamed.

  super   W1 to a super stream of 3 partitions (3-replica partition streams, hash routing by
          the event-streams-group-key annotation, one key per message; ADR 0014) from a producer
          on one node, which appends to the partition it leads and relays the others to their
          leaders, against W1 to a plain one-partition stream on its leader, and a control: the
          plain stream with the same annotation (same bytes, no routing).

  python benchmarks/stream_features.py [--runs 3] [--count 200000] [--only dedup|super]
                                      [--out F]

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
SUPER_CASES = ("plain", "keyed", "super")


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


def super_run(c: Cluster, binary: Path, a: argparse.Namespace, run: int) -> list[dict[str, Any]]:
    turn = run % len(SUPER_CASES)
    order = SUPER_CASES[turn:] + SUPER_CASES[:turn]
    rows = []
    for case in order:
        name = f"ss-{case}-{run}"
        if case == "super":
            partitions = c.create_super_stream(name, partitions=3, replicas=3)
            for stream in partitions:
                c.leaders(stream)  # every partition has a live leader before the clock starts
            host, port = c.amqp(c.node_ids()[0])
        else:
            c.create_stream(name, replicas=3)
            host, port = c.amqp(c.leaders(name)[0])
        w = workload.Workload(
            stream=name, count=a.count, label=f"spate/cluster3/super-{case}/run{run}",
            group_keys=case != "plain",
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


def summary(
    rows: list[dict[str, Any]], name: str, cases: tuple[str, ...], ratios: list[tuple[str, str]]
) -> dict[str, Any]:
    """Medians per case, and the ratios `a_vs_b` of their W1 rates."""
    s: dict[str, Any] = {"workload": name, "loadavg": loadavg()}
    for case in cases:
        s[case] = {
            "w1_msgs_per_s": median(rows, case, "msgs_per_s"),
            "w1_confirm_p50_ms": median(rows, case, "confirm_p50_ms"),
            "w1_confirm_p99_ms": median(rows, case, "confirm_p99_ms"),
            "runs": sum(1 for r in rows if r.get("case") == case and not r.get("error")),
            "errors": [r["error"] for r in rows if r.get("case") == case and r.get("error")],
        }
    for top, bottom in ratios:
        x, y = s[top]["w1_msgs_per_s"], s[bottom]["w1_msgs_per_s"]
        s[f"{top}_vs_{bottom}"] = round(x / y, 3) if x and y else None
    return s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--count", type=int, default=workload.COUNT)
    p.add_argument("--only", choices=("dedup", "super"), help="one benchmark (default: all)")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    binary = build_client()
    with Cluster(3) as c:
        if a.only in (None, "dedup"):
            rows: list[dict[str, Any]] = []
            for run in range(1, a.runs + 1):
                rows += dedup_run(c, binary, a, run)
            s = summary(
                rows, "dedup_summary", CASES, [("named", "unnamed"), ("named", "annotated")]
            )
            emit(s, a.out)
            log(
                f"dedup W1 medians of {a.runs}: unnamed {s['unnamed']['w1_msgs_per_s']} msgs/s "
                f"(p99 {s['unnamed']['w1_confirm_p99_ms']} ms), named "
                f"{s['named']['w1_msgs_per_s']} msgs/s (p99 {s['named']['w1_confirm_p99_ms']} "
                f"ms), annotated {s['annotated']['w1_msgs_per_s']} msgs/s; named/unnamed "
                f"{s['named_vs_unnamed']}, named/annotated {s['named_vs_annotated']}; "
                f"load {s['loadavg']}"
            )
        if a.only in (None, "super"):
            rows = []
            for run in range(1, a.runs + 1):
                rows += super_run(c, binary, a, run)
            s = summary(
                rows, "super_summary", SUPER_CASES, [("super", "plain"), ("super", "keyed")]
            )
            emit(s, a.out)
            log(
                f"super-stream W1 medians of {a.runs}: plain {s['plain']['w1_msgs_per_s']} "
                f"msgs/s (p99 {s['plain']['w1_confirm_p99_ms']} ms), keyed control "
                f"{s['keyed']['w1_msgs_per_s']} msgs/s, super stream of 3 "
                f"{s['super']['w1_msgs_per_s']} msgs/s (p99 {s['super']['w1_confirm_p99_ms']} "
                f"ms); super/plain {s['super_vs_plain']}, super/keyed {s['super_vs_keyed']}; "
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
