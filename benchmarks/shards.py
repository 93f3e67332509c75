#!/usr/bin/env python3
"""One node as 1 vs 2 shard processes (ADR 0032): does a host use its second core?

  python benchmarks/shards.py [--runs 3] [--partitions 4] [--count 200000] [--out FILE]

Per run and shard count S (alternating 1, 2, 1, 2, ...): a fresh `spate dev up --nodes 1
--shards S` (one host, fsync on as always; its idle gateway is not used), a stream of P
partitions with 1 replica (placement gives each shard P/S of them), then
- W1: P native load clients (clients/amqp_load.c) publish COUNT/P 100-byte messages each with
  confirms (window 10,000/P), each straight to its partition's leader; aggregate = accepted /
  (earliest first send -> latest last confirm) (partitions.measure);
- W2: P consumers read their partition from the start concurrently; aggregate = received /
  the slowest consumer's attach->last delivery.
One JSON line per run on stdout (and appended to --out) with the load average; the summary
prints the medians per S.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadclient import TIMEOUT_S, BenchError, build_client, emit, loadavg, log
from partitions import commit, measure

from cluster import Cluster


def consume_all(c: Cluster, binary: Path, stream: str, partitions: int, per: int) -> dict[str, Any]:
    leaders = c.leaders(stream)
    procs = []
    for p in range(partitions):
        host, port = c.amqp(leaders[p])
        cmd = [str(binary), "consume", "--host", host, "--port", port, "--address", stream]
        cmd += ["--partition", str(p), "--count", str(per), "--credit", "10000"]
        cmd += ["--offset", "first", "--timeout", f"{TIMEOUT_S:g}"]
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    rows = []
    for proc in procs:
        out, err = proc.communicate(timeout=TIMEOUT_S + 30)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            raise BenchError(f"consumer printed nothing: {err[-500:]}")
        rows.append(json.loads(lines[-1]))
    received = sum(int(r.get("received", 0)) for r in rows)
    slowest = max(float(r.get("elapsed_s", 0) or 0) for r in rows)
    return {
        "received": received,
        "elapsed_s": slowest,
        "msgs_per_s": round(received / slowest, 1) if slowest else None,
        "per_consumer": [r.get("msgs_per_s") for r in rows],
        "error": "; ".join(str(r["error"]) for r in rows if r.get("error")) or None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    binary = build_client()
    results: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    try:
        for run in range(a.runs):
            for shards in (1, 2):
                with Cluster(1, shards=shards) as c:
                    stream = f"shards-{shards}-{run}"
                    w1 = measure(c, binary, a.partitions, a.count, stream=stream, replicas=1)
                    time.sleep(1.0)
                    w2 = consume_all(c, binary, stream, a.partitions, a.count // a.partitions)
                    row = {
                        "workload": "shards-w1-w2",
                        "shards": shards,
                        "run": run,
                        "partitions": a.partitions,
                        "replicas": 1,
                        "leaders": w1["leaders"],
                        "w1_msgs_per_s": w1.get("msgs_per_s"),
                        "w2_msgs_per_s": w2["msgs_per_s"],
                        "w2_per_consumer": w2["per_consumer"],
                        "error": w1["error"] or w2["error"],
                        "commit": commit(),
                        "loadavg": loadavg(),
                    }
                    emit(row, a.out)
                    results[shards].append(row)
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    for shards, rows in results.items():
        w1 = [r["w1_msgs_per_s"] for r in rows if r["w1_msgs_per_s"]]
        w2 = [r["w2_msgs_per_s"] for r in rows if r["w2_msgs_per_s"]]
        log(
            f"{shards} shard(s): W1 median {statistics.median(w1) if w1 else None} msgs/s "
            f"{w1}; W2 median {statistics.median(w2) if w2 else None} msgs/s {w2}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
