#!/usr/bin/env python3
"""`make bench`: every benchmark of Spate, then (with --peers) the peer brokers on the same
machine in the same session, and a side-by-side table with Spate/peer ratios.

Parts, in order:
  storage   benchmarks/storage_append.py (written by the storage helper), if present
  spate     `spate dev up --nodes 1 --data-dir TMP`; a stream per workload via
            `spate stream create NAME --replicas 1`; W1/W2/W3 (workload.py) and gateway CPU
            per message (gateway_cpu.py) with the native load client; `spate dev down`
  spate -n3 (--nodes 3) `spate dev up --nodes 3`, streams with 3 replicas, W1 (producer
            redirected to the leader), W2/W3 (consumer on a follower; W3 again on the leader);
            then failover.py (--kills leader kills) and partitions.py (1, 3, 12 partitions),
            stream_features.py (W1 named vs unnamed producers) and offset_commits.py
            (commits per second and commit latency), one run each, and consumer_groups.py
            (5 rebalances per case, one W2 run of group vs plain consumers; --quick: its own)
  peers     (--peers) ../shared/peers: RabbitMQ 3.10 single node (streams, rstream client, and
            AMQP 1.0 with the same native load client as Spate) and NATS JetStream single
            (nats-py raw publisher), the same workload, then stopped

Every step has a time limit; everything listens on 127.0.0.1 only (peers inside their own
network namespace); only processes started here are stopped, by PID; temp dirs are removed.
A part that cannot run is reported as MISSING or FAILED with the reason, and the exit status
is then 1 (never a silent skip).

  python benchmarks/run_all.py                 # storage + Spate
  python benchmarks/run_all.py --peers         # + RabbitMQ and NATS, ratios
  python benchmarks/run_all.py --quick         # small counts (20k messages, W3 5 s): smoke
  python benchmarks/run_all.py --nodes 3 --peers --no-storage   # 3 nodes, 3 replicas everywhere
JSON lines go to benchmarks/results/<UTC date>/ (--out-dir), the table to stdout and
summary.md there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gateway_cpu
import workload
from loadclient import ROOT, BenchError, build_client, emit, loadavg, log, machine, rss_kib

from cluster import Cluster, stop_pids

HERE = Path(__file__).resolve().parent
SPATE = ROOT / ".venv" / "bin" / "spate"
PEERS_DIR = Path(os.environ.get("SPATE_PEERS_DIR", ROOT.parent / "shared" / "peers"))
PEERS_VENV_PY = Path(os.environ.get("PEERS_ROOT", "/tmp/peers")) / "venv" / "bin" / "python"

STORAGE_TIMEOUT_S = 900.0
DEV_UP_TIMEOUT_S = 180.0
DEV_DOWN_TIMEOUT_S = 60.0
PEER_INSTALL_TIMEOUT_S = 1200.0
PEER_START_TIMEOUT_S = 300.0
PEER_BENCH_TIMEOUT_S = 900.0
PEER_STOP_TIMEOUT_S = 120.0
FAILOVER_TIMEOUT_S = 1200.0
PARTITIONS_TIMEOUT_S = 900.0
STREAM_FEATURES_TIMEOUT_S = 900.0
CONSUMER_GROUPS_TIMEOUT_S = 600.0
RABBITMQ_AMQP10_W2_COUNT = 60_000
"""RabbitMQ 3.10's AMQP 1.0 stream consumers stall after ~65,535 + credit messages
(../shared/peers/RESULTS.md): W2 over AMQP 1.0 reads fewer."""


@dataclass
class Part:
    name: str
    status: str = "not run"  # ok | FAILED | MISSING | not run
    detail: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)


def _run(
    cmd: list[str], timeout_s: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(cmd))
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env, cwd=cwd
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{' '.join(cmd)} did not finish within {timeout_s:.0f} s") from e


def _tail(p: subprocess.CompletedProcess[str], n: int = 15) -> str:
    return "\n".join((p.stderr or p.stdout or "").strip().splitlines()[-n:])


# storage ---------------------------------------------------------------------------------------


def run_storage(part: Part) -> None:
    script = HERE / "storage_append.py"
    if not script.is_file():
        part.status, part.detail = "MISSING", f"{script} does not exist yet"
        return
    p = _run([sys.executable, str(script)], STORAGE_TIMEOUT_S, cwd=ROOT)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        part.status, part.detail = "FAILED", f"exit {p.returncode}: {_tail(p)}"
        return
    part.status = "ok"
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            part.results.append(json.loads(line))


# spate -----------------------------------------------------------------------------------------


def spate_available() -> str | None:
    """None when `spate dev up` can be used, else why not."""
    if not SPATE.exists():
        return f"{SPATE} not found: run `make install`"
    p = _run([str(SPATE), "dev", "up", "--help"], 60.0)
    if p.returncode != 0:
        return f"`spate dev up` is not available yet (the node is not ready): {_tail(p, 3)}"
    return None


def run_spate(part: Part, w: workload.Workload, out_dir: Path) -> None:
    why = spate_available()
    if why:
        part.status, part.detail = "MISSING", why
        return
    data_dir = Path(tempfile.mkdtemp(prefix="spate-bench-"))
    pids: list[int] = []
    try:
        p = _run(
            [
                str(SPATE),
                "dev",
                "up",
                "--nodes",
                "1",
                "--data-dir",
                str(data_dir),
                "--output",
                "json",
            ],
            DEV_UP_TIMEOUT_S,
            cwd=ROOT,
        )
        ep_file = data_dir / "endpoints.json"
        if ep_file.is_file():
            pids = [
                int(n["pid"])
                for n in json.loads(ep_file.read_text()).get("nodes", [])
                if n.get("pid")
            ]
        if p.returncode != 0:
            raise BenchError(f"spate dev up failed (exit {p.returncode}): {_tail(p)}")
        ns = argparse.Namespace(
            host="127.0.0.1",
            port="0",
            address_format="{stream}",
            create_cmd=f"{SPATE} stream create {{stream}} --replicas 1 --admin {{admin}}",
            user=None,
            password=None,
            partition=None,
            filter="rabbitmq",
            prefix="",
            peer="spate",
            endpoints=data_dir,
            node=None,
        )
        t = workload.target_from_args(ns)
        log(f"Spate node {t.host}:{t.port} pid {t.server_pid}, admin {t.admin}")
        out = out_dir / "spate-single-c-proton.jsonl"
        w.label = "spate/single/c-proton/run1"
        part.results += workload.run(t, w, ["w1"], out)
        if t.server_pid:
            rss = {
                "peer": "spate",
                "workload": "rss_after_w1",
                "label": w.label,
                "rss_kib": [rss_kib(int(t.server_pid))],
                "loadavg": loadavg(),
            }
            emit(rss, out)
            part.results.append(rss)
        part.results += workload.run(t, w, ["w2", "w3"], out)
        if not t.server_pid:
            raise BenchError("endpoints.json has no pid for the node: no gateway CPU figure")
        cpu = gateway_cpu.measure(
            t,
            int(t.server_pid),
            w.stream + "-cpu",
            min(w.count, 100_000),
            label="spate/single/c-proton/cpu",
        )
        emit(cpu, out)
        part.results.append(cpu)
        errors = [f"{r.get('workload')}: {r['error']}" for r in part.results if r.get("error")]
        part.status = "FAILED" if errors else "ok"
        part.detail = "; ".join(errors)
    finally:
        d = _run(
            [str(SPATE), "dev", "down", "--data-dir", str(data_dir)], DEV_DOWN_TIMEOUT_S, cwd=ROOT
        )
        if d.returncode != 0:
            log(f"spate dev down failed (exit {d.returncode}): {_tail(d, 5)}")
        stop_pids(pids)
        shutil.rmtree(data_dir, ignore_errors=True)


def run_spate_cluster(part: Part, w: workload.Workload, out_dir: Path, nodes: int) -> None:
    """W1/W2/W3 on `spate dev up --nodes N`, streams with N replicas (fsync on every replica
    before a majority `accepted`). W1's producer connects to the first node and follows
    amqp:link:redirect to the partition's leader; W2's and W3's consumers attach to a follower
    (a replica that does not lead), which serves them from its own log."""
    why = spate_available()
    if why:
        part.status, part.detail = "MISSING", why
        return
    mode = f"cluster{nodes}"
    out = out_dir / f"spate-{mode}-c-proton.jsonl"
    with Cluster(nodes) as c:
        # W3 twice: consumer on a follower (the table's figure), then on the leader
        streams = (w.stream, w.stream + "-e2e", w.stream + "-l-e2e")
        for s in streams:
            c.create_stream(s, replicas=nodes)
        leaders = {s: c.leaders(s)[0] for s in streams}
        first = c.node_ids()[0]

        def target(node_id: str) -> workload.Target:
            host, port = c.amqp(node_id)
            return workload.Target(
                host=host, port=port, peer="spate", server_pid=c.node(node_id).get("pid")
            )

        def follower(stream: str) -> str:
            return next(n for n in c.node_ids() if n != leaders[stream])

        w.label = f"spate/{mode}/c-proton/run1"
        binary = build_client()
        w_leader = workload.Workload(**{**w.__dict__, "stream": w.stream + "-l"})
        steps: list[tuple[str, str, str, workload.Workload]] = [
            ("w1", first, streams[0], w),
            ("w2", follower(streams[0]), streams[0], w),
            ("w3", follower(streams[1]), streams[1], w),
            ("w3", leaders[streams[2]], streams[2], w_leader),
        ]
        for name, node_id, stream, wl in steps:
            fn = {"w1": workload.w1, "w2": workload.w2, "w3": workload.w3}[name]
            r = fn(binary, target(node_id), wl)
            r.update(nodes=nodes, replicas=nodes, connected_to=node_id, commit=_commit())
            r["leader"] = leaders[stream]
            if wl is w_leader:  # not the table's W3: recorded beside it
                r["workload"] = "w3-consumer-on-leader"
            emit(r, out)
            part.results.append(r)
            if name == "w1":
                rss = {
                    "peer": "spate",
                    "workload": "rss_after_w1",
                    "label": w.label,
                    "rss_kib": [rss_kib(int(n["pid"])) for n in c.endpoints["nodes"]],
                    "loadavg": loadavg(),
                }
                emit(rss, out)
                part.results.append(rss)
    errors = [f"{r.get('workload')}: {r['error']}" for r in part.results if r.get("error")]
    part.status = "FAILED" if errors else "ok"
    part.detail = "; ".join(errors)


def _commit() -> str:
    p = _run(["git", "rev-parse", "--short", "HEAD"], 30.0, cwd=ROOT)
    return p.stdout.strip()


def run_script(part: Part, script: str, args: list[str], out: Path, timeout_s: float) -> None:
    """A benchmark script of this directory that appends JSON lines to `out` (--out)."""
    p = _run([sys.executable, str(HERE / script), *args, "--out", str(out)], timeout_s, cwd=ROOT)
    for line in p.stderr.splitlines():
        if " $ " not in line:
            log("  " + line)
    part.results += [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    part.status = "ok" if p.returncode == 0 else "FAILED"
    if p.returncode != 0:
        part.detail = f"exit {p.returncode}: {_tail(p, 5)}"


# peers -----------------------------------------------------------------------------------------


def _peer_script(name: str) -> str:
    path = PEERS_DIR / name
    if not path.is_file():
        raise BenchError(f"{path} not found (set SPATE_PEERS_DIR to the peers harness)")
    return str(path)


def _peers_installed() -> bool:
    return (
        Path("/usr/lib/rabbitmq/bin/rabbitmq-server").exists()
        and shutil.which("nats-server") is not None
        and PEERS_VENV_PY.exists()
    )


def run_peers(part: Part, w: workload.Workload, out_dir: Path, mode: str = "single") -> None:
    """mode: single (one server each) or cluster (3 nodes, streams with 3 replicas)."""
    replicas = 3 if mode == "cluster" else 1
    if os.geteuid() != 0:
        part.status, part.detail = "MISSING", "the peers harness needs root (apt, ip netns)"
        return
    rabbit, nats = _peer_script("setup_rabbitmq.sh"), _peer_script("setup_nats.sh")
    run_bench = _peer_script("run_bench.sh")
    if not _peers_installed():
        # `setup_rabbitmq.sh install` runs `rabbitmqctl version`, which daemonises an epmd on the
        # host (0.0.0.0:4369): stop the epmd processes that appeared during install, by PID.
        before = _epmd_pids()
        try:
            for script in (rabbit, nats):
                p = _run([script, "install"], PEER_INSTALL_TIMEOUT_S)
                if p.returncode != 0:
                    raise BenchError(f"{script} install failed: {_tail(p)}")
        finally:
            for pid in _epmd_pids() - before:
                log(f"stopping the epmd (pid {pid}) that the RabbitMQ install started")
                os.kill(pid, signal.SIGTERM)
    env = dict(
        os.environ,
        N=str(w.count),
        SIZE=str(w.size),
        WINDOW=str(w.window),
        RATE=str(w.rate),
        DURATION=f"{w.duration_s:g}",
        STEP_TIMEOUT=f"{w.timeout_s:g}",
    )
    errors: list[str] = []
    try:
        # RabbitMQ single: stream protocol (rstream), then AMQP 1.0 with our load client
        jsonl = out_dir / f"rabbitmq-{mode}-rstream.jsonl"
        p = _run(
            [run_bench, "rabbitmq", mode, "1"],
            PEER_BENCH_TIMEOUT_S,
            env=dict(env, CLIENT="rstream", OUT=str(jsonl)),
        )
        if p.returncode != 0:
            errors.append(f"rabbitmq rstream: exit {p.returncode}: {_tail(p, 5)}")
        part.results += _read_jsonl(jsonl, f"rabbitmq/{mode}/rstream/run1")
        t = workload.Target(
            port="5672",
            address_format="/amq/queue/{stream}",
            user="guest",
            password="guest",
            create_cmd=f"ip netns exec peers {PEERS_VENV_PY} {HERE / 'rabbitmq_stream.py'} "
            f"{{stream}} --replicas {replicas}",
            prefix=["ip", "netns", "exec", "peers"],
            peer="rabbitmq-stream",
        )
        wa = workload.Workload(
            **{
                **w.__dict__,
                "stream": "amqp10",
                "w2_count": min(w.count, RABBITMQ_AMQP10_W2_COUNT),
                "label": f"rabbitmq/{mode}/c-proton-amqp10/run1",
            }
        )
        part.results += workload.run(
            t, wa, ["w1", "w2", "w3"], out_dir / f"rabbitmq-{mode}-c-proton-amqp10.jsonl"
        )
    finally:
        p = _run([rabbit, "stop"], PEER_STOP_TIMEOUT_S)
        if p.returncode != 0:
            errors.append(f"rabbitmq stop: {_tail(p, 5)}")
    try:
        jsonl = out_dir / f"nats-{mode}-nats-py-raw.jsonl"
        p = _run(
            [run_bench, "nats", mode, "1"],
            PEER_BENCH_TIMEOUT_S,
            env=dict(env, CLIENT="nats-py-raw", OUT=str(jsonl)),
        )
        if p.returncode != 0:
            errors.append(f"nats: exit {p.returncode}: {_tail(p, 5)}")
        part.results += _read_jsonl(jsonl, f"nats/{mode}/nats-py-raw/run1")
    finally:
        p = _run([nats, "stop"], PEER_STOP_TIMEOUT_S)
        if p.returncode != 0:
            errors.append(f"nats stop: {_tail(p, 5)}")
    errors += [
        f"{r.get('label')} {r.get('workload')}: {r['error']}"
        for r in part.results
        if r.get("error")
    ]
    part.status = "FAILED" if errors else "ok"
    part.detail = "; ".join(errors)


def _epmd_pids() -> set[int]:
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "epmd":
                    pids.add(int(d.name))
            except OSError:
                continue
    return pids


def _read_jsonl(path: Path, label: str) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BenchError(f"{path} was not written")
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.startswith("{")]
    return [r for r in rows if r.get("label") == label]


# table -----------------------------------------------------------------------------------------


def _figures(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    by = {r.get("workload"): r for r in rows}
    w1, w2, w3 = by.get("w1", {}), by.get("w2", {}), by.get("w3", {})
    figs = {
        "W1 publish msgs/s": w1.get("msgs_per_s"),
        "W2 consume msgs/s": w2.get("msgs_per_s"),
        "W3 e2e p50 ms": w3.get("e2e_p50_ms"),
        "W3 e2e p99 ms": w3.get("e2e_p99_ms"),
    }
    lead = by.get("w3-consumer-on-leader")
    if lead:  # Spate 3 nodes: compared with the peers' (only) W3
        figs[LEADER_P50] = lead.get("e2e_p50_ms")
        figs[LEADER_P99] = lead.get("e2e_p99_ms")
    return figs


LEADER_P50 = "W3 e2e p50 ms, Spate consumer on the leader"
LEADER_P99 = "W3 e2e p99 ms, Spate consumer on the leader"
PEER_METRIC = {LEADER_P50: "W3 e2e p50 ms", LEADER_P99: "W3 e2e p99 ms"}


def table(spate: Part, peers: Part | None, mode: str = "single") -> str:
    cols: list[tuple[str, dict[str, float | None]]] = [
        ("Spate (C client)", _figures(spate.results))
    ]
    if peers is not None:
        for name, prefix in (
            ("RabbitMQ rstream", f"rabbitmq/{mode}/rstream"),
            ("RabbitMQ AMQP 1.0 (C client)", f"rabbitmq/{mode}/c-proton-amqp10"),
            ("NATS nats-py raw", f"nats/{mode}/nats-py-raw"),
        ):
            cols.append(
                (
                    name,
                    _figures(
                        [r for r in peers.results if str(r.get("label", "")).startswith(prefix)]
                    ),
                )
            )
    head = (
        f"| {'single node' if mode == 'single' else '3 nodes, 3 replicas'} | "
        + " | ".join(c if i == 0 else f"{c} | Spate/peer" for i, (c, _) in enumerate(cols))
        + " |"
    )
    lines = [head, "|---" * (1 + 1 + 2 * (len(cols) - 1)) + "|"]
    for metric in cols[0][1]:
        s = cols[0][1][metric]
        cells = [_fmt(s)]
        for _, figs in cols[1:]:
            v = figs.get(PEER_METRIC.get(metric, metric))
            cells += [_fmt(v), f"{s / v:.2f}" if s and v else "-"]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Ratios: throughput higher is better for Spate (> 1), latency lower is better "
        "(< 1). W2 over RabbitMQ AMQP 1.0 reads at most "
        f"{RABBITMQ_AMQP10_W2_COUNT:,} messages (its consumers stall past ~65k)."
    )
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


# main ------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--peers", action="store_true", help="also run RabbitMQ and NATS (root)")
    ap.add_argument("--quick", action="store_true", help="20k messages, W3 5 s (a smoke run)")
    ap.add_argument(
        "--nodes",
        type=int,
        choices=(1, 3),
        default=1,
        help="3: a three-node Spate cluster with 3-replica streams, and (--peers) the RabbitMQ "
        "and NATS 3-node clusters with 3 replicas (no gateway CPU part)",
    )
    ap.add_argument("--kills", type=int, default=20, help="failover.py kills (--nodes 3)")
    ap.add_argument("--no-storage", action="store_true")
    ap.add_argument("--no-spate", action="store_true")
    ap.add_argument(
        "--out-dir", type=Path, default=HERE / "results" / time.strftime("%Y-%m-%d", time.gmtime())
    )
    a = ap.parse_args()
    w = workload.Workload()
    if a.quick:
        w.count, w.duration_s = 20_000, 5.0
    a.out_dir.mkdir(parents=True, exist_ok=True)
    log(f"machine: {machine()}; results -> {a.out_dir}")
    try:
        build_client()
    except BenchError as e:
        log(f"FAILED: the load client: {e}")
        return 1

    peer_mode = "single" if a.nodes == 1 else "cluster"
    parts: list[Part] = []
    storage, spate = Part("storage"), Part("spate")
    failover = Part("failover") if a.nodes > 1 else None
    partitions = Part("partitions") if a.nodes > 1 else None
    features = Part("stream features") if a.nodes > 1 else None
    commits = Part("offset commits") if a.nodes > 1 else None
    groups = Part("consumer groups") if a.nodes > 1 else None
    peers = Part("peers") if a.peers else None
    for part, fn, skip in (
        (storage, run_storage, a.no_storage),
        (
            spate,
            lambda p: (
                run_spate(p, w, a.out_dir)
                if a.nodes == 1
                else run_spate_cluster(p, w, a.out_dir, a.nodes)
            ),
            a.no_spate,
        ),
        (
            failover,
            lambda p: run_script(
                p,
                "failover.py",
                ["--kills", str(a.kills)],
                a.out_dir / "spate-cluster3-failover.jsonl",
                FAILOVER_TIMEOUT_S,
            ),
            a.nodes == 1 or a.no_spate,
        ),
        (
            partitions,
            lambda p: run_script(
                p,
                "partitions.py",
                ["--count", str(w.count)],
                a.out_dir / "spate-cluster3-partitions.jsonl",
                PARTITIONS_TIMEOUT_S,
            ),
            a.nodes == 1 or a.no_spate,
        ),
        (
            features,
            lambda p: run_script(
                p,
                "stream_features.py",
                ["--runs", "1", "--count", str(w.count)],
                a.out_dir / "spate-cluster3-stream-features.jsonl",
                STREAM_FEATURES_TIMEOUT_S,
            ),
            a.nodes == 1 or a.no_spate,
        ),
        (
            commits,
            lambda p: run_script(
                p,
                "offset_commits.py",
                ["--runs", "1", "--commits", "500" if a.quick else "2000"],
                a.out_dir / "spate-cluster3-offset-commits.jsonl",
                STREAM_FEATURES_TIMEOUT_S,
            ),
            a.nodes == 1 or a.no_spate,
        ),
        (
            groups,
            lambda p: run_script(
                p,
                "consumer_groups.py",
                ["--quick"] if a.quick else ["--runs", "5", "--w2-runs", "1"],
                a.out_dir / "spate-cluster3-consumer-groups.jsonl",
                CONSUMER_GROUPS_TIMEOUT_S,
            ),
            a.nodes == 1 or a.no_spate,
        ),
        (peers, lambda p: run_peers(p, w, a.out_dir, peer_mode), peers is None),
    ):
        if part is None or (skip and part in (failover, partitions, features, commits, groups)):
            continue
        parts.append(part)
        if skip:
            part.status = "skipped (option)"
            continue
        log(f"=== {part.name} ===")
        try:
            fn(part)
        except BenchError as e:
            part.status, part.detail = "FAILED", str(e)

    summary = table(spate, peers, peer_mode)
    for r in failover.results if failover else []:
        summary += (
            f"\n\nFailover (leader kill -9 -> next acknowledged publish, {r.get('kills')} kills, "
            f"{r.get('client')}): p50 {r.get('failover_p50_ms')} ms, p99 "
            f"{r.get('failover_p99_ms')} ms, max {r.get('failover_max_ms')} ms"
        )
    for r in partitions.results if partitions else []:
        summary += (
            f"\nPartitions {r.get('partitions')} (3 replicas, one C-client producer per "
            f"partition on its leader): {r.get('msgs_per_s')} msgs/s aggregate"
        )
    for r in groups.results if groups else []:
        if r.get("workload") == "consumer_groups_rebalance_summary":
            summary += (
                f"\nConsumer group rebalance ({r.get('case')}, 6 partitions, {r.get('runs')} "
                f"runs): p50 {r.get('p50_ms')} ms, p99 {r.get('p99_ms')} ms"
            )
        elif r.get("workload") == "consumer_groups_w2_summary":
            summary += (
                f"\nW2 through a group of 3 vs 3 plain consumers (python clients): "
                f"{r['group']['msgs_per_s']} vs {r['plain']['msgs_per_s']} msgs/s, "
                f"ratio {r.get('group_vs_plain')}"
            )
    if a.nodes > 1:
        summary += (
            "\nSpate with 3 nodes: W1's producer follows the redirect to the leader; W2's and "
            "the first W3's consumers read from a follower, the last rows' from the leader."
        )
    report = ["## Parts", ""] + [
        f"- {p.name}: {p.status}" + (f" — {p.detail}" if p.detail else "") for p in parts
    ]
    m = machine()
    report += [
        "",
        f"## Figures ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; nproc "
        f"{m['nproc']}, kernel {m['kernel']}, load average {m['loadavg']})",
        "",
        summary,
        "",
    ]
    text = "\n".join(report)
    print(text)
    (a.out_dir / "summary.md").write_text(text + "\n")
    bad = [p for p in parts if p.status in ("FAILED", "MISSING")]
    for p in bad:
        log(f"{p.status}: {p.name}: {p.detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
