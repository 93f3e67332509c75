"""One ReplicationHost in its own OS process, driven by JSON lines on stdin/stdout.

Used by test_shell_processes.py and benchmarks/raft_vs_pysyncobj.py. Start:

    python replica_process.py NODE DATA_DIR [TICK_MS]

It prints {"event": "started", "port": P} once listening on 127.0.0.1:P (port 0: the OS picks).
Requests (one JSON object per line; replies carry the request's "id"):

    {"op": "peers", "peers": {"n1": ["127.0.0.1", 4711], ...}}          -> {"ok": true}
    {"op": "open", "stream": "s", "partition": 0, "replicas": [...],
     "segment_bytes": 65536, "max_bytes": null, "readers": true}           -> {"ok": true}
        ("readers": false: no listener on the replica, so "visible" records nothing and a
        follower gets no commit updates of its own, ADR 0044)
    {"op": "append", "stream": "s", "partition": 0, "records": ["<hex>"]} -> {"ok": true,
        "offset": N} or {"ok": false, "code": "not-leader", "retryable": true, "leader": "n2"}
    {"op": "burst", "stream": "s", "partition": 0, "count": N, "bytes": B, "window": W}
        -> appends N records of B bytes, W in flight, from this (leader) process; replies with
           {"ok": true, "latencies_ms": [...], "seconds": S}
        plus "starts": [[offset, monotonic seconds the append began], ...], "fsyncs",
        "batches" and "cpu_seconds" (this process, during the burst)
    {"op": "visible", "stream": "s", "partition": 0}
        -> {"visible": [[end_offset, monotonic seconds it became committed here], ...]}
           (recorded from the open on; the clock is CLOCK_MONOTONIC, shared by the processes)
    {"op": "status"}  -> {"partitions": [{"stream", "partition", "role", "leader", "epoch",
                          "end_offset", "first_offset"}]}
    {"op": "read", "stream": "s", "partition": 0}  -> {"records": ["<hex>", ...]} (committed)
    {"op": "retention"}  -> {"deleted": N}
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from spate.core.backend import OffsetSpec
from spate.core.errors import BrokerError
from spate.core.ids import NodeId, Offset, PartitionId, StreamName
from spate.core.streams import Retention
from spate.node.log import LogConfig
from spate.node.replication.host import ReplicationHost

SECRET = "test-cluster-secret"


async def main() -> None:
    node = NodeId(sys.argv[1])
    data_dir = Path(sys.argv[2])
    tick_ms = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    addresses: dict[NodeId, tuple[str, int]] = {}
    host = ReplicationHost(
        node,
        data_dir,
        host="127.0.0.1",
        port=0,
        secret=SECRET,
        peers=addresses.get,
        tick_ms=tick_ms,
    )
    port = await host.start()
    out = sys.stdout

    def reply(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    reply({"event": "started", "port": port})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[None]] = set()
    visible: dict[tuple[StreamName, PartitionId], list[tuple[int, float]]] = {}

    async def append(request: dict[str, Any]) -> None:
        part = host.partition(StreamName(request["stream"]), PartitionId(request["partition"]))
        records = [bytes.fromhex(r) for r in request["records"]]
        try:
            offset = await part.append(records)
            reply({"id": request["id"], "ok": True, "offset": offset})
        except BrokerError as error:
            reply(
                {
                    "id": request["id"],
                    "ok": False,
                    "code": error.code.value,
                    "retryable": error.retryable,
                    "message": error.message,
                    "leader": getattr(error, "leader_node", None),
                }
            )

    async def burst(request: dict[str, Any]) -> None:
        part = host.partition(StreamName(request["stream"]), PartitionId(request["partition"]))
        record = os.urandom(request["bytes"])
        semaphore = asyncio.Semaphore(request["window"])
        latencies: list[float] = []
        starts: list[tuple[int, float]] = []

        async def one() -> None:
            async with semaphore:
                started = time.monotonic()
                offset = await part.append([record])
                latencies.append((time.monotonic() - started) * 1000)
                starts.append((offset, started))

        fsyncs, batches, cpu = host.fsyncs, host.batches, time.process_time()
        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(request["count"])))
        reply(
            {
                "id": request["id"],
                "ok": True,
                "latencies_ms": latencies,
                "starts": starts,
                "seconds": time.monotonic() - started,
                "fsyncs": host.fsyncs - fsyncs,
                "batches": host.batches - batches,
                "cpu_seconds": time.process_time() - cpu,
            }
        )

    while True:
        line = await reader.readline()
        if not line:
            break
        request = json.loads(line)
        op = request["op"]
        if op == "peers":
            addresses.clear()
            addresses.update({NodeId(k): (v[0], v[1]) for k, v in request["peers"].items()})
            reply({"id": request.get("id"), "ok": True})
        elif op == "open":
            retention = Retention(max_bytes=request.get("max_bytes"))
            config = LogConfig(
                segment_bytes=request.get("segment_bytes", 64 * 1024 * 1024), retention=retention
            )
            opened = await host.open_partition(
                StreamName(request["stream"]),
                PartitionId(request["partition"]),
                [NodeId(r) for r in request["replicas"]],
                config,
            )
            seen = visible.setdefault((opened.stream, opened.partition), [])

            def record_visible(part: Any = opened, seen: list[tuple[int, float]] = seen) -> None:
                end = int(part.end_offset())
                if not seen or seen[-1][0] < end:
                    seen.append((end, time.monotonic()))

            if request.get("readers", True):
                opened.add_listener(record_visible)
            reply({"id": request.get("id"), "ok": True})
        elif op == "visible":
            key = (StreamName(request["stream"]), PartitionId(request["partition"]))
            reply({"id": request.get("id"), "visible": visible.get(key, [])})
        elif op in ("append", "burst"):
            task = loop.create_task(append(request) if op == "append" else burst(request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elif op == "status":
            parts = []
            for part in host.partitions():
                parts.append(
                    {
                        "stream": part.stream,
                        "partition": part.partition,
                        "role": part.role.value,
                        "leader": part.leader,
                        "epoch": part.leader_epoch,
                        "end_offset": part.end_offset(),
                        "first_offset": part.resolve(OffsetSpec.first()),
                    }
                )
            reply({"id": request.get("id"), "partitions": parts})
        elif op == "read":
            part = host.partition(StreamName(request["stream"]), PartitionId(request["partition"]))
            records: list[str] = []
            start = part.resolve(OffsetSpec.first())
            while start < part.end_offset():
                for view in part.read(start, 1 << 20):
                    records += [bytes(r).hex() for r in view.records]
                    start = Offset(view.first_offset + len(view.records))
            reply({"id": request.get("id"), "records": records})
        elif op == "retention":
            deleted = sum(host.apply_retention(p) for p in host.partitions())
            reply({"id": request.get("id"), "deleted": deleted})
        else:
            reply({"id": request.get("id"), "ok": False, "message": f"unknown op {op}"})
    await host.stop()


if __name__ == "__main__":
    asyncio.run(main())
