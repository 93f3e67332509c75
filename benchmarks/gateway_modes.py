#!/usr/bin/env python3
"""The standard workload through the gateway tier (issue 7): W1/W2/W3 direct to the partition's
leader, through a gateway in proxy mode, and through a gateway in redirect mode, in one run on
one three-node cluster (streams with 3 replicas, majority fsync before `accepted`), plus the
gateway's CPU per proxied message in (W1) and out (W2).

  python benchmarks/gateway_modes.py [--runs 3] [--count 200000] [--duration 20] [--out F]

`spate dev up --nodes 3` starts the cluster and one gateway in proxy mode; this script starts a
second gateway in redirect mode itself (`spate gateway run --mode redirect`) and stops it by
PID. Each run takes the modes in turn on fresh streams (same order every run). The native C
client (clients/amqp_load.c) follows amqp:link:redirect. Gateway CPU = utime+stime of the
gateway process (/proc/PID/stat) over the W1 or W2 run / messages (one clock tick = 10 ms, i.e.
0.05 µs/msg at 200,000 messages). Prints one JSON line per workload and mode, then a summary of
medians with ratios to direct.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import workload
from loadclient import (
    CLOCK_TICKS_PER_S,
    BenchError,
    build_client,
    emit,
    loadavg,
    log,
    proc_cpu_ticks,
    split_hostport,
)

from cluster import SPATE, Cluster, stop_pids

MODES = ("direct", "proxy", "redirect")
GATEWAY_START_S = 60.0


def start_redirect_gateway(c: Cluster, directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    admins = ",".join(str(n["admin"]) for n in c.endpoints["nodes"])
    log_file = open(directory / "gateway-redirect.log", "ab")  # noqa: SIM115 - closed by caller
    proc = subprocess.Popen(
        [
            str(SPATE),
            "gateway",
            "run",
            "--gateway-id",
            "bench-redirect",
            "--mode",
            "redirect",
            "--admin",
            admins,
            "--data-dir",
            str(directory),
            "--port",
            "0",
            "--refresh-ms",
            "500",
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + GATEWAY_START_S
    path = directory / "gateway.json"
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"the redirect gateway did not start; see {log_file.name}")
        time.sleep(0.1)
    return proc, str(json.loads(path.read_text())["amqp"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--count", type=int, default=workload.COUNT)
    p.add_argument("--duration", type=float, default=workload.DURATION_S)
    p.add_argument("--rate", type=int, default=workload.RATE_PER_S)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    binary = build_client()
    rows: list[dict[str, Any]] = []
    with Cluster(3) as c, tempfile.TemporaryDirectory(prefix="spate-gw-") as tmp:
        gateways = c.endpoints.get("gateways") or []
        proxy = next((g for g in gateways if g.get("mode") == "proxy" and g.get("pid")), None)
        if proxy is None:
            raise BenchError(f"spate dev up started no proxy gateway: {gateways}")
        proxy_pid = int(proxy["pid"])
        redirect_proc, redirect_amqp = start_redirect_gateway(c, Path(tmp))
        try:
            for run in range(1, a.runs + 1):
                for mode in MODES:
                    rows += one_mode(c, binary, a, run, mode, proxy, proxy_pid, redirect_amqp)
        finally:
            stop_pids([redirect_proc.pid])
    summary = summarize(rows)
    emit({"workload": "gateway_modes_summary", **summary, "loadavg": loadavg()}, a.out)
    print_summary(summary)
    return 0


def one_mode(  # noqa: PLR0917 - one call site, every value named there
    c: Cluster,
    binary: Path,
    a: argparse.Namespace,
    run: int,
    mode: str,
    proxy: dict[str, Any],
    proxy_pid: int,
    redirect_amqp: str,
) -> list[dict[str, Any]]:
    stream = f"gm-{mode}-{run}"
    for s in (stream, stream + "-e2e"):
        c.create_stream(s, replicas=3)
    leaders = {s: c.leaders(s)[0] for s in (stream, stream + "-e2e")}
    time.sleep(1.0)  # the gateways' next refresh (500 ms) sees the leaders
    if mode == "direct":
        host, port = c.amqp(leaders[stream])
    elif mode == "proxy":
        host, port = split_hostport(str(proxy["amqp"]))
    else:
        host, port = split_hostport(redirect_amqp)
    target = workload.Target(host=host, port=port, peer="spate")
    w = workload.Workload(
        stream=stream, count=a.count, rate=a.rate, duration_s=a.duration,
        label=f"spate/cluster3/{mode}/run{run}",
    )  # fmt: skip
    out: list[dict[str, Any]] = []
    for name, fn in (("w1", workload.w1), ("w2", workload.w2), ("w3", workload.w3)):
        if mode == "direct" and name == "w3":
            host, port = c.amqp(leaders[stream + "-e2e"])
            target = workload.Target(host=host, port=port, peer="spate")
        before = proc_cpu_ticks(proxy_pid)
        r = fn(binary, target, w)
        ticks = proc_cpu_ticks(proxy_pid) - before
        r.update(mode=mode, run=run, leader=leaders[stream], commit=commit())
        if mode == "proxy" and name in ("w1", "w2"):
            messages = r.get("confirmed") if name == "w1" else r.get("received")
            if messages:
                r["gateway_cpu_us_per_msg"] = round(
                    ticks / CLOCK_TICKS_PER_S * 1e6 / int(messages), 2
                )
                log(f"proxy gateway CPU {name}: {r['gateway_cpu_us_per_msg']} µs/msg")
        emit(r, a.out)
        out.append(r)
    return out


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in rows if r.get("mode") == mode]

        def median(workload_name: str, key: str, among: list[dict[str, Any]] = mine) -> Any:
            values = [
                float(r[key])
                for r in among
                if r.get("workload") == workload_name and r.get(key) is not None
                and not r.get("error")
            ]  # fmt: skip
            return round(statistics.median(values), 2) if values else None

        figures[mode] = {
            "w1_msgs_per_s": median("w1", "msgs_per_s"),
            "w1_confirm_p99_ms": median("w1", "confirm_p99_ms"),
            "w2_msgs_per_s": median("w2", "msgs_per_s"),
            "w3_e2e_p50_ms": median("w3", "e2e_p50_ms"),
            "w3_e2e_p99_ms": median("w3", "e2e_p99_ms"),
            "gateway_cpu_in_us": median("w1", "gateway_cpu_us_per_msg"),
            "gateway_cpu_out_us": median("w2", "gateway_cpu_us_per_msg"),
            "runs": len({r.get("run") for r in mine}),
            "errors": [r["error"] for r in mine if r.get("error")],
        }
    direct = figures["direct"]
    for mode in ("proxy", "redirect"):
        for key in ("w1_msgs_per_s", "w2_msgs_per_s"):
            if direct[key] and figures[mode][key]:
                figures[mode][key.replace("msgs_per_s", "vs_direct")] = round(
                    figures[mode][key] / direct[key], 2
                )
    return figures


def print_summary(s: dict[str, Any]) -> None:
    print(
        f"{'mode':<10}{'W1 msg/s':>11}{'vs direct':>10}{'W2 msg/s':>11}{'vs direct':>10}"
        f"{'W3 p50':>8}{'W3 p99':>8}{'gw in µs':>9}{'gw out µs':>10}",
        file=sys.stderr,
    )
    for mode in MODES:
        f = s[mode]
        print(
            f"{mode:<10}{f['w1_msgs_per_s']!s:>11}{f.get('w1_vs_direct', '')!s:>10}"
            f"{f['w2_msgs_per_s']!s:>11}{f.get('w2_vs_direct', '')!s:>10}"
            f"{f['w3_e2e_p50_ms']!s:>8}{f['w3_e2e_p99_ms']!s:>8}"
            f"{f['gateway_cpu_in_us']!s:>9}{f['gateway_cpu_out_us']!s:>10}",
            file=sys.stderr,
        )
        if f["errors"]:
            print(f"  errors: {f['errors']}", file=sys.stderr)


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent.parent)
    try:
        sys.exit(main())
    except BenchError as e:
        log(f"FAILED: {e}")
        sys.exit(1)
