"""The cluster-operation commands (ADR 0022) against a real host process (metadata voter +
admin server, no partition replicas): every refusal before an operation starts has its gRPC
status, exit code and message, an operation id can be watched, and `partition replicas`
reports replicas it cannot reach as unavailable, with the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli.test_admin_cli import fails, ok, ok_json

pytestmark = pytest.mark.xdist_group("cli-ops-host")

HOST_SCRIPT = Path(__file__).with_name("admin_host.py")


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("ops-host")
    proc = subprocess.Popen(
        [sys.executable, str(HOST_SCRIPT), str(data_dir), "--also-register", "n2,n3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the host process exited before serving"
        address = str(json.loads(line)["admin"])
        ok("stream", "create", "ops", "--replicas", "3", "--admin", address)
        yield address
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_refusals_before_an_operation_starts(admin: str) -> None:
    a = ("--admin", admin)
    move = ("partition", "move")
    assert "does not exist" in fails(3, *move, "nope", "0", "--from", "n1", "--to", "n2", *a)
    assert "partition: 'ops' has partitions 0 to 0, not 5" in fails(
        2, *move, "ops", "5", "--from", "n1", "--to", "n2", *a
    )
    assert "'n7' is not registered" in fails(3, *move, "ops", "0", "--from", "n1", "--to", "n7", *a)
    assert "is on n2 already" in fails(1, *move, "ops", "0", "--from", "n1", "--to", "n2", *a)
    assert "is alive" in fails(1, "node", "remove", "n2", *a)
    assert "the cluster keeps the last 256" in fails(3, "operation", "show", "nope", *a)


def test_an_operation_id_is_returned_at_once_and_can_be_watched(admin: str) -> None:
    started = ok_json(
        "partition", "transfer-leader", "ops", "0", "--to", "n2", "--no-wait", "--admin", admin
    )
    assert started["kind"] == "transfer-leader" and started["state"] == "running"
    assert started["target"] == "ops/0 ->n2"
    again = ok_json("operation", "show", started["id"], "--admin", admin)
    assert again["id"] == started["id"] and again["state"] in ("running", "failed")


def test_replicas_it_cannot_reach_are_reported_with_the_reason(admin: str) -> None:
    found = ok_json("partition", "replicas", "ops", "--admin", admin)["partitions"]
    assert [(p["stream"], p["partition"]) for p in found] == [("ops", 0)]
    states = found[0]["states"]
    assert sorted(s["node"] for s in states) == ["n1", "n2", "n3"]
    assert all(not s["available"] and s["unavailable_reason"] for s in states)
    table = ok("partition", "replicas", "--admin", admin)
    assert "unavailable" in table
