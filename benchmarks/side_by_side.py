#!/usr/bin/env python3
"""Spate beside RabbitMQ Streams and NATS JetStream, three replicas each, in one run (issue 16).

  python benchmarks/side_by_side.py [--runs 3] [--sizes 100,1024,16384] [--partitions 1,3,12]
      [--duration 20] [--no-peers | --peer rabbitmq|nats ...] [--no-w3 | --w3-only [--w1]]
      [--quick] [--out-dir DIR]

Systems, all up at once for the whole run (so that every run meets the same machine):
  spate-direct   `spate dev up --nodes 3` (a proxy gateway beside it), streams with 3 replicas,
                 fsync on a majority before `accepted`; native C load client (clients/amqp_load.c);
                 W1's producer on the first node, redirected to the leader; W2 on a follower
  spate-gateway  the same cluster through its gateway (g1, proxy mode): every link via the gateway
  rabbitmq       RabbitMQ 3.10, 3-node cluster, a stream with 3 replicas (../shared/peers), the
                 stream protocol with rstream (its Python client), no fsync before confirm
  nats           NATS JetStream 2.9, 3 servers, R3 file storage, nats-py raw publisher
Per run, systems in an order that rotates from run to run: for each size, W1 (publish COUNT
with confirms into a fresh stream, window 10,000) then W2 (read them back from the first); the
RSS of every server process after W2; then W3 (100-byte messages at 5,000/s for --duration s,
consumer on a follower for spate-direct, also on the leader, and via the gateway); then Spate's
aggregate publish rate with 1, 3 and 12 partitions (partitions.py). COUNT per size keeps the
bytes moderate: 200,000 at 100 B, 100,000 at 1 KiB, 20,000 at 16 KiB (--quick: a tenth, W3 5 s).
--w3-only runs W3 alone, with --w1 also W1 at the first --sizes (latency work, issue 16: W3
before and after, and the publish rate it must not cost). Spate's W2 consumer asks for
pre-settled deliveries (`--settled`, no disposition per message: the stream protocol's consumers
do not acknowledge messages either); W2 with an `accepted` per message is measured beside it as
`spate-direct-acked`.

Writes JSON lines (`results.jsonl`), `summary.md` (medians with min-max, ratios Spate/peer) and
`side_by_side.png` into --out-dir (default benchmarks/results/<UTC date>/side-by-side). Every
step is bounded in time; peers listen in their own network namespace, Spate on 127.0.0.1; only
processes started here are stopped, by PID. Exit status 1 when a step failed (reported, never
skipped silently).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import partitions as partitions_bench
import workload
from loadclient import (
    ROOT,
    BenchError,
    build_client,
    emit,
    loadavg,
    log,
    machine,
    rss_kib,
    run_client,
)
from run_all import PEERS_DIR, PEERS_VENV_PY, _commit, _epmd_pids, _peers_installed

from cluster import Cluster

REPLICAS = 3
COUNTS = {100: 200_000, 1024: 100_000, 16384: 20_000}
PEER_STEP_TIMEOUT_S = 300.0
PEER_START_TIMEOUT_S = 300.0
W3_SIZE = 100


class Peer:
    """A peer cluster of ../shared/peers, started once and driven one workload at a time."""

    def __init__(self, name: str, setup: str, bench: list[str]) -> None:
        self.name, self.setup, self.bench = name, str(PEERS_DIR / setup), bench

    def _sh(self, *args: str, timeout_s: float) -> str:
        done = subprocess.run(
            [self.setup, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            raise BenchError(
                f"{self.setup} {' '.join(args)}: {(done.stderr or done.stdout)[-800:]}"
            )
        return done.stdout.strip()

    def start(self) -> None:
        self._sh("start", "cluster", timeout_s=PEER_START_TIMEOUT_S)
        if self.name == "nats":
            ports = self._sh("ports", timeout_s=30)
            self.bench = [*self.bench, "--ports", ports]

    def stop(self) -> None:
        try:
            self._sh("stop", timeout_s=120)
        except (BenchError, subprocess.TimeoutExpired) as e:
            log(f"{self.name} stop: {e}")

    def pids(self) -> list[int]:
        return [int(p) for p in self._sh("pids", timeout_s=30).split()]

    def run(
        self, which: str, stream: str, size: int, count: int, w: argparse.Namespace
    ) -> dict[str, Any]:
        cmd = [
            self.setup,
            "exec",
            str(PEERS_VENV_PY),
            *self.bench,
            "--workload",
            which,
            "--stream",
            stream,
            "--count",
            str(count),
            "--size",
            str(size),
            "--window",
            "10000",
            "--batch",
            "100",
            "--rate",
            "5000",
            "--duration",
            f"{w.duration:g}",
            "--replicas",
            str(REPLICAS),
            "--timeout",
            f"{PEER_STEP_TIMEOUT_S:g}",
        ]
        if which == "w2":
            cmd.append("--delete")
        log("$ " + " ".join(cmd[3:]))
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=PEER_STEP_TIMEOUT_S + 60 + w.duration,
                check=False,
                cwd=PEERS_DIR,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"{self.name} {which} did not finish in time"}
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            return {"error": f"{self.name} {which}: no output: {done.stderr[-800:]}"}
        result: dict[str, Any] = json.loads(lines[-1])
        return result


def _peers() -> list[Peer]:
    return [
        Peer(
            "rabbitmq",
            "setup_rabbitmq.sh",
            ["bench_rabbitmq.py", "--client", "rstream", "--port", "5552"],
        ),
        Peer(
            "nats", "setup_nats.sh", ["bench_nats.py", "--publisher", "raw", "--consumer", "push"]
        ),
    ]


class Spate:
    """The three-node cluster and its gateway, as two systems (direct, gateway)."""

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster
        self.binary = build_client()
        self.gateway = self.c.endpoints["gateways"][0]
        self.n = 0

    def _target(self, hostport: str, pid: int | None) -> workload.Target:
        host, port = hostport.rsplit(":", 1)
        return workload.Target(host=host, port=port, peer="spate", server_pid=pid)

    def node(self, node_id: str) -> workload.Target:
        n = self.c.node(node_id)
        return self._target(str(n["amqp"]), n.get("pid"))

    def via_gateway(self) -> workload.Target:
        return self._target(str(self.gateway["amqp"]), self.gateway.get("pid"))

    def fresh(self, name: str) -> str:
        """Create a 3-replica stream; its leader, once it has one."""
        self.c.create_stream(name, replicas=REPLICAS)
        return self.c.leaders(name)[0]

    def follower(self, leader: str) -> str:
        return next(n for n in self.c.node_ids() if n != leader)

    def pids(self) -> list[int]:
        return [int(n["pid"]) for n in self.c.endpoints["nodes"]] + [int(self.gateway["pid"])]

    def next_name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


def _wl(stream: str, size: int, count: int, w: argparse.Namespace, label: str) -> workload.Workload:
    return workload.Workload(
        stream=stream, count=count, size=size, duration_s=w.duration, label=label, timeout_s=300.0
    )


def _w2(s: Spate, t: workload.Target, wl: workload.Workload, settled: bool) -> dict[str, Any]:
    args = [
        "--host", t.host, "--port", t.port, "--address", wl.stream, "--count", str(wl.count),
        "--credit", str(wl.credit), "--offset", "first", "--filter", t.filter,
    ]  # fmt: skip
    if settled:
        args.append("--settled")
    r = run_client(s.binary, "consume", args, wl.timeout_s, [])
    r.update(peer="spate", stream=wl.stream, loadavg=loadavg(), label=wl.label)
    how = "sent settled" if settled else "accepted each"
    log(f"W2 consume ({how}): {r.get('msgs_per_s')} msgs/s, received {r.get('received')}")
    return r


def spate_w1_w2(
    s: Spate, system: str, size: int, count: int, *, w: argparse.Namespace, label: str
) -> list[dict[str, Any]]:
    stream = s.next_name(f"sbs{size}-")
    leader = s.fresh(stream)
    wl = _wl(stream, size, count, w, label)
    if system == "spate-gateway":
        t1 = t2 = s.via_gateway()
    else:
        t1, t2 = s.node(s.c.node_ids()[0]), s.node(s.follower(leader))
    results = [workload.w1(s.binary, t1, wl)]
    if w.w3_only:
        return results  # --w3-only --w1: the publish rate only
    results.append(_w2(s, t2, wl, settled=True))
    if system == "spate-direct":
        acked = _w2(s, t2, wl, settled=False)
        acked["system"] = "spate-direct-acked"
        results.append(acked)
    return results


def spate_w3(s: Spate, where: str, w: argparse.Namespace, label: str) -> dict[str, Any]:
    """W3 on a fresh stream `<base>-e2e` (created here, so the consumer can be placed)."""
    base = s.next_name("sbs-w3-")
    leader = s.fresh(f"{base}-e2e")
    t = {
        "gateway": s.via_gateway,
        "follower": lambda: s.node(s.follower(leader)),
        "leader": lambda: s.node(leader),
    }[where]()
    r = workload.w3(s.binary, t, _wl(base, W3_SIZE, 0, w, label))
    r["consumer_on"] = where
    return r


# the run ---------------------------------------------------------------------------------------


def _rss(pids: list[int]) -> list[int | None]:
    return [rss_kib(p) for p in pids]


def run_once(
    run: int, s: Spate, peers: list[Peer], w: argparse.Namespace, emit_row: Callable[..., None]
) -> None:
    systems: list[str] = ["spate-direct", "spate-gateway", *(p.name for p in peers)]
    shift = (run - 1) % len(systems)
    order = systems[shift:] + systems[:shift]
    by_name = {p.name: p for p in peers}
    for size in w.sizes[:1] if w.w3_only and w.w1 else [] if w.w3_only else w.sizes:
        count = max(1000, COUNTS.get(size, 100_000) // (10 if w.quick else 1))
        for system in order:
            label = f"{system}/run{run}"
            try:
                if system in by_name:
                    peer = by_name[system]
                    stream = f"sbs{size}r{run}"
                    rows = [peer.run("w1", stream, size, count, w)]
                    if not w.w3_only:
                        rows.append(peer.run("w2", stream, size, count, w))
                    pids = peer.pids()
                else:
                    rows = spate_w1_w2(s, system, size, count, w=w, label=label)
                    pids = s.pids()
            except BenchError as e:
                rows, pids = [{"workload": "w1", "error": str(e)}], []
            for r in rows:
                emit_row(r, system=r.get("system", system), run=run, size=size, count=count)
            emit_row(
                {"workload": "rss_after_w2", "rss_kib": _rss(pids)},
                system=system,
                run=run,
                size=size,
            )
    w3_order = ["spate-direct", "spate-direct-leader", "spate-gateway", *(p.name for p in peers)]
    shift = (run - 1) % len(w3_order)
    for system in [] if w.no_w3 else w3_order[shift:] + w3_order[:shift]:
        label = f"{system}/run{run}"
        try:
            if system in by_name:
                r = by_name[system].run("w3", f"sbse2e{run}", W3_SIZE, 0, w)
            else:
                where = {"spate-direct": "follower", "spate-direct-leader": "leader"}.get(
                    system, "gateway"
                )
                r = spate_w3(s, where, w, label)
        except BenchError as e:
            r = {"workload": "w3", "error": str(e)}
        emit_row(r, system=system, run=run, size=W3_SIZE)
    binary = s.binary
    for p in w.partitions:
        try:
            stream = s.next_name(f"sbs-parts{p}-")
            r = partitions_bench.measure(s.c, binary, p, 200_000 // (10 if w.quick else 1), stream)
        except BenchError as e:
            r = {"workload": "partitions", "error": str(e)}
        emit_row(r, system="spate-direct", run=run, size=100, partitions=p)


# summary ---------------------------------------------------------------------------------------

FIGURES: list[tuple[str, str, str, bool]] = [
    # (figure, workload, field, higher is better)
    ("W1 publish msgs/s", "w1", "msgs_per_s", True),
    ("W2 consume msgs/s", "w2", "msgs_per_s", True),
    ("W3 e2e p50 ms", "w3", "e2e_p50_ms", False),
    ("W3 e2e p99 ms", "w3", "e2e_p99_ms", False),
]
SYSTEMS = [
    "spate-direct",
    "spate-direct-acked",
    "spate-direct-leader",
    "spate-gateway",
    "rabbitmq",
    "nats",
]


def _median(values: list[float]) -> tuple[float, float, float] | None:
    return (statistics.median(values), min(values), max(values)) if values else None


def _ratio(
    medians: dict[tuple[str, int, str], float],
    figure: str,
    size: int,
    a: str,
    b: str,
    *,
    higher: bool,
) -> str:
    """a/b, marked when a is at least as good as b."""
    x, y = medians.get((figure, size, a)), medians.get((figure, size, b))
    if not x or not y:
        return "-"
    return f"{x / y:.2f}" + (" (ok)" if (x >= y) == higher else "")


def summarize(rows: list[dict[str, Any]]) -> tuple[str, dict[tuple[str, int, str], float]]:
    medians: dict[tuple[str, int, str], float] = {}
    lines = [
        "| figure | size | " + " | ".join(SYSTEMS) + " | spate-direct / rabbitmq | "
        "spate-gateway / rabbitmq | spate-direct / nats |",
        "|---|---|" + "---|" * (len(SYSTEMS) + 3),
    ]
    sizes = sorted({int(r["size"]) for r in rows if "size" in r})
    for figure, wl, fld, higher in FIGURES:
        for size in sizes:
            cells = []
            for system in SYSTEMS:
                values = [
                    float(r[fld])
                    for r in rows
                    if r.get("system") == system
                    and r.get("workload") == wl
                    and r.get("size") == size
                    and not r.get("error")
                    and r.get(fld) is not None
                ]
                m = _median(values)
                if m:
                    medians[(figure, size, system)] = m[0]
                    cells.append(f"{m[0]:,.1f} ({m[1]:,.1f}-{m[2]:,.1f})")
                else:
                    cells.append("-")
            if all(c == "-" for c in cells):
                continue

            lines.append(
                f"| {figure} | {size} | "
                + " | ".join(cells)
                + f" | {_ratio(medians, figure, size, 'spate-direct', 'rabbitmq', higher=higher)}"
                f" | {_ratio(medians, figure, size, 'spate-gateway', 'rabbitmq', higher=higher)}"
                f" | {_ratio(medians, figure, size, 'spate-direct', 'nats', higher=higher)} |"
            )
    parts = sorted({int(r["partitions"]) for r in rows if r.get("workload") == "w1-partitions"})
    if parts:
        lines += ["", "| Spate partitions (3 replicas) | aggregate W1 msgs/s, median (min-max) |"]
        lines.append("|---|---|")
        for p in parts:
            m = _median(
                [
                    float(r["msgs_per_s"])
                    for r in rows
                    if r.get("workload") == "w1-partitions"
                    and r.get("partitions") == p
                    and r.get("msgs_per_s")
                ]
            )
            if m:
                lines.append(f"| {p} | {m[0]:,.0f} ({m[1]:,.0f}-{m[2]:,.0f}) |")
    rss = [r for r in rows if r.get("workload") == "rss_after_w2" and r.get("rss_kib")]
    if rss:
        lines += ["", "| RSS per server process after W1+W2, MiB (median over runs) | size | "]
        lines[-1] = "| system | size | RSS per server process after W2, MiB (medians over runs) |"
        lines.append("|---|---|---|")
        for system in SYSTEMS:
            for size in sizes:
                mine = [r["rss_kib"] for r in rss if r["system"] == system and r["size"] == size]
                if not mine:
                    continue
                per = [
                    statistics.median(v[i] for v in mine if i < len(v) and v[i])
                    for i in range(max(map(len, mine)))
                ]
                lines.append(
                    f"| {system} | {size} | " + ", ".join(f"{v / 1024:,.0f}" for v in per) + " |"
                )
    return "\n".join(lines) + "\n", medians


def chart(medians: dict[tuple[str, int, str], float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ["spate-direct", "spate-gateway", "rabbitmq", "nats"]
    fig, axes = plt.subplots(1, len(FIGURES), figsize=(4.2 * len(FIGURES), 3.8))
    for ax, (figure, _, _, _) in zip(axes, FIGURES, strict=True):
        sizes = sorted({size for (f, size, _) in medians if f == figure})
        width = 0.8 / len(shown)
        for i, system in enumerate(shown):
            ys = [medians.get((figure, size, system), 0.0) for size in sizes]
            xs = [j + i * width for j in range(len(sizes))]
            ax.bar(xs, ys, width, label=system)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"{z} B" for z in sizes])
        ax.set_title(figure, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle("3 replicas each; medians; W1/W2 higher is better, W3 lower", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="100,1024,16384", help="W1/W2 body sizes, bytes")
    ap.add_argument("--partitions", default="1,3,12", help="Spate partition counts")
    ap.add_argument("--duration", type=float, default=20.0, help="W3 seconds at 5,000 msgs/s")
    ap.add_argument("--no-peers", action="store_true", help="Spate only")
    ap.add_argument(
        "--peer",
        action="append",
        choices=["rabbitmq", "nats"],
        help="only this peer (repeatable; default both)",
    )
    ap.add_argument(
        "--no-w3", action="store_true", help="W1/W2 only (with --partitions '': no partitions)"
    )
    ap.add_argument(
        "--w3-only",
        action="store_true",
        help="W3 only (no W1/W2, no partitions; with --w1 also W1 at the first --sizes)",
    )
    ap.add_argument(
        "--w1", action="store_true", help="with --w3-only: W1 publish too (throughput check)"
    )
    ap.add_argument("--quick", action="store_true", help="a tenth of the messages, W3 5 s")
    ap.add_argument("--out-dir", type=Path)
    ap.add_argument("--summarize", type=Path, help="only rebuild summary.md and the chart")
    w = ap.parse_args()
    w.sizes = [int(x) for x in w.sizes.split(",") if x]
    w.partitions = [int(x) for x in w.partitions.split(",") if x]
    if w.w3_only:
        w.partitions = []
        if w.no_w3:
            ap.error("--w3-only and --no-w3 exclude each other")
    if w.quick:
        w.duration = min(w.duration, 5.0)
    if w.summarize:
        rows = [json.loads(x) for x in (w.summarize / "results.jsonl").read_text().splitlines()]
        write_summary(rows, w.summarize)
        return 0
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    out_dir = w.out_dir or ROOT / "benchmarks" / "results" / date / "side-by-side"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "results.jsonl"
    rows: list[dict[str, Any]] = []
    commit = _commit()

    def emit_row(r: dict[str, Any], **tags: Any) -> None:
        r = {**r, **tags, "commit": commit, "loadavg": r.get("loadavg") or loadavg()}
        emit(r, out)
        rows.append(r)

    emit_row({"workload": "machine", **machine()})
    peers: list[Peer] = []
    if not w.no_peers:
        if os.geteuid() != 0 or not _peers_installed():
            log("the peers are not installed: ../shared/peers/setup_rabbitmq.sh install and ")
            log("setup_nats.sh install (as root), or run with --no-peers")
            return 1
        peers = [p for p in _peers() if not w.peer or p.name in w.peer]
    epmd_before = _epmd_pids()
    started: list[Peer] = []
    try:
        for p in peers:
            log(f"starting {p.name} (3 nodes)")
            p.start()
            started.append(p)
        with Cluster(3) as c:
            s = Spate(c)
            for run in range(1, w.runs + 1):
                log(f"=== run {run} of {w.runs}; load {loadavg()}")
                t0 = time.monotonic()
                run_once(run, s, peers, w, emit_row)
                log(f"run {run} took {time.monotonic() - t0:.0f} s")
    finally:
        for p in started:
            p.stop()
        for pid in _epmd_pids() - epmd_before:
            os.kill(pid, 15)
    write_summary(rows, out_dir)
    errors = [r for r in rows if r.get("error")]
    for r in errors:
        log(f"FAILED {r.get('system')} {r.get('workload')} run {r.get('run')}: {r['error']}")
    return 1 if errors else 0


def write_summary(rows: list[dict[str, Any]], out_dir: Path) -> None:
    text, medians = summarize(rows)
    (out_dir / "summary.md").write_text(text)
    sys.stdout.write(text)
    if medians:
        chart(medians, out_dir / "side_by_side.png")
        log(f"wrote {out_dir / 'summary.md'} and {out_dir / 'side_by_side.png'}")


if __name__ == "__main__":
    raise SystemExit(main())
