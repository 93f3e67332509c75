#!/usr/bin/env python3
"""Offset commits on a three-node cluster (issue 8, ADR 0012; BRIEF §4 target: commit p99 <
2 ms): commits per second and commit latency of spate.client's `commit()` (a named consumer
in rcv-settle-mode second: the broker settles once the offset is majority-fsynced), beside a
single publish with its confirm (the same Raft path: one entry, majority fsync) measured in
the same run.

  commit-1   one consumer, 3-replica stream, connected to the leader: receive one event,
             `await commit()`, repeat; latency = commit() call to return.
  commit-8   eight consumers (eight names) on the same partition doing the same concurrently:
             aggregate commits/s and latency (stores from several links share fsyncs).
  publish-1  one producer: send one 100 B message, await its `accepted`, repeat.

  python benchmarks/offset_commits.py [--runs 3] [--commits 2000] [--out F]

Cases rotate which goes first in each run. Prints one JSON line per case and run, then
medians and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from loadclient import BenchError, emit, loadavg, log
from spate.client.aio import AsyncConsumer, AsyncProducer

from cluster import Cluster

CASES = ("commit-1", "commit-8", "publish-1")
CONCURRENT = 8


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": round(ordered[-1], 3)}


async def commit_loop(url: str, stream: str, name: str, commits: int) -> list[float]:
    consumer = await AsyncConsumer.connect(
        url, stream, name=name, start="first", commit="manual", credit=1000
    )
    samples = []
    try:
        for _ in range(commits):
            event = await consumer.receive(timeout=10)
            started = time.perf_counter()
            committed = await consumer.commit()
            samples.append((time.perf_counter() - started) * 1000)
            if committed != event.offset:
                raise BenchError(f"commit() returned {committed}, expected {event.offset}")
    finally:
        await consumer.close()
    return samples


async def publish_loop(url: str, stream: str, count: int) -> list[float]:
    producer = await AsyncProducer.connect(url, stream)
    samples = []
    try:
        for i in range(count):
            started = time.perf_counter()
            await (await producer.send(b"%099d" % i))
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        await producer.close()
    return samples


async def fill(url: str, stream: str, count: int) -> None:
    producer = await AsyncProducer.connect(url, stream)
    for i in range(count):
        await producer.send(b"%099d" % i)
    await producer.flush()
    await producer.close()


def one_case(c: Cluster, case: str, a: argparse.Namespace, run: int) -> dict[str, Any]:
    stream = f"oc-{case}-{run}"
    c.create_stream(stream, replicas=3)
    host, port = c.amqp(c.leaders(stream)[0])
    url = f"amqp://{host}:{port}"
    started = time.perf_counter()
    if case == "publish-1":
        samples = asyncio.run(publish_loop(url, stream, a.commits))
    else:
        consumers = CONCURRENT if case == "commit-8" else 1
        per_consumer = a.commits // consumers
        asyncio.run(fill(url, stream, per_consumer))

        async def all_loops() -> list[list[float]]:
            return await asyncio.gather(
                *(commit_loop(url, stream, f"bench-{k}", per_consumer) for k in range(consumers))
            )

        started = time.perf_counter()
        samples = [s for loop in asyncio.run(all_loops()) for s in loop]
    elapsed = time.perf_counter() - started
    return {
        "workload": "offset_commits",
        "case": case,
        "run": run,
        "operations": len(samples),
        "per_s": round(len(samples) / elapsed, 1),
        **percentiles(samples),
        "loadavg": loadavg(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--commits", type=int, default=2000, help="per case and run")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    rows: list[dict[str, Any]] = []
    with Cluster(3) as c:
        for run in range(1, a.runs + 1):
            turn = run % len(CASES)
            for case in CASES[turn:] + CASES[:turn]:
                row = one_case(c, case, a, run)
                emit(row, a.out)
                rows.append(row)
    summary: dict[str, Any] = {"workload": "offset_commits_summary", "loadavg": loadavg()}
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        summary[case] = {
            key: round(statistics.median(r[key] for r in mine), 3)
            for key in ("per_s", "p50_ms", "p99_ms", "max_ms")
        }
    emit(summary, a.out)
    log(
        "medians of {}: {}; load {}".format(
            a.runs,
            ", ".join(
                f"{case} {summary[case]['per_s']}/s p50 {summary[case]['p50_ms']} ms "
                f"p99 {summary[case]['p99_ms']} ms"
                for case in CASES
            ),
            summary["loadavg"],
        )
    )
    return 0


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent.parent)
    try:
        sys.exit(main())
    except BenchError as e:
        log(f"FAILED: {e}")
        sys.exit(1)
