"""The deploy recipe end to end on three "hosts" (issue 14, docs/deploy.md).

Three network namespaces (chaos.netns: each its own address on a bridge, reachable from the
root namespace as from another machine) play the three hosts. Each runs `spate node run
--config` with the shipped deploy/config/nN.toml, its example addresses and paths replaced by
the namespaces' and this test's; host 1 also runs the gateway from the [gateway] table of its
file. Users come from `spate user add` (an admin with a token, an application with a password
and write/read on `orders`). The client, in the root namespace, reaches the cluster only
through the advertised addresses: it creates the stream with the admin token, publishes and
consumes through the gateway, then host 3 is stopped (its node terminated, its network cut)
and the cluster keeps serving: more publishes confirmed, every message read back in order.
Anonymous access from the client's (non-loopback) address is refused, and nodes and the
gateway talk over mutual TLS on the replication port (the configs' cluster_tls_* files). The
admin port speaks mutual TLS (admin_tls_*): the CLI passes the CA and a client certificate
($SPATE_ADMIN_TLS_*), the gateway its own; without them the CLI is told the port speaks TLS.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import ConnectionException
from proton.utils import BlockingConnection
from spate.client.blocking import Consumer, Producer
from support.certs import TestCA

from chaos.netns import Host, Network

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "deploy" / "config"
SECRET = "deploy-test-cluster-secret"
APP_PASSWORD = "app-password"
START_TIMEOUT_S = 60.0
CLI = [sys.executable, "-m", "spate.cli.main"]


def _cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    done = subprocess.run(
        [*CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"spate {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


class Deployment:
    def __init__(self, root: Path, network: Network) -> None:
        self.root = root
        self.network = network
        self.hosts: list[Host] = [network.add_host(f"n{i}") for i in (1, 2, 3)]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.starting: dict[str, Path] = {}
        """Processes started since the last `wait_ready`, with their ready files."""
        users = root / "users.json"
        tls = root / "tls"
        tls.mkdir()
        ca = TestCA(tls)  # the cluster CA; one certificate for every host, naming their addresses
        issued = ca.issue("spate-host", tuple(host.address for host in self.hosts))
        cert, key = issued.cert, issued.key
        self.ca, self.cert, self.key = ca.cert, cert, key
        self.admin_token = _cli(
            "user", "add", "admin", "--users-file", str(users), "--no-password", "--token"
        ).strip()
        _cli(
            "user",
            "add",
            "app",
            "--users-file",
            str(users),
            "--password-stdin",
            "--configure",
            "",
            "--write",
            "^orders$",
            "--read",
            "^orders$",
            stdin=APP_PASSWORD + "\n",
        )
        self.env = dict(
            os.environ,
            SPATE_METADATA_PASSWORD=SECRET,
            SPATE_ADMIN_TOKEN=self.admin_token,
            SPATE_ADMIN_TLS_CA=str(ca.cert),
            SPATE_ADMIN_TLS_CERT=str(cert),
            SPATE_ADMIN_TLS_KEY=str(key),
        )
        for i in range(1, len(self.hosts) + 1):
            text = (CONFIGS / f"n{i}.toml").read_text()
            for j, other in enumerate(self.hosts, start=1):
                text = text.replace(f"10.0.0.{j}", other.address)
            text = text.replace("/var/lib/spate", str(root / "data"))
            text = text.replace("/etc/spate/users.json", str(users))
            text = text.replace("/etc/spate/tls/host.pem", str(cert))
            text = text.replace("/etc/spate/tls/admin.pem", str(cert))
            text = text.replace("/etc/spate/tls/host.key", str(key))
            text = text.replace("/etc/spate/tls/ca.pem", str(ca.cert))
            (root / f"n{i}.toml").write_text(text)
        self.gateway_amqp = f"{self.hosts[0].address}:5673"

    def start(self, name: str, argv: list[str], ready: Path) -> None:
        host = self.hosts[int(name[1]) - 1]
        ready.unlink(missing_ok=True)
        ready.parent.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{name}.log", "ab") as log:
            self.processes[name] = host.popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        self.starting[name] = ready

    def wait_ready(self) -> dict[str, dict[str, str]]:
        found = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        starting, self.starting = self.starting, {}
        for name, path in starting.items():
            while not path.exists():
                proc = self.processes[name]
                log = (self.root / f"{name}.log").read_text()[-3000:]
                assert proc.poll() is None, f"{name} exited:\n{log}"
                assert time.monotonic() < deadline, f"{name} not ready:\n{log}"
                time.sleep(0.1)
            time.sleep(0.1)
            found[name] = json.loads(path.read_text())
        return found

    def stop(self, name: str) -> None:
        proc = self.processes.get(name)
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI and these machines run as root)")
    with Network() as network:
        deployment = Deployment(tmp_path, network)
        try:
            yield deployment
        finally:
            for name in list(deployment.processes):
                deployment.stop(name)


def _bodies(consumer: Consumer, count: int) -> list[bytes]:
    return [bytes(consumer.receive(timeout=30).body) for _ in range(count)]


@pytest.mark.long
def test_three_hosts_from_the_config_files_survive_losing_one(deployment: Deployment) -> None:
    d = deployment
    for i in (1, 2, 3):
        data = d.root / "data" / f"n{i}"
        d.start(
            f"n{i}",
            [*CLI, "node", "run", "--config", str(d.root / f"n{i}.toml")],
            data / "node.json",
        )
    nodes = d.wait_ready()
    for i, host in enumerate(d.hosts, start=1):
        assert nodes[f"n{i}"]["amqp"] == f"{host.address}:5672"
        assert nodes[f"n{i}"]["metrics"] == f"http://{host.address}:7900/metrics"
    d.start(
        "g1",
        [*CLI, "gateway", "run", "--config", str(d.root / "n1.toml")],
        d.root / "data" / "g1" / "gateway.json",
    )
    gateway = d.wait_ready()["g1"]
    assert gateway["amqp"] == d.gateway_amqp

    # the replication port speaks TLS only: a plain TCP peer gets no handshake challenge, and
    # a TLS peer without a certificate of the cluster CA is cut off
    with socket.create_connection((d.hosts[1].address, 7800), timeout=5) as plain:
        plain.settimeout(1.0)
        with pytest.raises(TimeoutError):
            plain.recv(64)
    anonymous = ssl.create_default_context()
    anonymous.check_hostname, anonymous.verify_mode = False, ssl.CERT_NONE
    anonymous.minimum_version = ssl.TLSVersion.TLSv1_3
    with (
        socket.create_connection((d.hosts[1].address, 7800), timeout=5) as raw,
        anonymous.wrap_socket(raw) as tls,  # a TLS server: our half of the handshake completes
        contextlib.suppress(ssl.SSLError, ConnectionError),  # the alert: certificate required
    ):
        assert tls.recv(64) == b"", "a peer without a certificate was served"
    member = ssl.create_default_context(cafile=str(d.ca))
    member.check_hostname = False
    member.load_cert_chain(d.cert, d.key)
    with (
        socket.create_connection((d.hosts[1].address, 7800), timeout=5) as raw,
        member.wrap_socket(raw) as tls,
    ):
        assert tls.recv(64)  # the transport's CHALLENGE: a cluster member gets as far as that

    admin = f"{d.hosts[0].address}:7600"
    _cli(
        "stream",
        "create",
        "orders",
        "--partitions",
        "1",
        "--replicas",
        "3",
        "--admin",
        admin,
        env=d.env,
    )
    # without the token, from this (non-loopback) address, with a certificate whose common
    # name is no user: refused; without TLS: told the port speaks TLS
    no_token = {k: v for k, v in d.env.items() if k != "SPATE_ADMIN_TOKEN"}
    plaintext = {k: v for k, v in d.env.items() if not k.startswith("SPATE_ADMIN_TLS")}
    for env, refusal in (
        (no_token, "common name 'spate-host' is not a user"),
        (plaintext, f"the admin API at {admin} speaks TLS: pass --tls-ca"),
    ):
        denied = subprocess.run(
            [*CLI, "stream", "list", "--admin", admin],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert denied.returncode != 0 and refusal in denied.stderr, denied.stderr
    with pytest.raises(ConnectionException):
        BlockingConnection(f"amqp://{d.gateway_amqp}", timeout=10, allowed_mechs="ANONYMOUS")

    url = f"amqp://{d.gateway_amqp}"
    first = [b"before %d" % i for i in range(100)]
    with Producer(url, "orders", user="app", password=APP_PASSWORD, reconnect_timeout_s=30) as p:
        p.send_batch(first)
    with Consumer(url, "orders", user="app", password=APP_PASSWORD, start="first") as c:
        assert _bodies(c, 100) == first

    # host 3 goes away: its node stops and its network is cut
    d.stop("n3")
    d.network.isolate(d.hosts[2])
    second = [b"after %d" % i for i in range(100)]
    with Producer(url, "orders", user="app", password=APP_PASSWORD, reconnect_timeout_s=30) as p:
        p.send_batch(second)
    with Consumer(url, "orders", user="app", password=APP_PASSWORD, start="first") as c:
        assert _bodies(c, 200) == first + second
    status = json.loads(_cli("cluster", "status", "--admin", admin, "--output", "json", env=d.env))
    alive = {n["node_id"]: n.get("alive") for n in status["nodes"]}
    assert alive.get("n1") and alive.get("n2"), status["nodes"]
