#!/usr/bin/env python3
"""Consumer groups on a three-node cluster (issue 9, ADR 0015), through the proxy gateway of
`spate dev up --nodes 3`: how long a rebalance takes, and what a group costs a reader.

  rebalance  A 6-partition stream (3 replicas) and a group defined with `spate group create
             STREAM GROUP --strategy round-robin --rebalance-delay-ms 0`; members are
             spate.client GroupConsumers through the gateway (two in this process, the dying
             one in a subprocess). A prober publishes one message to every partition every
             --probe-interval-ms (one spate.client Producer per partition, confirms counted).
             join:  2 members hold 3 partitions each; a third is constructed (attach) -> 2 each.
             death: 3 members hold 2 each; the subprocess one is killed with SIGKILL (its
                    connection drops, its link goes) -> the 2 survivors hold 3 each.
             leave: after each join the third member is closed (a graceful detach) -> 3 each;
                    measured the same way, reported beside the two asked for.

             REBALANCE TIME = end - T0. T0: just before the joining member's constructor is
             called (it returns once attached), or just before SIGKILL, or before close().
             end: the first moment at which (a) the live members' `assignment`s (each member's
             partitions as of its last delivery that announced a change) are disjoint, cover
             partitions 0-5 and are balanced (6 // members each, or one more), and (b) every
             live member has received (its thread took from receive()) at least one message
             of each of its partitions after both T0 and the moment that partition last entered
             its assignment. end = the latest of those first receipts; (a) must still hold
             --stable-ms later, else the wait goes on. The figure includes one publish and
             delivery through the gateway (the probe's) and up to one probe interval.
             Clocks: time.monotonic() (CLOCK_MONOTONIC, shared by the processes).
             Afterwards every confirmed probe must have reached some member (offsets 0..n-1 of
             each partition): a loss stops the benchmark with the missing offsets.

  w2         W2 (the standard consume workload) through the gateway with python clients on
             both sides: a stream of 6 partitions (3 replicas) prefilled with --count x 100 B
             (count/6 per partition, spate.client Producers), read from the first message by
             group:  3 GroupConsumers of a fresh group (round-robin, rebalance delay 0,
                     start="first": a fresh group has no committed offset), one per process;
             plain:  3 processes each reading 2 partitions with 2 partition-bound Consumers
                     (start="first"), one thread each.
             msgs/s = count / (the moment the 3 processes are told to attach -> the moment the
             last partition's last message was received by some process); so a group's start
             (a member first gets all 6 partitions, then two rebalances as the others join)
             is in its figure. Every offset must arrive (duplicates, from a partition moved
             with deliveries in flight, are counted); a consumer that stops fails the run.
             Cases alternate which goes first.

  python benchmarks/consumer_groups.py [--runs 20] [--w2-runs 3] [--count 300000]
                                       [--only rebalance|w2] [--quick] [--out F]

Prints one JSON line per run and case, then medians (w2) and p50/p99 (rebalance; with 20
samples p99 is the maximum), with the load average; figures on stderr.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from loadclient import BenchError, emit, loadavg, log

from cluster import SPATE, Cluster, run

PARTITIONS = 6
REPLICAS = 3
BODY_BYTES = 100
REBALANCE_TIMEOUT_S = 60.0
"""A rebalance not finished by then is reported as a failure (the session timeout is 30 s)."""
POLL_S = 0.002
SPAWN_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 30.0
W2_TIMEOUT_S = 300.0
PREFILL_WINDOW = 2_000
PROBE_WINDOW = 200
MEMBER_CREDIT = 100
"""Rebalance members' credit: what a member holds unfinished when a partition moves."""


def now() -> float:
    return time.monotonic()


# rebalance: members -----------------------------------------------------------------------------


class Member:
    """What a group member received and when its assignment changed, by monotonic time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.history: list[tuple[float, frozenset[int]]] = []
        """(time, assignment) at every change."""
        self.receipts: list[tuple[float, int, int]] = []
        """(time, partition, offset) in the order received."""
        self.times: list[list[float]] = [[] for _ in range(PARTITIONS)]
        """Per partition, the times of its receipts (ascending)."""
        self.alive = True

    def assignment(self) -> frozenset[int]:
        with self.lock:
            return self.history[-1][1] if self.history else frozenset()

    def on_assignment(self, partitions: frozenset[int], at: float | None = None) -> None:
        with self.lock:
            self.history.append((now() if at is None else at, frozenset(partitions)))

    def on_receipt(self, at: float, partition: int, offset: int) -> None:
        with self.lock:
            self.receipts.append((at, partition, offset))
            self.times[partition].append(at)

    def holds_since(self, partition: int) -> float:
        """When `partition` last entered this member's assignment."""
        with self.lock:
            since = 0.0
            for at, parts in self.history:
                if partition not in parts:
                    since = float("inf")
                elif since == float("inf"):
                    since = at
            return since

    def first_receipt(self, partition: int, after: float) -> float | None:
        with self.lock:
            times = self.times[partition]
            i = bisect.bisect_left(times, after)
            return times[i] if i < len(times) else None

    def close(self) -> None:
        self.alive = False


class LocalMember(Member):
    """A GroupConsumer in this process, read by its own thread."""

    def __init__(self, name: str, url: str, stream: str, group: str) -> None:
        super().__init__(name)
        from spate.client import GroupConsumer

        self.consumer = GroupConsumer(
            url, stream, group, credit=MEMBER_CREDIT, on_assignment=self.on_assignment
        )
        self.thread = threading.Thread(target=self._read, name=name, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        from spate.client import ConsumerClosed

        while self.alive:
            try:
                event = self.consumer.receive(timeout=0.5)
            except TimeoutError:
                continue
            except ConsumerClosed:
                return
            assert event.partition is not None, "a group member's event names its partition"
            self.on_receipt(now(), int(event.partition), event.offset)

    def close(self) -> None:
        self.consumer.close()
        self.alive = False
        self.thread.join(10)


class RemoteMember(Member):
    """A GroupConsumer in a subprocess (`--member`), reporting as JSON lines; killable."""

    def __init__(self, name: str, url: str, stream: str, group: str) -> None:
        super().__init__(name)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--member", url, stream, group],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.joined = threading.Event()
        self.thread = threading.Thread(target=self._read, name=name, daemon=True)
        self.thread.start()
        if not self.joined.wait(SPAWN_TIMEOUT_S):
            self.kill()
            raise BenchError(f"member subprocess {name} did not attach within {SPAWN_TIMEOUT_S} s")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, *fields = line.split()
            if kind == "joined":
                self.joined.set()
            elif kind == "a":
                self.on_assignment(frozenset(int(p) for p in fields[1:]), float(fields[0]))
            elif kind == "r":
                self.on_receipt(float(fields[0]), int(fields[1]), int(fields[2]))

    def kill(self) -> None:
        """SIGKILL; returns once it is gone and every line it wrote was read."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.thread.join(10)
        self.alive = False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()


def member_process(url: str, stream: str, group: str) -> int:
    """`--member`: one GroupConsumer; prints `a TIME P...` on an assignment change and
    `r TIME PARTITION OFFSET` per message, each line flushed (a SIGKILL loses none written)."""
    from spate.client import GroupConsumer

    out, lock = sys.stdout, threading.Lock()

    def write(line: str) -> None:  # from this thread and the client's loop thread
        with lock:
            out.write(line)
            out.flush()

    def assigned(partitions: frozenset[int]) -> None:
        write(f"a {now()} {' '.join(str(p) for p in sorted(partitions))}\n")

    consumer = GroupConsumer(
        url, stream, group, credit=MEMBER_CREDIT, on_assignment=assigned
    )  # fmt: skip
    write("joined\n")
    while True:
        event = consumer.receive(timeout=None)
        write(f"r {now()} {event.partition} {event.offset}\n")


class Prober:
    """One message to every partition every `interval_s`, from a thread; confirms counted."""

    def __init__(self, url: str, stream: str, interval_s: float) -> None:
        from spate.client import Producer

        self.interval_s = interval_s
        self.producers = [
            Producer(url, stream, partition=p, window=PROBE_WINDOW) for p in range(PARTITIONS)
        ]
        self.sent = [0] * PARTITIONS
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="prober", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        body = b"p" * BODY_BYTES
        due = now()
        while not self.stopping.is_set():
            for p, producer in enumerate(self.producers):
                producer.send_async(body).add_done_callback(self._confirmed)
                self.sent[p] += 1
            due += self.interval_s
            time.sleep(max(0.0, due - now()))

    def _confirmed(self, future: Any) -> None:
        if future.exception() is not None:
            self.errors.append(repr(future.exception()))

    def stop(self) -> list[int]:
        """Stop, wait for every confirm; how many messages each partition got."""
        self.stopping.set()
        self.thread.join(10)
        for producer in self.producers:
            producer.flush(DRAIN_TIMEOUT_S)
            producer.close()
        if self.errors:
            raise BenchError(f"probe publishes failed: {self.errors[:5]}")
        return self.sent


# rebalance: measuring ---------------------------------------------------------------------------


def balanced(assignments: list[frozenset[int]]) -> bool:
    union = sorted(p for parts in assignments for p in parts)
    sizes = [len(parts) for parts in assignments]
    fair = PARTITIONS // len(assignments)
    return union == list(range(PARTITIONS)) and all(fair <= s <= fair + 1 for s in sizes)


def settled_at(members: list[Member], t0: float) -> float | None:
    """`end` of the docstring for these live members, if (a) and (b) hold now."""
    assignments = [m.assignment() for m in members]
    if not balanced(assignments):
        return None
    end = t0
    for m, parts in zip(members, assignments, strict=True):
        for p in parts:
            first = m.first_receipt(p, max(t0, m.holds_since(p)))
            if first is None:
                return None
            end = max(end, first)
    return end


def wait_settled(
    members: list[Member], t0: float, stable_s: float, what: str
) -> tuple[float, float]:
    """The rebalance time (s) after T0 = t0, once it held for `stable_s`; and when the last
    member learnt its final assignment (s after t0; 0 when none changed)."""
    deadline = t0 + REBALANCE_TIMEOUT_S
    candidate: tuple[float, list[frozenset[int]]] | None = None
    while True:
        end = settled_at(members, t0)
        assignments = [m.assignment() for m in members]
        if end is None:
            candidate = None
        elif candidate is None or candidate[1] != assignments:
            candidate = (end, assignments)
        elif now() >= candidate[0] + stable_s:
            announced = max(max((at for at, _ in m.history), default=t0) for m in members)
            return candidate[0] - t0, max(0.0, announced - t0)
        if now() > deadline:
            state = {
                m.name: {
                    "assignment": sorted(m.assignment()),
                    "history": [(round(at - t0, 3), sorted(a)) for at, a in m.history[-5:]],
                    "last_receipts": [(round(at - t0, 3), p, o) for at, p, o in m.receipts[-6:]],
                }
                for m in members
            }
            raise BenchError(
                f"{what}: the group did not settle within {REBALANCE_TIMEOUT_S:.0f} s of T0 "
                f"(times relative to T0): {json.dumps(state)}"
            )
        time.sleep(POLL_S)


def check_delivered(members: list[Member], sent: list[int]) -> dict[str, int]:
    """Every confirmed probe reached some member; else BenchError naming what did not."""
    deadline = now() + DRAIN_TIMEOUT_S
    while True:
        seen: list[set[int]] = [set() for _ in range(PARTITIONS)]
        total = 0
        for m in members:
            with m.lock:
                for _, p, o in m.receipts:
                    seen[p].add(o)
                total += len(m.receipts)
        missing = {p: sorted(set(range(sent[p])) - seen[p]) for p in range(PARTITIONS)}
        if not any(missing.values()):
            return {"published": sum(sent), "received": total, "repeats": total - sum(sent)}
        if now() > deadline:
            raise BenchError(
                "lost messages: confirmed probes no member received, per partition "
                "(count, first 20): "
                + json.dumps({p: (len(m), m[:20]) for p, m in missing.items() if m})
            )
        time.sleep(0.2)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rebalance_summary(case: str, samples_ms: list[float]) -> dict[str, Any]:
    return {
        "workload": "consumer_groups_rebalance_summary",
        "case": case,
        "runs": len(samples_ms),
        "p50_ms": round(percentile(samples_ms, 0.50), 1),
        "p99_ms": round(percentile(samples_ms, 0.99), 1),
        "min_ms": round(min(samples_ms), 1),
        "max_ms": round(max(samples_ms), 1),
        "loadavg": loadavg(),
    }


def rebalance(c: Cluster, gateway: str, a: argparse.Namespace) -> None:
    stream, group = "cg-probe", "crew"
    c.create_stream(stream, replicas=REPLICAS, partitions=PARTITIONS)
    c.leaders(stream)
    define_group(c, stream, group)
    stable_s = a.stable_ms / 1000
    everyone: list[Member] = []

    def local(name: str) -> LocalMember:
        m = LocalMember(name, gateway, stream, group)
        everyone.append(m)
        return m

    first, second = local("m1"), local("m2")
    prober = Prober(gateway, stream, a.probe_interval_ms / 1000)
    samples: dict[str, list[float]] = {"join": [], "leave": [], "death": []}
    try:
        wait_settled([first, second], now(), stable_s, "start with 2 members")
        for run_ in range(1, a.runs + 1):
            t0 = now()
            third = local(f"join{run_}")
            attached_s = now() - t0
            took = wait_settled([first, second, third], t0, stable_s, f"join run {run_}")
            record(samples, "join", run_, took, a.out, attached_ms=round(attached_s * 1000, 1))
            t0 = now()
            third.close()
            took = wait_settled([first, second], t0, stable_s, f"leave run {run_}")
            record(samples, "leave", run_, took, a.out)
        for run_ in range(1, a.runs + 1):
            victim = RemoteMember(f"victim{run_}", gateway, stream, group)
            everyone.append(victim)
            wait_settled([first, second, victim], now(), stable_s, f"death run {run_}: join")
            t0 = now()
            victim.kill()
            took = wait_settled([first, second], t0, stable_s, f"death run {run_}")
            record(samples, "death", run_, took, a.out)
        sent = prober.stop()
        delivered = check_delivered(everyone, sent)
        emit({"workload": "consumer_groups_probes", **delivered, "loadavg": loadavg()}, a.out)
    finally:
        prober.stopping.set()
        for m in everyone:
            if m.alive:
                m.close()
    for case in ("join", "death", "leave"):
        s = rebalance_summary(case, samples[case])
        emit(s, a.out)
        log(
            f"rebalance {case}: p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms "
            f"(min {s['min_ms']}, max {s['max_ms']}) over {s['runs']} runs; load {s['loadavg']}"
        )


def record(
    samples: dict[str, list[float]],
    case: str,
    run_: int,
    took_s: tuple[float, float],
    out: Path | None,
    **extra: Any,
) -> None:
    samples[case].append(took_s[0] * 1000)
    row = {
        "workload": "consumer_groups_rebalance",
        "case": case,
        "run": run_,
        "rebalance_ms": round(took_s[0] * 1000, 1),
        "announced_ms": round(took_s[1] * 1000, 1),
        **extra,
        "loadavg": loadavg(),
    }
    emit(row, out)


def define_group(c: Cluster, stream: str, group: str) -> None:
    run(
        [
            str(SPATE), "group", "create", stream, group, "--strategy", "round-robin",
            "--rebalance-delay-ms", "0", "--admin", c.admin,
        ],
        60.0,
    )  # fmt: skip


# w2 ---------------------------------------------------------------------------------------------


def w2_process(kind: str, url: str, stream: str, spec: str, counts: list[int]) -> int:
    """`--w2`: wait for `go` on stdin, attach, read; print `done P TIME` when partition P's last
    message arrives, and on `stop` a JSON line with what it received as offset ranges."""
    from spate.client import Consumer, ConsumerClosed, GroupConsumer

    seen = [bytearray(n) for n in counts]
    received = [0]
    lock = threading.Lock()
    out = sys.stdout

    def take(partition: int, offset: int) -> None:
        with lock:
            received[0] += 1
            seen[partition][offset] = 1
            if offset == counts[partition] - 1:
                out.write(f"done {partition} {now()}\n")
                out.flush()

    consumers: list[Any] = []

    def read(consumer: Any, bound: int | None) -> None:
        while True:
            try:
                event = consumer.receive(timeout=None)
            except ConsumerClosed:
                return
            except Exception as error:  # what stopped the consumer: told to the parent
                text = f"{type(error).__name__}: {error}".replace("\n", " ")
                with lock:
                    out.write(f"error {text}\n")
                    out.flush()
                return
            take(int(event.partition) if bound is None else bound, event.offset)

    out.write("ready\n")
    out.flush()
    if sys.stdin.readline().strip() != "go":
        return 2
    if kind == "group":
        consumers.append(GroupConsumer(url, stream, spec, start="first"))
        bounds: list[int | None] = [None]
    else:
        bounds = [int(p) for p in spec.split(",")]
        consumers += [Consumer(url, stream, partition=p, start="first") for p in bounds]
    threads = [
        threading.Thread(target=read, args=(c, b), daemon=True)
        for c, b in zip(consumers, bounds, strict=True)
    ]
    for t in threads:
        t.start()
    sys.stdin.readline()  # stop
    for consumer in consumers:
        consumer.close()
    for t in threads:
        t.join(10)
    with lock:
        ranges = {p: _ranges(s) for p, s in enumerate(seen)}
        out.write(json.dumps({"received": received[0], "ranges": ranges}) + "\n")
    out.flush()
    return 0


def _ranges(bits: bytearray) -> list[list[int]]:
    ranges: list[list[int]] = []
    for offset, hit in enumerate(bits):
        if hit:
            if ranges and ranges[-1][1] == offset - 1:
                ranges[-1][1] = offset
            else:
                ranges.append([offset, offset])
    return ranges


def prefill(gateway: str, stream: str, counts: list[int]) -> None:
    from spate.client import Producer

    body = b"w" * BODY_BYTES
    errors: list[str] = []

    def fill(p: int) -> None:
        try:
            with Producer(gateway, stream, partition=p, window=PREFILL_WINDOW) as producer:
                producer.send_batch([body] * counts[p])
        except Exception as e:  # reported below, with its partition
            errors.append(f"partition {p}: {e!r}")

    started = now()
    threads = [threading.Thread(target=fill, args=(p,)) for p in range(PARTITIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(W2_TIMEOUT_S)
    if errors:
        raise BenchError(f"prefill failed: {errors}")
    log(f"prefilled {sum(counts)} x {BODY_BYTES} B in {now() - started:.1f} s")


def w2_case(
    c: Cluster, gateway: str, stream: str, counts: list[int], *, case: str, run_: int
) -> dict[str, Any]:
    if case == "group":
        group = f"w2-{run_}"
        define_group(c, stream, group)
        specs = [group] * 3
    else:
        specs = [f"{2 * i},{2 * i + 1}" for i in range(3)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--w2", case, gateway, stream, spec, json.dumps(counts)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for spec in specs
    ]
    done: dict[int, float] = {}
    finals: list[dict[str, Any]] = []
    failures: list[str] = []
    lock = threading.Lock()

    def read(stdout: IO[str]) -> None:
        for line in stdout:
            if line.startswith("done "):
                _, p, at = line.split()
                with lock:
                    done.setdefault(int(p), float(at))
            elif line.startswith("{"):
                with lock:
                    finals.append(json.loads(line))
            elif line.startswith("error "):
                with lock:
                    failures.append(line[len("error ") :].strip())

    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise BenchError(f"w2 {case} worker did not start (exit {proc.wait(10)})")
        readers = [
            threading.Thread(target=read, args=(proc.stdout,), daemon=True) for proc in procs
        ]
        for t in readers:
            t.start()
        go = now()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        deadline = go + W2_TIMEOUT_S
        while len(done) < PARTITIONS:
            stopped = now() > deadline or any(proc.poll() is not None for proc in procs)
            if stopped or failures:
                raise BenchError(
                    f"w2 {case} run {run_}: partitions finished {sorted(done)} after "
                    f"{now() - go:.0f} s (exits {[proc.poll() for proc in procs]}); a consumer "
                    f"stopped: {failures}"
                )
            time.sleep(0.01)
        elapsed = max(done.values()) - go
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("stop\n")
            proc.stdin.flush()
        for proc, t in zip(procs, readers, strict=True):
            proc.wait(30)
            t.join(10)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    covered = [bytearray(n) for n in counts]
    for final in finals:
        for p, ranges in final["ranges"].items():
            for lo, hi in ranges:
                covered[int(p)][lo : hi + 1] = b"\x01" * (hi - lo + 1)
    missing = {
        p: counts[p] - sum(covered[p]) for p in range(PARTITIONS) if sum(covered[p]) < counts[p]
    }
    if len(finals) != 3 or missing:
        raise BenchError(
            f"w2 {case} run {run_}: lost messages (per partition, how many): {missing}; "
            f"{len(finals)} of 3 workers reported"
        )
    received = sum(f["received"] for f in finals)
    total = sum(counts)
    return {
        "workload": "consumer_groups_w2",
        "case": case,
        "run": run_,
        "count": total,
        "msgs_per_s": round(total / elapsed),
        "elapsed_s": round(elapsed, 3),
        "received": received,
        "repeats": received - total,
        "loadavg": loadavg(),
    }


def w2(c: Cluster, gateway: str, a: argparse.Namespace) -> None:
    stream = "cg-w2"
    c.create_stream(stream, replicas=REPLICAS, partitions=PARTITIONS)
    c.leaders(stream)
    counts = [a.count // PARTITIONS] * PARTITIONS
    prefill(gateway, stream, counts)
    rows: list[dict[str, Any]] = []
    for run_ in range(1, a.w2_runs + 1):
        order = ("group", "plain") if run_ % 2 else ("plain", "group")
        for case in order:
            row = w2_case(c, gateway, stream, counts, case=case, run_=run_)
            emit(row, a.out)
            rows.append(row)
    s: dict[str, Any] = {"workload": "consumer_groups_w2_summary", "loadavg": loadavg()}
    for case in ("group", "plain"):
        mine = [r for r in rows if r["case"] == case]
        s[case] = {
            "msgs_per_s": round(statistics.median(r["msgs_per_s"] for r in mine)),
            "repeats": [r["repeats"] for r in mine],
            "runs": len(mine),
        }
    s["group_vs_plain"] = round(s["group"]["msgs_per_s"] / s["plain"]["msgs_per_s"], 3)
    emit(s, a.out)
    log(
        f"W2 ({sum(counts)} x {BODY_BYTES} B, 6 partitions, medians of {a.w2_runs}): group of 3 "
        f"{s['group']['msgs_per_s']} msgs/s, 3 plain consumers x 2 partitions "
        f"{s['plain']['msgs_per_s']} msgs/s; group/plain {s['group_vs_plain']}; "
        f"load {s['loadavg']}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=20, help="rebalances per case")
    p.add_argument("--w2-runs", type=int, default=3)
    p.add_argument("--count", type=int, default=300_000, help="W2 messages (all partitions)")
    p.add_argument("--probe-interval-ms", type=float, default=5.0)
    p.add_argument("--stable-ms", type=float, default=300.0)
    p.add_argument("--only", choices=("rebalance", "w2"), help="one benchmark (default: both)")
    p.add_argument("--quick", action="store_true", help="3 rebalances, 1 W2 run of 30,000")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.quick:
        a.runs, a.w2_runs, a.count = 3, 1, 30_000
    log(f"load average {loadavg()}")
    with Cluster(3) as c:
        gateway = f"amqp://{c.endpoints['gateways'][0]['amqp']}"
        if a.only in (None, "rebalance"):
            rebalance(c, gateway, a)
        if a.only in (None, "w2"):
            w2(c, gateway, a)
    return 0


def entry(argv: list[str]) -> Callable[[], int]:
    """The subprocess roles (`--member`, `--w2`), else the benchmark."""
    if argv[:1] == ["--member"]:
        return lambda: member_process(*argv[1:4])
    if argv[:1] == ["--w2"]:
        return lambda: w2_process(argv[1], argv[2], argv[3], argv[4], json.loads(argv[5]))
    return main


if __name__ == "__main__":
    role = entry(sys.argv[1:])
    os.chdir(Path(__file__).resolve().parent.parent)
    try:
        sys.exit(role())
    except BenchError as e:
        log(f"FAILED: {e}")
        sys.exit(1)
