"""Super streams on a real three-node cluster with a proxy gateway (issue 8, ADR 0014):
`spate superstream create`, then plain python-qpid-proton senders publish to the super stream's
address through the gateway and through a node (partitions led elsewhere are relayed), each
message lands on the partition stream RabbitMQ's clients would pick, and consumers read the
partition streams as ordinary streams; `spate superstream delete` removes it all."""

from __future__ import annotations

import pytest
from proton import Delivery, Message, symbol
from proton.utils import BlockingConnection, LinkDetached
from spate.core.superstreams import hash_partition
from support.amqp_clients import LinkProperties, offset_filter, run_doc_examples
from support.cluster import Cluster

GROUP_KEY = symbol("event-streams-group-key")


def publish(url: str, keys: list[str], prefix: str, **options: object) -> None:
    connection = BlockingConnection(url, timeout=30)
    try:
        sender = connection.create_sender("invoices", **options)  # type: ignore[arg-type]
        for key in keys:
            delivery = sender.send(Message(body=f"{prefix}-{key}", annotations={GROUP_KEY: key}))
            assert delivery.remote_state == Delivery.ACCEPTED
    finally:
        connection.close()


def bodies(url: str, stream: str, count: int) -> list[str]:
    connection = BlockingConnection(url, timeout=30)
    try:
        receiver = connection.create_receiver(
            stream, options=[offset_filter(symbol("first"))], credit=500
        )
        out = [str(receiver.receive(timeout=30).body) for _ in range(count)]
        receiver.accept()
        return out
    finally:
        connection.close()


def test_publish_through_gateway_and_node_then_consume_the_partitions(cluster3: Cluster) -> None:
    created = cluster3.cli_json(
        "superstream", "create", "invoices", "--partitions", "3", "--replicas", "1"
    )
    assert created["super_stream"]["partitions"] == ["invoices-0", "invoices-1", "invoices-2"]
    leaders = {cluster3.leader_of(f"invoices-{p}") for p in range(3)}
    assert len(leaders) == 3  # one replica each: every node leads one partition
    gateway = f"amqp://{cluster3.state['gateways'][0]['amqp']}"
    keys = [f"hello{i}" for i in range(1, 11)]
    publish(gateway, keys, "g")  # proxy mode: each batch to its partition's leader
    publish(cluster3.amqp_url(0), keys, "n")  # a node: the two partitions it does not lead relayed
    redirect = LinkProperties({symbol("spate:gateway-mode"): "redirect"})
    publish(gateway, keys[:3], "r", options=[redirect])  # a redirect link is proxied here
    expected: list[list[str]] = [[], [], []]
    for prefix, sent in (("g", keys), ("n", keys), ("r", keys[:3])):
        for key in sent:
            expected[hash_partition(key, 3)].append(f"{prefix}-{key}")
    assert "g-hello2" in expected[0] and "g-hello4" in expected[2]  # the go client's table
    for partition in range(3):
        got = bodies(
            cluster3.amqp_url(partition), f"invoices-{partition}", len(expected[partition])
        )
        assert got == expected[partition]

    host, port = cluster3.state["gateways"][0]["amqp"].rsplit(":", 1)
    run_doc_examples(
        "super-stream example", host, int(port)
    )  # hello2 -> invoices-0, hello1 -> 1, hello4 -> 2, twice
    for partition, key in enumerate(("hello2", "hello1", "hello4")):
        got = bodies(gateway, f"invoices-{partition}", len(expected[partition]) + 2)
        assert got[-2:] == [f"invoice of {key}"] * 2

    assert cluster3.cli_json("superstream", "delete", "invoices") == {"deleted": "invoices"}
    names = [s["name"] for s in cluster3.cli_json("stream", "list")["streams"]]
    assert not [n for n in names if n.startswith("invoices")]
    connection = BlockingConnection(cluster3.amqp_url(1), timeout=30)
    try:
        with pytest.raises(LinkDetached) as refused:
            connection.create_sender("invoices")
        assert "amqp:not-found" in str(refused.value) and "'invoices'" in str(refused.value)
    finally:
        connection.close()
