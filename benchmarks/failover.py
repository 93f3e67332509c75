#!/usr/bin/env python3
"""Failover time on a three-node Spate cluster: from `kill -9` of a partition's leader to the
next publish the cluster acknowledges (the brief's target: p99 < 2 s).

  python benchmarks/failover.py [--kills 20] [--out FILE]

Method:
  * `spate dev up --nodes 3` in a temp dir; stream `failover`, 1 partition, 3 replicas.
  * A producer thread (spate.client.Producer: python-qpid-proton, follows amqp:link:redirect to
    the leader and retries refusals the broker marks retryable) publishes 100-byte messages one
    at a time, each waiting for its `accepted` (sent only after a majority fsynced it). On any
    failure (connection lost, timeout, refusal) it reconnects, trying the nodes in turn, and
    publishes the same message again. Every acknowledged publish is recorded as (send start,
    ack time), monotonic clock.
  * Per kill: look up the partition's leader (`spate partition list`), SIGKILL its node by the
    pid in endpoints.json (a process this script started), t0 = just before the kill. Failover
    time = ack time of the first publish *started after t0* minus t0 (a confirm already in
    flight before the kill does not count). Then `spate dev up` again (restarts the killed
    node) and wait until it is caught up: the restarted node serves, from its own replica, as
    many messages as had been acknowledged when it came back (native load client, consume from
    `first`). Only then the next kill.
  * Prints every sample and p50/p99/max (nearest rank); one JSON line on stdout (also appended to
    --out) with the samples, the commit and the load average.

Every wait is bounded; only processes this script started are killed, by PID; the temp dir is
removed. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from loadclient import BenchError, build_client, emit, loadavg, log, machine, run_client
from proton import ProtonException
from spate.client import AttachRefused, Producer, PublishRefused

from cluster import Cluster, alive

STREAM = "failover"
KILLS = 20
BODY_BYTES = 100
PRODUCER_TIMEOUT_S = 5.0
"""Per connect/attach/confirm of the benchmark's producer: a dead leader shows up as a closed
socket at once, so this only bounds a hang."""
RECONNECT_PAUSE_S = 0.01
FAILOVER_WAIT_S = 60.0
"""A kill whose next acknowledged publish takes longer than this fails the run."""
CATCHUP_TIMEOUT_S = 60.0
WARMUP_ACKS = 50
KILL_DEATH_WAIT_S = 10.0


@dataclass
class Acks:
    """(send start, ack) monotonic times of acknowledged publishes; shared with the thread."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    times: list[tuple[float, float]] = field(default_factory=list)
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)

    def count(self) -> int:
        with self.lock:
            return len(self.times)

    def first_after(self, t0: float) -> float | None:
        with self.lock:
            later = [ack for start, ack in self.times if start > t0]
        return min(later) if later else None


def produce(urls: list[str], acks: Acks, stop: threading.Event) -> None:
    """Publish one message at a time until `stop`, reconnecting (node after node) on failure."""
    body = b"f" * BODY_BYTES
    producer: Producer | None = None
    turn = 0
    while not stop.is_set():
        try:
            if producer is None:
                url = urls[turn % len(urls)]
                turn += 1
                producer = Producer(url, STREAM, timeout_s=PRODUCER_TIMEOUT_S)
            start = time.monotonic()
            producer.send(body)
            done = time.monotonic()
            with acks.lock:
                acks.times.append((start, done))
        except (ProtonException, PublishRefused, AttachRefused, OSError) as e:
            with acks.lock:
                acks.reconnects += 1
                if len(acks.errors) < 200:
                    acks.errors.append(f"{type(e).__name__}: {e}"[:200])
            if producer is not None:
                # the connection is usually gone already: closing it can only fail
                with contextlib.suppress(ProtonException, OSError):
                    producer.close()
                producer = None
            time.sleep(RECONNECT_PAUSE_S)
    if producer is not None:
        producer.close()


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[max(0, min(len(v) - 1, math.ceil(p / 100 * len(v)) - 1))]


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def caught_up(c: Cluster, binary: Path, node_id: str, count: int) -> None:
    """The node serves `count` messages of the stream from its own replica (BenchError if not
    within CATCHUP_TIMEOUT_S)."""
    host, port = c.amqp(node_id)
    args = ["--host", host, "--port", port, "--address", STREAM, "--count", str(count)]
    args += ["--offset", "first", "--credit", "10000"]
    r = run_client(binary, "consume", args, CATCHUP_TIMEOUT_S)
    if r.get("error") or r.get("received") != count:
        raise BenchError(f"{node_id} did not catch up to {count} messages: {r}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kills", type=int, default=KILLS)
    ap.add_argument("--out", type=Path, help="append the JSON line to this file")
    a = ap.parse_args()
    binary = build_client()
    samples: list[float] = []
    rows: list[dict[str, object]] = []
    stop = threading.Event()
    acks = Acks()
    error = None
    load_start = loadavg()
    with Cluster(3) as c:
        c.create_stream(STREAM, replicas=3)
        c.leaders(STREAM)
        urls = [f"amqp://{':'.join(c.amqp(n))}" for n in c.node_ids()]
        thread = threading.Thread(target=produce, args=(urls, acks, stop), daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + FAILOVER_WAIT_S
            while acks.count() < WARMUP_ACKS:
                if time.monotonic() > deadline:
                    raise BenchError(f"producer never got going: {acks.errors[-3:]}")
                time.sleep(0.05)
            for i in range(1, a.kills + 1):
                leader = c.leaders(STREAM)[0]
                c.refresh()
                pid = int(c.node(leader)["pid"])
                assert pid in c.pids, f"{pid} is not a node this benchmark started"
                before = acks.count()
                t0 = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                wait_until = time.monotonic() + KILL_DEATH_WAIT_S
                while alive(pid) and time.monotonic() < wait_until:
                    time.sleep(0.01)
                t_ack = None
                deadline = t0 + FAILOVER_WAIT_S
                while t_ack is None and time.monotonic() < deadline:
                    time.sleep(0.005)
                    t_ack = acks.first_after(t0)
                if t_ack is None:
                    raise BenchError(
                        f"kill {i}: no publish acknowledged {FAILOVER_WAIT_S:.0f} s "
                        f"after killing {leader}: {acks.errors[-3:]}"
                    )
                ms = (t_ack - t0) * 1000
                samples.append(ms)
                c.up()  # restarts the killed node
                acked = acks.count()
                t1 = time.monotonic()
                caught_up(c, binary, leader, acked)
                row = {
                    "kill": i,
                    "leader": leader,
                    "pid": pid,
                    "failover_ms": round(ms, 1),
                    "acks_before": before,
                    "catchup_s": round(time.monotonic() - t1, 2),
                    "new_leader": c.leaders(STREAM)[0],
                    "loadavg": loadavg(),
                }
                rows.append(row)
                log(
                    f"kill {i}/{a.kills}: leader {leader} (pid {pid}) -> next ack after "
                    f"{ms:.1f} ms; restarted, caught up to {acked} in {row['catchup_s']} s; "
                    f"load {row['loadavg']}"
                )
        except BenchError as e:
            error = str(e)
            log(f"FAILED: {e}")
        finally:
            stop.set()
            thread.join(PRODUCER_TIMEOUT_S * 3)
    result: dict[str, object] = {
        "peer": "spate",
        "workload": "failover",
        "client": "spate.client.Producer (python-qpid-proton), one message at a time",
        "nodes": 3,
        "replicas": 3,
        "kills": len(samples),
        "samples_ms": [round(s, 1) for s in samples],
        "per_kill": rows,
        "acked_total": acks.count(),
        "reconnects": acks.reconnects,
        "commit": commit(),
        "machine": machine(),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "error": error,
    }
    if samples:
        result.update(
            failover_p50_ms=round(pct(samples, 50), 1),
            failover_p99_ms=round(pct(samples, 99), 1),
            failover_max_ms=round(max(samples), 1),
        )
        log(
            f"failover over {len(samples)} kills: p50 {result['failover_p50_ms']} ms, p99 "
            f"{result['failover_p99_ms']} ms, max {result['failover_max_ms']} ms "
            f"(samples: {', '.join(f'{s:.0f}' for s in samples)})"
        )
    emit(result, a.out)
    return 1 if error or len(samples) < a.kills else 0


if __name__ == "__main__":
    sys.exit(main())
