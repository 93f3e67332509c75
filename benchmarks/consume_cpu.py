#!/usr/bin/env python3
"""CPU per delivered message on W2's path (issue 16): the serving node, the gateway when it
proxies, and the client, for consumers whose deliveries are sent settled and ones that accept
each delivery.

Method: a fresh `spate dev up --nodes 3` (a proxy gateway beside it), one stream with one
partition and 3 replicas; COUNT messages of SIZE bytes published once through the leader
(native client, clients/amqp_load.c); then for each case the same client reads them all back
from the first offset while utime + stime of every server process (all threads, /proc/PID/stat)
and the client's (getrusage of children) are sampled before and after. CPU-µs/msg = delta /
messages delivered. Process CPU time does not count time spent waiting for a core, so it is
robust on a shared machine where wall-clock rates are not; wall msgs/s is printed beside it as
indicative only. One clock tick is 10 ms: at 200,000 messages that is 0.05 µs/msg. Each row
also has the gateway's minor page faults per message (`gateway_faults_per_msg`: pages new or
given back to the kernel and touched again, RESULTS §57) and its VmRSS after the run.

Cases (each `--runs` times, in turns; medians):
  direct-settled   the consumer on a follower, `--settled` (snd-settle-mode settled: no
                   disposition per message, as the stream protocol's consumers)
  direct-acked     the same, accepting each delivery (a disposition per message, in ranges)
  gateway-settled  through the gateway (proxy mode): the gateway and the serving node both count
  gateway-acked

  python benchmarks/consume_cpu.py [--sizes 100,1024] [--count 200000] [--runs 3] [--out FILE]

For an A/B in one session run it twice, e.g. against another tree with
`PYTHONPATH=<dir holding a spate -> that tree's src symlink>` (the nodes inherit it).
Prints one line per case on stderr and one JSON line per measurement on stdout (and --out).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from loadclient import (
    CLOCK_TICKS_PER_S,
    BenchError,
    build_client,
    emit,
    loadavg,
    log,
    proc_cpu_ticks,
    proc_minor_faults,
    rss_kib,
    run_client,
    split_hostport,
)

from cluster import Cluster

CASES = ("direct-settled", "direct-acked", "gateway-settled", "gateway-acked")
CREDIT = 10_000
WINDOW = 10_000
TIMEOUT_S = 300.0


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _ticks(pids: dict[str, int]) -> dict[str, int]:
    return {name: proc_cpu_ticks(pid) for name, pid in pids.items()}


def _other_threads_ticks(pid: int) -> int:
    """utime + stime of a process's threads other than its main one (the asyncio loop): the
    metadata tick thread, the fsync and executor threads; threads gone meanwhile are not
    counted (they are few and short)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if task.name == str(pid):
            continue
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total


def consume_once(
    binary: Path,
    where: tuple[str, str],
    stream: str,
    count: int,
    *,
    settled: bool,
    pids: dict[str, int],
) -> dict[str, Any]:
    host, port = where
    args = [
        "--host", host, "--port", port, "--address", stream, "--count", str(count),
        "--credit", str(CREDIT), "--offset", "first",
    ]  # fmt: skip
    if settled:
        args.append("--settled")
    t0 = {name: _other_threads_ticks(pid) for name, pid in pids.items()}
    f0 = {name: proc_minor_faults(pid) for name, pid in pids.items()}
    k0, c0 = _ticks(pids), _children_cpu_s()
    r = run_client(binary, "consume", args, TIMEOUT_S)
    k1, c1 = _ticks(pids), _children_cpu_s()
    f1 = {name: proc_minor_faults(pid) for name, pid in pids.items()}
    t1 = {name: _other_threads_ticks(pid) for name, pid in pids.items()}
    n = int(r.get("received") or 0)
    if r.get("error") or n < count:
        raise BenchError(f"consume failed: {r.get('error')} (received {n} of {count})")
    tick_us = 1e6 / CLOCK_TICKS_PER_S
    out: dict[str, Any] = {
        "received": n,
        "msgs_per_s": r.get("msgs_per_s"),
        "client_us_per_msg": round((c1 - c0) * 1e6 / n, 3),
    }
    for name in pids:
        out[f"{name}_us_per_msg"] = round((k1[name] - k0[name]) * tick_us / n, 3)
    if "gateway" in pids:
        # the gateway's memory: new or returned pages touched per message, and RSS after
        out["gateway_faults_per_msg"] = round((f1["gateway"] - f0["gateway"]) / n, 3)
        out["gateway_rss_kib"] = rss_kib(pids["gateway"])
    nodes = [name for name in pids if name != "gateway"]
    # the node serving the link: the follower it attached to (direct) or the one the gateway
    # reads from: the busiest node
    serving = max(nodes, key=lambda name: out[f"{name}_us_per_msg"])
    out["node_us_per_msg"] = out[f"{serving}_us_per_msg"]
    # the serving node's CPU outside its main thread (RESULTS §31: the metadata thread)
    out["node_other_threads_us_per_msg"] = round((t1[serving] - t0[serving]) * tick_us / n, 3)
    out["nodes_total_us_per_msg"] = round(sum(out[f"{name}_us_per_msg"] for name in nodes), 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--count", type=int, default=200_000, help="messages per size (1 KiB: half)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            ap.error(f"--cases: {c!r} is not one of {', '.join(CASES)}")
    binary = build_client()
    with Cluster(3) as c:
        gateway = c.endpoints["gateways"][0]
        for size in (int(s) for s in a.sizes.split(",") if s):
            count = a.count if size <= 100 else a.count // 2
            stream = f"cpu{size}-{int(time.time())}"
            c.create_stream(stream, replicas=3)
            leader = c.leaders(stream)[0]
            follower = next(n for n in c.node_ids() if n != leader)
            lh, lp = c.amqp(leader)
            pub = run_client(
                binary,
                "publish",
                ["--host", lh, "--port", lp, "--address", stream, "--count", str(count),
                 "--size", str(size), "--window", str(WINDOW)],
                TIMEOUT_S,
            )  # fmt: skip
            if pub.get("error"):
                raise BenchError(f"publish failed: {pub['error']}")
            time.sleep(2.0)  # the followers' replicas catch up and settle
            pids = {n: int(c.node(n)["pid"]) for n in c.node_ids()}
            pids["gateway"] = int(gateway["pid"])
            results: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
            for run in range(1, a.runs + 1):
                for case in cases:
                    where, how = case.split("-")
                    if where == "direct":
                        host, port = c.amqp(follower)
                    else:
                        host, port = split_hostport(str(gateway["amqp"]))
                    r = consume_once(
                        binary, (host, port), stream, count, settled=how == "settled", pids=pids
                    )
                    r.update(
                        workload="consume_cpu", case=case, size=size, run=run, label=a.label,
                        follower=follower, leader=leader, loadavg=loadavg(),
                    )  # fmt: skip
                    emit(r, a.out)
                    results[case].append(r)
            for case, rows in results.items():
                fields = ["node", "node_other_threads", "gateway", "nodes_total", "client"]
                med = {f: statistics.median(r[f"{f}_us_per_msg"] for r in rows) for f in fields}
                rate = statistics.median(float(r["msgs_per_s"] or 0) for r in rows)
                log(
                    f"{a.label} {size} B {case}: serving node {med['node']:.2f} (outside its "
                    f"main thread {med['node_other_threads']:.2f}), gateway "
                    f"{med['gateway']:.2f}, all nodes {med['nodes_total']:.2f}, client "
                    f"{med['client']:.2f} CPU-µs/msg (medians of {len(rows)}); "
                    f"{rate:,.0f} msgs/s wall; load {loadavg()}"
                )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        log(f"error: {e}")
        sys.exit(1)
