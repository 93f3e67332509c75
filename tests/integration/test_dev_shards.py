"""A node as two shard processes (ADR 0032), end to end: `spate dev up --nodes 1 --shards 2`
runs n1 and n1-s1 on one simulated host; a two-partition stream gets one partition led by each;
clients publish and consume on both through the shard that does not lead them (redirects
followed) and through the gateway (proxied); a client that does not follow redirects is sent
to the leading shard's own port. Then `spate node run --shards 2` supervises two shards: a
killed shard is started again, SIGTERM stops both."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proton import symbol
from proton.utils import BlockingConnection, LinkDetached
from spate.client import Consumer, Producer
from support.amqp_clients import partition_option
from support.cluster import Cluster, spate
from support.ports import free_port


def test_a_one_host_cluster_of_two_shards_serves_partitions_led_by_each(tmp_path: Path) -> None:
    data = tmp_path / "shards"
    cluster = Cluster(data, {})
    try:
        out = spate(
            "dev", "up", "--nodes", "1", "--shards", "2", "--data-dir", str(data),
            "--output", "json",
        )  # fmt: skip
        cluster.state = json.loads(out.stdout)
        nodes = {n["node_id"]: n for n in cluster.state["nodes"]}
        assert sorted(nodes) == ["n1", "n1-s1"]
        assert {n["host"] for n in nodes.values()} == {"n1"}
        assert [nodes["n1"]["metadata_voter"], nodes["n1-s1"]["metadata_voter"]] == [True, False]
        registered = cluster.cli_json("cluster", "status")["nodes"]
        assert {n["node_id"]: n["failure_domain"] for n in registered} == {
            "n1": "n1",
            "n1-s1": "n1",
        }
        cluster.cli("stream", "create", "clicks", "--partitions", "2", "--replicas", "1")
        leaders = [cluster.leader_of("clicks", p) for p in range(2)]
        assert sorted(leaders) == ["n1", "n1-s1"]  # the shards share the host's partitions
        gateway = f"amqp://{cluster.state['gateways'][0]['amqp']}"
        for partition, leader in enumerate(leaders):
            other = next(n for n in nodes.values() if n["node_id"] != leader)
            bodies = [f"p{partition}-{i}".encode() for i in range(30)]
            # through the shard that does not lead it: spate.client follows the redirect
            with Producer(f"amqp://{other['amqp']}", "clicks", partition=partition) as producer:
                assert producer.send_batch(bodies) == len(bodies)
            with Consumer(
                f"amqp://{other['amqp']}", "clicks", partition=partition, start="first"
            ) as consumer:
                assert [consumer.receive(timeout=20).body for _ in bodies] == bodies
            # through the gateway (proxy mode), the way most applications connect
            with Consumer(gateway, "clicks", partition=partition, start="first") as consumer:
                assert [consumer.receive(timeout=20).body for _ in bodies] == bodies
            # a client that does not follow redirects is told the leading shard's port
            connection = BlockingConnection(f"amqp://{other['amqp']}", timeout=20)
            try:
                with pytest.raises(LinkDetached) as detached:
                    connection.create_sender("clicks", options=[partition_option(str(partition))])
                condition = detached.value.link.remote_condition
                assert condition.name == "amqp:link:redirect"
                port = int(condition.info[symbol("port")])
                assert port == int(nodes[leader]["amqp"].rsplit(":", 1)[1])
            finally:
                connection.close()
    finally:
        spate("dev", "down", "--data-dir", str(data), check=False)


def _endpoints(path: Path) -> dict[str, object] | None:
    try:
        loaded: dict[str, object] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _port_pairs(count: int) -> list[int]:
    """`count` ports p, each with p + 1 free too (shard 1's), all distinct."""
    taken: set[int] = set()
    found: list[int] = []
    while len(found) < count:
        port = free_port(taken)
        taken.add(port)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        if port + 1 not in taken:
            taken.add(port + 1)
            found.append(port)
    return found


def test_node_run_shards_supervises_its_shards(tmp_path: Path) -> None:
    amqp, admin, meta, repl, metrics = _port_pairs(5)
    data = tmp_path / "n1"
    argv = [
        sys.executable, "-m", "spate.cli.main", "node", "run", "--node-id", "n1",
        "--data-dir", str(data), "--shards", "2", "--amqp-port", str(amqp),
        "--admin-port", str(admin), "--metadata-port", str(meta),
        "--replication-port", str(repl), "--metrics-port", str(metrics),
    ]  # fmt: skip
    log = tmp_path / "supervisor.log"
    with open(log, "ab") as out:
        supervisor = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, SPATE_METADATA_PASSWORD="shard-test-secret"),
        )
    shard_files = [data / "node.json", tmp_path / "n1-s1" / "node.json"]
    try:
        deadline = time.monotonic() + 60
        while not all(_endpoints(f) for f in shard_files):
            assert supervisor.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        first, second = (_endpoints(f) for f in shard_files)
        assert first is not None and second is not None
        assert (first["node_id"], second["node_id"]) == ("n1", "n1-s1")
        assert second["amqp"] == f"127.0.0.1:{amqp + 1}"  # every port of shard i is + i
        killed = second["pid"]
        assert isinstance(killed, int)
        os.kill(killed, signal.SIGKILL)
        while True:  # the supervisor starts it again (after 1 s) with the same data directory
            again = _endpoints(shard_files[1])
            if again is not None and again["pid"] != killed:
                break
            assert supervisor.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert "shard n1-s1 (pid" in log.read_text()
        pids = [first["pid"], again["pid"]]
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0
        assert not any(_alive(p) for p in pids if isinstance(p, int))
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
