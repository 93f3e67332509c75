"""One chaos run (issue 13): three nodes (four for the `voters` schedule) and two gateways, each
in its own network namespace, the workload, a fault schedule, then a heal, the final reads, the
checker and the report.

    python -m chaos run [--schedule standard] [--seed S] [--minutes M] [--out chaos/reports]

Writes `<out>/<run-id>/`: `history.jsonl` (every operation), `verdict.json` (the checker's),
`summary.md` (verdict, counts, anomalies, the fault timeline, the replay command) and
`timeline.png` (acknowledged sends per second and their latency, faults shaded). The last line
printed is the verdict; the exit code is 0 only when the history is valid.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos import checker
from chaos.cluster import ADMIN_PORT, ChaosCluster
from chaos.nemesis import (
    SCHEDULES,
    Fault,
    Nemesis,
    cluster_shape,
    needs_proxies,
    plan,
    tmpfs_bytes,
)
from chaos.workload import History, Workload, read_partition

STREAM = "chaos"
PARTITIONS = 3
SUPER_STREAM = "chaos-routed"
SUPER_PARTITIONS = 3
PRODUCERS = 6
HEAL_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    run_dir: Path
    verdict: checker.Verdict
    faults: list[Fault]
    harness_errors: list[str]
    start_retries: list[str] = field(default_factory=list)
    """Processes that exited while (re)starting and were started again (liveness, noted)."""

    @property
    def valid(self) -> bool:
        return self.verdict.valid and not self.harness_errors


def run(schedule_name: str, seed: int | None, minutes: float | None, out: Path) -> Outcome:
    schedule = SCHEDULES[schedule_name]
    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    seconds = 60.0 * (minutes if minutes is not None else schedule.minutes)
    run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{schedule.name}-s{seed}"
    run_dir = out / run_id
    run_dir.mkdir(parents=True)
    faults = plan(schedule, seed, seconds)
    replay = (
        f"python -m chaos run --schedule {schedule.name} --seed {seed} --minutes {seconds / 60:g}"
    )
    print(f"chaos: run {run_id}: {len(faults)} faults over {seconds:.0f} s; replay: {replay}")
    data = Path(tempfile.mkdtemp(prefix="spate-chaos-"))
    history = History(run_dir / "history.jsonl")
    errors: list[str] = []
    retries: list[str] = []
    try:
        nodes, voters = cluster_shape(schedule)
        with ChaosCluster(
            data,
            nodes=nodes,
            voters=voters,
            proxied=needs_proxies(schedule),
            tmpfs_bytes=tmpfs_bytes(schedule),
        ) as cluster:
            try:
                replicas = _exercise(cluster, history, faults, seconds, errors)
            finally:
                cluster.save_logs(run_dir / "logs")
                retries = list(cluster.start_retries)
    finally:
        history.close()
        shutil.rmtree(data, ignore_errors=True)
    verdict = checker.check(history.ops, replicas)
    outcome = Outcome(run_dir, verdict, faults, errors, retries)
    _report(outcome, history.ops, schedule.name, seed, replay)
    return outcome


def _exercise(
    cluster: ChaosCluster,
    history: History,
    faults: list[Fault],
    seconds: float,
    errors: list[str],
) -> dict[str, dict[int, list[tuple[int, str]]]]:
    """Start the cluster and the workload, inject the faults, heal, read everything back."""
    cluster.start()
    cluster.cli("stream", "create", STREAM, "--partitions", str(PARTITIONS), "--replicas", "3")
    cluster.cli(
        "superstream", "create", SUPER_STREAM, "--partitions", str(SUPER_PARTITIONS),
        "--replicas", "3",
    )  # fmt: skip
    _wait_for_leaders(cluster)
    node_urls = [cluster.url(n) for n in cluster.node_names]
    admin = [f"{cluster.host(n).address}:{ADMIN_PORT}" for n in cluster.node_names]
    gateway_urls = [cluster.url(g) for g in cluster.gateway_names]
    workload = Workload(
        history, gateway_urls, node_urls, STREAM, PARTITIONS, PRODUCERS, admin,
        (SUPER_STREAM, SUPER_PARTITIONS),
    )  # fmt: skip
    nemesis = Nemesis(cluster, history, STREAM, faults)
    workload.start()
    nemesis.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        elapsed = time.monotonic() - history.started
        print(f"chaos: {elapsed:5.0f} s, {_acked(history)} acknowledged", flush=True)
    nemesis.stop()
    workload.stop()
    errors += workload.errors + nemesis.errors
    _heal(cluster)
    history.record("final", "info", "heal", None)
    return _final_reads(cluster, history)


def _acked(history: History) -> int:
    return sum(1 for op in history.ops if op["f"] == "send" and op["type"] == "ok")


def _wait_for_leaders(cluster: ChaosCluster) -> None:
    deadline = time.monotonic() + HEAL_TIMEOUT_S
    while True:
        try:
            leaders = cluster.leaders(STREAM)
            routed = [cluster.leaders(s) for s in _super_partition_streams()]
            if (
                len(leaders) == PARTITIONS
                and all(leaders.values())
                and all(len(r) == 1 and all(r.values()) for r in routed)
            ):
                return
        except RuntimeError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the partitions of {STREAM} have no leaders after the heal")
        time.sleep(0.5)


def _super_partition_streams() -> list[str]:
    return [f"{SUPER_STREAM}-{i}" for i in range(SUPER_PARTITIONS)]


def _heal(cluster: ChaosCluster) -> None:
    cluster.network.heal()
    for name, process in cluster.processes.items():
        if process.paused:
            cluster.resume(name)
    cluster.start()
    _wait_for_leaders(cluster)


def _final_reads(
    cluster: ChaosCluster, history: History
) -> dict[str, dict[int, list[tuple[int, str]]]]:
    """The whole of every partition through the gateway (the truth the checker uses), then
    each node's own copy (for divergence): the stream's partitions, and the super stream's
    partition streams (one partition each) as partitions SUPER_BASE + i."""
    sources = {p: (STREAM, p) for p in range(PARTITIONS)}
    for i, name in enumerate(_super_partition_streams()):
        sources[checker.SUPER_BASE + i] = (name, 0)
    # A node reports the end offsets of the partitions it hosts only (four nodes and more:
    # not every one): the highest any node reports.
    ends: dict[int, int] = {}
    hosted: dict[str, list[int]] = defaultdict(list)
    by_stream = {(name, p): key for key, (name, p) in sources.items()}
    for name in dict.fromkeys(name for name, _ in sources.values()):
        for node in cluster.node_names:
            try:
                described = cluster.cli("stream", "describe", name, at=node)
            except RuntimeError:
                continue  # the others say
            for p in described["partitions"]:
                key = by_stream.get((name, int(p["partition"])))
                if p["available"] and key is not None:
                    ends[key] = max(ends.get(key, 0), int(p["end_offset"] or 0))
                    hosted[node].append(key)
    missing = sorted(set(sources) - set(ends))
    if missing:
        raise RuntimeError(f"no node reports the end offset of partitions {missing}")
    for key, end in sorted(ends.items()):
        name, partition = sources[key]
        for offset, value, stamp in read_partition(cluster.url("g1"), name, partition, end):
            read = {"partition": key, "offset": offset, "value": value, "timestamp": stamp}
            history.record("final", "ok", "read", read)
    replicas: dict[str, dict[int, list[tuple[int, str]]]] = defaultdict(dict)
    for node in cluster.node_names:
        for key in hosted[node]:
            name, partition = sources[key]
            entries = read_partition(cluster.url(node), name, partition, ends[key])
            replicas[node][key] = [(o, v) for o, v, _ in entries]
    return replicas


def _report(
    outcome: Outcome, ops: list[dict[str, Any]], schedule: str, seed: int, replay: str
) -> None:
    run_dir, verdict = outcome.run_dir, outcome.verdict
    (run_dir / "verdict.json").write_text(
        json.dumps(verdict.to_json() | {"harness_errors": outcome.harness_errors}, indent=2)
    )
    spans = _fault_spans(ops)
    _plot(ops, spans, run_dir / "timeline.png")
    totals = verdict.totals()
    lines = [
        f"# Chaos run {run_dir.name}",
        "",
        f"**Verdict: {'valid' if outcome.valid else 'INVALID'}** — schedule `{schedule}`, "
        f"seed {seed}.",
        f"Replay: `{replay}`",
        "",
        "| partition | acknowledged | stored | recovered (unknown, stored) "
        "| unknown, not stored | refused | live reads | anomalies |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p, r in sorted(verdict.partitions.items()):
        if p == checker.METADATA:
            continue
        anomalies = ", ".join(f"{k} {v}" for k, v in sorted(r.anomalies.items())) or "none"
        lines.append(
            f"| {p} | {r.acknowledged} | {r.stored} | {r.recovered} | {r.indeterminate_lost} "
            f"| {r.failed} | {r.reads} | {anomalies} |"
        )
    if any(p >= checker.SUPER_BASE for p in verdict.partitions):
        lines += [
            "",
            f"Partitions {checker.SUPER_BASE}.. are the super stream `{SUPER_STREAM}`'s "
            f"partition streams (`{SUPER_STREAM}-0`..), written by routed producers (`r<i>`, "
            "the broker routing each message by its key) and checked as partitions, and for "
            "misrouted values.",
        ]
    meta = verdict.partitions.get(checker.METADATA)
    if meta is not None:
        anomalies = ", ".join(f"{k} {v}" for k, v in sorted(meta.anomalies.items())) or "none"
        lines += [
            "",
            f"Metadata service: {meta.acknowledged} streams created, {meta.failed} creates "
            f"refused, {meta.reads} lists checked against them; anomalies: {anomalies}.",
        ]
    group = Counter(
        (str(op["f"]), str(op["type"]), bool((op.get("value") or {}).get("probe")))
        for op in ops
        if op.get("f") in ("grant", "commit", "group-read") and op.get("type") != "invoke"
    )
    if group:
        lines += [
            "",
            f"Consumer group `chaos`: {group['grant', 'ok', False]} grants (epochs taken over), "
            f"{group['grant', 'fail', False]} refused, {group['grant', 'info', False]} unknown; "
            f"{group['grant', 'fail', True]} stale epochs asked for on purpose and refused "
            f"({group['grant', 'ok', True]} granted, {group['grant', 'info', True]} unknown); "
            f"{group['group-read', 'ok', False]} reads; {group['commit', 'ok', False]} commits "
            f"acknowledged, {group['commit', 'info', False]} unknown (the member was displaced "
            "or cut off first); checked for fenced-commit, stale-grant, commit-lost, group-skip "
            "and read-mismatch (above).",
        ]
    named = _completions(ops, ("attach", "named-read", "named-commit"))
    if named:
        resumed = _named_resumes(ops)
        lines += [
            "",
            f"Named consumers (server-side offsets): {named['attach', 'ok']} sessions attached "
            f"({resumed} resumed after a stored offset), {named['attach', 'fail']} refused, "
            f"{named['attach', 'info']} unknown; {named['named-read', 'ok']} reads; "
            f"{named['named-commit', 'ok']} commits acknowledged, {named['named-commit', 'info']} "
            "unknown; checked for named-commit-lost, named-ahead, named-resume, named-skip and "
            "read-mismatch (above).",
        ]
    sac = _completions(ops, ("sac-attach", "sac-read", "sac-commit"))
    if sac:
        members = sorted({str(op["process"]) for op in ops if op.get("f") == "sac-read"})
        lines += [
            "",
            f"Single active consumers: {sac['sac-attach', 'ok']} member sessions attached, "
            f"{sac['sac-attach', 'fail']} refused, {sac['sac-attach', 'info']} unknown; "
            f"{sac['sac-read', 'ok']} reads by {len(members)} members; "
            f"{sac['sac-commit', 'ok']} commits acknowledged, {sac['sac-commit', 'info']} "
            "unknown; checked for sac-repeat, sac-gap, sac-skip and read-mismatch (above).",
        ]
    lines += ["", f"Anomalies in all: {dict(totals) or 'none'}."]
    for p, r in sorted(verdict.partitions.items()):
        for kind, examples in sorted(r.examples.items()):
            lines.append(f"- partition {p}, {kind}: " + "; ".join(examples[:3]))
    if outcome.start_retries:
        lines += ["", "Started again after exiting while starting (a supervisor would have):"]
        lines += [f"- {r}" for r in outcome.start_retries]
    if outcome.harness_errors:
        lines += ["", "Harness errors (the run is not valid with these):"]
        lines += [f"- {e}" for e in outcome.harness_errors]
    lines += ["", "## Faults", "", "| start (s) | end (s) | fault |", "|---|---|---|"]
    for start, end, detail in spans:
        lines.append(f"| {start:.1f} | {end:.1f} | {json.dumps(detail, sort_keys=True)} |")
    lines += ["", "![timeline](timeline.png)", "", "Process logs: `logs/`.", ""]
    (run_dir / "summary.md").write_text("\n".join(lines))


def _fault_spans(ops: list[dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
    spans: list[tuple[float, float, dict[str, Any]]] = []
    open_at: tuple[float, dict[str, Any]] | None = None
    for op in ops:
        if op["process"] != "nemesis":
            continue
        if op["f"] == "start":
            open_at = (op["time"], op["value"])
        elif op["f"] == "stop" and open_at is not None:
            spans.append((open_at[0], op["time"], open_at[1]))
            open_at = None
    return spans


def _plot(
    ops: list[dict[str, Any]], spans: list[tuple[float, float, dict[str, Any]]], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    invoked: dict[tuple[str, str], float] = {}
    per_second: dict[int, int] = defaultdict(int)
    latency: dict[int, list[float]] = defaultdict(list)
    for op in ops:
        if op["f"] != "send":
            continue
        key = (op["process"], op["value"]["value"])
        if op["type"] == "invoke":
            invoked[key] = op["time"]
        elif op["type"] == "ok" and key in invoked:
            second = int(op["time"])
            per_second[second] += 1
            latency[second].append(1000 * (op["time"] - invoked[key]))
    end = max([*per_second, *(int(e) for _, e, _ in spans), 1])
    xs = list(range(end + 1))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    top.plot(xs, [per_second.get(x, 0) for x in xs], color="tab:blue", linewidth=1)
    top.set_ylabel("acknowledged sends / s")
    p99 = [
        statistics.quantiles(latency[x], n=100)[98]
        if len(latency[x]) > 1
        else (latency[x][0] if latency[x] else float("nan"))
        for x in xs
    ]
    bottom.plot(xs, p99, color="tab:red", linewidth=1)
    bottom.set_yscale("log")
    bottom.set_ylabel("send latency p99 (ms)")
    bottom.set_xlabel("seconds since the start")
    for start, stop, detail in spans:
        for axis in (top, bottom):
            axis.axvspan(start, stop, color="tab:orange", alpha=0.2)
        top.text(
            start,
            top.get_ylim()[1] * 0.95,
            str(detail.get("kind")),
            fontsize=7,
            rotation=90,
            va="top",
        )
    fig.suptitle(f"chaos run {path.parent.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _completions(ops: list[dict[str, Any]], fs: tuple[str, ...]) -> Counter[tuple[str, str]]:
    """(f, type) counts of the completed operations of these `f`s."""
    return Counter(
        (str(op["f"]), str(op["type"]))
        for op in ops
        if op.get("f") in fs and op.get("type") != "invoke"
    )


def _named_resumes(ops: list[dict[str, Any]]) -> int:
    """Named-consumer sessions that attached with a stored offset and read after it."""
    stored: set[tuple[str, int]] = set()
    read: set[tuple[str, int]] = set()
    for op in ops:
        if op.get("f") not in ("attach", "named-read") or op.get("type") != "ok":
            continue
        value = op["value"]
        key = (str(op.get("process")), int(value["session"]))
        if op["f"] == "attach" and value.get("stored") is not None:
            stored.add(key)
        elif op["f"] == "named-read":
            read.add(key)
    return len(stored & read)
