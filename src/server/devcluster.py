"""`spate dev up|down|status`: a local cluster of separate node processes under one directory.

Layout of DIR (the only state; `up` is idempotent because it re-reads it):

    DIR/cluster.json      nodes and their fixed ports (chosen once, reused on every restart)
    DIR/secret            metadata Raft password (mode 0600), handed to nodes by environment
    DIR/endpoints.json    what is running: admin address and every process with pid and endpoints
    DIR/<node>/           the node's data directory; node.json (its live endpoints), node.log, pid

A process counts as running only if its pid is alive AND its command line names this node's data
directory, so a recycled pid is never signalled.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spate.core.errors import InvalidArgument, Unavailable
from spate.server.settings import shard_id

HOST = "127.0.0.1"
CLUSTER_FILE = "cluster.json"
ENDPOINTS_FILE = "endpoints.json"
NODE_ENDPOINTS_FILE = "node.json"
GATEWAY_ENDPOINTS_FILE = "gateway.json"
gateways_max = 4
gateway_refresh_ms = 500
"""How often a dev gateway re-reads the routes (a leader change reaches it within this)."""
metadata_voters_max = 3
nodes_max = 9
"""Nodes of a dev cluster: the first three are the metadata voters, the others non-voting
metadata replicas (ADR 0022)."""
shards_max = 8
"""Shard processes per dev node (ADR 0032): one per core of the machine is the point."""
node_start_timeout_s = 60.0
node_stop_timeout_s = 15.0
dev_port_min, dev_port_max = 20_000, 32_000
"""Dev cluster ports come from here, below Linux's default ephemeral range (32768-60999)."""
DEV_PORTS_ENV = "SPATE_DEV_PORTS"
"""`LOW-HIGH` (HIGH excluded): draw dev cluster ports from this range instead. Two clusters
brought up at once on one machine can draw the same free port (each probes it free, then the
first node to bind takes it from the other): give each its own range. The test suite gives each
pytest-xdist worker its own slice of dev_port_min..dev_port_max (tests/conftest.py)."""


@dataclass(frozen=True)
class GatewayPlan:
    gateway_id: str
    amqp_port: int
    mode: str = "proxy"
    synap_port: int = 0
    """The Synap API's port (ADR 0018; 0 in plans written before it: any free port)."""
    metrics_port: int = 0
    """Prometheus /metrics (ADR 0023; 0 in plans written before it: one is drawn on load)."""


@dataclass(frozen=True)
class NodePlan:
    node_id: str
    amqp_port: int
    admin_port: int
    metadata_port: int
    replication_port: int
    metrics_port: int = 0
    """Prometheus /metrics (ADR 0023; 0 in plans written before it: one is drawn on load)."""
    host: str = ""
    """The simulated host (failure domain) the process belongs to: `n1` for n1 and its shards
    n1-s1... (ADR 0032; empty in plans written before shards: the node id)."""
    shard: int = 0
    """Its shard index on that host; only shard 0 of the first three hosts votes."""

    @property
    def host_id(self) -> str:
        return self.host or self.node_id

    @property
    def ports(self) -> tuple[int, int, int, int, int]:
        return (
            self.amqp_port,
            self.admin_port,
            self.metadata_port,
            self.replication_port,
            self.metrics_port,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "amqp_port": self.amqp_port,
            "admin_port": self.admin_port,
            "metadata_port": self.metadata_port,
            "replication_port": self.replication_port,
            "metrics_port": self.metrics_port,
        } | ({"host": self.host, "shard": self.shard} if self.host else {})


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _dev_port_range() -> tuple[int, int]:
    """[low, high) to draw dev cluster ports from: $SPATE_DEV_PORTS, else the default range."""
    spec = os.environ.get(DEV_PORTS_ENV, "")
    if not spec:
        return dev_port_min, dev_port_max
    low, dash, high = spec.partition("-")
    if not (dash and low.isdigit() and high.isdigit() and 0 < int(low) < int(high) <= 65_536):
        raise InvalidArgument(f"{DEV_PORTS_ENV}={spec!r}: expected LOW-HIGH, e.g. 20000-26000")
    return int(low), int(high)


def _free_port(taken: Collection[int] = ()) -> int:
    """A port free now and outside the kernel's ephemeral range, so no outgoing connection can
    take it between this choice and the node binding it (the ports are fixed for restarts),
    and not one of `taken` (the plan's other ports: a port free now is free for every draw
    until a node binds it, so two listeners of one plan could get the same one), drawn from
    _dev_port_range()."""
    low, high = _ephemeral_range()
    first, end = _dev_port_range()
    candidates = [p for p in range(first, end) if not low <= p <= high and p not in taken]
    for port in random.sample(candidates, k=min(len(candidates), 200)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    raise Unavailable(f"no free port between {first} and {end} on {HOST}")


def grow_plan(
    plan: list[NodePlan], nodes: int, shards: int, draw_port: Callable[[], int]
) -> list[NodePlan]:
    """The plan with whatever is missing of `nodes` hosts of `shards` shard processes each
    (ADR 0032: host n1 runs n1, n1-s1, ...), ports from `draw_port`; it only grows. A node
    planned unsharded that grows shards gets its host named (the process registers it at its
    next start; until then it is its own failure domain, which is the same name)."""
    plan = list(plan)
    by_id = {n.node_id: n for n in plan}
    hosts = len(dict.fromkeys(n.host_id for n in plan))
    for host_index in range(1, max(nodes, hosts) + 1):
        host = f"n{host_index}"
        for index in range(shards):
            node_id = shard_id(host, index)
            known = by_id.get(node_id)
            if known is not None:
                if shards > 1 and not known.host:
                    plan[plan.index(known)] = replace(known, host=host, shard=index)
                continue
            amqp, admin, metadata, replication, metrics = (draw_port() for _ in range(5))
            entry = NodePlan(node_id, amqp, admin, metadata, replication, metrics)
            plan.append(replace(entry, host=host, shard=index) if shards > 1 else entry)
    return sorted(plan, key=lambda n: (len(n.host_id), n.host_id, n.shard))


class DevCluster:
    def __init__(
        self,
        data_dir: Path,
        *,
        require_defined_groups: bool = False,
        node_args: tuple[str, ...] = (),
        gateway_args: tuple[str, ...] = (),
    ) -> None:
        self.dir = data_dir.resolve()
        self.node_args = node_args
        """More `spate node run` flags for the nodes `up` starts (e.g. `--dialect eventhubs`)."""
        self.gateway_args = gateway_args
        """More `spate gateway run` flags for the gateways `up` starts."""
        self.require_defined_groups = require_defined_groups
        """Processes started by `up` get `--require-defined-groups` (running ones keep theirs)."""

    # -- plan -------------------------------------------------------------------------------
    def _load_plan(self) -> list[NodePlan]:
        path = self.dir / CLUSTER_FILE
        if not path.exists():
            return []
        raw = json.loads(path.read_text())
        plan = []
        taken = {
            value for node in raw["nodes"] for key, value in node.items() if key.endswith("_port")
        }
        for node in raw["nodes"]:
            # cluster.json written before nodes had a replication port: give them one now
            if "replication_port" not in node:
                node["replication_port"] = _free_port(taken)
                taken.add(node["replication_port"])
            if not node.get("metrics_port"):  # written before nodes served /metrics
                node["metrics_port"] = _free_port(taken)
                taken.add(node["metrics_port"])
            plan.append(NodePlan(**node))
        return plan

    def _load_gateways(self) -> list[GatewayPlan]:
        path = self.dir / CLUSTER_FILE
        if not path.exists():
            return []
        raw = json.loads(path.read_text())
        taken = {v for n in raw["nodes"] for k, v in n.items() if k.endswith("_port")}
        taken |= {v for g in raw.get("gateways", []) for k, v in g.items() if k.endswith("_port")}
        gateways = []
        for gateway in raw.get("gateways", []):
            if not gateway.get("metrics_port"):  # written before gateways served /metrics
                gateway["metrics_port"] = _free_port(taken)
                taken.add(gateway["metrics_port"])
            gateways.append(GatewayPlan(**gateway))
        return gateways

    def _save_plan(self, plan: list[NodePlan], gateways: list[GatewayPlan] | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if gateways is None:
            gateways = self._load_gateways()
        doc = {
            "version": 1,
            "nodes": [n.to_json() for n in plan],
            "gateways": [
                {
                    "gateway_id": g.gateway_id,
                    "amqp_port": g.amqp_port,
                    "mode": g.mode,
                    "synap_port": g.synap_port,
                    "metrics_port": g.metrics_port,
                }
                for g in gateways
            ],
        }
        (self.dir / CLUSTER_FILE).write_text(json.dumps(doc, indent=2))

    def _secret(self) -> str:
        path = self.dir / "secret"
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(24))
        return path.read_text().strip()

    # -- processes --------------------------------------------------------------------------
    def _node_dir(self, node_id: str) -> Path:
        return self.dir / node_id

    def _pid(self, node_id: str) -> int | None:
        try:
            pid = int((self._node_dir(node_id) / "pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if self._is_ours(pid, node_id) else None

    def _is_ours(self, pid: int, node_id: str) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                return False
        except (OSError, IndexError):
            return False
        return str(self._node_dir(node_id)).encode() in cmdline

    def _voters(self, plan: list[NodePlan]) -> list[NodePlan]:
        return [n for n in plan if n.shard == 0][:metadata_voters_max]

    @staticmethod
    def _hosts(plan: list[NodePlan]) -> list[str]:
        return list(dict.fromkeys(n.host_id for n in plan))

    def _is_voter(self, node: NodePlan, plan: list[NodePlan]) -> bool:
        """As the node last recorded its metadata voters (`spate cluster add-voter` and
        `remove-voter` change them, ADR 0025); the plan's first three before that."""
        path = self._node_dir(node.node_id) / "metadata" / "metadata.voters"
        try:
            voters = json.loads(path.read_text())["voters"]
        except (OSError, ValueError, KeyError, TypeError):
            return node in self._voters(plan)
        return f"{HOST}:{node.metadata_port}" in voters

    def _start_node(self, node: NodePlan, plan: list[NodePlan]) -> subprocess.Popen[bytes]:
        node_dir = self._node_dir(node.node_id)
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / NODE_ENDPOINTS_FILE).unlink(missing_ok=True)
        voter = node in self._voters(plan)
        peers = [f"{HOST}:{v.metadata_port}" for v in self._voters(plan) if v != node]
        argv = [
            sys.executable,
            "-m",
            "spate.cli.main",
            "node",
            "run",
            "--node-id",
            node.node_id,
            "--data-dir",
            str(node_dir),
            "--host",
            HOST,
            "--amqp-port",
            str(node.amqp_port),
            "--admin-port",
            str(node.admin_port),
            "--metadata-port",
            str(node.metadata_port),
            "--replication-port",
            str(node.replication_port),
            "--metrics-port",
            str(node.metrics_port),
            "--metadata-peers",
            ",".join(peers),
            *([] if voter else ["--metadata-observer"]),
            *(["--failure-domain", node.host] if node.host else []),
            *(["--require-defined-groups"] if self.require_defined_groups else []),
            *self.node_args,
        ]
        env = dict(os.environ, SPATE_METADATA_PASSWORD=self._secret())
        with open(node_dir / "node.log", "ab") as log_file:
            proc = subprocess.Popen(
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (node_dir / "pid").write_text(str(proc.pid))
        return proc

    def _start_gateway(self, gateway: GatewayPlan, plan: list[NodePlan]) -> subprocess.Popen[bytes]:
        gateway_dir = self._node_dir(gateway.gateway_id)
        gateway_dir.mkdir(parents=True, exist_ok=True)
        (gateway_dir / GATEWAY_ENDPOINTS_FILE).unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "spate.cli.main",
            "gateway",
            "run",
            "--gateway-id",
            gateway.gateway_id,
            "--admin",
            ",".join(f"{HOST}:{n.admin_port}" for n in plan),
            "--data-dir",
            str(gateway_dir),
            "--host",
            HOST,
            "--port",
            str(gateway.amqp_port),
            "--refresh-ms",
            str(gateway_refresh_ms),
            "--mode",
            gateway.mode,
            *(["--synap-port", str(gateway.synap_port)] if gateway.mode == "proxy" else []),
            "--metrics-port",
            str(gateway.metrics_port),
            *(["--require-defined-groups"] if self.require_defined_groups else []),
            *self.gateway_args,
        ]
        env = dict(os.environ, SPATE_METADATA_PASSWORD=self._secret())
        with open(gateway_dir / "node.log", "ab") as log_file:
            proc = subprocess.Popen(
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (gateway_dir / "pid").write_text(str(proc.pid))
        return proc

    def _wait_ready(
        self, node_id: str, proc: subprocess.Popen[bytes], endpoints_file: str = NODE_ENDPOINTS_FILE
    ) -> dict[str, Any]:
        """Wait for the node's endpoints file; the child is polled (its /proc cmdline is the
        parent's until exec, so the cmdline check would race)."""
        pid = proc.pid
        deadline = time.monotonic() + node_start_timeout_s
        path = self._node_dir(node_id) / endpoints_file
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise Unavailable(
                    f"node {node_id} exited during start-up; last lines of "
                    f"{self._node_dir(node_id) / 'node.log'}:\n{self._log_tail(node_id)}"
                )
            try:
                endpoints: dict[str, Any] = json.loads(path.read_text())
                if endpoints.get("pid") == pid:
                    return endpoints
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise Unavailable(
            f"node {node_id} (pid {pid}) did not become ready within {node_start_timeout_s:.0f}s; "
            f"see {self._node_dir(node_id) / 'node.log'}"
        )

    def _log_tail(self, node_id: str, lines: int = 20) -> str:
        try:
            text = (self._node_dir(node_id) / "node.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- commands ---------------------------------------------------------------------------
    def up(self, nodes: int, gateways: int = 1, shards: int = 1) -> dict[str, Any]:
        """Start what is missing of `nodes` hosts of `shards` shard processes each (ADR 0032:
        host n1 runs n1, n1-s1, ...; the plan only grows)."""
        if not 1 <= nodes <= nodes_max:
            raise InvalidArgument(
                f"--nodes must be between 1 and {nodes_max}: the first {metadata_voters_max} "
                "are metadata voters, the others non-voting metadata replicas"
            )
        if not 1 <= shards <= shards_max:
            raise InvalidArgument(
                f"--shards must be between 1 and {shards_max} (shard processes per node)"
            )
        plan = self._load_plan()
        known_hosts = self._hosts(plan)
        if plan and len(known_hosts) < nodes and len(known_hosts) < metadata_voters_max:
            raise InvalidArgument(
                f"this cluster was created with {len(known_hosts)} node(s): all of them are "
                f"metadata voters, and growing the voter set of a running cluster is not "
                f"supported yet. A cluster of {metadata_voters_max} grows by non-voting nodes "
                f"(--nodes {metadata_voters_max + 1} and more). Use a new --data-dir, or `spate "
                f"dev down` and delete {self.dir} first"
            )
        taken = {port for node in plan for port in node.ports}

        def draw() -> int:
            port = _free_port(taken)
            taken.add(port)
            return port

        plan = grow_plan(plan, nodes, shards, draw)
        if not 0 <= gateways <= gateways_max:
            raise InvalidArgument(f"--gateways must be between 0 and {gateways_max}")
        gateway_plan = self._load_gateways()
        taken |= {
            port for g in gateway_plan for port in (g.amqp_port, g.synap_port, g.metrics_port)
        }
        while len(gateway_plan) < gateways:
            port = _free_port(taken)
            taken.add(port)
            synap_port = _free_port(taken)
            taken.add(synap_port)
            metrics_port = _free_port(taken)
            taken.add(metrics_port)
            gateway_plan.append(
                GatewayPlan(f"g{len(gateway_plan) + 1}", port, "proxy", synap_port, metrics_port)
            )
        self._save_plan(plan, gateway_plan)
        started: list[tuple[str, subprocess.Popen[bytes]]] = []
        for node in plan:
            if self._pid(node.node_id) is None:
                started.append((node.node_id, self._start_node(node, plan)))
        for node_id, proc in started:
            self._wait_ready(node_id, proc)
        started = []
        for gateway in gateway_plan[:gateways]:
            if self._pid(gateway.gateway_id) is None:
                started.append((gateway.gateway_id, self._start_gateway(gateway, plan)))
        for gateway_id, proc in started:
            self._wait_ready(gateway_id, proc, GATEWAY_ENDPOINTS_FILE)
        return self._write_endpoints(plan)

    def down(self) -> dict[str, Any]:
        plan = self._load_plan()
        stopped = []
        pids = {g.gateway_id: self._pid(g.gateway_id) for g in self._load_gateways()}
        pids |= {n.node_id: self._pid(n.node_id) for n in plan}
        for pid in pids.values():
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
        for node_id, pid in pids.items():
            if pid is None:
                continue
            deadline = time.monotonic() + node_stop_timeout_s
            while self._is_ours(pid, node_id) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._is_ours(pid, node_id):
                os.kill(pid, signal.SIGKILL)
            stopped.append({"node_id": node_id, "pid": pid})
            (self._node_dir(node_id) / "pid").unlink(missing_ok=True)
        result = self._write_endpoints(plan)
        result["stopped"] = stopped
        return result

    def status(self) -> dict[str, Any]:
        return self._describe(self._load_plan())

    def _describe(self, plan: list[NodePlan]) -> dict[str, Any]:
        processes = []
        admin = None
        for node in plan:
            pid = self._pid(node.node_id)
            live = None
            if pid is not None:
                try:
                    live = json.loads(
                        (self._node_dir(node.node_id) / NODE_ENDPOINTS_FILE).read_text()
                    )
                except (OSError, ValueError):
                    live = None
            entry = {
                "node_id": node.node_id,
                "role": "node",
                "metadata_voter": self._is_voter(node, plan),
                "host": node.host_id,
                "shard": node.shard,
                "pid": pid,
                "running": pid is not None,
                "ready": bool(live and live.get("pid") == pid),
                "amqp": f"{HOST}:{node.amqp_port}",
                "admin": f"{HOST}:{node.admin_port}",
                "metadata": f"{HOST}:{node.metadata_port}",
                "replication": f"{HOST}:{node.replication_port}",
                "metrics": f"http://{HOST}:{node.metrics_port}/metrics",
                "data_dir": str(self._node_dir(node.node_id)),
                "log": str(self._node_dir(node.node_id) / "node.log"),
            }
            if admin is None and entry["ready"]:
                admin = entry["admin"]
            processes.append(entry)
        gateways = []
        for gateway in self._load_gateways():
            pid = self._pid(gateway.gateway_id)
            live = None
            if pid is not None:
                try:
                    live = json.loads(
                        (self._node_dir(gateway.gateway_id) / GATEWAY_ENDPOINTS_FILE).read_text()
                    )
                except (OSError, ValueError):
                    live = None
            gateways.append(
                {
                    "node_id": gateway.gateway_id,
                    "role": "gateway",
                    "mode": gateway.mode,
                    "pid": pid,
                    "running": pid is not None,
                    "ready": bool(live and live.get("pid") == pid),
                    "amqp": f"{HOST}:{gateway.amqp_port}",
                    "synap": (live or {}).get("synap")
                    or (f"ws://{HOST}:{gateway.synap_port}/synap" if gateway.synap_port else None),
                    "metrics": f"http://{HOST}:{gateway.metrics_port}/metrics",
                    "data_dir": str(self._node_dir(gateway.gateway_id)),
                    "log": str(self._node_dir(gateway.gateway_id) / "node.log"),
                }
            )
        return {
            "data_dir": str(self.dir),
            "admin": admin,
            "nodes": processes,
            "gateways": gateways,
            "processes": processes + gateways,
        }

    def _write_endpoints(self, plan: list[NodePlan]) -> dict[str, Any]:
        described = self._describe(plan)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / ENDPOINTS_FILE).write_text(json.dumps(described, indent=2))
        return described
