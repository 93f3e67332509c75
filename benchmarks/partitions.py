#!/usr/bin/env python3
"""Publish throughput with 1, 3 and 12 partitions of a 3-replica stream on a three-node Spate
cluster (W1-style: 100-byte messages with confirms, 10,000 unsettled in total).

  python benchmarks/partitions.py [--partitions 1,3,12] [--count 200000] [--out FILE]

Per partition count P: a fresh stream `parts-P` (P partitions, 3 replicas); once every
partition has a leader, P native load clients (clients/amqp_load.c) run concurrently, one per
partition, each bound to its partition (link property event-streams-partition) and connected
straight to that partition's leader (`spate partition list` + endpoints.json), each publishing
COUNT / P messages with a window of 10,000 / P. Aggregate msgs/s = all accepted messages /
(earliest first send -> latest last confirm), both on the system-wide monotonic clock the
clients report. One JSON line per P on stdout (and appended to --out), with the per-producer
figures, the leaders, the commit and the load average.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadclient import (
    CLIENT_GRACE_S,
    COUNT,
    SIZE_BYTES,
    TIMEOUT_S,
    WINDOW,
    BenchError,
    build_client,
    emit,
    loadavg,
    log,
)

from cluster import Cluster

REPLICAS = 3


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def measure(
    c: Cluster,
    binary: Path,
    partitions: int,
    count: int,
    stream: str | None = None,
    *,
    replicas: int = REPLICAS,
) -> dict[str, Any]:
    stream = stream or f"parts-{partitions}"
    c.create_stream(stream, replicas=replicas, partitions=partitions)
    leaders = c.leaders(stream)
    per, window = count // partitions, max(1, WINDOW // partitions)
    procs: list[tuple[int, subprocess.Popen[str]]] = []
    try:
        for pid_ in range(partitions):
            host, port = c.amqp(leaders[pid_])
            cmd = [str(binary), "publish", "--host", host, "--port", port, "--address", stream]
            cmd += ["--partition", str(pid_), "--count", str(per), "--size", str(SIZE_BYTES)]
            cmd += ["--window", str(window), "--timeout", f"{TIMEOUT_S:g}"]
            log("$ " + shlex.join(cmd))
            procs.append(
                (
                    pid_,
                    subprocess.Popen(
                        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                    ),
                )
            )
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + TIMEOUT_S + CLIENT_GRACE_S
        for pid_, p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if not lines:
                raise BenchError(f"producer for partition {pid_} printed nothing: {err[-500:]}")
            r = json.loads(lines[-1])
            r["leader"] = leaders[pid_]
            rows.append(r)
    finally:
        for _, p in procs:  # only on error: ours, by PID
            if p.poll() is None:
                p.kill()
                p.wait()
    errors = [f"partition {r.get('partition')}: {r['error']}" for r in rows if r.get("error")]
    accepted = sum(int(r.get("confirmed", 0)) for r in rows)
    result: dict[str, Any] = {
        "peer": "spate",
        "workload": "w1-partitions",
        "client": "c-proton",
        "stream": stream,
        "nodes": len(c.node_ids()),
        "replicas": replicas,
        "partitions": partitions,
        "count": per * partitions,
        "window_total": window * partitions,
        "size": SIZE_BYTES,
        "accepted": accepted,
        "leaders": {str(k): v for k, v in sorted(leaders.items())},
        "producers": [
            {
                k: r.get(k)
                for k in (
                    "partition",
                    "leader",
                    "endpoint",
                    "confirmed",
                    "msgs_per_s",
                    "confirm_p50_ms",
                    "confirm_p99_ms",
                    "error",
                )
            }
            for r in rows
        ],
        "commit": commit(),
        "loadavg": loadavg(),
        "error": "; ".join(errors) or None,
    }
    spans = [(r["t_first_mono_ns"], r["t_last_mono_ns"]) for r in rows if "t_first_mono_ns" in r]
    if len(spans) == len(rows) and rows:
        elapsed = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e9
        result["elapsed_s"] = round(elapsed, 3)
        result["msgs_per_s"] = round(accepted / elapsed, 1)
    log(
        f"{partitions} partition(s): {result.get('msgs_per_s')} msgs/s aggregate "
        f"({accepted}/{per * partitions} accepted; leaders "
        f"{', '.join(sorted(set(leaders.values())))}); load {result['loadavg']}"
        + (f"; ERROR {result['error']}" if result["error"] else "")
    )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--partitions", default="1,3,12", help="comma-separated partition counts")
    ap.add_argument("--count", type=int, default=COUNT, help="messages in total per run")
    ap.add_argument("--out", type=Path, help="append the JSON lines to this file")
    a = ap.parse_args()
    counts = [int(x) for x in a.partitions.split(",") if x.strip()]
    binary = build_client()
    failed = False
    try:
        with Cluster(3) as c:
            for p in counts:
                r = measure(c, binary, p, a.count)
                emit(r, a.out)
                failed |= bool(r["error"])
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
