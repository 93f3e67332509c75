"""W1 publish, CPU per message on every node of a three-node cluster (issue 16, RESULTS §37).

`spate dev up --nodes 3` (its one gateway idle unless `--via gateway`); for each message size a
fresh stream with three replicas; the native load client (clients/amqp_load.c) publishes
`--count` messages straight to the partition's leader (or through the gateway) with a window of
`--window` unconfirmed. Around each run the script reads
every node's CPU time (utime and stime of all its threads, /proc/PID/stat) and its /metrics,
and prints one JSON line per size:

- `cpu_us_per_msg` {leader, followers...}: CPU microseconds per message (user and system); a
  figure that holds up on a shared machine, where msg/s does not (`msgs_per_s` is beside it,
  with the load average, as an indication only);
- `faults_per_msg`: minor page faults per message on each node (new or returned memory
  touched: mostly the heap growing to its working set early in a run; 2-45 us each on this
  kind of VM, RESULTS §55);
- `page_cost_us`: what a page of memory cost on this machine just before the cluster started
  (benchmarks/page_cost.py, measured once per invocation): CPU figures from different
  sessions compare only beside it (RESULTS §55);
- per MiB published: Raft entries (chunks) the leader proposed, its Append messages sent,
  and on each follower the Appends and entries received, batches and fsyncs (the counters a
  node exports; the ones a node does not export yet are null).

    SPATE_DEV_PORTS=16000-19000 .venv/bin/python benchmarks/w1_cpu.py --sizes 100,1024,16384 \
        --label after --out benchmarks/results/w1_cpu.jsonl

`--rate R` paces the publisher at R msg/s (amqp_load's `--rate`, W3's producer: 5,000) instead
of as fast as the window allows: CPU per message at a steady rate, where each message is
replicated nearly on its own (RESULTS §56).

`--profile DIR` also samples the leader and one follower with py-spy (`--native`, idle threads
left out, collapsed stacks in DIR/SIZE-ROLE.txt) for the length of each run;
benchmarks/profile_table.py turns those into CPU microseconds per message per function
(RESULTS §41); `--profiler perf` takes `perf record -g` instead (kernel frames too). Sampling
slows the nodes: the CPU figures of a profiled run are not comparable with unprofiled ones.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import page_cost
from loadclient import (
    CLOCK_TICKS_PER_S,
    BenchError,
    build_client,
    emit,
    loadavg,
    log,
    run_client,
    split_hostport,
)

from cluster import Cluster

COUNTS = {100: 300_000, 1024: 100_000, 16384: 10_000}
"""Messages per run by size (about 5-15 s each at the rates before issue 16's change on a quiet
machine)."""
COUNT_BYTES = 200 * 1024 * 1024
"""Other sizes: this many bytes of messages."""
NODE_COUNTERS = (
    "spate_replication_batches_total",
    "spate_replication_fsyncs_total",
    "spate_replication_appends_sent_total",
    "spate_replication_appends_received_total",
    "spate_replication_entries_received_total",
    "spate_replication_acks_coalesced_total",
)
METRICS_TIMEOUT_S = 10.0
PY_SPY = Path(sys.executable).parent / "py-spy"
PROFILE_RATE_HZ = 200
PROFILE_STOP_S = 60.0
_SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$")


def scrape(url: str) -> dict[str, float]:
    """Node-wide counters, and the per-partition last index as `last_index{stream}`."""
    with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        if name in NODE_COUNTERS:
            out[name] = float(value)
        elif name == "spate_partition_last_index" and labels:
            stream = re.search(r'stream="([^"]*)"', labels)
            if stream:
                out[f"last_index{{{stream.group(1)}}}"] = float(value)
    return out


def cpu_ticks(pid: int) -> tuple[int, int, int]:
    """utime and stime (ticks) and minor page faults of `pid`, all its threads."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]), int(fields[12]), int(fields[7])


def start_profiles(
    pids: dict[str, int], directory: Path, size: int, profiler: str
) -> list[subprocess.Popen[bytes]]:
    """A sampler on each (role -> pid) until stopped: py-spy's collapsed stacks in
    DIRECTORY/SIZE-ROLE.txt, or `perf record -g` (kernel and native frames, for
    `perf report`) in DIRECTORY/SIZE-ROLE.perf.data."""
    directory.mkdir(parents=True, exist_ok=True)
    samplers = []
    for role, pid in pids.items():
        if profiler == "perf":
            cmd = ["perf", "record", "-F", str(PROFILE_RATE_HZ), "-g", "-p", str(pid)]
            cmd += ["-o", str(directory / f"{size}-{role}.perf.data")]
        else:
            cmd = [str(PY_SPY), "record", "--pid", str(pid), "--rate", str(PROFILE_RATE_HZ)]
            cmd += ["--native", "--threads", "--format", "raw"]
            cmd += ["--output", str(directory / f"{size}-{role}.txt")]
        samplers.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # the samplers attach
    return samplers


def stop_profiles(samplers: list[subprocess.Popen[bytes]]) -> None:
    for sampler in samplers:
        sampler.send_signal(signal.SIGINT)  # both write their output on SIGINT
    for sampler in samplers:
        try:
            sampler.wait(PROFILE_STOP_S)
        except subprocess.TimeoutExpired:
            sampler.kill()
            raise BenchError(f"the profiler {sampler.args[0]} did not stop") from None


def one_size(  # noqa: PLR0917 (one run's settings)
    cluster: Cluster,
    binary: Path,
    size: int,
    count: int,
    window: int,
    n: int,
    via: str,
    extra: list[str],
    profile: Path | None = None,
    profiler: str = "py-spy",
) -> dict[str, Any]:
    stream = f"w1cpu-{size}-{n}"
    cluster.create_stream(stream, replicas=3)
    leader = cluster.leaders(stream)[0]
    nodes = cluster.node_ids()
    pids = {node: int(cluster.node(node)["pid"]) for node in nodes}
    gateway = cluster.endpoints["gateways"][0]
    if via == "gateway":
        pids["gateway"] = int(gateway["pid"])
    urls = {node: str(cluster.node(node)["metrics"]) for node in nodes}
    time.sleep(1.0)  # the new group's election and first heartbeats settle
    before = {node: scrape(urls[node]) for node in nodes}
    followers = [node for node in nodes if node != leader]
    samplers = (
        []
        if profile is None
        else start_profiles(
            {"leader": pids[leader], "follower": pids[followers[0]]}, profile, size, profiler
        )
    )
    cpu0 = {node: cpu_ticks(pid) for node, pid in pids.items()}
    load_before = loadavg()
    host, port = split_hostport(str(gateway["amqp"])) if via == "gateway" else cluster.amqp(leader)
    args = ["--host", host, "--port", port, "--address", stream]
    args += ["--count", str(count), "--size", str(size), "--window", str(window), *extra]
    try:
        result = run_client(binary, "publish", args, 600.0)
        cpu1 = {node: cpu_ticks(pid) for node, pid in pids.items()}
    finally:
        stop_profiles(samplers)
    after = {node: scrape(urls[node]) for node in nodes}
    confirmed = int(result.get("confirmed") or 0)
    if result.get("error") or confirmed != count:
        raise BenchError(f"W1 at {size} B: {result}")
    mib = count * size / (1 << 20)
    tick_us = 1e6 / CLOCK_TICKS_PER_S

    def delta(node: str, name: str) -> float | None:
        if name not in after[node]:
            return None
        return after[node][name] - before[node].get(name, 0.0)

    def per_mib(value: float | None) -> float | None:
        return None if value is None else round(value / mib, 2)

    row: dict[str, Any] = {
        "size": size,
        "count": count,
        "msgs_per_s": result.get("msgs_per_s"),
        "confirm_p50_ms": result.get("confirm_p50_ms"),
        "leader": leader,
        "via": via,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "cpu_us_per_msg": {},
        "user_us_per_msg": {},
        "faults_per_msg": {},
        "per_mib": {},
        "profile": None if profile is None else str(profile),
    }
    for node in [leader, *followers, *(["gateway"] if via == "gateway" else [])]:
        user = (cpu1[node][0] - cpu0[node][0]) * tick_us / count
        system = (cpu1[node][1] - cpu0[node][1]) * tick_us / count
        role = "leader" if node == leader else node if node == "gateway" else f"follower {node}"
        row["cpu_us_per_msg"][role] = round(user + system, 2)
        row["user_us_per_msg"][role] = round(user, 2)
        row["faults_per_msg"][role] = round((cpu1[node][2] - cpu0[node][2]) / count, 3)
        if node == "gateway":
            continue
        figures = {
            "batches": per_mib(delta(node, "spate_replication_batches_total")),
            "fsyncs": per_mib(delta(node, "spate_replication_fsyncs_total")),
        }
        if node == leader:
            figures["entries"] = per_mib(delta(node, f"last_index{{{stream}}}"))
            figures["appends_sent"] = per_mib(delta(node, "spate_replication_appends_sent_total"))
        else:
            figures["appends_received"] = per_mib(
                delta(node, "spate_replication_appends_received_total")
            )
            figures["entries_received"] = per_mib(
                delta(node, "spate_replication_entries_received_total")
            )
            figures["acks_coalesced"] = per_mib(
                delta(node, "spate_replication_acks_coalesced_total")
            )
        row["per_mib"][role] = figures
    row["cpu_us_per_msg"]["total"] = round(sum(row["cpu_us_per_msg"].values()), 2)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1024,16384", help="message sizes, bytes")
    parser.add_argument("--count", type=int, default=0, help="messages per run (0: by size)")
    parser.add_argument("--window", type=int, default=10_000, help="unconfirmed messages")
    parser.add_argument(
        "--via",
        choices=("leader", "gateway"),
        default="leader",
        help="publish straight to the leader (default) or through the cluster's gateway",
    )
    parser.add_argument(
        "--producer-name",
        default="",
        help="a named producer (deduplication on, x-opt-publishing-id per message; issue 8)",
    )
    parser.add_argument(
        "--annotate",
        action="store_true",
        help="unnamed, but every message carries x-opt-publishing-id (named's wire bytes)",
    )
    parser.add_argument(
        "--rate", type=float, default=0.0, help="msg/s, paced (0: as fast as the window allows)"
    )
    parser.add_argument("--label", default="", help="tag every row (e.g. before, after)")
    parser.add_argument("--out", type=Path, default=None, help="append the JSON lines here")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="sample the leader and a follower into this directory (--profiler)",
    )
    parser.add_argument("--profiler", choices=("py-spy", "perf"), default="py-spy")
    a = parser.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    extra = ["--producer-name", a.producer_name] if a.producer_name else []
    extra += ["--annotate"] if a.annotate else []
    binary = build_client()
    pages = page_cost.measure()
    log(f"page cost (us per 4 KiB page): {pages}")
    with Cluster(3) as cluster:
        log(f"cluster up: {[split_hostport(str(n['amqp'])) for n in cluster.endpoints['nodes']]}")
        for n, size in enumerate(sizes):
            count = a.count or COUNTS.get(size) or max(1000, COUNT_BYTES // size)
            paced = ["--rate", str(a.rate), "--duration", str(count / a.rate)] if a.rate else []
            row = one_size(
                cluster,
                binary,
                size,
                count,
                a.window,
                n,
                a.via,
                extra + paced,
                a.profile,
                a.profiler,
            )
            row["rate"] = a.rate or None
            row["page_cost_us"] = pages
            row["label"] = a.label
            row["producer_name"] = a.producer_name or None
            row["annotate"] = a.annotate
            emit(row, a.out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as error:
        log(f"error: {error}")
        sys.exit(1)
