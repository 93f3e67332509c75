"""A `spate dev up` cluster for the benchmarks: start, stop (by PID, only what it started),
create replicated streams, wait for and look up partition leaders.

Used by run_all.py (--nodes 3), failover.py and partitions.py. Every failure is a BenchError;
every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from loadclient import ROOT, BenchError, log, read_endpoints, split_hostport

SPATE = ROOT / ".venv" / "bin" / "spate"

DEV_UP_TIMEOUT_S = 180.0
DEV_DOWN_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 60.0
LEADER_WAIT_S = 60.0
LEADER_POLL_S = 0.2
KILL_GRACE_S = 15.0


def run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run a command; its stdout, or BenchError with its stderr."""
    log("$ " + shlex.join(cmd))
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env, cwd=ROOT
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{shlex.join(cmd)} did not finish within {timeout_s:.0f} s") from e
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
        raise BenchError(f"{shlex.join(cmd)} failed (exit {done.returncode}): {tail}")
    return done.stdout


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop_pids(pids: list[int]) -> None:
    """SIGTERM then SIGKILL processes this benchmark started."""
    live = [pid for pid in pids if alive(pid)]
    for pid in live:
        log(f"pid {pid} still running: SIGTERM")
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while live and time.monotonic() < deadline:
        time.sleep(0.2)
        live = [pid for pid in live if alive(pid)]
    for pid in live:
        log(f"pid {pid} ignored SIGTERM: SIGKILL")
        os.kill(pid, signal.SIGKILL)


class Cluster:
    """`spate dev up --nodes N` in a temp dir; a context manager that always tears it down."""

    def __init__(self, nodes: int, data_dir: Path | None = None, shards: int = 1) -> None:
        self.nodes = nodes
        self.shards = shards
        """Shard processes per node (`spate dev up --shards`, ADR 0032)."""
        self.own_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix=f"spate-bench{nodes}-"))
        self.pids: set[int] = set()
        """Every node PID this object has seen: stopped by PID on exit."""
        self.endpoints: dict[str, Any] = {}

    def __enter__(self) -> Cluster:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SPATE_DATA_DIR=str(self.data_dir))

    def up(self) -> None:
        """Start (or restart the missing nodes of) the cluster; idempotent."""
        cmd = [
            str(SPATE),
            "dev",
            "up",
            "--nodes",
            str(self.nodes),
            "--data-dir",
            str(self.data_dir),
            "--shards",
            str(self.shards),
        ]
        try:
            run([*cmd, "--output", "json"], DEV_UP_TIMEOUT_S)
        finally:
            self.refresh()

    def refresh(self) -> dict[str, Any]:
        if (self.data_dir / "endpoints.json").is_file():
            self.endpoints = read_endpoints(self.data_dir)
            self.pids |= {int(n["pid"]) for n in self.endpoints["nodes"] if n.get("pid")}
        return self.endpoints

    def down(self) -> None:
        try:
            run([str(SPATE), "dev", "down", "--data-dir", str(self.data_dir)], DEV_DOWN_TIMEOUT_S)
        except BenchError as e:
            log(f"spate dev down: {e}")
        stop_pids(sorted(self.pids))
        if self.own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    @property
    def admin(self) -> str:
        return str(self.endpoints.get("admin", ""))

    def node(self, node_id: str) -> dict[str, Any]:
        for n in self.endpoints["nodes"]:
            if n["node_id"] == node_id:
                return dict(n)
        raise BenchError(f"node {node_id!r} not in {self.data_dir}/endpoints.json")

    def node_ids(self) -> list[str]:
        return [str(n["node_id"]) for n in self.endpoints["nodes"]]

    def amqp(self, node_id: str) -> tuple[str, str]:
        return split_hostport(str(self.node(node_id)["amqp"]))

    def create_stream(self, name: str, replicas: int, partitions: int = 1, *options: str) -> None:
        """`options`: more `spate stream create` flags, e.g. "--filter-size-bytes", "64"."""
        run(
            [
                str(SPATE),
                "stream",
                "create",
                name,
                "--replicas",
                str(replicas),
                "--partitions",
                str(partitions),
                "--admin",
                self.admin,
                *options,
            ],
            CLI_TIMEOUT_S,
        )

    def create_super_stream(self, name: str, partitions: int, replicas: int) -> list[str]:
        """`spate superstream create NAME --partitions N`; its partition streams."""
        run(
            [
                str(SPATE),
                "superstream",
                "create",
                name,
                "--partitions",
                str(partitions),
                "--replicas",
                str(replicas),
                "--admin",
                self.admin,
                "--output",
                "json",
            ],
            CLI_TIMEOUT_S,
        )
        return [f"{name}-{i}" for i in range(partitions)]

    def partitions(self, stream: str) -> list[dict[str, Any]]:
        out = run(
            [str(SPATE), "partition", "list", stream, "--admin", self.admin, "--output", "json"],
            CLI_TIMEOUT_S,
        )
        rows: list[dict[str, Any]] = json.loads(out)["partitions"]
        return rows

    def leaders(self, stream: str, timeout_s: float = LEADER_WAIT_S) -> dict[int, str]:
        """partition -> leader node id, once every partition has a live leader."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.partitions(stream)
            if rows and all(r.get("leader") and r.get("leader_alive") for r in rows):
                return {int(r["partition"]): str(r["leader"]) for r in rows}
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{stream}: no live leader for every partition after {timeout_s:.0f} s: {rows}"
                )
            time.sleep(LEADER_POLL_S)
