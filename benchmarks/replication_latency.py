"""Latency of one replicated append: three replica processes (one ReplicationHost each, real
files with fsync, real sockets on 127.0.0.1), the leader's process appending single small
records one after another (window 1 by default), as a producer waiting for each confirm does.

    .venv/bin/python benchmarks/replication_latency.py [--count 2000] [--bytes 100] [--window 1]

Reported, per append:
- leader commit latency p50/p99: from `append()` to its resolved future (a majority fsynced);
- follower visibility p50/p99: from the leader's `append()` to the moment each follower's
  committed end offset covers it (CLOCK_MONOTONIC is shared by the processes), i.e. how soon a
  consumer on a follower could read it;
- fsyncs (file syncs) and fsync batches per append on the leader, and the leader process's
  CPU milliseconds per append: figures that a busy machine disturbs less than wall clock;
- the load average before and after (other work on the machine skews every latency);
- with `--no-readers`: no listener on any replica, so followers get no commit updates of their
  own (ADR 0044: the case of a partition nobody reads from its followers) and follower
  visibility is not measured (null);
- with `--entry-points DIR`: per node, the loop thread's CPU per append and, per replication
  driver entry point, calls per append and CPU µs per call (benchmarks/entry_points.py; the
  count covers the warm-up appends too, and the per-append figures divide by both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path
from typing import Any

from replica_group import IDS, replica_group


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[int(0.90 * (len(ordered) - 1))], 2),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 2),
    }


async def run(
    count: int,
    size: int,
    window: int,
    warmup: int,
    tick_ms: int,
    *,
    entry_points: Path | None,
    readers: bool = True,
) -> dict[str, Any]:
    async with replica_group("lat", tick_ms, entry_points, readers=readers) as (call, leader):
        burst = {"op": "burst", "stream": "lat", "partition": 0, "bytes": size}
        await call(leader, **burst, count=warmup, window=window)
        result = await call(leader, **burst, count=count, window=window)
        await asyncio.sleep(0.5)  # let the followers learn the last commit
        followers = [n for n in IDS if n != leader]
        seen = {
            n: (await call(n, op="visible", stream="lat", partition=0))["visible"]
            for n in followers
        }
    follower_ms: list[float] = []
    for node in followers:
        visible = seen[node]
        position = 0
        for offset, started in sorted(result["starts"]):
            while position < len(visible) and visible[position][0] <= offset:
                position += 1
            if position < len(visible):
                follower_ms.append((visible[position][1] - started) * 1000)
    out: dict[str, Any] = {
        "leader": leader,
        "count": count,
        "record_bytes": size,
        "window": window,
        "leader_commit": percentiles(result["latencies_ms"]),
        "follower_visible": percentiles(follower_ms) if readers else None,
        "appends_per_s": round(count / result["seconds"]),
        "leader_fsyncs_per_append": round(result["fsyncs"] / count, 3),
        "leader_batches_per_append": round(result["batches"] / count, 3),
        "leader_cpu_ms_per_append": round(result["cpu_seconds"] * 1000 / count, 3),
    }
    if entry_points is not None:
        out["entry_points"] = entry_point_table(entry_points, count + warmup)
    return out


def entry_point_table(directory: Path, appends: int) -> dict[str, Any]:
    """The reports benchmarks/entry_points.py wrote at exit, per append."""
    table: dict[str, Any] = {}
    for node in IDS:
        report = json.loads((directory / f"{node}.json").read_text())
        points = {
            name: {
                "calls_per_append": round(point["calls"] / appends, 2),
                "us_per_call": round(point["cpu_ns"] / max(point["calls"], 1) / 1000, 1),
                "us_per_append": round(point["cpu_ns"] / appends / 1000, 1),
            }
            for name, point in sorted(
                report["entry_points"].items(), key=lambda item: -item[1]["cpu_ns"]
            )
        }
        table[node] = {
            "loop_thread_ms_per_append": round(report["loop_thread_ns"] / appends / 1e6, 3),
            "process_ms_per_append": round(report["process_ns"] / appends / 1e6, 3),
            "points": points,
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=100)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--tick-ms", type=int, default=50)
    parser.add_argument(
        "--entry-points",
        type=Path,
        metavar="DIR",
        help="time the replication driver's entry points in every replica process; reports "
        "(JSON per node) land in DIR, the table in the output",
    )
    parser.add_argument(
        "--no-readers",
        action="store_true",
        help="no listener on any replica: followers get no commit updates of their own "
        "(ADR 0044); follower visibility not measured",
    )
    args = parser.parse_args()
    if args.entry_points is not None:
        args.entry_points.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    out = asyncio.run(
        run(
            args.count,
            args.bytes,
            args.window,
            args.warmup,
            args.tick_ms,
            entry_points=args.entry_points,
            readers=not args.no_readers,
        )
    )
    out["loadavg_before"] = [round(x, 2) for x in load_before]
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
