"""The container image end to end (issue 14; run by deploy/test-image.sh, docs/deploy.md).

Three network namespaces (chaos.netns) play three hosts, as in
tests/integration/test_deploy_netns.py, but every Spate process is a container of the image:
`podman run --network ns:/run/netns/<host>` with the host's /etc/spate (its deploy/config/nN.toml
with the example 10.0.0.N addresses replaced, users.json, cluster TLS files) mounted read-only and
its /var/lib/spate mounted read-write, the cluster secret from an env file. Host 1 also runs the
gateway from the same image and the same config file. The users file is written by the image's
own `spate user add`.

From the root namespace (another "machine"), with the host venv's spate CLI and spate.client
(python-qpid-proton): create a stream with the admin token, publish with confirms and consume
through the gateway's advertised address with a password, scrape a node's and the gateway's
/metrics, stop host 3's container, publish and read again, then stop every container and check
each exited 0 (spate is PID 1 in its container and stops on SIGTERM).

Containers are named spate-image-test-<run>-<host> and labelled spate.image-test=<run>; only
they are stopped and removed (on any exit), never another container. Exits non-zero with the
failing step and the containers' logs on any failure.

    python tools/image_smoke.py --image localhost/spate:latest [--run-id ID]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spate.client.blocking import Consumer, Producer  # noqa: E402

from chaos.netns import Host, Network  # noqa: E402  (the repository root, above)

CONFIGS = ROOT / "deploy" / "config"
SECRET = "image-test-cluster-secret"
APP_PASSWORD = "image-test-app-password"
START_TIMEOUT_S = 90.0
CLI = [sys.executable, "-m", "spate.cli.main"]
LABEL = "spate.image-test"


class Failed(Exception):
    """A step failed; the message says which and why."""


def say(text: str) -> None:
    print(f"image-test: {text}", flush=True)


def run(argv: Sequence[str], *, stdin: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 120) -> str:  # fmt: skip
    done = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, env=env,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise Failed(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done.stdout


class Cluster:
    """Three hosts, each a network namespace with its own /etc/spate and /var/lib/spate."""

    def __init__(self, image: str, run_id: str, root: Path, network: Network) -> None:
        self.image, self.run_id, self.root, self.network = image, run_id, root, network
        # deploy/podman-env.sh: the podman command line and the limits this machine needs
        self.podman = shlex.split(os.environ.get("SPATE_PODMAN", "podman"))
        # (the image is the one built here: never pulled)
        self.limits = ["--pull=never", *shlex.split(os.environ.get("SPATE_PODMAN_LIMITS", ""))]
        self.hosts: list[Host] = [network.add_host(f"n{i}") for i in (1, 2, 3)]
        self.containers: list[str] = []
        ask = [*self.podman, "run", "--rm", *self.limits, "--network", "none", "--entrypoint"]
        uid, gid = (run([*ask, "id", image, flag]).strip() for flag in ("-u", "-g"))
        self.uid, self.gid = int(uid), int(gid)
        say(f"the image runs as uid {self.uid} gid {self.gid} (user spate)")

        # users, written by the image's own CLI into a directory its user owns
        shared = root / "shared"
        shared.mkdir()
        os.chown(shared, self.uid, self.gid)
        user_add = [*self.podman, "run", "--rm", *self.limits, "--network", "none", "-i",
                    "-v", f"{shared}:/etc/spate", image, "user", "add"]  # fmt: skip
        users = ["--users-file", "/etc/spate/users.json"]
        self.admin_token = run([*user_add, "admin", *users, "--no-password", "--token"]).strip()
        app = ["--configure", "", "--write", "^orders$", "--read", "^orders$"]
        run([*user_add, "app", *users, "--password-stdin", *app], stdin=APP_PASSWORD + "\n")
        reader = ["--configure", "", "--write", "", "--read", ".*"]
        gateway_token = run(
            [*user_add, "gateway", *users, "--no-password", "--token", *reader]
        ).strip()

        # cluster TLS the way docs/deploy.md makes it: a CA, one certificate per host
        ca_dir = root / "ca"
        ca_dir.mkdir()
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        run(["openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=spate-cluster-ca",
             "-keyout", str(ca_dir / "ca.key"), "-out", str(ca_dir / "ca.pem")])  # fmt: skip
        for i in (1, 2, 3):
            etc, data = root / f"etc-n{i}", root / f"data-n{i}"
            (etc / "tls").mkdir(parents=True)
            data.mkdir()
            text = (CONFIGS / f"n{i}.toml").read_text()
            for j, other in enumerate(self.hosts, start=1):
                text = text.replace(f"10.0.0.{j}", other.address)
            (etc / "spate.toml").write_text(text)
            shutil.copy(shared / "users.json", etc / "users.json")
            shutil.copy(ca_dir / "ca.pem", etc / "tls" / "ca.pem")
            run(["openssl", "req", *ec, "-subj", f"/CN=host{i}", "-keyout",
                 str(etc / "tls" / "host.key"), "-out", str(ca_dir / f"host{i}.csr")])  # fmt: skip
            run(["openssl", "x509", "-req", "-in", str(ca_dir / f"host{i}.csr"), "-CA",
                 str(ca_dir / "ca.pem"), "-CAkey", str(ca_dir / "ca.key"), "-CAcreateserial",
                 "-days", "2", "-out", str(etc / "tls" / "host.pem")])  # fmt: skip
            # admin TLS (mutual in the shipped files): the same key, the address clients dial
            ext = ca_dir / f"host{i}.ext"
            ext.write_text(
                f"subjectAltName=IP:{self.hosts[i - 1].address}\n"
                "extendedKeyUsage=serverAuth,clientAuth\n"
            )
            admin_pem = etc / "tls" / "admin.pem"
            run(["openssl", "x509", "-req", "-in", str(ca_dir / f"host{i}.csr"), "-CA",
                 str(ca_dir / "ca.pem"), "-CAkey", str(ca_dir / "ca.key"), "-CAcreateserial",
                 "-days", "2", "-extfile", str(ext), "-out", str(admin_pem)])  # fmt: skip
            secret = f"SPATE_METADATA_PASSWORD={SECRET}\n"
            if i == 1:
                secret += f"SPATE_ADMIN_TOKEN={gateway_token}\n"
            (etc / "secret.env").write_text(secret)
            for path in [etc, *etc.rglob("*"), data]:
                os.chown(path, self.uid, self.gid)
            for path in [etc / "secret.env", etc / "users.json", etc / "tls" / "host.key"]:
                path.chmod(0o600)
        # the operator's client certificate for the admin port (its CN is the user `admin`)
        run(["openssl", "req", *ec, "-subj", "/CN=admin", "-keyout", str(ca_dir / "admin.key"),
             "-out", str(ca_dir / "admin.csr")])  # fmt: skip
        run(["openssl", "x509", "-req", "-in", str(ca_dir / "admin.csr"), "-CA",
             str(ca_dir / "ca.pem"), "-CAkey", str(ca_dir / "ca.key"), "-CAcreateserial",
             "-days", "2", "-out", str(ca_dir / "admin.pem")])  # fmt: skip
        self.env = dict(
            os.environ,
            SPATE_ADMIN_TOKEN=self.admin_token,
            SPATE_ADMIN_TLS_CA=str(ca_dir / "ca.pem"),
            SPATE_ADMIN_TLS_CERT=str(ca_dir / "admin.pem"),
            SPATE_ADMIN_TLS_KEY=str(ca_dir / "admin.key"),
        )
        self.gateway_url = f"amqp://{self.hosts[0].address}:5673"
        self.admin = f"{self.hosts[0].address}:7600"

    def name(self, process: str) -> str:
        return f"spate-image-test-{self.run_id}-{process}"

    def start(self, process: str, host: int, argv: list[str]) -> None:
        etc, data = self.root / f"etc-n{host}", self.root / f"data-n{host}"
        name = self.name(process)
        self.containers.append(name)
        run([*self.podman, "run", "--detach", *self.limits, "--name", name,
             "--label", f"{LABEL}={self.run_id}",
             "--network", f"ns:/run/netns/{self.hosts[host - 1].namespace}",
             "--env-file", str(etc / "secret.env"),
             "-v", f"{etc}:/etc/spate:ro", "-v", f"{data}:/var/lib/spate",
             self.image, *argv])  # fmt: skip

    def running(self, process: str) -> bool:
        out = run([*self.podman, "inspect", "--format", "{{.State.Running}}", self.name(process)])
        return out.strip() == "true"

    def logs(self, process: str) -> str:
        done = subprocess.run(
            [*self.podman, "logs", "--tail", "40", self.name(process)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return done.stdout + done.stderr

    def wait_ready(self, process: str, ready: Path) -> dict[str, str]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if not self.running(process):
                raise Failed(f"{process} exited before it was ready:\n{self.logs(process)}")
            if time.monotonic() > deadline:
                raise Failed(f"{process} not ready in {START_TIMEOUT_S:.0f} s:\n"
                             f"{self.logs(process)}")  # fmt: skip
            time.sleep(0.2)
        time.sleep(0.1)
        found: dict[str, str] = json.loads(ready.read_text())
        return found

    def stop(self, process: str) -> int:
        """Stop (SIGTERM, 30 s grace) and return the container's exit code."""
        run([*self.podman, "stop", "--time", "30", self.name(process)], timeout=90)
        code = run([*self.podman, "inspect", "--format", "{{.State.ExitCode}}",
                    self.name(process)])  # fmt: skip
        return int(code.strip())

    def remove_all(self) -> None:
        for name in self.containers:
            subprocess.run(
                [*self.podman, "rm", "--force", "--time", "5", name],
                capture_output=True, timeout=90, check=False,
            )  # fmt: skip


def _bodies(consumer: Consumer, count: int) -> list[bytes]:
    return [bytes(consumer.receive(timeout=30).body) for _ in range(count)]


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
    return text


def exercise(c: Cluster) -> None:
    started = time.monotonic()
    for i in (1, 2, 3):
        c.start(f"n{i}", i, ["node", "run", "--config", "/etc/spate/spate.toml"])
    nodes = {f"n{i}": c.wait_ready(f"n{i}", c.root / f"data-n{i}" / f"n{i}" / "node.json")
             for i in (1, 2, 3)}  # fmt: skip
    for i, host in enumerate(c.hosts, start=1):
        if nodes[f"n{i}"]["amqp"] != f"{host.address}:5672":
            raise Failed(f"n{i} advertises {nodes[f'n{i}']['amqp']}, not {host.address}:5672")
    say(f"three node containers ready in {time.monotonic() - started:.1f} s: "
        + ", ".join(f"{n} amqp {nodes[n]['amqp']}" for n in sorted(nodes)))  # fmt: skip
    c.start("g1", 1, ["gateway", "run", "--config", "/etc/spate/spate.toml"])
    gateway = c.wait_ready("g1", c.root / "data-n1" / "g1" / "gateway.json")
    if f"amqp://{gateway['amqp']}" != c.gateway_url:
        raise Failed(f"the gateway advertises {gateway['amqp']}, expected {c.gateway_url}")
    say(f"gateway container ready: amqp {gateway['amqp']}")

    run([*CLI, "stream", "create", "orders", "--partitions", "1", "--replicas", "3",
         "--admin", c.admin], env=c.env)  # fmt: skip
    say("stream orders created (1 partition, 3 replicas) with the admin token")
    first = [b"image %d" % i for i in range(200)]
    with Producer(c.gateway_url, "orders", user="app", password=APP_PASSWORD,
                  reconnect_timeout_s=30) as p:  # fmt: skip
        confirmed = p.send_batch(first)
    if confirmed != len(first):
        raise Failed(f"{confirmed} of {len(first)} publishes confirmed")
    with Consumer(c.gateway_url, "orders", user="app", password=APP_PASSWORD,
                  start="first") as consumer:  # fmt: skip
        got = _bodies(consumer, len(first))
    if got != first:
        raise Failed(f"read back {len(got)} messages, not the {len(first)} published in order")
    say(f"published {len(first)} with confirms and read them back in order through the gateway")

    node_metrics = _metrics(nodes["n2"]["metrics"])
    gateway_metrics = _metrics(f"http://{c.hosts[0].address}:7901/metrics")
    if "spate_" not in node_metrics or "spate_" not in gateway_metrics:
        raise Failed("a /metrics endpoint served no spate_ metric")
    say(f"/metrics served by node n2 ({len(node_metrics.splitlines())} lines) and the gateway "
        f"({len(gateway_metrics.splitlines())} lines)")  # fmt: skip

    code = c.stop("n3")
    c.network.isolate(c.hosts[2])
    say(f"host 3 down: its container stopped (exit {code}), its network cut")
    second = [b"after %d" % i for i in range(100)]
    with Producer(c.gateway_url, "orders", user="app", password=APP_PASSWORD,
                  reconnect_timeout_s=30) as p:  # fmt: skip
        confirmed = p.send_batch(second)
    with Consumer(c.gateway_url, "orders", user="app", password=APP_PASSWORD,
                  start="first") as consumer:  # fmt: skip
        got = _bodies(consumer, len(first) + len(second))
    if confirmed != len(second) or got != first + second:
        raise Failed(f"with host 3 down: {confirmed} confirmed, {len(got)} read back in order?")
    say(f"with two hosts: {len(second)} more confirmed, all {len(got)} read back in order")

    codes = {"n3": code}
    for process in ("g1", "n1", "n2"):
        codes[process] = c.stop(process)
    if any(codes.values()):
        raise Failed(f"containers exited with {codes} (0 expected after SIGTERM)")
    say(f"every container stopped on SIGTERM with exit 0 ({time.monotonic() - started:.1f} s "
        "from the first start)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="localhost/spate:latest")
    parser.add_argument("--run-id", default=str(os.getpid()), help="names and labels containers")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("image-test: needs root (network namespaces, rootful podman)", file=sys.stderr)
        return 2
    # SIGTERM (deploy/test-image.sh's trap) unwinds like an error: containers and namespaces
    # are removed by the `finally` blocks below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="spate-image-test-"))
    cluster: Cluster | None = None
    try:
        with Network() as network:
            try:
                cluster = Cluster(opts.image, opts.run_id, root, network)
                exercise(cluster)
            except Exception as failure:  # a step's Failed, or the client's own error
                print(f"image-test: FAILED: {failure!r}", file=sys.stderr)
                if cluster is not None:
                    for name in ("n1", "n2", "n3", "g1"):
                        if cluster.name(name) in cluster.containers:
                            print(f"--- {name}\n{cluster.logs(name)}", file=sys.stderr)
                return 1
            finally:
                if cluster is not None:
                    cluster.remove_all()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    say("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
