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
- the load average before and after (other work on the machine skews every latency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from typing import Any

from replica_group import IDS, replica_group


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[int(0.90 * (len(ordered) - 1))], 2),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 2),
    }


async def run(count: int, size: int, window: int, warmup: int, tick_ms: int) -> dict[str, Any]:
    async with replica_group("lat", tick_ms) as (call, leader):
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
    return {
        "count": count,
        "record_bytes": size,
        "window": window,
        "leader_commit": percentiles(result["latencies_ms"]),
        "follower_visible": percentiles(follower_ms),
        "appends_per_s": round(count / result["seconds"]),
        "leader_fsyncs_per_append": round(result["fsyncs"] / count, 3),
        "leader_batches_per_append": round(result["batches"] / count, 3),
        "leader_cpu_ms_per_append": round(result["cpu_seconds"] * 1000 / count, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=100)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--tick-ms", type=int, default=50)
    args = parser.parse_args()
    load_before = os.getloadavg()
    out = asyncio.run(run(args.count, args.bytes, args.window, args.warmup, args.tick_ms))
    out["loadavg_before"] = [round(x, 2) for x in load_before]
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
