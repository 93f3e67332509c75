"""Gateways in proxy mode in front of a real three-node cluster (issue 7): unmodified AMQP 1.0
clients — python-qpid-proton's BlockingConnection and plain rhea, neither following redirects —
publish partition-agnostic to a 6-partition stream and consume through a gateway; a leader's
kill -9 and a gateway's kill -9 lose no acknowledged message.

The cluster is `spate dev up --nodes 3 --gateways 2` (both gateways in proxy mode)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from proton import Message, Timeout, symbol
from proton.utils import BlockingConnection, LinkDetached, SendException
from spate.client import Consumer, Producer
from spate.server import allocator
from support.amqp_clients import (
    LinkProperties,
    RunningGateway,
    da,
    offset_filter,
    partition_option,
    run_rhea,
)
from support.cluster import Cluster, spate

PARTITIONS = 6
TRIMMED = "free heap given back"


# The tests that kill nothing share one cluster (a start is ~10 s), on one worker.
shared = pytest.mark.xdist_group("gateway-proxy-shared")


@contextmanager
def proxy_cluster(data_dir: Path) -> Iterator[Cluster]:
    cluster = Cluster(data_dir, {})
    try:
        out = spate(
            "dev", "up", "--nodes", "3", "--gateways", "2", "--data-dir", str(data_dir),
            "--output", "json",
        )  # fmt: skip
        cluster.state = json.loads(out.stdout)
        yield cluster
    finally:
        spate("dev", "down", "--data-dir", str(data_dir), check=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Shared: each test creates its own stream and kills nothing."""
    with proxy_cluster(tmp_path_factory.mktemp("proxy") / "cluster") as cluster:
        yield cluster


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A test's own cluster, for the tests that kill a process."""
    with proxy_cluster(tmp_path / "proxy") as cluster:
        yield cluster


def gateways(cluster: Cluster) -> list[str]:
    return [f"amqp://{g['amqp']}" for g in cluster.state["gateways"]]


def wait_leaders(cluster: Cluster, stream: str, partitions: int) -> None:
    for partition in range(partitions):
        cluster.leader_of(stream, partition)
    time.sleep(1.0)  # the gateways' next refresh (500 ms in dev) sees them


def consume_all(url: str, stream: str, expect: int, timeout_s: float = 30) -> list[Message]:
    """A plain partition-agnostic BlockingConnection receiver from the first offset."""
    connection = BlockingConnection(url, timeout=timeout_s)
    try:
        receiver = connection.create_receiver(
            stream, options=[offset_filter(symbol("first"))], credit=500
        )
        out = [receiver.receive(timeout=timeout_s) for _ in range(expect)]
        for _ in out:
            receiver.accept()
        return out
    finally:
        connection.close()


@shared
def test_status_lists_proxy_gateways(cluster: Cluster) -> None:
    listed = cluster.state["gateways"]
    assert [g["role"] for g in listed] == ["gateway", "gateway"]
    assert {g["mode"] for g in listed} == {"proxy"}


@shared
def test_a_quiet_gateway_gives_its_free_heap_back_once(cluster: Cluster) -> None:
    """ADR 0048 (4): after traffic, `allocator.IDLE_TRIM_S` without a byte through its listener,
    a gateway hands its free heap back to the kernel once and logs the RSS before and after."""
    cluster.cli("stream", "create", "quiet", "--replicas", "3")
    wait_leaders(cluster, "quiet", 1)
    gateway = cluster.state["gateways"][1]
    log = Path(gateway["log"])
    connection = BlockingConnection(f"amqp://{gateway['amqp']}", timeout=30)
    try:
        sender = connection.create_sender("quiet")
        for _ in range(300):
            sender.send(Message(body=bytes(16_000)))
    finally:
        connection.close()
    sent = log.read_text().count(TRIMMED)
    deadline = time.monotonic() + allocator.IDLE_TRIM_S + 15
    while log.read_text().count(TRIMMED) == sent:
        assert time.monotonic() < deadline, f"no '{TRIMMED}' in {log} after the traffic"
        time.sleep(0.5)
    time.sleep(allocator.IDLE_TRIM_S / 2)
    assert log.read_text().count(TRIMMED) == sent + 1  # once per quiet spell


@shared
def test_blocking_connection_publishes_agnostic_and_consumes_through_proxy(
    cluster: Cluster,
) -> None:
    """000 §4.1-4.2: a link without `event-streams-partition` is partition-agnostic; the
    gateway routes each message (round-robin, by event-streams-target-partition) to its
    partition's leader and accepts it after that partition's majority fsync."""
    cluster.cli("stream", "create", "six", "--partitions", str(PARTITIONS), "--replicas", "3")
    wait_leaders(cluster, "six", PARTITIONS)
    url = gateways(cluster)[0]
    connection = BlockingConnection(url, timeout=30)
    try:
        sender = connection.create_sender("six")
        for i in range(120):
            sender.send(Message(body=f"m{i}"))
        # a targeted message: event-streams-target-partition is a delivery annotation (§4.6.6)
        targeted = Message(body="to-4")
        targeted.instructions = {symbol("event-streams-target-partition"): symbol("4")}
        sender.send(targeted)
    finally:
        connection.close()
    received = consume_all(gateways(cluster)[1], "six", 121)
    bodies = sorted(str(m.body) for m in received)
    assert bodies == sorted([f"m{i}" for i in range(120)] + ["to-4"])
    by_partition: dict[str, list[int]] = defaultdict(list)
    for message in received:
        by_partition[str(da(message, "event-streams-source-partition"))].append(
            int(da(message, "event-streams-offset"))
        )
    assert len(by_partition) == PARTITIONS  # round-robin reached every partition
    (to_4,) = [m for m in received if m.body == "to-4"]
    assert str(da(to_4, "event-streams-source-partition")) == "4"
    for offsets in by_partition.values():
        assert offsets == sorted(offsets) == list(range(len(offsets)))


@shared
def test_bound_links_and_rhea_through_proxy(cluster: Cluster) -> None:
    cluster.cli("stream", "create", "bound", "--partitions", "3", "--replicas", "3")
    wait_leaders(cluster, "bound", 3)
    url = gateways(cluster)[0]
    connection = BlockingConnection(url, timeout=30)
    try:
        sender = connection.create_sender("bound", options=[partition_option("2")])
        echoed = sender.link.remote_properties
        assert str(echoed[symbol("event-streams-partition")]) == "2"
        for i in range(10):
            sender.send(Message(body=f"p2-{i}"))
    finally:
        connection.close()
    port = int(url.rsplit(":", 1)[1])
    report = run_rhea(
        RunningGateway(port),
        [
            {"op": "publish", "address": "bound", "bodies": {"prefix": "rhea-", "count": 30}},
            {
                "op": "consume",
                "address": "bound",
                "count": 40,
                "filter": {
                    "rhea-offset": {
                        "descriptor": "rabbitmq:stream-offset-spec",
                        "type": "string",
                        "value": "first",
                    }
                },
            },
        ],
    )
    assert "error" not in report, report
    assert report["steps"][0]["outcomes"] == ["accepted"] * 30
    messages = report["steps"][1]["messages"]
    assert sorted(m["body"] for m in messages) == sorted(
        [f"p2-{i}" for i in range(10)] + [f"rhea-{i}" for i in range(30)]
    )


@shared
def test_redirect_mode_on_request(cluster: Cluster) -> None:
    """A client may ask a proxy gateway for a redirect per link (spate:gateway-mode)."""
    cluster.cli("stream", "create", "ask", "--replicas", "3")
    wait_leaders(cluster, "ask", 1)
    connection = BlockingConnection(gateways(cluster)[0], timeout=30)
    try:
        with pytest.raises(LinkDetached) as detached:
            connection.create_sender(
                "ask",
                name="redirected",
                options=[LinkProperties({symbol("spate:gateway-mode"): "redirect"})],
            )
        condition = detached.value.link.remote_condition
        assert condition.name == "amqp:link:redirect"
        with pytest.raises(LinkDetached) as refused:
            connection.create_sender(
                "ask",
                name="unknown-mode",
                options=[LinkProperties({symbol("spate:gateway-mode"): "teleport"})],
            )
        assert refused.value.link.remote_condition.name == "amqp:invalid-field"
        sender = connection.create_sender("ask")  # the gateway's default: proxy
        sender.send(Message(body="proxied"))
    finally:
        connection.close()


def test_leader_kill9_during_proxied_publish_and_consume(own_cluster: Cluster) -> None:
    """A BlockingConnection publishes through one gateway while another BlockingConnection
    consumes through the other gateway, and the partition's leader is killed -9 midway (the
    consuming gateway reads from the leader, so its reader must move too). Every accepted
    message is consumed, in publish order; the consumer sees every offset once, in order;
    messages refused while the leader changed carried a retryable condition and were resent."""
    cluster = own_cluster
    cluster.cli("stream", "create", "orders", "--replicas", "3")
    leader = cluster.leader_of("orders")
    time.sleep(1.0)
    publisher = BlockingConnection(gateways(cluster)[0], timeout=60)
    reader = BlockingConnection(gateways(cluster)[1], timeout=60)
    accepted: list[str] = []
    received: list[Message] = []
    refused = 0

    def take(timeout_s: float) -> None:
        try:
            while True:
                received.append(receiver.receive(timeout=timeout_s))
                receiver.accept()
        except Timeout:
            pass

    try:
        receiver = reader.create_receiver(
            "orders", options=[offset_filter(symbol("first"))], credit=500
        )
        sender = publisher.create_sender("orders")
        for i in range(300):
            body = f"o{i}"
            while True:
                try:
                    sender.send(Message(body=body))
                    accepted.append(body)
                    break
                except SendException as error:
                    refused += 1
                    assert refused < 50, error
                    time.sleep(0.2)
            if i == 100:
                cluster.kill9(cluster.index_of(leader))
            if i % 20 == 0:
                take(0.01)
        deadline = time.monotonic() + 60
        while len({str(m.body) for m in received} & set(accepted)) < len(accepted):
            assert time.monotonic() < deadline, "the consumer did not catch up"
            take(1.0)
    finally:
        publisher.close()
        reader.close()
    offsets = [int(da(m, "event-streams-offset")) for m in received]
    assert offsets == list(range(len(offsets))), "the consumer skipped or repeated an offset"
    bodies = [str(m.body) for m in received]
    # resent after an unknown outcome may be stored twice; accepted ones are all there, in order
    first_seen = {body: i for i, body in reversed(list(enumerate(bodies)))}
    assert set(accepted) <= set(first_seen)
    positions = [first_seen[body] for body in accepted]
    assert positions == sorted(positions)


def test_gateway_kill9_during_publish_and_consume(own_cluster: Cluster) -> None:
    """spate.client with both gateways' URLs rides through one gateway's kill -9: it keeps its
    unconfirmed messages and resends them; every confirmed one is consumed, in order."""
    cluster = own_cluster
    cluster.cli("stream", "create", "events", "--replicas", "3")
    wait_leaders(cluster, "events", 1)
    urls = gateways(cluster)
    first_gateway_pid = int(cluster.state["gateways"][0]["pid"])
    producer = Producer(urls, "events", timeout_s=10, reconnect_timeout_s=60)
    consumer = Consumer(urls, "events", start="first", reconnect_timeout_s=60)
    confirmed: list[bytes] = []
    received: list[tuple[int, bytes]] = []
    try:
        for batch in range(20):
            bodies = [f"e{batch}-{i}".encode() for i in range(25)]
            producer.send_batch(bodies)
            confirmed.extend(bodies)
            if batch == 8:
                os.kill(first_gateway_pid, signal.SIGKILL)
            while True:
                try:
                    event = consumer.receive(timeout=0.05)
                except Exception:
                    break
                received.append((event.offset, event.body))
        while len({b for _, b in received}) < len(set(confirmed)):
            event = consumer.receive(timeout=30)
            received.append((event.offset, event.body))
    finally:
        producer.close()
        consumer.close()
    assert producer.reconnects >= 1
    offsets = [offset for offset, _ in received]
    assert offsets == sorted(set(offsets)), "a consumer that resumed skipped or repeated offsets"
    seen = {body: offset for offset, body in received}
    assert set(confirmed) <= set(seen)
    positions = [seen[body] for body in confirmed]
    assert positions == sorted(positions)


@shared
def test_any_node_serves_partition_agnostic_links(cluster: Cluster) -> None:
    """000 §4.1-4.2 through a node, not a gateway: with one replica per partition each node
    leads two of the six partitions and holds no copy of the other four; a plain
    BlockingConnection sender without `event-streams-partition` still reaches all six (the
    node relays to their leaders over the gateway wire), and a plain receiver reads all six."""
    cluster.cli("stream", "create", "spread", "--partitions", str(PARTITIONS), "--replicas", "1")
    wait_leaders(cluster, "spread", PARTITIONS)
    node_url = cluster.amqp_url(0)
    connection = BlockingConnection(node_url, timeout=30)
    try:
        sender = connection.create_sender("spread")
        for i in range(60):
            sender.send(Message(body=f"n{i}"))
    finally:
        connection.close()
    received = consume_all(cluster.amqp_url(1), "spread", 60)
    assert sorted(str(m.body) for m in received) == sorted(f"n{i}" for i in range(60))
    partitions = {str(da(m, "event-streams-source-partition")) for m in received}
    assert partitions == {str(p) for p in range(PARTITIONS)}


@shared
def test_a_redirect_gateway_proxies_partition_agnostic_links(cluster: Cluster) -> None:
    """A link that cannot be redirected to one leader is proxied by a gateway that can."""
    cluster.cli("stream", "create", "agnostic", "--partitions", "3", "--replicas", "3")
    wait_leaders(cluster, "agnostic", 3)
    connection = BlockingConnection(gateways(cluster)[0], timeout=30)
    try:
        mode = LinkProperties({symbol("spate:gateway-mode"): "redirect"})
        sender = connection.create_sender("agnostic", options=[mode])
        for i in range(9):
            sender.send(Message(body=f"r{i}"))
    finally:
        connection.close()
    assert len(consume_all(gateways(cluster)[1], "agnostic", 9)) == 9
