"""A gateway process in redirect mode in front of a real three-node cluster (issue 7): clients
that follow `amqp:link:redirect` connect only to the gateway, publish to and read from the
partitions' leaders, and keep going through a leader's death via the gateway."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Delivery, Message, symbol
from proton.utils import BlockingConnection, LinkDetached
from spate.client import Consumer, Producer
from support.amqp_clients import partition_option
from support.cluster import Cluster


@pytest.fixture
def gateway_url(cluster3: Cluster, tmp_path: Path) -> Iterator[str]:
    admins = ",".join(n["admin"] for n in cluster3.state["nodes"])
    data = tmp_path / "g1"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spate.cli.main",
            "gateway",
            "run",
            "--admin",
            admins,
            "--data-dir",
            str(data),
            "--port",
            "0",
            "--refresh-ms",
            "200",
            "--mode",
            "redirect",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not (data / "gateway.json").exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)
        endpoints = json.loads((data / "gateway.json").read_text())
        assert endpoints["role"] == "gateway" and endpoints["mode"] == "redirect"
        yield f"amqp://{endpoints['amqp']}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_clients_reach_every_partition_through_the_gateway(
    cluster3: Cluster, gateway_url: str
) -> None:
    cluster3.cli("stream", "create", "clicks", "--partitions", "3", "--replicas", "3")
    for partition in range(3):
        cluster3.leader_of("clicks", partition)
    time.sleep(0.5)  # the gateway's next refresh sees the leaders
    for partition in range(3):
        bodies = [f"p{partition}-{i}".encode() for i in range(50)]
        with Producer(gateway_url, "clicks", partition=partition) as producer:
            assert producer.send_batch(bodies) == len(bodies)
        with Consumer(gateway_url, "clicks", partition=partition, start="first") as consumer:
            assert [consumer.receive(timeout=20).body for _ in bodies] == bodies
    # A client that does not follow redirects learns where to go (or uses proxy mode).
    connection = BlockingConnection(gateway_url, timeout=20)
    try:
        with pytest.raises(LinkDetached) as detached:
            connection.create_sender("clicks", options=[partition_option("1")])
        info = detached.value.link.remote_condition.info
        assert detached.value.link.remote_condition.name == "amqp:link:redirect"
        assert str(info[symbol("network-host")]) == "127.0.0.1"
    finally:
        connection.close()


def test_a_producer_on_the_gateway_rides_through_a_leader_kill(
    cluster3: Cluster, gateway_url: str
) -> None:
    cluster3.cli("stream", "create", "orders", "--replicas", "3")
    leader = cluster3.leader_of("orders")
    time.sleep(0.5)
    producer = Producer([gateway_url], "orders", timeout_s=5, reconnect_timeout_s=60)
    acked: list[bytes] = []
    for batch in range(10):
        bodies = [f"b{batch}-{i}".encode() for i in range(20)]
        producer.send_batch(bodies)
        acked.extend(bodies)
        if batch == 3:
            cluster3.kill9(cluster3.index_of(leader))
    assert producer.reconnects >= 1
    producer.close()
    with Consumer(gateway_url, "orders", start="first", reconnect_timeout_s=30) as consumer:
        seen: dict[bytes, int] = {}
        while len(seen) < len(set(acked)):
            event = consumer.receive(timeout=30)
            seen.setdefault(event.body, event.offset)
    positions = [seen[body] for body in acked]
    assert positions == sorted(positions)


def test_a_super_stream_sender_is_redirected_to_a_node(cluster3: Cluster, gateway_url: str) -> None:
    """One link to a super stream reaches several leaders: a redirect gateway without the
    cluster secret sends it to a node, which routes its messages (ADR 0014)."""
    cluster3.cli("superstream", "create", "invoices", "--partitions", "2", "--replicas", "1")
    for partition in range(2):
        cluster3.leader_of(f"invoices-{partition}")
    connection = BlockingConnection(gateway_url, timeout=20)
    try:
        with pytest.raises(LinkDetached) as detached:
            connection.create_sender("invoices")
        condition = detached.value.link.remote_condition
        assert condition.name == "amqp:link:redirect"
        host, port = (
            str(condition.info[symbol("network-host")]),
            int(condition.info[symbol("port")]),
        )
    finally:
        connection.close()
    node = BlockingConnection(f"amqp://{host}:{port}", timeout=20)
    try:
        sender = node.create_sender("invoices")
        for key in ("hello1", "hello2", "hello3"):
            message = Message(body=key, annotations={symbol("event-streams-group-key"): key})
            assert sender.send(message).remote_state == Delivery.ACCEPTED
    finally:
        node.close()
