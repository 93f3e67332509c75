#!/usr/bin/env python3
"""Server CPU per message, in (publish) and out (consume), for an AMQP 1.0 server process.

Method (research/proton.md section 5): read utime + stime of the server process (all its
threads) from /proc/PID/stat just before and just after one load-client run; CPU µs/msg =
delta / messages. The native client (clients/amqp_load.c) costs ~1-2 µs/msg itself and runs
in its own process, so it is not counted; its own CPU is reported beside the figure.
Resolution is one clock tick (10 ms at 100 Hz): 100,000 messages make that 0.1 µs/msg.
The server's idle CPU over 1 s before the runs is reported too (not subtracted).

  python benchmarks/gateway_cpu.py --endpoints DIR --stream cpu \
      --create-cmd '.venv/bin/spate stream create {stream} --replicas 1 --admin {admin}'
  python benchmarks/gateway_cpu.py --pid 1234 --port 5672 --stream cpu ...

Prints `in: X µs/msg, out: Y µs/msg` on stderr and one JSON line on stdout.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

from loadclient import (
    CLOCK_TICKS_PER_S,
    CREDIT,
    SIZE_BYTES,
    WINDOW,
    BenchError,
    build_client,
    emit,
    loadavg,
    log,
    proc_cpu_ticks,
    run_client,
)
from workload import Target, create_stream, target_from_args
from workload import parser as workload_parser

COUNT = 100_000
IDLE_SAMPLE_S = 1.0


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(
    t: Target,
    pid: int,
    stream: str,
    count: int,
    *,
    size: int = SIZE_BYTES,
    window: int = WINDOW,
    credit: int = CREDIT,
    timeout_s: float = 300.0,
    label: str = "",
) -> dict[str, Any]:
    binary = build_client()
    create_stream(t, stream)
    address = t.address_format.format(stream=stream)
    common = ["--host", t.host, "--port", t.port, "--address", address]
    if t.user:
        common += ["--user", t.user]
    if t.password:
        common += ["--password", t.password]
    if t.partition:
        common += ["--partition", t.partition]
    tick_us = 1e6 / CLOCK_TICKS_PER_S

    c0 = proc_cpu_ticks(pid)
    time.sleep(IDLE_SAMPLE_S)
    idle_us_per_s = (proc_cpu_ticks(pid) - c0) * tick_us / IDLE_SAMPLE_S

    res: dict[str, Any] = {
        "peer": t.peer,
        "workload": "gateway_cpu",
        "pid": pid,
        "count": count,
        "size": size,
        "window": window,
        "credit": credit,
        "idle_cpu_us_per_s": round(idle_us_per_s, 1),
        "loadavg": loadavg(),
    }
    if label:
        res["label"] = label

    k0, s0 = proc_cpu_ticks(pid), _children_cpu_s()
    pub = run_client(
        binary,
        "publish",
        [*common, "--count", str(count), "--size", str(size), "--window", str(window)],
        timeout_s,
        t.prefix,
    )
    k1, s1 = proc_cpu_ticks(pid), _children_cpu_s()
    sub = run_client(
        binary,
        "consume",
        [
            *common,
            "--count",
            str(count),
            "--credit",
            str(credit),
            "--offset",
            "first",
            "--filter",
            t.filter,
        ],
        timeout_s,
        t.prefix,
    )
    k2, s2 = proc_cpu_ticks(pid), _children_cpu_s()

    n_in = int(pub.get("confirmed") or 0)
    n_out = int(sub.get("received") or 0)
    res.update(
        {
            "in_msgs": n_in,
            "out_msgs": n_out,
            "in_cpu_s": round((k1 - k0) * tick_us / 1e6, 3),
            "out_cpu_s": round((k2 - k1) * tick_us / 1e6, 3),
            "cpu_us_per_msg_in": round((k1 - k0) * tick_us / n_in, 2) if n_in else None,
            "cpu_us_per_msg_out": round((k2 - k1) * tick_us / n_out, 2) if n_out else None,
            "client_cpu_us_per_msg_in": round((s1 - s0) * 1e6 / n_in, 2) if n_in else None,
            "client_cpu_us_per_msg_out": round((s2 - s1) * 1e6 / n_out, 2) if n_out else None,
            "in_msgs_per_s": pub.get("msgs_per_s"),
            "out_msgs_per_s": sub.get("msgs_per_s"),
            "loadavg_after": loadavg(),
        }
    )
    errors = [
        f"{k}: {r['error']}" for k, r in (("publish", pub), ("consume", sub)) if r.get("error")
    ]
    if errors:
        res["error"] = "; ".join(errors)
    log(
        f"gateway CPU: in {res['cpu_us_per_msg_in']} µs/msg ({n_in} msgs, "
        f"{pub.get('msgs_per_s')} msgs/s), out {res['cpu_us_per_msg_out']} µs/msg ({n_out} msgs, "
        f"{sub.get('msgs_per_s')} msgs/s); client {res['client_cpu_us_per_msg_in']} / "
        f"{res['client_cpu_us_per_msg_out']} µs/msg; server idle {res['idle_cpu_us_per_s']} "
        f"µs/s; load {res['loadavg']}" + (f"; ERROR {res['error']}" if errors else "")
    )
    return res


def main() -> int:
    ap = workload_parser()
    ap.description = __doc__
    ap.add_argument(
        "--pid", type=int, help="server process (default: the node's pid in endpoints.json)"
    )
    ap.set_defaults(count=COUNT, stream="cpu")
    a = ap.parse_args()
    try:
        t = target_from_args(a)
        pid = a.pid or t.server_pid
        if not pid:
            raise BenchError("no server pid: give --pid or --endpoints")
        res = measure(
            t,
            int(pid),
            a.stream,
            a.count,
            size=a.size,
            window=a.window,
            credit=a.credit,
            timeout_s=a.timeout,
            label=a.label,
        )
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    emit(res, a.out)
    return 1 if res.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
