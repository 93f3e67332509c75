"""Replicate the same 16 KiB batches through a three-process pysyncobj group and through Spate's
partition Raft (three processes, one ReplicationHost each), on this machine.

    .venv/bin/python benchmarks/raft_vs_pysyncobj.py [--count 2000] [--window 200]

Both sides run a leader-local closed loop: the leader process keeps `window` appends in
flight and measures each from submission to its commit callback / resolved future. Reported:
MB/s, commits/s, p50/p99 commit latency, and whether the commit waited for fsync (pysyncobj
never fsyncs, research/pysyncobj.md §2; Spate fsyncs a majority before it acks, group commit).
The latency of single sequential appends (leader commit and follower visibility) is measured
by benchmarks/replication_latency.py on the same three-process harness.

pysyncobj 0.3.17 is configured as ADR 0004 says it must always be: bindAddress 127.0.0.1,
`password` set (so it unpickles nothing unauthenticated), `journalFile` and `fullDumpFile`, with
appendEntriesPeriod 0.01 s / autoTickPeriod 0.002 s (research §1.4: p50 ~12-19 ms instead of
100 ms). Stock pickle and zlib (no monkeypatches).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from replica_group import replica_group

BATCH_BYTES = 16 * 1024


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def summary(
    name: str, latencies_ms: list[float], seconds: float, count: int, fsync: str
) -> dict[str, Any]:
    ordered = sorted(latencies_ms)
    return {
        "system": name,
        "commits": count,
        "seconds": round(seconds, 2),
        "commits_per_s": round(count / seconds),
        "MB_per_s": round(count * BATCH_BYTES / seconds / 1e6, 1),
        "p50_ms": round(statistics.median(ordered), 1),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 1),
        "fsync_before_ack": fsync,
    }


# -- pysyncobj: one process per node (this file, --pysyncobj-node)


def pysyncobj_node(index: int, ports: list[int], data_dir: Path, count: int, window: int) -> None:
    from pysyncobj import SyncObj, SyncObjConf, replicated

    class Log(SyncObj):  # type: ignore[misc]
        def __init__(self) -> None:
            conf = SyncObjConf(
                password="benchmark-secret",
                journalFile=str(data_dir / f"journal{index}"),
                fullDumpFile=str(data_dir / f"dump{index}"),
                appendEntriesPeriod=0.01,
                autoTickPeriod=0.002,
                bindAddress=f"127.0.0.1:{ports[index]}",
            )
            me = f"127.0.0.1:{ports[index]}"
            others = [f"127.0.0.1:{p}" for i, p in enumerate(ports) if i != index]
            super().__init__(me, others, conf)
            self.size = 0

        @replicated  # type: ignore[misc]
        def append(self, data: bytes) -> int:
            self.size += len(data)
            return self.size

    node = Log()
    deadline = time.monotonic() + 30
    while not node._isReady() or node._getLeader() is None:
        assert time.monotonic() < deadline, "pysyncobj elected no leader"
        time.sleep(0.05)
    if not node._isLeader():
        sys.stdin.read()  # followers serve until the driver closes stdin
        node.destroy()
        return
    data = os.urandom(BATCH_BYTES)
    slots = threading.Semaphore(window)
    done = threading.Event()
    latencies: list[float] = []
    failures = [0]

    def submit() -> None:
        started = time.perf_counter()

        def callback(result: object, error: object) -> None:
            if error:  # FAIL_REASON.SUCCESS is 0
                failures[0] += 1
            latencies.append((time.perf_counter() - started) * 1000)
            slots.release()
            if len(latencies) == count:
                done.set()

        node.append(data, callback=callback)

    started = time.perf_counter()
    for _ in range(count):
        slots.acquire()
        submit()
    done.wait(120)
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {"leader": True, "latencies_ms": latencies, "seconds": seconds, "failures": failures[0]}
        ),
        flush=True,
    )
    node.destroy()


def run_pysyncobj(count: int, window: int) -> dict[str, Any]:
    ports = free_ports(3)
    with tempfile.TemporaryDirectory() as tmp:
        errors = open(Path(tmp) / "stderr", "w+")  # noqa: SIM115 (closed below)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--pysyncobj-node",
                    str(i),
                    "--ports",
                    ",".join(map(str, ports)),
                    "--dir",
                    tmp,
                    "--count",
                    str(count),
                    "--window",
                    str(window),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )
            for i in range(3)
        ]
        try:
            result: dict[str, Any] | None = None
            while result is None:
                for proc in procs:
                    if proc.poll() is not None and proc.stdout is not None:
                        line = proc.stdout.readline()
                        if line:
                            result = json.loads(line)
                time.sleep(0.1)
        finally:
            for proc in procs:
                if proc.stdin is not None:
                    proc.stdin.close()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            errors.seek(0)
            warnings = errors.read().count("truncating already-applied log entries")
            errors.close()
    out = summary(
        "pysyncobj 0.3.17", result["latencies_ms"], result["seconds"], count, "no (never fsyncs)"
    )
    out["failed"] = result["failures"]
    out["applied_entries_truncated_warnings"] = warnings
    return out


# -- Spate: one ReplicationHost per process (tests/replication/replica_process.py)


async def run_spate(count: int, window: int) -> dict[str, Any]:
    async with replica_group("bench") as (call, leader):
        result = await call(
            leader,
            op="burst",
            stream="bench",
            partition=0,
            count=count,
            bytes=BATCH_BYTES,
            window=window,
        )
    out = summary(
        "Spate partition Raft",
        result["latencies_ms"],
        result["seconds"],
        count,
        "yes (majority fsynced, group commit)",
    )
    out["leader_fsync_batches"] = result["batches"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--pysyncobj-node", type=int)
    parser.add_argument("--ports")
    parser.add_argument("--dir")
    args = parser.parse_args()
    if args.pysyncobj_node is not None:
        pysyncobj_node(
            args.pysyncobj_node,
            [int(p) for p in args.ports.split(",")],
            Path(args.dir),
            args.count,
            args.window,
        )
        return
    print(
        f"{args.count} batches of {BATCH_BYTES} random bytes, {args.window} in flight, "
        "3 replicas as 3 processes on 127.0.0.1, leader-local closed loop",
        flush=True,
    )
    results = [
        run_pysyncobj(args.count, args.window),
        asyncio.run(run_spate(args.count, args.window)),
    ]
    columns = ["system", "MB_per_s", "commits_per_s", "p50_ms", "p99_ms", "fsync_before_ack"]
    widths = [max(len(c), *(len(str(r[c])) for r in results)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in results:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
