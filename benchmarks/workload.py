#!/usr/bin/env python3
"""The standard workload (W1 publish, W2 consume, W3 end-to-end latency) against any AMQP 1.0
endpoint, driven by the native load client (clients/amqp_load.c).

  W1  publish --count messages of --size bytes into a fresh stream, <= --window unsettled,
      confirm = `accepted`; msgs/s first send -> last confirm, confirm latency p50/p99/max.
  W2  consume --w2-count (default --count) of them from the start (source filter
      rabbitmq:stream-offset-spec = first, or the OASIS 0x200 filter), link credit --credit.
  W3  fresh stream <stream>-e2e; consumer attached first, then a producer in a separate process
      publishes --rate msgs/s for --duration s (paced every 2 ms, confirms on); latency =
      consumer's clock - the timestamp in the body.

Prints the figures on stderr and one JSON line per workload on stdout (fields as
../shared/peers/benchlib.py: msgs_per_s, confirm_p50_ms, e2e_p99_ms, received, expected, ...,
plus peer, label, loadavg), also appended to --out.

  # Spate (a `spate dev up` cluster):
  python benchmarks/workload.py --endpoints DIR --stream bench \
      --create-cmd '.venv/bin/spate stream create {stream} --replicas 1 --admin {admin}'
  # RabbitMQ 3.10 AMQP 1.0 (inside the peers netns; streams made by the stream protocol):
  python benchmarks/workload.py --port 5672 --user guest --password guest \
      --address-format '/amq/queue/{stream}' --prefix 'ip netns exec peers' \
      --create-cmd '...' --w2-count 60000
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadclient import (
    COUNT,
    CREDIT,
    DURATION_S,
    RATE_PER_S,
    SIZE_BYTES,
    TIMEOUT_S,
    WINDOW,
    BenchError,
    build_client,
    emit,
    loadavg,
    log,
    node_entry,
    read_endpoints,
    run_client,
    split_hostport,
)

CREATE_TIMEOUT_S = 120.0


@dataclass
class Target:
    """Where and how to reach the server under test."""

    host: str = "127.0.0.1"
    port: str = "5672"
    address_format: str = "{stream}"
    create_cmd: str | None = None
    """Command (shell words, {stream} and {admin} substituted) that makes a fresh stream."""
    admin: str = ""
    user: str | None = None
    password: str | None = None
    partition: str | None = None
    filter: str = "rabbitmq"
    prefix: list[str] = field(default_factory=list)
    peer: str = "amqp1.0"
    server_pid: int | None = None


@dataclass
class Workload:
    stream: str = "bench"
    count: int = COUNT
    w2_count: int | None = None
    size: int = SIZE_BYTES
    window: int = WINDOW
    credit: int = CREDIT
    rate: int = RATE_PER_S
    duration_s: float = DURATION_S
    timeout_s: float = TIMEOUT_S
    label: str = ""
    producer_name: str | None = None
    """W1 as a deduplicating producer (ADR 0011): link property spate:producer-name and an
    x-opt-publishing-id per message."""
    annotate: bool = False
    """W1's messages carry x-opt-publishing-id without a producer name (a control)."""
    group_keys: bool = False
    """W1's messages carry an event-streams-group-key (a super stream's routing key)."""


def create_stream(t: Target, stream: str) -> None:
    if not t.create_cmd:
        return
    cmd = [w.format(stream=stream, admin=t.admin) for w in shlex.split(t.create_cmd)]
    log("$ " + shlex.join(cmd))
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=CREATE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"creating stream {stream} took over {CREATE_TIMEOUT_S:.0f} s") from e
    if done.returncode != 0:
        raise BenchError(
            f"creating stream {stream} failed (exit {done.returncode}): "
            f"{shlex.join(cmd)}\n{(done.stderr or done.stdout).strip()[-2000:]}"
        )


def _common(t: Target, address: str) -> list[str]:
    args = ["--host", t.host, "--port", t.port, "--address", address]
    if t.user:
        args += ["--user", t.user]
    if t.password:
        args += ["--password", t.password]
    if t.partition:
        args += ["--partition", t.partition]
    return args


def _tag(r: dict[str, Any], t: Target, w: Workload) -> dict[str, Any]:
    r["peer"] = t.peer
    r["stream"] = w.stream
    r["loadavg"] = loadavg()
    if w.label:
        r["label"] = w.label
    return r


def w1(binary: Path, t: Target, w: Workload) -> dict[str, Any]:
    create_stream(t, w.stream)
    args = _common(t, t.address_format.format(stream=w.stream))
    args += ["--count", str(w.count), "--size", str(w.size), "--window", str(w.window)]
    if w.producer_name:
        args += ["--producer-name", w.producer_name]
    if w.annotate:
        args += ["--annotate"]
    if w.group_keys:
        args += ["--group-keys"]
    r = _tag(run_client(binary, "publish", args, w.timeout_s, t.prefix), t, w)
    log(
        f"W1 publish: {r.get('msgs_per_s')} msgs/s, confirm p50 {r.get('confirm_p50_ms')} ms "
        f"p99 {r.get('confirm_p99_ms')} ms, confirmed {r.get('confirmed')}/{w.count}, rejected "
        f"{r.get('rejected')}, released {r.get('released')}; load {r['loadavg']}"
        + (f"; ERROR {r['error']}" if r.get("error") else "")
    )
    return r


def w2(binary: Path, t: Target, w: Workload) -> dict[str, Any]:
    n = w.w2_count or w.count
    args = _common(t, t.address_format.format(stream=w.stream))
    args += [
        "--count",
        str(n),
        "--credit",
        str(w.credit),
        "--offset",
        "first",
        "--filter",
        t.filter,
    ]
    r = _tag(run_client(binary, "consume", args, w.timeout_s, t.prefix), t, w)
    log(
        f"W2 consume: {r.get('msgs_per_s')} msgs/s, received {r.get('received')}/{n}; load "
        f"{r['loadavg']}" + (f"; ERROR {r['error']}" if r.get("error") else "")
    )
    return r


def w3(binary: Path, t: Target, w: Workload) -> dict[str, Any]:
    stream = w.stream + "-e2e"
    create_stream(t, stream)
    args = _common(t, t.address_format.format(stream=stream))
    args += [
        "--rate",
        str(w.rate),
        "--duration",
        f"{w.duration_s:g}",
        "--size",
        str(w.size),
        "--window",
        str(w.window),
        "--credit",
        str(w.credit),
        "--offset",
        "first",
        "--filter",
        t.filter,
    ]
    r = _tag(run_client(binary, "latency", args, w.duration_s + 60.0, t.prefix), t, w)
    p = r.get("producer") or {}
    log(
        f"W3 e2e: p50 {r.get('e2e_p50_ms')} ms p99 {r.get('e2e_p99_ms')} ms max "
        f"{r.get('e2e_max_ms')} ms, delivered {r.get('received')}/{r.get('expected')}; producer "
        f"{p.get('msgs_per_s')} msgs/s, confirm p50 {p.get('confirm_p50_ms')} ms p99 "
        f"{p.get('confirm_p99_ms')} ms; load {r['loadavg']}"
        + (f"; ERROR {r['error']}" if r.get("error") else "")
    )
    return r


def run(t: Target, w: Workload, which: list[str], out: Path | None = None) -> list[dict[str, Any]]:
    """Run the chosen workloads in order; each result is emitted as soon as it exists."""
    binary = build_client()
    results = []
    for name in which:
        r = {"w1": w1, "w2": w2, "w3": w3}[name](binary, t, w)
        emit(r, out)
        results.append(r)
    return results


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workloads", default="w1,w2,w3", help="comma-separated, in order")
    ap.add_argument(
        "--endpoints",
        type=Path,
        help="a `spate dev up` data dir or its endpoints.json: AMQP host/port and "
        "admin address come from there (first node unless --node)",
    )
    ap.add_argument("--node", help="node_id in endpoints.json")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", default="5672")
    ap.add_argument("--stream", default="bench", help="stream name (W3 uses <stream>-e2e)")
    ap.add_argument(
        "--address-format",
        default="{stream}",
        help="AMQP address for a stream (RabbitMQ: /amq/queue/{stream})",
    )
    ap.add_argument(
        "--create-cmd",
        help="command making a fresh stream; {stream} and {admin} "
        "are substituted; none: the streams must exist",
    )
    ap.add_argument("--user")
    ap.add_argument("--password")
    ap.add_argument("--partition", help="link property event-streams-partition")
    ap.add_argument(
        "--filter",
        choices=("rabbitmq", "oasis"),
        default="rabbitmq",
        help="offset filter: rabbitmq:stream-offset-spec or OASIS 0x200",
    )
    ap.add_argument(
        "--prefix",
        default="",
        help="run the client under this command (e.g. 'ip netns exec peers')",
    )
    ap.add_argument("--peer", default="amqp1.0", help="name copied into the JSON lines")
    ap.add_argument("--count", type=int, default=COUNT)
    ap.add_argument("--w2-count", type=int, help="W2 message count (default --count)")
    ap.add_argument("--size", type=int, default=SIZE_BYTES)
    ap.add_argument("--window", type=int, default=WINDOW)
    ap.add_argument("--credit", type=int, default=CREDIT)
    ap.add_argument("--rate", type=int, default=RATE_PER_S)
    ap.add_argument("--duration", type=float, default=DURATION_S)
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="per W1/W2 run, s")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, help="append the JSON lines to this file")
    return ap


def target_from_args(a: argparse.Namespace) -> Target:
    t = Target(
        host=a.host,
        port=a.port,
        address_format=a.address_format,
        create_cmd=a.create_cmd,
        user=a.user,
        password=a.password,
        partition=a.partition,
        filter=a.filter,
        prefix=shlex.split(a.prefix),
        peer=a.peer,
    )
    if a.endpoints is not None:
        ep = read_endpoints(a.endpoints)
        node = node_entry(ep, a.node)
        t.host, t.port = split_hostport(node["amqp"])
        t.admin = ep.get("admin") or node.get("admin", "")
        t.server_pid = node.get("pid")
    return t


def main() -> int:
    a = parser().parse_args()
    which = [w.strip() for w in a.workloads.split(",") if w.strip()]
    bad = [w for w in which if w not in ("w1", "w2", "w3")]
    if bad:
        sys.exit(f"unknown workload(s): {', '.join(bad)}")
    w = Workload(
        stream=a.stream,
        count=a.count,
        w2_count=a.w2_count,
        size=a.size,
        window=a.window,
        credit=a.credit,
        rate=a.rate,
        duration_s=a.duration,
        timeout_s=a.timeout,
        label=a.label,
    )
    try:
        results = run(target_from_args(a), w, which, a.out)
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
