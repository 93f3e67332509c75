#!/usr/bin/env python3
"""Sub-entry batching and compression (issue 11, ADR 0017): storage bytes and W1/W2 throughput
for 100-byte JSON messages, plain and in sub-entries of each codec, on a three-node cluster
(3-replica streams, majority fsync before `accepted`).

  native  W1 and W2 of workload.py (the native C client, random 100-byte bodies): the plain
          path at full speed, for reference
  plain   W1: COUNT messages, one transfer each (spate.client AsyncProducer, window 10,000)
  <codec> W1: the same messages in sub-entries of SIZE (SubEntryBatch, window 10,000 / SIZE
          transfers, so as many messages are in flight), codec none | gzip | snappy | lz4 | zstd
  then    storage: the partition's bytes on disk (`spate stream describe`) per message;
          W2: a consumer attached to a follower reads all from the first, one message per
          delivery (the sub-entries are unpacked for it: it is a plain AMQP consumer);
          W2 as is: the same with `sub_entries=True` (one delivery per sub-entry, unpacked by
          spate.client; credit 100 deliveries, i.e. 10,000 messages as for W2); W2 native:
          workload.py's W2 (native C client, credit 10,000) on the same stream, where the
          broker's unpacking, not the Python client, is what limits.

  python benchmarks/sub_entries.py [--runs 3] [--count 200000] [--size 100] [--out F]

The producer and consumer are spate.client's asyncio ones in this process (the native C client
of workload.py sends no sub-entries), so msg/s here compare the cases with each other, not with
workload.py's W1/W2 figures. Each run takes the cases in turn on fresh streams, rotating which
goes first. Prints one JSON line per case and run, then medians and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import workload
from loadclient import build_client, emit, loadavg, log
from spate.client.aio import AsyncConsumer, AsyncProducer, encode
from spate.client.core import SubEntryBatch

from cluster import SPATE, Cluster, run

CASES = ("native", "plain", "none", "gzip", "snappy", "lz4", "zstd")
WINDOW = 10_000


def json_bodies(count: int, seed: int = 7) -> list[bytes]:
    """100-byte JSON readings: realistic repetition (keys, sensor ids), varying numbers."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        doc = {
            "id": i,
            "sensor": f"s-{rng.randrange(64):02d}",
            "ts": 1764115200000 + i * 13,
            "temp": round(rng.uniform(-10, 40), 2),
            "ok": True,
        }
        raw = json.dumps(doc, separators=(",", ":"))
        out.append((raw[:-1] + ',"p":"' + "x" * (100 - len(raw) - 7) + '"}').encode())
        assert len(out[-1]) == 100, out[-1]
    return out


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def w1(url: str, stream: str, bodies: list[bytes], case: str, size: int) -> dict[str, Any]:
    if case == "plain":
        items: list[Any] = bodies
        window = WINDOW
    else:
        encoded = [encode(b) for b in bodies]
        items = [SubEntryBatch(encoded[i : i + size], case) for i in range(0, len(encoded), size)]
        window = max(WINDOW // size, 1)
    producer = await AsyncProducer.connect(url, stream, window=window)
    cpu, start = cpu_s(), time.perf_counter()
    for item in items:
        await producer.send(item)
    await producer.flush()
    elapsed = time.perf_counter() - start
    cpu = cpu_s() - cpu
    await producer.close()
    return {
        "w1_msgs_per_s": round(len(bodies) / elapsed),
        "w1_client_cpu_us_per_msg": round(cpu / len(bodies) * 1e6, 2),
        "transfers": len(items),
    }


async def w2(url: str, stream: str, count: int, as_is: bool = False) -> float:
    """msg/s reading `count` from the first; `as_is`: sub-entries whole, unpacked here."""
    consumer = await AsyncConsumer.connect(
        url, stream, start="first", credit=WINDOW // 100 if as_is else WINDOW, sub_entries=as_is
    )
    start = time.perf_counter()
    for _ in range(count):
        await consumer.receive(timeout=60)
    elapsed = time.perf_counter() - start
    await consumer.close()
    return round(count / elapsed)


def describe(c: Cluster, stream: str) -> dict[str, Any]:
    """The leader's figures for partition 0 (`spate stream describe`: messages, bytes)."""
    out = run(
        [str(SPATE), "stream", "describe", stream, "--admin", c.admin, "--output", "json"], 60
    )
    partition: dict[str, Any] = json.loads(out)["partitions"][0]
    return partition


def native(binary: Path, c: Cluster, node: str, stream: str, *, count: int, phase: str) -> float:
    host, port = c.amqp(node)
    w = workload.Workload(stream=stream, count=count, label=f"spate/cluster3/sub-entries/{phase}")
    target = workload.Target(host=host, port=port, peer="spate")
    r = (workload.w1 if phase == "w1" else workload.w2)(binary, target, w)
    return float(r["msgs_per_s"])


def one(
    c: Cluster, binary: Path, case: str, run: int, *, bodies: list[bytes], size: int
) -> dict[str, Any]:
    stream = f"se-{case}-{run}"
    c.create_stream(stream, replicas=3)
    leader = c.leaders(stream)[0]
    follower = next(n for n in c.node_ids() if n != leader)
    host, port = c.amqp(leader)
    row: dict[str, Any] = {"case": case, "run": run, "count": len(bodies), "size": size}
    if case == "native":
        row["w1_msgs_per_s"] = native(binary, c, leader, stream, count=len(bodies), phase="w1")
        row |= {k: v for k, v in describe(c, stream).items() if k in ("bytes", "messages")}
        row["stored_bytes_per_msg"] = round(int(row["bytes"]) / len(bodies), 1)
        row["w2_native_msgs_per_s"] = native(
            binary, c, follower, stream, count=len(bodies), phase="w2"
        )
        row["load"] = loadavg()
        return row
    row |= asyncio.run(w1(f"amqp://{host}:{port}", stream, bodies, case, size))
    stored = describe(c, stream)
    row["stored_bytes"] = int(stored["bytes"])
    row["stored_bytes_per_msg"] = round(int(stored["bytes"]) / len(bodies), 1)
    row["messages"] = int(stored["messages"])
    host, port = c.amqp(follower)
    row["w2_msgs_per_s"] = asyncio.run(w2(f"amqp://{host}:{port}", stream, len(bodies)))
    if case != "plain":
        url = f"amqp://{host}:{port}"
        row["w2_as_is_msgs_per_s"] = asyncio.run(w2(url, stream, len(bodies), as_is=True))
    row["w2_native_msgs_per_s"] = native(binary, c, follower, stream, count=len(bodies), phase="w2")
    row["load"] = loadavg()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100, help="messages per sub-entry")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    bodies = json_bodies(a.count)
    binary = build_client()
    rows: list[dict[str, Any]] = []
    with Cluster(3) as c:
        for run in range(a.runs):
            order = CASES[run % len(CASES) :] + CASES[: run % len(CASES)]
            for case in order:
                row = one(c, binary, case, run, bodies=bodies, size=a.size)
                emit(row, a.out)
                rows.append(row)
    log(f"medians of {a.runs}, load {loadavg()}")
    keys = (
        "stored_bytes_per_msg",
        "w1_msgs_per_s",
        "w1_client_cpu_us_per_msg",
        "w2_msgs_per_s",
        "w2_as_is_msgs_per_s",
        "w2_native_msgs_per_s",
    )
    print("| case | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        cells = [
            f"{statistics.median(r[k] for r in mine):g}" if k in mine[0] else "-" for k in keys
        ]  # (native: W1 and W2 of the C client)
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
