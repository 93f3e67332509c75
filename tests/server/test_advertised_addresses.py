"""Advertised addresses (issue 7; 004 "When a Load Balancer is in Use"): a node bound to every
interface registers, and redirects clients to, the host and port it is told to advertise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spate.core.errors import InvalidArgument
from spate.server.devcluster import NODE_ENDPOINTS_FILE, _free_port
from spate.server.settings import NodeSettings, load_settings
from support.cluster import spate


def settings(**overrides: object) -> NodeSettings:
    base = {"node_id": "n1", "data_dir": "/tmp/x", "metadata_password": "pw"}
    return load_settings(None, {**base, **overrides})


def test_a_wildcard_bind_needs_an_advertised_host() -> None:
    with pytest.raises(InvalidArgument, match="--advertise-host"):
        settings(host="0.0.0.0")
    assert settings(host="0.0.0.0", advertise_host="node-1.example").advertise_host == (
        "node-1.example"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"advertise_host": "a b"}, "host name"),
        ({"advertise_host": "h:5672"}, "host name"),
        ({"advertise_amqp_port": 0}, "1-65535"),
        ({"advertise_amqp_port": 70000}, "1-65535"),
    ],
)
def test_bad_advertised_addresses_are_refused_with_the_flag_named(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        settings(**overrides)


@pytest.mark.slow
def test_a_node_bound_to_every_interface_registers_its_advertised_endpoints(
    tmp_path: Path,
) -> None:
    data = tmp_path / "n1"
    metadata_port = _free_port()
    env = {**os.environ, "SPATE_METADATA_PASSWORD": "secret-for-test"}
    node = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spate.cli.main",
            "node",
            "run",
            "--node-id",
            "n1",
            "--data-dir",
            str(data),
            "--host",
            "0.0.0.0",
            "--advertise-host",
            "127.0.0.1",
            "--amqp-port",
            "0",
            "--advertise-amqp-port",
            "15999",
            "--admin-port",
            "0",
            "--metadata-port",
            str(metadata_port),
            "--replication-port",
            "0",
            "--metrics-port",
            "0",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        endpoints_file = data / NODE_ENDPOINTS_FILE
        deadline = time.monotonic() + 60
        while not endpoints_file.exists():
            assert node.poll() is None, node.stderr.read() if node.stderr else ""
            assert time.monotonic() < deadline, "the node did not start"
            time.sleep(0.1)
        endpoints = json.loads(endpoints_file.read_text())
        assert endpoints["amqp"] == "127.0.0.1:15999"
        assert endpoints["admin"].rsplit(":", 1)[0] == "127.0.0.1"
        # What the metadata service holds (and redirects use) is the advertised address.
        status = spate("cluster", "status", "--admin", endpoints["admin"], "--output", "json")
        report = json.loads(status.stdout)
        nodes = {n["node_id"]: n["endpoints"] for n in report["nodes"]}
        assert nodes["n1"]["amqp"] == "127.0.0.1:15999", nodes
        assert nodes["n1"]["metadata"] == f"127.0.0.1:{metadata_port}", nodes
        assert report["metadata"]["self_address"] == f"127.0.0.1:{metadata_port}"
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(20)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
