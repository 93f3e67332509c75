"""Rooms (ADR 0018): the index's memory per room, fan-out through a real gateway, and RSS of a
cluster holding many rooms.

    python benchmarks/rooms.py memory [--rooms 1000,10000,100000]
    python benchmarks/rooms.py fanout [--subscribers 100] [--events 2000] [--nodes 3]
    python benchmarks/rooms.py many [--rooms 100000] [--nodes 3] [--concurrency 64]
    python benchmarks/rooms.py publish [--events 2000] [--concurrency 64] [--nodes 3]

`memory` measures `RoomIndex` with tracemalloc (one event per room, names `room-<i>`).
`fanout` starts `spate dev up`, subscribes N WebSocket clients to one room and publishes
events from one more (in a window of 64 outstanding publishes); it prints the delivered
events/s over all subscribers and the publish-to-delivery latency percentiles (the publisher
puts its send time in the event). `many` publishes one event to each of N rooms and prints
the RSS of every node and the gateway. `publish` sends N publishes to one room over HTTP (W
outstanding, no subscriber) and prints publishes/s, the publish round trip's p50/p99 and the
CPU milliseconds each node and the gateway spent per publish (from /proc: a figure the
machine's load does not scale the way it scales the rates).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from spate.gateway.rooms import RoomIndex


def memory(counts: list[int]) -> None:
    for count in counts:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        index = RoomIndex(100_000, 24 * 3600 * 1000, 24 * 3600 * 1000)
        for i in range(count):
            index.apply(f"room-{i}", i, 1_700_000_000_000 + i, 0)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        print(
            f"memory: {count} rooms, 1 event each: {used / count:.0f} B/room ({used / 1e6:.1f} MB)"
        )
        tracemalloc.start()
        index = RoomIndex(100_000, 24 * 3600 * 1000, 24 * 3600 * 1000)
        before = tracemalloc.get_traced_memory()[0]
        for i in range(min(count, 10_000)):
            for j in range(10):
                index.apply(f"room-{i}", i * 10 + j, 1_700_000_000_000, 0)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        print(
            f"memory: {min(count, 10_000)} rooms, 10 events each: "
            f"{used / min(count, 10_000):.0f} B/room"
        )


RETRIES_MAX = 10
"""Tries of one publish in `many` (a retryable refusal, a leader change, is resent)."""


def _spate(*args: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "spate.cli.main", *args, "--output", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _fanout(url: str, subscribers: int, events: int) -> None:
    import aiohttp

    http = "http://" + url.removeprefix("ws://")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        sockets = [await session.ws_connect(url, max_msg_size=0) for _ in range(subscribers)]
        for ws in sockets:
            await ws.send_json({"command": "stream.subscribe", "payload": {"room": "bench"}})
            assert (await ws.receive_json())["success"]
        latencies: list[float] = []

        async def drain(ws: Any) -> None:
            for _ in range(events):
                event = await ws.receive_json(timeout=120)
                latencies.append(time.time() - event["data"]["t"])

        drains = [asyncio.ensure_future(drain(ws)) for ws in sockets]
        window = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with window:
                body = {
                    "command": "stream.publish",
                    "payload": {
                        "room": "bench",
                        "event_type": "tick",
                        "data": {"i": i, "t": time.time()},
                    },
                }
                async with session.post(http, json=body) as response:
                    answer = await response.json()
                    assert "error" not in answer, answer

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(events)))
        published = time.perf_counter() - started
        await asyncio.gather(*drains)
        elapsed = time.perf_counter() - started
        latencies.sort()
        n = len(latencies)
        print(
            f"fanout: {subscribers} subscribers x {events} events: published "
            f"{events / published:.0f} ev/s; delivered {n / elapsed:.0f} msg/s over all "
            "subscribers; latency p50 "
            f"{latencies[n // 2] * 1000:.1f} ms p99 {latencies[int(n * 0.99)] * 1000:.1f} ms"
        )
        for ws in sockets:
            await ws.close()


async def _many(url: str, rooms: int, concurrency: int) -> None:
    import aiohttp

    http = "http://" + url.removeprefix("ws://")
    window = asyncio.Semaphore(concurrency)
    retried = 0
    created = 0
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            nonlocal retried, created
            async with window:
                body = {
                    "command": "stream.publish",
                    "payload": {"room": f"room-{i}", "event_type": "t", "data": i},
                }
                for _ in range(RETRIES_MAX):
                    async with session.post(http, json=body) as response:
                        answer = await response.json()
                    if "error" not in answer:
                        break
                    assert answer.get("retryable"), answer  # e.g. a leader change: resend
                    retried += 1
                    await asyncio.sleep(0.5)
                else:
                    raise AssertionError(f"room-{i}: {RETRIES_MAX} tries failed: {answer}")
                created += 1
                if created % 10_000 == 0:
                    print(
                        f"many: {created} rooms after {time.perf_counter() - started:.0f} s",
                        flush=True,
                    )

        await asyncio.gather(*(one(i) for i in range(rooms)))
        print(
            f"many: {rooms} rooms created in {time.perf_counter() - started:.1f} s "
            f"({retried} retryable refusals resent)",
            flush=True,
        )


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def _publish(url: str, events: int, concurrency: int, pids: dict[str, int]) -> None:
    import aiohttp

    http = "http://" + url.removeprefix("ws://")
    window = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            async with window:
                body = {
                    "command": "stream.publish",
                    "payload": {"room": "bench", "event_type": "t", "data": i},
                }
                sent = time.perf_counter()
                async with session.post(http, json=body) as response:
                    answer = await response.json()
                    assert "error" not in answer, answer
                latencies.append(time.perf_counter() - sent)

        await asyncio.gather(*(one(-1 - i) for i in range(concurrency)))  # warm up
        latencies.clear()
        before = {name: _cpu_ticks(pid) for name, pid in pids.items()}
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(events)))
        elapsed = time.perf_counter() - started
        after = {name: _cpu_ticks(pid) for name, pid in pids.items()}
    latencies.sort()
    n = len(latencies)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    cpu = ", ".join(
        f"{name} {(after[name] - before[name]) * tick_ms / events:.2f}" for name in pids
    )
    print(
        f"publish: {events} to one room, {concurrency} outstanding: {events / elapsed:.0f} "
        f"publishes/s; round trip p50 {latencies[n // 2] * 1000:.0f} ms p99 "
        f"{latencies[int(n * 0.99)] * 1000:.0f} ms; CPU ms per publish: {cpu}"
    )


def cluster(nodes: int, run: Any, with_pids: bool = False) -> None:
    with tempfile.TemporaryDirectory() as data:
        state = _spate("dev", "up", "--nodes", str(nodes), "--data-dir", data)
        try:
            gateway = state["gateways"][0]
            before = {p["node_id"]: _rss_mb(p["pid"]) for p in state["processes"]}
            pids = {p["node_id"]: p["pid"] for p in state["processes"]}
            asyncio.run(run(gateway["synap"], pids) if with_pids else run(gateway["synap"]))
            after = {p["node_id"]: _rss_mb(p["pid"]) for p in state["processes"]}
            for name, rss in after.items():
                print(f"rss {name}: {before[name]:.0f} MB -> {rss:.0f} MB", flush=True)
        finally:
            subprocess.run(
                [sys.executable, "-m", "spate.cli.main", "dev", "down", "--data-dir", data],
                capture_output=True,
                check=False,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("memory", "fanout", "many", "publish"))
    parser.add_argument("--rooms", default="1000,10000,100000")
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    print(f"load average: {os.getloadavg()}")
    if args.what == "memory":
        memory([int(c) for c in args.rooms.split(",")])
    elif args.what == "publish":
        cluster(
            args.nodes,
            lambda url, pids: _publish(url, args.events, args.concurrency, pids),
            with_pids=True,
        )
    elif args.what == "fanout":
        cluster(args.nodes, lambda url: _fanout(url, args.subscribers, args.events))
    else:
        cluster(
            args.nodes, lambda url: _many(url, int(args.rooms.split(",")[-1]), args.concurrency)
        )


if __name__ == "__main__":
    main()
