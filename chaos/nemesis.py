"""Fault schedules (issue 13): which faults a run injects, when, and for how long. The plan is
pure (a seeded random.Random makes it; the same seed gives the same plan, printed for replay);
`Nemesis` carries it out on a ChaosCluster and records each fault in the history as
`{"process": "nemesis", "type": "info", "f": "start" | "stop", "value": {...}}`.

| fault           | what is done                                                         |
|-----------------|----------------------------------------------------------------------|
| kill            | kill -9 one node; restarted when the fault ends                      |
| pause           | SIGSTOP a partition's leader (longer than election and session       |
|                 | timeouts), SIGCONT when it ends                                      |
| partition-leader | isolate a partition's leader from every other host (nftables)       |
| partition-halves | cut the hosts into two sides (the gateways among them)              |
| partition-one-way | one node stops receiving from another                              |
| partition-bridge | two nodes cut from each other, the third seeing both (Jepsen's bridge) |
| loss            | one node drops 30 % of the packets it receives                        |
| netem           | what one node sends is delayed 40 ± 30 ms, 5 % lost, 5 % doubled, 25 % |
|                 | sent at once (reordered): chaos.netem on an NFQUEUE (no tc netem here) |
| kill-gateway    | kill -9 one gateway (clients fail over to the other); restarted after |
| pause-kill      | NATS's schedule (anchors B.2): pause a node, kill another, resume the |
|                 | first, restart the second                                             |
| disk-truncate   | kill -9 a node, cut the last 1-200 bytes off one partition's active   |
|                 | segment (a torn write), restart it                                    |
| disk-bitflip    | kill -9 a node, flip one byte inside one of its segment files, restart |
| disk-index      | kill -9 a node, delete one of its segment index files, restart        |
| disk-full       | (tmpfs) fill a node's data directory; when the fault ends, free it and |
|                 | restart the node (a replica whose write failed stops: fail-stop, as    |
|                 | after any disk error, since the page cache can no longer be trusted)   |
| clock-skew      | restart one node with its wall clock an hour ahead and another an hour |
|                 | behind ($SPATE_CLOCK_OFFSET_MS); restart both when the fault ends     |
| link-latency    | (proxied) 200 ± 100 ms each way on the replication links of two nodes  |
| link-bandwidth  | (proxied) 20 KB/s each way on the replication links of two nodes       |
| link-reset      | (proxied) the replication links of two nodes reset after 500 ms, again |
|                 | and again                                                             |
| link-slicer     | (proxied) replication bytes of two nodes cut into ~64-byte pieces      |
| link-blackhole  | (proxied) every link into and out of one node holds its bytes         |
| client-latency  | (proxied) 100 ± 50 ms each way between the clients and the gateways   |
| client-reset    | (proxied) the clients' gateway connections reset after 2 s, repeatedly |

Schedules name a mix of kinds; each fault lasts `duration_s` drawn from the schedule's range,
with a quiet gap after it, so the cluster heals between faults (RabbitMQ's CI: 20 s healthy,
then a 10-30 s partition).
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.cluster import ADMIN_PORT, ChaosCluster
from chaos.netem import Impairment
from chaos.workload import History

NETWORK_KINDS = (
    "partition-leader",
    "partition-halves",
    "partition-one-way",
    "partition-bridge",
    "loss",
    "netem",
)
"""Faults of the network between hosts (nftables, NFQUEUE): the `partitions` schedule."""
KINDS = (
    "kill",
    "pause",
    *NETWORK_KINDS,
    "kill-gateway",
    "pause-kill",
    "disk-truncate",
    "disk-bitflip",
    "disk-index",
    "clock-skew",
)
DISK_KINDS = ("disk-truncate", "disk-bitflip", "disk-index")
NETEM = Impairment(delay_ms=40, jitter_ms=30, loss=5, duplicate=5, reorder=25)
"""The `netem` fault: what one node sends, delayed, jittered, lost, doubled and reordered."""
LINK_KINDS = (
    "link-latency",
    "link-bandwidth",
    "link-reset",
    "link-slicer",
    "link-blackhole",
    "client-latency",
    "client-reset",
)
"""Faults on one link, through the proxies: the schedule's cluster runs with proxied=True."""
VOTER_KINDS = ("voter-swap",)
"""Metadata voter changes (ADR 0025): the schedule's cluster has four nodes, three voting."""


@dataclass(frozen=True)
class Schedule:
    name: str
    kinds: tuple[str, ...]
    duration_s: tuple[float, float]
    gap_s: tuple[float, float]
    minutes: float
    """The default length of a run of this schedule."""


SCHEDULES = {
    "standard": Schedule("standard", KINDS + LINK_KINDS, (8.0, 20.0), (5.0, 12.0), 10.0),
    "ci": Schedule(
        "ci",
        (
            "kill",
            "pause",
            "partition-leader",
            "loss",
            "netem",
            "kill-gateway",
            "disk-truncate",
            "clock-skew",
            "link-latency",
            "link-blackhole",
            "client-reset",
        ),
        (6, 10),
        (4, 6),
        3.0,
    ),
    "partitions": Schedule(
        "partitions",
        NETWORK_KINDS,
        (10.0, 30.0),
        (10.0, 20.0),
        10.0,
    ),
    "links": Schedule("links", LINK_KINDS, (8.0, 20.0), (5.0, 12.0), 10.0),
    "clocks": Schedule("clocks", ("clock-skew", "pause", "kill"), (8.0, 15.0), (4.0, 8.0), 5.0),
    "disks": Schedule("disks", (*DISK_KINDS, "disk-full", "kill"), (5.0, 10.0), (5.0, 10.0), 10.0),
    "voters": Schedule(
        "voters",
        # voter changes weighted up, between faults that take a voter or a leader away
        ("voter-swap", "voter-swap", "voter-swap", "kill", "pause", "partition-leader", "loss"),
        (6, 10),
        (4, 6),
        5.0,
    ),
    "processes": Schedule(
        "processes", ("kill", "pause", "kill-gateway", "pause-kill"), (8, 20), (5, 12), 10.0
    ),
}


def needs_proxies(schedule: Schedule) -> bool:
    return any(kind in LINK_KINDS for kind in schedule.kinds)


def cluster_shape(schedule: Schedule) -> tuple[int, int]:
    """(nodes, metadata voters) of the schedule's cluster (voters 0: every node)."""
    return (4, 3) if any(kind in VOTER_KINDS for kind in schedule.kinds) else (3, 0)


TMPFS_BYTES = 512 << 20
VOTER_RETRY_S = 30.0
VOTER_CLI = (sys.executable, "-m", "spate.cli.main", "cluster")


def tmpfs_bytes(schedule: Schedule) -> int:
    """The nodes' data directories are tmpfs of this size when the schedule fills disks."""
    return TMPFS_BYTES if "disk-full" in schedule.kinds else 0


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    duration_s: float
    pick: int
    """Which node or partition (an index taken modulo what exists when the fault starts)."""


def plan(schedule: Schedule, seed: int, seconds: float) -> list[Fault]:
    """The faults of a run: starting after a healthy first gap, none ending past `seconds`."""
    rng = random.Random(f"chaos/{schedule.name}/{seed}")
    faults: list[Fault] = []
    at = rng.uniform(*schedule.gap_s)
    while True:
        duration = rng.uniform(*schedule.duration_s)
        if at + duration > seconds:
            return faults
        faults.append(
            Fault(
                round(at, 3), rng.choice(schedule.kinds), round(duration, 3), rng.randrange(1 << 30)
            )
        )
        at += duration + rng.uniform(*schedule.gap_s)


class Nemesis:
    def __init__(
        self, cluster: ChaosCluster, history: History, stream: str, faults: list[Fault]
    ) -> None:
        self.cluster, self.history, self.stream, self.faults = cluster, history, stream, faults
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self.errors: list[str] = []
        self.injected = 0

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(120)

    def _run(self) -> None:
        started = time.monotonic()
        for fault in self.faults:
            if self.stopping.wait(max(0.0, started + fault.at_s - time.monotonic())):
                return
            try:
                undo = self._inject(fault)
            except Exception as error:  # reported in the summary; the run goes on
                self.errors.append(f"{fault.kind} at {fault.at_s}s: {error}")
                continue
            self.injected += 1
            self.stopping.wait(fault.duration_s)
            try:
                undo()
            finally:
                self.history.record("nemesis", "info", "stop", {"kind": fault.kind})

    def _leader(self, pick: int) -> str:
        """A partition leader (by `pick`); a node by `pick` when none is known, or when no
        node can say (no metadata quorum at the moment: definitions are not read stale)."""
        try:
            leaders = {p: n for p, n in self.cluster.leaders(self.stream).items() if n}
        except RuntimeError:
            leaders = {}
        if not leaders:
            return self.cluster.node_names[pick % len(self.cluster.node_names)]
        partitions = sorted(leaders)
        return str(leaders[partitions[pick % len(partitions)]])

    def _inject(self, fault: Fault) -> Any:
        c, net = self.cluster, self.cluster.network
        nodes = c.node_names
        node = nodes[fault.pick % len(nodes)]
        detail: dict[str, Any] = {"kind": fault.kind, "duration_s": fault.duration_s}
        undo: Any
        if fault.kind == "kill":
            c.kill9(node)
            detail["node"] = node
            undo = lambda: c.start(node)  # noqa: E731
        elif fault.kind == "kill-gateway":
            gateway = c.gateway_names[fault.pick % len(c.gateway_names)]
            c.kill9(gateway)
            detail["node"] = gateway
            undo = lambda: c.start(gateway)  # noqa: E731
        elif fault.kind == "pause":
            leader = self._leader(fault.pick)
            c.pause(leader)
            detail["node"] = leader
            undo = lambda: c.resume(leader)  # noqa: E731
        elif fault.kind == "partition-leader":
            leader = self._leader(fault.pick)
            net.isolate(c.host(leader))
            detail["node"] = leader
            undo = net.heal
        elif fault.kind == "partition-halves":
            hosts = [*nodes, *c.gateway_names]
            random.Random(fault.pick).shuffle(hosts)
            side = hosts[: len(hosts) // 2]
            for a in side:
                for b in hosts:
                    if b not in side:
                        net.cut(c.host(a), c.host(b))
            detail["sides"] = [sorted(side), sorted(h for h in hosts if h not in side)]
            undo = net.heal
        elif fault.kind == "partition-one-way":
            other = nodes[(fault.pick + 1) % len(nodes)]
            net.cut(c.host(node), c.host(other), both=False)
            detail["from"], detail["to"] = node, other
            undo = net.heal
        elif fault.kind == "partition-bridge":
            # Jepsen's bridge: two sides that cannot see each other, and one node (`node`)
            # that sees both — a majority each way, through it.
            others = [n for n in nodes if n != node]
            left, right = others[: len(others) // 2], others[len(others) // 2 :]
            for a in left:
                for b in right:
                    net.cut(c.host(a), c.host(b))
            detail["bridge"], detail["sides"] = node, [left, right]
            undo = net.heal
        elif fault.kind == "loss":
            net.loss(c.host(node), 30)
            detail["node"] = node
            undo = net.heal
        elif fault.kind == "netem":
            net.netem(c.host(node), NETEM, seed=fault.pick)
            detail["node"], detail["impairment"] = node, vars(NETEM)
            undo = net.heal
        elif fault.kind == "pause-kill":
            crasher = nodes[(fault.pick + 1) % len(nodes)]
            c.pause(node)
            time.sleep(min(3.0, fault.duration_s / 3))
            c.kill9(crasher)
            c.resume(node)
            detail["paused"], detail["killed"] = node, crasher
            undo = lambda: c.start(crasher)  # noqa: E731
        elif fault.kind in LINK_KINDS:
            detail |= self._toxics(fault, node, nodes[(fault.pick + 1) % len(nodes)])
            undo = self._clear_toxics
        elif fault.kind == "clock-skew":
            # Two nodes, one an hour ahead and one an hour behind, restarted one after the
            # other: whoever leads next stamps with its own clock (and the kills move leaders).
            skewed = {node: 3_600_000, nodes[(fault.pick + 1) % len(nodes)]: -3_600_000}
            for name, offset_ms in skewed.items():
                c.kill9(name)
                c.processes[name].env["SPATE_CLOCK_OFFSET_MS"] = str(offset_ms)
                c.start(name)
            # the third node now leads everything: pause it past an election so that the
            # skewed ones take over
            third = next(n for n in nodes if n not in skewed)
            c.pause(third)
            time.sleep(3.0)
            c.resume(third)
            detail["offsets_ms"] = skewed

            def undo() -> None:
                for name in skewed:
                    c.kill9(name)
                    c.processes[name].env.pop("SPATE_CLOCK_OFFSET_MS", None)
                    c.start(name)

        elif fault.kind == "disk-full":
            detail["node"], detail["filled_bytes"] = node, c.fill_disk(node)

            def undo() -> None:
                c.free_disk(node)
                c.kill9(node)  # its failed replicas stay stopped until it restarts
                c.start(node)

        elif fault.kind == "voter-swap":
            detail |= self._swap_voter(fault.pick)
            undo = lambda: None  # noqa: E731  (the new voter set stays)
        elif fault.kind in DISK_KINDS:
            c.kill9(node)
            detail["node"] = node
            detail["damage"] = damage(c.processes[node].data_dir, fault.kind, fault.pick)
            undo = lambda: c.start(node)  # noqa: E731
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")
        self.history.record("nemesis", "info", "start", detail)
        return undo

    def _swap_voter(self, pick: int) -> dict[str, Any]:
        """`spate cluster add-voter` the non-voting node, then `remove-voter` a voter picked
        by `pick` (the metadata leader itself when it is picked: it hands over first). A change
        refused because the previous fault's node is not back yet (too few live voters) is
        asked again for up to VOTER_RETRY_S; a change still refused then is recorded as
        refused (liveness, in the summary), not as a harness error; anything else is one."""
        c = self.cluster
        status = c.cli("cluster", "status")
        voters = sorted(n["node_id"] for n in status["nodes"] if n["metadata_voter"])
        others = sorted(n["node_id"] for n in status["nodes"] if not n["metadata_voter"])
        if not others:
            raise RuntimeError(f"no non-voting node to add (voters {voters})")
        add, remove = others[0], voters[pick % len(voters)]
        steps = {}
        for verb, node in (("add-voter", add), ("remove-voter", remove)):
            outcome = self._voter_change(verb, node)
            steps[verb] = {"node": node, "outcome": outcome}
            self.history.record("nemesis", "info", verb, {"node": node, "outcome": outcome})
            if outcome != "ok":
                break
        return {"voters_before": voters, "steps": steps}

    def _voter_change(self, verb: str, node: str) -> str:
        c = self.cluster
        deadline = time.monotonic() + VOTER_RETRY_S
        why = "no node is running"
        while True:
            live = [n for n in c.node_names if c.processes[n].running and not c.processes[n].paused]
            for asked in live:
                admin = f"{c.host(asked).address}:{ADMIN_PORT}"
                done = subprocess.run(
                    [*VOTER_CLI, verb, node, "--admin", admin, "--wait-timeout", "60"],
                    capture_output=True,
                    text=True,
                    timeout=90,
                    check=False,
                )
                if done.returncode == 0:
                    return "ok"
                lines = (done.stderr or done.stdout).strip().splitlines()
                why = f"at {asked}: exit {done.returncode}: {lines[-1] if lines else '?'}"
                # 1: a failed precondition (a voter down, a change running), 5: unavailable
                # (this node is cut off or has no metadata leader: ask the next one)
                if done.returncode not in (1, 5):
                    raise RuntimeError(f"spate cluster {verb} {node} {why}")
                if done.returncode == 1:
                    break
            if time.monotonic() > deadline or self.stopping.is_set():
                return f"refused: {why}"
            time.sleep(2.0)

    def _toxics(self, fault: Fault, a: str, b: str) -> dict[str, Any]:
        """Put the fault's toxics on its links (both directions of each)."""
        import requests

        api = self.cluster.toxiproxy_url
        attributes: dict[str, Any]
        if fault.kind.startswith("client-"):
            names = [f"client-{g}" for g in self.cluster.gateway_names]
        elif fault.kind == "link-blackhole":
            names = [n for n in self.cluster.proxies if a in n.split("-")[:2]]
        else:
            names = [f"{a}-{b}-7800", f"{b}-{a}-7800"]
        kind, attributes = {
            "link-latency": ("latency", {"latency": 200, "jitter": 100}),
            "link-bandwidth": ("bandwidth", {"rate": 20}),
            "link-reset": ("reset_peer", {"timeout": 500}),
            "link-slicer": ("slicer", {"average_size": 64, "size_variation": 32, "delay": 200}),
            "link-blackhole": ("timeout", {"timeout": 0}),
            "client-latency": ("latency", {"latency": 100, "jitter": 50}),
            "client-reset": ("reset_peer", {"timeout": 2000}),
        }[fault.kind]
        for name in names:
            for stream in ("downstream", "upstream"):
                toxic = {"type": kind, "stream": stream, "attributes": attributes}
                requests.post(f"{api}/proxies/{name}/toxics", json=toxic, timeout=10)
        return {"links": names, "toxic": kind, "attributes": attributes}

    def _clear_toxics(self) -> None:
        import requests

        requests.post(f"{self.cluster.toxiproxy_url}/reset", timeout=10)


def damage(data_dir: Path, kind: str, pick: int) -> str:
    """Damage a stopped node's partition files as `kind` says; what was done, for the report."""
    rng = random.Random(pick)
    logs = sorted(data_dir.glob("partitions/*/*/log"))
    if not logs:
        return "no partition files yet"
    log = logs[rng.randrange(len(logs))]
    segments = sorted(log.glob("*.segment"))
    if kind == "disk-index":
        indexes = sorted(log.glob("*.index"))
        if not indexes:
            return f"{log}: no index file"
        victim = indexes[rng.randrange(len(indexes))]
        victim.unlink()
        return f"deleted {victim.relative_to(data_dir)}"
    if not segments:
        return f"{log}: no segment"
    if kind == "disk-truncate":
        victim = segments[-1]
        size = victim.stat().st_size
        cut = min(size, rng.randint(1, 200))
        with victim.open("r+b") as f:
            f.truncate(size - cut)
        return f"cut {cut} bytes off {victim.relative_to(data_dir)} ({size} bytes)"
    victim = segments[rng.randrange(len(segments))]
    size = victim.stat().st_size
    if size == 0:
        return f"{victim.relative_to(data_dir)} is empty"
    at = rng.randrange(size)
    with victim.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << rng.randrange(8))]))
    return f"flipped a bit of byte {at} of {victim.relative_to(data_dir)} ({size} bytes)"
