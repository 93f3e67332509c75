"""Three metadata voters in three OS processes, driven through the real admin gRPC API.

The issue's acceptance test: a command acknowledged to an admin client survives kill -9 of all
three nodes at once. Each process is tests/cli/admin_host.py (a metadata voter, the admin server,
node registration, heartbeats and leader reports, i.e. a node without partitions).
research/pysyncobj.md §2: a SUCCESS callback means the entry is in the page cache of a majority
(which survives kill -9) and, with our leader-side fsync, on the leader's disk.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc

HOST_SCRIPT = Path(__file__).parent.parent / "cli" / "admin_host.py"
NODES = ("n1", "n2", "n3")
START_TIMEOUT_S = 60.0
REGISTER_TIMEOUT_S = 15.0
"""Bound on a host becoming ready (imports, election, registration) on a busy 2-core box."""


class Cluster:
    """Three host processes; `start()` (re)starts all from their data dirs and metadata ports."""

    def __init__(self, root: Path, ports: list[int]) -> None:
        self.root = root
        self.addresses = [f"127.0.0.1:{p}" for p in ports]
        self.procs: list[subprocess.Popen[str]] = []
        self.admin: dict[str, str] = {}

    def start(self) -> None:
        assert not self.procs
        for i, node in enumerate(NODES):
            peers = ",".join(a for a in self.addresses if a != self.addresses[i])
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HOST_SCRIPT),
                        str(self.root / node),
                        "--node-id",
                        node,
                        "--metadata",
                        self.addresses[i],
                        "--peers",
                        peers,
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for node, proc in zip(NODES, self.procs, strict=True):
            self.admin[node] = json.loads(_read_line(proc, START_TIMEOUT_S))["admin"]

    def kill_all(self) -> None:
        """SIGKILL every host back to back, then reap them."""
        for proc in self.procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=10)
        self.procs = []

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self.procs = []

    def call(self, node: str, method: str, request: Any) -> Any:
        with grpc.insecure_channel(self.admin[node]) as channel:
            return getattr(pb_grpc.AdminStub(channel), method)(request, timeout=15)


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise AssertionError(f"host {proc.pid} printed nothing within {timeout_s} s")
    line = proc.stdout.readline()
    assert line, f"host {proc.pid} exited with {proc.wait(timeout=10)} before serving"
    return line


@pytest.fixture
def cluster(tmp_path: Path, free_port: Callable[[], int]) -> Iterator[Cluster]:
    group = Cluster(tmp_path, [free_port() for _ in NODES])
    try:
        yield group
    finally:
        group.stop()


def placement(cluster: Cluster, node: str) -> dict[tuple[str, int], tuple[str, ...]]:
    answer = cluster.call(node, "ListPartitions", pb.ListPartitionsRequest())
    return {(p.stream, p.partition): tuple(p.replicas) for p in answer.partitions}


def leaders(cluster: Cluster, node: str) -> dict[tuple[str, int], tuple[str, int]]:
    answer = cluster.call(node, "ListPartitions", pb.ListPartitionsRequest())
    return {
        (p.stream, p.partition): (p.leader, p.leader_epoch) for p in answer.partitions if p.leader
    }


def test_acknowledged_commands_survive_kill_9_of_all_three_nodes(cluster: Cluster) -> None:
    cluster.start()
    # A host prints its endpoints once it serves; its registration may reach n1's copy of the
    # metadata a moment later (seen in a run: n2 missing from n1's first answer).
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while True:
        status = cluster.call("n1", "ClusterStatus", pb.ClusterStatusRequest())
        listed = sorted(n.node_id for n in status.nodes)
        if listed == list(NODES) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(status.metadata.voters) == 3
    assert listed == list(NODES)

    # Every command goes to a different node: followers forward to the leader.
    acknowledged = []
    for i, (name, partitions, replicas) in enumerate(
        [
            ("orders", 6, None),
            ("audit", 2, 2),
            ("clicks", 1, 1),
            ("doomed", 1, None),
            ("late", 3, 3),
        ]
    ):
        config = pb.StreamConfig(name=name, partitions=partitions, replicas=replicas)
        answer = cluster.call(NODES[i % 3], "CreateStream", pb.CreateStreamRequest(stream=config))
        acknowledged.append(answer.stream)
    cluster.call("n2", "DeleteStream", pb.DeleteStreamRequest(name="doomed"))
    assert acknowledged[0].replicas == 3  # default: min(3, registered nodes)

    before = placement(cluster, "n3")  # read on a node that did not take the last command
    assert sorted({stream for stream, _ in before}) == ["audit", "clicks", "late", "orders"]
    assert all(len(set(r)) == len(r) for r in before.values())
    reported = leaders(cluster, "n1")
    streams_before = cluster.call("n1", "ListStreams", pb.ListStreamsRequest()).streams

    cluster.kill_all()
    cluster.start()

    for node in NODES:
        assert cluster.call(node, "ListStreams", pb.ListStreamsRequest()).streams == streams_before
        assert placement(cluster, node) == before
        after = leaders(cluster, node)
        assert {key: after.get(key) for key in reported} == reported  # epochs never go back
    status = cluster.call("n2", "ClusterStatus", pb.ClusterStatusRequest())
    assert [(n.node_id, n.alive) for n in status.nodes] == [(n, True) for n in NODES]
    assert sum(n.partitions_hosted for n in status.nodes) == sum(len(r) for r in before.values())
    # And the cluster still takes commands.
    cluster.call("n3", "CreateStream", pb.CreateStreamRequest(stream=pb.StreamConfig(name="new")))
    deadline = time.monotonic() + 15
    while ("new", 0) not in placement(cluster, "n1"):
        assert time.monotonic() < deadline, "n1 never saw the stream created on n3"
        time.sleep(0.05)
