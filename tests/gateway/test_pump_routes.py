"""Redirect mode (src/gateway/routes.py) through the pump rig: the node's listener over a
RedirectBroker sends every link to its partition's leader (core §2.8.18, 000 §4), refuses
retryably while a partition has no leader, and never goes back to an older picture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from proton import symbol
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.gateway.routes import RedirectBroker, Route, Routes, RoutingTable
from support.pump import Client, PumpRig, condition

ORDERS, CLICKS = StreamName("orders"), StreamName("clicks")


def routes(version: int, leader_of_clicks_1: str | None = "n2", alive: bool = True) -> Routes:
    def route(leader: str | None) -> Route:
        return Route(
            NodeId(leader) if leader else None,
            LeaderEpoch(3),
            alive,
            (NodeId("n1"), NodeId("n2"), NodeId("n3")),
        )

    return Routes(
        version,
        {ORDERS: StreamConfig(ORDERS), CLICKS: StreamConfig(CLICKS, partitions=2)},
        {
            (ORDERS, PartitionId(0)): route("n1"),
            (CLICKS, PartitionId(0)): route("n3"),
            (CLICKS, PartitionId(1)): route(leader_of_clicks_1),
        },
        {NodeId(f"n{i}"): (f"node-{i}.example", 5670 + i) for i in (1, 2, 3)},
    )


@pytest.fixture
def table() -> RoutingTable:
    table = RoutingTable()
    assert table.update(routes(7))
    return table


@pytest.fixture
def rig(table: RoutingTable) -> Iterator[PumpRig]:
    rig = PumpRig(RedirectBroker(table), node_id="g1")  # type: ignore[arg-type]
    yield rig
    rig.close()


@pytest.fixture
def client(rig: PumpRig) -> Client:
    return rig.connect()


PARTITION = symbol("event-streams-partition")


def test_a_bound_sender_is_redirected_to_its_partitions_leader(
    rig: PumpRig, client: Client
) -> None:
    sender = client.sender("clicks", properties={PARTITION: symbol("1")})
    rig.pump()
    name, _, info = condition(sender)
    assert name == "amqp:link:redirect"
    assert {str(k): v for k, v in info.items()} == {
        "hostname": "node-2.example",
        "network-host": "node-2.example",
        "port": 5672,
        "address": "clicks",
    }


def test_consumers_and_one_partition_streams_are_redirected_too(
    rig: PumpRig, client: Client
) -> None:
    sender = client.sender("orders")  # unbound, one partition: partition 0
    receiver = client.receiver("clicks", properties={PARTITION: symbol("0")}, credit=1)
    rig.pump()
    assert condition(sender)[2][symbol("network-host")] == "node-1.example"
    assert condition(receiver)[0] == "amqp:link:redirect"
    assert condition(receiver)[2][symbol("network-host")] == "node-3.example"


def test_an_agnostic_sender_on_several_partitions_needs_binding(
    rig: PumpRig, client: Client
) -> None:
    sender = client.sender("clicks")
    rig.pump()
    name, description, _ = condition(sender)
    assert name == "amqp:resource-locked"
    assert "event-streams-partition" in (description or "")


def test_no_leader_is_a_retryable_refusal(
    table: RoutingTable, rig: PumpRig, client: Client
) -> None:
    assert table.update(routes(8, leader_of_clicks_1=None))
    sender = client.sender("clicks", properties={PARTITION: symbol("1")})
    rig.pump()
    name, _, info = condition(sender)
    assert name == "amqp:resource-locked"
    assert info[symbol("spate:retryable")] is True


def test_a_stream_the_gateway_does_not_know_is_sent_to_a_node(rig: PumpRig, client: Client) -> None:
    """Created since the last refresh, or not at all: a node answers for sure."""
    sender = client.sender("nope")
    rig.pump()
    name, _, info = condition(sender)
    assert name == "amqp:link:redirect"
    assert info[symbol("network-host")] == "node-1.example"


def test_a_partition_that_does_not_exist_is_not_found(rig: PumpRig, client: Client) -> None:
    sender = client.sender("clicks", properties={PARTITION: symbol("5")})
    rig.pump()
    assert condition(sender)[0] == "amqp:not-found"


def test_an_older_picture_never_replaces_a_newer_one(table: RoutingTable) -> None:
    """Revision fencing: a node that is behind answers with an older metadata version."""
    assert not table.update(routes(6, leader_of_clicks_1="n3"))
    assert table.routes.version == 7 and table.stale_refused == 1
    assert table.update(routes(9, leader_of_clicks_1="n3"))


def test_before_the_first_picture_every_attach_is_retryable() -> None:
    rig = PumpRig(RedirectBroker(RoutingTable()), node_id="g1")  # type: ignore[arg-type]
    try:
        client = rig.connect()
        sender = client.sender("orders")
        rig.pump()
        name, _, info = condition(sender)
        assert name == "amqp:resource-locked" and info[symbol("spate:retryable")] is True
    finally:
        rig.close()
