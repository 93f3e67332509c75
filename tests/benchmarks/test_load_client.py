"""The native load client (benchmarks/clients/amqp_load.c) builds and measures a real Spate node,
so `make bench` cannot rot: build with gcc against Debian's libqpid-proton, start one node with
`spate dev up`, then publish, consume and a short latency run through AMQP 1.0.

Needs gcc and libqpid-proton11-dev (benchmarks/README.md). Figures are printed by the client,
never asserted; the assertions are on counts, sequence numbers and annotations.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "benchmarks" / "clients" / "build.sh"
SPATE = Path(sys.executable).parent / "spate"
# One build and one node serve the whole module (scope="module"): its tests go to one xdist
# worker, so gcc and `spate dev up` run once, not once per worker.
pytestmark = pytest.mark.xdist_group("load-client")

STEP_TIMEOUT_S = 120.0
CLIENT_TIMEOUT_S = 30
N = 2000


@dataclass
class Node:
    host: str
    port: str
    admin: str


def _run(cmd: list[str], timeout_s: float = STEP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


@pytest.fixture(scope="module")
def client() -> Path:
    done = _run(["bash", str(BUILD)])
    assert done.returncode == 0, f"build.sh failed:\n{done.stderr}"
    path = Path(done.stdout.strip().splitlines()[-1])
    assert os.access(path, os.X_OK)
    return path


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    data_dir = tmp_path_factory.mktemp("bench-node")
    up = _run(
        [str(SPATE), "dev", "up", "--nodes", "1", "--data-dir", str(data_dir), "--output", "json"]
    )
    endpoints_file = data_dir / "endpoints.json"
    pids: list[int] = []
    endpoints: dict[str, Any] = {}
    if endpoints_file.is_file():
        endpoints = json.loads(endpoints_file.read_text())
        pids = [int(n["pid"]) for n in endpoints["nodes"] if n.get("pid")]
    try:
        assert up.returncode == 0, f"spate dev up failed:\n{up.stderr}"
        entry = endpoints["nodes"][0]
        host, _, port = entry["amqp"].rpartition(":")
        yield Node(host, port, endpoints["admin"])
    finally:
        _run([str(SPATE), "dev", "down", "--data-dir", str(data_dir)])
        for pid in pids:  # what dev down left behind: ours, stopped by PID
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"


def _stream(node: Node, name: str) -> str:
    done = _run([str(SPATE), "stream", "create", name, "--replicas", "1", "--admin", node.admin])
    assert done.returncode == 0, done.stderr
    return name


def _load(client: Path, node: Node, mode: str, *args: str) -> tuple[int, dict[str, Any]]:
    done = _run(
        [
            str(client),
            mode,
            "--host",
            node.host,
            "--port",
            node.port,
            *args,
            "--timeout",
            str(CLIENT_TIMEOUT_S),
        ],
        CLIENT_TIMEOUT_S + 30,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, f"expected one JSON line, got {done.stdout!r} / {done.stderr!r}"
    return done.returncode, json.loads(lines[0])


def test_bad_usage_exits_2_with_a_usage_line(client: Path) -> None:
    done = _run([str(client), "publish"])
    assert done.returncode == 2
    assert "usage: amqp_load" in done.stderr
    done = _run([str(client), "publish", "--address", "s", "--size", "8"])
    assert done.returncode == 2
    assert "--size must be >= 16" in done.stderr


def test_publish_then_consume_from_first(client: Path, node: Node) -> None:
    """W1 then W2 in miniature: every publish accepted (002 §3.4.2), every delivery carries the
    event-streams-offset delivery annotation (000 §5.1), bodies come back 1..N in order."""
    stream = _stream(node, "load-w1w2")
    rc, pub = _load(
        client, node, "publish", "--address", stream, "--count", str(N), "--window", "500"
    )
    assert rc == 0, pub
    assert (pub["sent"], pub["confirmed"], pub["rejected"], pub["released"]) == (N, N, 0, 0)
    assert pub["error"] is None
    assert pub["confirm_p50_ms"] is not None and pub["msgs_per_s"] > 0

    rc, sub = _load(
        client,
        node,
        "consume",
        "--address",
        stream,
        "--count",
        str(N),
        "--credit",
        "300",
        "--offset",
        "first",
        "--filter",
        "rabbitmq",
    )
    assert rc == 0, sub
    assert sub["received"] == N
    assert sub["da_offset_seen"] == N
    assert (sub["first_seq"], sub["last_seq"], sub["seq_breaks"], sub["bad_body"]) == (1, N, 0, 0)


def test_consume_from_an_offset_with_the_oasis_filter(client: Path, node: Node) -> None:
    """The 0x00000000:0x00000200 filter with a simple offset value (000 §5.2.1; Spate also takes
    first/last/next/N there): offset 90 is the 91st message, body sequence 91."""
    stream = _stream(node, "load-oasis")
    rc, pub = _load(client, node, "publish", "--address", stream, "--count", "100")
    assert rc == 0, pub
    rc, sub = _load(
        client,
        node,
        "consume",
        "--address",
        stream,
        "--count",
        "10",
        "--offset",
        "90",
        "--filter",
        "oasis",
    )
    assert rc == 0, sub
    assert (sub["received"], sub["first_seq"], sub["last_seq"], sub["seq_breaks"]) == (
        10,
        91,
        100,
        0,
    )


def test_latency_mode_runs_a_separate_producer(client: Path, node: Node) -> None:
    """W3 in miniature: the consumer attaches, the producer process publishes 400 msgs/s for 1 s;
    everything published arrives once, in order."""
    stream = _stream(node, "load-w3")
    rc, res = _load(
        client,
        node,
        "latency",
        "--address",
        stream,
        "--rate",
        "400",
        "--duration",
        "1",
        "--offset",
        "first",
    )
    assert rc == 0, res
    assert (res["expected"], res["received"], res["seq_breaks"], res["bad_body"]) == (
        400,
        400,
        0,
        0,
    )
    assert res["e2e_p50_ms"] is not None
    producer = res["producer"]
    assert (producer["sent"], producer["confirmed"], producer["error"]) == (400, 400, None)


def test_refused_attach_is_reported_not_hung(client: Path, node: Node) -> None:
    """A publish to a stream that does not exist ends at once with the broker's condition
    (amqp:not-found) in the JSON and exit status 1."""
    rc, pub = _load(client, node, "publish", "--address", "no-such-stream", "--count", "10")
    assert rc == 1
    assert "amqp:not-found" in pub["error"]
    assert pub["confirmed"] == 0


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """`spate dev up --nodes 3`: every partition a Raft group over three node processes."""
    data_dir = tmp_path_factory.mktemp("bench-cluster3")
    up = _run(
        [str(SPATE), "dev", "up", "--nodes", "3", "--data-dir", str(data_dir), "--output", "json"]
    )
    endpoints_file = data_dir / "endpoints.json"
    endpoints: dict[str, Any] = {}
    pids: list[int] = []
    if endpoints_file.is_file():
        endpoints = json.loads(endpoints_file.read_text())
        pids = [int(n["pid"]) for n in endpoints["nodes"] if n.get("pid")]
    try:
        assert up.returncode == 0, f"spate dev up --nodes 3 failed:\n{up.stderr}"
        yield data_dir, endpoints
    finally:
        _run([str(SPATE), "dev", "down", "--data-dir", str(data_dir)])
        for pid in pids:
            deadline = time.monotonic() + 15
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _leader(admin: str, stream: str) -> str:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        done = _run([str(SPATE), "partition", "list", stream, "--admin", admin, "--output", "json"])
        assert done.returncode == 0, done.stderr
        row = json.loads(done.stdout)["partitions"][0]
        if row["leader"] and row["leader_alive"]:
            return str(row["leader"])
        assert time.monotonic() < deadline, f"no leader for {stream}: {row}"
        time.sleep(0.2)


def test_publish_to_a_follower_follows_the_redirect(
    client: Path, cluster3: tuple[Path, dict[str, Any]]
) -> None:
    """A node that does not lead the partition refuses the producer link with
    amqp:link:redirect and the leader's network-host/port (002 §2.8.15); the client reconnects
    there (one hop) and every message is accepted. A consumer on the follower is served from its
    own replica, no redirect."""
    _, endpoints = cluster3
    admin = endpoints["admin"]
    done = _run([str(SPATE), "stream", "create", "redir", "--replicas", "3", "--admin", admin])
    assert done.returncode == 0, done.stderr
    leader_id = _leader(admin, "redir")
    by_id = {n["node_id"]: n for n in endpoints["nodes"]}
    follower = next(n for n in endpoints["nodes"] if n["node_id"] != leader_id)
    host, _, port = follower["amqp"].rpartition(":")
    node = Node(host, port, admin)
    rc, pub = _load(client, node, "publish", "--address", "redir", "--count", "500")
    assert rc == 0, pub
    assert (pub["confirmed"], pub["redirects"], pub["error"]) == (500, 1, None)
    assert pub["endpoint"] == by_id[leader_id]["amqp"]

    rc, sub = _load(client, node, "consume", "--address", "redir", "--count", "500")
    assert rc == 0, sub
    assert (sub["received"], sub["redirects"], sub["seq_breaks"]) == (500, 0, 0)
    assert sub["endpoint"] == follower["amqp"]
