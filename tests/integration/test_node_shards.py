"""A node as two shard processes (ADR 0032), end to end, in one test (the suite's time budget):
`spate node run --shards 2` runs n1 and n1-s1 on one host under one supervisor; a two-partition
stream gets one partition led by each; clients publish and consume on both through the shard
that does not lead them (redirects followed) and through a gateway (proxied); a client that
does not follow redirects is sent to the leading shard's own port; a killed shard is started
again by the supervisor and serves its partition; SIGTERM stops both.
(`spate dev up --shards N` starts the same processes itself: its plan is tested in
tests/server/test_shard_settings.py.)"""

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
from support.cluster import spate
from support.ports import free_port


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


WAIT_S = 120.0
"""For each step (processes starting, a leader, a restart): generous, a loaded machine is slow."""


def _leader(admin_at: tuple[str, str], partition: int, deadline: float) -> str:
    while True:
        out = spate("partition", "list", "clicks", *admin_at, "--output", "json").stdout
        found = next(p for p in json.loads(out)["partitions"] if p["partition"] == partition)
        if found["leader"] is not None:
            return str(found["leader"])
        assert time.monotonic() < deadline, f"clicks/{partition} has no leader"
        time.sleep(0.1)


def _start_gateway(tmp_path: Path, admins: list[object]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "spate.cli.main", "gateway", "run", "--admin",
         ",".join(map(str, admins)), "--data-dir", str(tmp_path / "g1"), "--port", "0",
         "--refresh-ms", "200"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        env=dict(os.environ, SPATE_METADATA_PASSWORD="shard-test-secret"),
    )  # fmt: skip


def _gateway_url(tmp_path: Path, gateway: subprocess.Popen[bytes], deadline: float) -> str:
    path = tmp_path / "g1" / "gateway.json"
    while (endpoints := _endpoints(path)) is None:
        assert gateway.poll() is None, "the gateway exited"
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.1)
    time.sleep(0.5)  # its next route refresh sees both leaders
    return f"amqp://{endpoints['amqp']}"


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


@pytest.mark.long
def test_a_node_of_two_shards_serves_partitions_led_by_each_and_survives_a_shard_kill(
    tmp_path: Path,
) -> None:
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
    processes: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while not all(_endpoints(f) for f in shard_files):
            assert supervisor.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        first, second = (_endpoints(f) for f in shard_files)
        assert first is not None and second is not None
        assert (first["node_id"], second["node_id"]) == ("n1", "n1-s1")
        assert second["amqp"] == f"127.0.0.1:{amqp + 1}"  # every port of shard i is + i
        shards = {"n1": first, "n1-s1": second}
        admin_at = ("--admin", f"127.0.0.1:{admin}")
        registered = json.loads(spate("cluster", "status", *admin_at, "--output", "json").stdout)[
            "nodes"
        ]
        assert {n["node_id"]: (n["failure_domain"], n["metadata_voter"]) for n in registered} == {
            "n1": ("n1", True),
            "n1-s1": ("n1", False),
        }
        spate("stream", "create", "clicks", "--partitions", "2", "--replicas", "1", *admin_at)
        leaders = [_leader(admin_at, p, time.monotonic() + WAIT_S) for p in range(2)]
        assert leaders == ["n1", "n1-s1"]  # the shards share the host's partitions
        gateway = _start_gateway(tmp_path, [first["admin"], second["admin"]])
        processes.append(gateway)
        gateway_url = _gateway_url(tmp_path, gateway, time.monotonic() + WAIT_S)
        bodies = {p: [f"p{p}-{i}".encode() for i in range(30)] for p in range(2)}
        for partition, leader in enumerate(leaders):
            other = f"amqp://{shards['n1-s1' if leader == 'n1' else 'n1']['amqp']}"
            # through the shard that does not lead it: spate.client follows the redirect
            with Producer(other, "clicks", partition=partition) as producer:
                assert producer.send_batch(bodies[partition]) == 30
            # through the gateway (proxy mode), the way most applications connect
            with Consumer(gateway_url, "clicks", partition=partition, start="first") as consumer:
                assert [consumer.receive(timeout=20).body for _ in range(30)] == bodies[partition]
            # a client that does not follow redirects is told the leading shard's port
            connection = BlockingConnection(other, timeout=20)
            try:
                with pytest.raises(LinkDetached) as detached:
                    connection.create_sender("clicks", options=[partition_option(str(partition))])
                condition = detached.value.link.remote_condition
                assert condition.name == "amqp:link:redirect"
                leader_port = int(str(shards[leader]["amqp"]).rsplit(":", 1)[1])
                assert int(condition.info[symbol("port")]) == leader_port
            finally:
                connection.close()
        killed = second["pid"]
        assert isinstance(killed, int)
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while True:  # the supervisor starts it again (after 1 s) with the same data directory
            again = _endpoints(shard_files[1])
            if again is not None and again["pid"] != killed:
                break
            assert supervisor.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert "shard n1-s1 (pid" in log.read_text()
        # the restarted shard serves its partition again, reached through the other shard
        with Consumer(
            f"amqp://{first['amqp']}", "clicks", partition=1, start="first", reconnect_timeout_s=30
        ) as consumer:
            assert [consumer.receive(timeout=30).body for _ in range(30)] == bodies[1]
        pids = [first["pid"], again["pid"]]
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(30) == 0
        assert not any(_alive(p) for p in pids if isinstance(p, int))
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if supervisor.poll() is None:
            supervisor.kill()  # its shards get SIGTERM from the kernel (PR_SET_PDEATHSIG)
            supervisor.wait()
