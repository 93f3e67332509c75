"""No credential-free access from another host by default (issue 14, ADR 0023).

A node with default security settings (anonymous on, no users file, no admin token required)
runs in its own network namespace, bound to every interface. From inside that namespace (over
loopback) anonymous AMQP and token-less admin calls work, as on a developer's machine; from the
root namespace — another host — both are refused: SASL ANONYMOUS fails, and the admin API
answers UNAUTHENTICATED saying what to do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from proton import ConnectionException
from proton.utils import BlockingConnection
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc

from chaos.netns import Host, Network

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "spate.cli.main"]
INSIDE_AMQP = """
import sys
from proton import Message
from proton.utils import BlockingConnection
c = BlockingConnection("amqp://127.0.0.1:5672", timeout=10, allowed_mechs="ANONYMOUS")
c.create_sender("orders").send(Message(body="from loopback"))
c.close()
print("published")
"""


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Host]:
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI and these machines run as root)")
    with Network() as network:
        host = network.add_host("n1")
        data = tmp_path / "n1"
        env = dict(os.environ, SPATE_METADATA_PASSWORD="remote-anonymous-test")
        with open(tmp_path / "n1.log", "wb") as log:
            proc = host.popen(
                [
                    *CLI,
                    "node",
                    "run",
                    "--node-id",
                    "n1",
                    "--data-dir",
                    str(data),
                    "--host",
                    "0.0.0.0",
                    "--advertise-host",
                    host.address,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 60
            while not (data / "node.json").exists():
                assert proc.poll() is None, (tmp_path / "n1.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "n1.log").read_text()[-3000:]
                time.sleep(0.1)
            yield host
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_anonymous_works_on_loopback_only(node: Host) -> None:
    # inside the host: loopback, as `spate dev up` clusters are used
    created = node.run([*CLI, "stream", "create", "orders", "--admin", "127.0.0.1:7600"])
    assert "Created stream 'orders'" in created
    assert "published" in node.run([sys.executable, "-c", INSIDE_AMQP])
    listed = json.loads(
        node.run([*CLI, "stream", "list", "--admin", "127.0.0.1:7600", "--output", "json"])
    )
    assert [s["name"] for s in listed["streams"]] == ["orders"]

    # from another host: refused
    with pytest.raises(ConnectionException):
        BlockingConnection(f"amqp://{node.address}:5672", timeout=10, allowed_mechs="ANONYMOUS")
    with (
        grpc.insecure_channel(f"{node.address}:7600") as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        pb_grpc.AdminStub(channel).ListStreams(pb.ListStreamsRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "accepted from loopback only" in (refused.value.details() or "")
    metrics = subprocess.run(
        ["curl", "-sf", f"http://{node.address}:7900/metrics"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    # the metrics endpoint carries no credentials (docs/security.md): reachable, by design
    assert metrics.returncode == 0 and "spate_amqp_authentication_failures_total" in metrics.stdout
    failures = [
        line
        for line in metrics.stdout.splitlines()
        if line.startswith("spate_amqp_authentication_failures_total")
    ]
    assert failures and float(failures[0].rsplit(" ", 1)[1]) >= 1
