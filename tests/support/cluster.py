"""A real local cluster for tests: `spate dev up` in a temp dir, `spate dev down` afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def spate(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (`python -m spate.cli.main`) and return the completed process."""
    proc = subprocess.run(
        [sys.executable, "-m", "spate.cli.main", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"spate {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@dataclass
class Cluster:
    data_dir: Path
    state: dict[str, Any]

    @property
    def admin(self) -> str:
        admin: str = self.state["admin"]
        return admin

    def amqp_url(self, index: int = 0) -> str:
        return f"amqp://{self.state['nodes'][index]['amqp']}"

    def node_pid(self, index: int = 0) -> int:
        pid: int = self.state["nodes"][index]["pid"]
        return pid

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`spate ARGS` at the cluster's admin address, unless ARGS name one (`--admin`)."""
        admin = () if "--admin" in args else ("--admin", self.admin)
        return spate(*args, *admin, check=check)

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--output", "json").stdout)

    def refresh(self) -> None:
        """Re-read which processes run (after a kill): `admin` becomes a live node's."""
        out = spate("dev", "status", "--data-dir", str(self.data_dir), "--output", "json")
        self.state = json.loads(out.stdout)

    def urls(self) -> list[str]:
        """AMQP URLs of every node of the plan (running or not)."""
        return [f"amqp://{n['amqp']}" for n in self.state["nodes"]]

    def index_of(self, node_id: str) -> int:
        ids = [n["node_id"] for n in self.state["nodes"]]
        return ids.index(node_id)

    def leader_of(self, stream: str, partition: int = 0, timeout_s: float = 30) -> str:
        """The partition's leader as reported to metadata, once one is."""
        deadline = time.monotonic() + timeout_s
        while True:
            parts = self.cli_json("partition", "list", stream)["partitions"]
            leader = next(p["leader"] for p in parts if p["partition"] == partition)
            if leader is not None:
                return str(leader)
            assert time.monotonic() < deadline, f"{stream}/{partition} has no leader"
            time.sleep(0.1)

    def stop_node(self, index: int) -> None:
        """SIGTERM one node and wait for it to exit."""
        pid = self.node_pid(index)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.05)

    def up(self, nodes: int) -> None:
        out = spate(
            "dev", "up", "--nodes", str(nodes), "--data-dir", str(self.data_dir), "--output", "json"
        )
        self.state = json.loads(out.stdout)

    def kill9(self, index: int = 0) -> None:
        pid = self.node_pid(index)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.02)


@contextmanager
def running_cluster(data_dir: Path, nodes: int = 1) -> Iterator[Cluster]:
    """`spate dev up --nodes N` in data_dir; `spate dev down` afterwards, whatever happened."""
    cluster = Cluster(data_dir, {})
    try:
        cluster.up(nodes)
        yield cluster
    finally:
        spate("dev", "down", "--data-dir", str(data_dir), check=False)


@dataclass(frozen=True)
class TlsGateway:
    """A gateway process serving AMQP over TLS (SASL PLAIN, anonymous refused) in front of a
    dev cluster, as an operator terminating TLS at the gateway tier runs it."""

    url: str
    """amqps://localhost:PORT (the certificate names localhost and 127.0.0.1)."""
    ca: Path
    """The self-signed certificate to trust."""
    user: str
    password: str


@contextmanager
def tls_gateway(cluster: Cluster, directory: Path) -> Iterator[TlsGateway]:
    """Start `spate gateway run --tls-cert --tls-key --users-file --no-anonymous` (proxy
    mode, the cluster's secret) on a free port; SIGTERM it afterwards."""
    from support.amqp_clients import self_signed_cert

    directory.mkdir(parents=True, exist_ok=True)
    cert, key = self_signed_cert(directory)
    users, user, password = directory / "users.json", "spark", "s3cret-pass"
    subprocess.run(
        [sys.executable, "-m", "spate.cli.main", "user", "add", user, "--users-file", str(users),
         "--password-stdin"],
        input=password, text=True, check=True, capture_output=True,
    )  # fmt: skip
    admins = ",".join(n["admin"] for n in cluster.state["nodes"])
    secret = (cluster.data_dir / "secret").read_text().strip()
    data = directory / "gateway"
    with open(directory / "gateway.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "spate.cli.main", "gateway", "run", "--gateway-id", "tls",
             "--admin", admins, "--data-dir", str(data), "--port", "0", "--refresh-ms", "200",
             "--tls-cert", str(cert), "--tls-key", str(key), "--users-file", str(users),
             "--no-anonymous"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, SPATE_METADATA_PASSWORD=secret),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (data / "gateway.json").exists():
            assert process.poll() is None, (directory / "gateway.log").read_text()
            assert time.monotonic() < deadline, "the TLS gateway did not start"
            time.sleep(0.1)
        port = json.loads((data / "gateway.json").read_text())["amqp"].rsplit(":", 1)[1]
        yield TlsGateway(f"amqps://localhost:{port}", cert, user, password)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
