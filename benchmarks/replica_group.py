"""Three Spate replica processes hosting one partition, for the replication benchmarks.

Each process is tests/replication/replica_process.py (one ReplicationHost, driven by JSON lines
on stdin/stdout). `replica_group` starts them in a temp dir, wires their peers, opens the
partition on all three, waits for a leader and yields (call, leader); on exit it closes their
stdin, waits, and kills only what does not stop. With `entry_points=DIR` each process is
benchmarks/entry_points.py instead (the same process with its driver's entry points timed,
reports written into DIR at exit).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SPATE_REPLICA = REPO / "tests" / "replication" / "replica_process.py"
ENTRY_POINTS = REPO / "benchmarks" / "entry_points.py"
IDS = ["n1", "n2", "n3"]
leader_wait_s = 30.0
stop_wait_s = 10.0

Call = Callable[..., Awaitable[dict[str, Any]]]


@asynccontextmanager
async def replica_group(
    stream: str, tick_ms: int = 50, entry_points: Path | None = None, *, readers: bool = True
) -> AsyncIterator[tuple[Call, str]]:
    """`readers`: every replica has a listener (the visibility record): followers get commit
    updates of their own (ADR 0044); False: none, followers learn commits from the next
    Append or heartbeat."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("SPATE_BENCH_DIR")) as tmp:
        procs: dict[str, asyncio.subprocess.Process] = {}
        try:
            ports = {}
            for node in IDS:
                script = SPATE_REPLICA if entry_points is None else ENTRY_POINTS
                env = None
                if entry_points is not None:
                    env = {**os.environ, "SPATE_ENTRY_POINTS": str(entry_points)}
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(script),
                    node,
                    str(Path(tmp) / node),
                    str(tick_ms),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    limit=64 * 1024 * 1024,
                    env=env,
                )
                procs[node] = proc
                assert proc.stdout is not None
                ports[node] = json.loads(await proc.stdout.readline())["port"]

            async def call(node: str, **request: Any) -> dict[str, Any]:
                proc = procs[node]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write((json.dumps({"id": 1, **request}) + "\n").encode())
                await proc.stdin.drain()
                reply: dict[str, Any] = json.loads(await proc.stdout.readline())
                return reply

            peers = {n: ["127.0.0.1", p] for n, p in ports.items()}
            for node in IDS:
                await call(node, op="peers", peers=peers)
            for node in IDS:
                await call(
                    node, op="open", stream=stream, partition=0, replicas=IDS, readers=readers
                )
            leader = None
            deadline = time.monotonic() + leader_wait_s
            while leader is None:
                assert time.monotonic() < deadline, "no leader elected"
                for node in IDS:
                    status = (await call(node, op="status"))["partitions"][0]
                    if status["role"] == "leader":
                        leader = node
                await asyncio.sleep(0.05)
            yield call, leader
        finally:
            for proc in procs.values():
                if proc.stdin is not None:
                    proc.stdin.close()
            for proc in procs.values():
                try:
                    await asyncio.wait_for(proc.wait(), stop_wait_s)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
