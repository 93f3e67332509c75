#!/usr/bin/env python3
"""spate.client's own CPU per 100-byte message: the blocking Producer (proton's
BlockingConnection) against the asyncio AsyncProducer (proton's engine in an asyncio Protocol),
and the blocking Consumer against AsyncConsumer, on the same node (issue 7: the client must
not be the benchmark's bottleneck).

    spate dev up --nodes 1 --data-dir /tmp/spate-bench
    python benchmarks/client_cpu.py --url amqp://127.0.0.1:PORT [--count 100000] [--runs 3]

Each run publishes COUNT messages to a fresh stream with confirms (window 10,000; the blocking
producer confirms per batch of 10,000), then reads them back from the first. CPU is this
process's user+sys time around each phase (the broker is another process). Prints one line per
run, medians, and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from spate.client import Consumer, Producer
from spate.client.aio import AsyncConsumer, AsyncProducer

BODY = b"x" * 100
WINDOW = 10_000


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(work: Callable[[], None], count: int) -> tuple[float, float]:
    """(msg/s, CPU µs per message) of `work`."""
    wall, cpu = time.perf_counter(), cpu_s()
    work()
    return count / (time.perf_counter() - wall), (cpu_s() - cpu) * 1e6 / count


def blocking_run(url: str, stream: str, count: int) -> dict[str, float]:
    row: dict[str, float] = {}

    def publish() -> None:
        with Producer(url, stream) as producer:
            for start in range(0, count, WINDOW):
                producer.send_batch([BODY] * min(WINDOW, count - start), window=WINDOW)

    def consume() -> None:
        with Consumer(url, stream, start="first", credit=WINDOW) as consumer:
            for _ in range(count):
                consumer.receive(timeout=30)

    row["publish_per_s"], row["publish_cpu_us"] = measure(publish, count)
    row["consume_per_s"], row["consume_cpu_us"] = measure(consume, count)
    return row


def async_run(url: str, stream: str, count: int) -> dict[str, float]:
    row: dict[str, float] = {}

    async def publish() -> None:
        producer = await AsyncProducer.connect(url, stream, window=WINDOW)
        for _ in range(count):
            await producer.send(BODY)
        await producer.flush()
        await producer.close()

    async def consume() -> None:
        consumer = await AsyncConsumer.connect(url, stream, start="first", credit=WINDOW)
        for _ in range(count):
            await consumer.receive(timeout=30)
        await consumer.close()

    row["publish_per_s"], row["publish_cpu_us"] = measure(lambda: asyncio.run(publish()), count)
    row["consume_per_s"], row["consume_cpu_us"] = measure(lambda: asyncio.run(consume()), count)
    return row


def create_stream(admin: str | None, name: str) -> None:
    command = [sys.executable, "-m", "spate.cli.main", "stream", "create", name]
    if admin:
        command += ["--admin", admin]
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin", help="admin endpoint (default: SPATE_DATA_DIR's cluster)")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for run in range(args.runs):
        for client, function in (("blocking", blocking_run), ("asyncio", async_run)):
            stream = f"client-cpu-{uuid.uuid4().hex[:8]}"
            create_stream(args.admin, stream)
            load = loadavg()
            row = {
                "client": client,
                "run": run,
                "load": load,
                **function(args.url, stream, args.count),
            }
            rows.append(row)
            print(
                f"{client:8} run {run}: publish {row['publish_per_s']:8.0f}/s "
                f"{row['publish_cpu_us']:6.1f} µs/msg, consume {row['consume_per_s']:8.0f}/s "
                f"{row['consume_cpu_us']:6.1f} µs/msg, load {load:.2f}",
                file=sys.stderr,
                flush=True,
            )
    medians = []
    for client in ("blocking", "asyncio"):
        group = [r for r in rows if r["client"] == client]
        median = {
            key: statistics.median(r[key] for r in group)
            for key in ("publish_per_s", "publish_cpu_us", "consume_per_s", "consume_cpu_us")
        }
        medians.append({"client": client, **median})
        print(f"median {client}: {median}", file=sys.stderr)
    print(
        json.dumps(
            {"benchmark": "client_cpu", "count": args.count, "rows": rows, "medians": medians}
        )
    )


if __name__ == "__main__":
    main()
