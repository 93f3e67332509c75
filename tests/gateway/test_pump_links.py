"""Link logic through the in-memory pump rig (tests/support/pump.py; fixtures `memory`, `rig`,
`client` in conftest.py): the production listener and
a proton client engine, bytes moved by hand, no sockets, no sleeps. Each test cites the clause
it checks: 000 is the Event Streams extension (../shared/seeds/000_e36e0ffc94de3955.txt), 002
AMQP 1.0 messaging, and "core" the AMQP 1.0 core specification (transport, links)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from proton import Delivery, Described, symbol
from spate.client.offsets import offset_filter
from spate.core import limits
from spate.core.ids import NodeId, Offset, PartitionId, StreamName, offset_from_symbol
from spate.core.superstreams import hash_partition
from support.memory_broker import MemoryBroker, RemoteLeader
from support.pump import Client, PumpRig, condition, decode, encode


def publish(rig: PumpRig, client: Client, address: str, bodies: list[Any]) -> list[Delivery]:
    sender = client.sender(address)
    rig.pump()
    deliveries = [client.send(sender, encode(body=body)) for body in bodies]
    rig.pump()
    rig.release()
    return deliveries


def offsets(received: list[tuple[bytes, Delivery]]) -> list[Offset | None]:
    out = []
    for data, _ in received:
        instructions = decode(data).instructions or {}
        out.append(offset_from_symbol(str(instructions[symbol("event-streams-offset")])))
    return out


# -- the connection


def test_open_offers_the_event_streams_capability(rig: PumpRig, client: Client) -> None:
    """000 §3.1: a broker supporting the extension offers AMQP_EVENT_STREAMS_V1_0."""
    offered = [str(c) for c in client.connection.remote_offered_capabilities or []]
    assert "AMQP_EVENT_STREAMS_V1_0" in offered
    assert client.connection.remote_container == "n1"


# -- attach refusals: attach with a null terminus and an immediate detach (core §2.6.3)


@pytest.mark.parametrize(
    ("address", "properties", "expected"),
    [
        ("nope", None, "amqp:not-found"),
        ("orders/$bogus", None, "amqp:not-found"),
        ("$rooms", None, "amqp:not-found"),
        ("clicks", {symbol("event-streams-partition"): symbol("7")}, "amqp:not-found"),
        ("orders/$info", None, "amqp:invalid-field"),  # a sender to $info
    ],
)
def test_a_sender_is_refused_with_the_condition_of_the_table(
    rig: PumpRig, client: Client, address: str, properties: dict[Any, Any] | None, expected: str
) -> None:
    sender = client.sender(address, properties=properties)
    rig.pump()
    name, description, _ = condition(sender)
    assert name == expected, (name, description)
    assert sender.remote_target.address is None, "refusal attaches with a null target"
    # The connection survives: a good link on it still works.
    good = client.sender("orders")
    rig.pump()
    assert condition(good)[0] is None and good.remote_target.address == "orders"


def test_an_unparsable_offset_filter_is_refused_as_invalid_field(
    rig: PumpRig, client: Client
) -> None:
    """000 §5.2: a filter the broker cannot honour refuses the attach, naming accepted forms."""
    receiver = client.receiver(
        "orders",
        filters={
            symbol("rabbitmq:stream-offset-spec"): Described(
                symbol("rabbitmq:stream-offset-spec"), "sideways"
            )
        },
    )
    rig.pump()
    name, description, _ = condition(receiver)
    assert name == "amqp:invalid-field", (name, description)
    assert description


def test_a_partition_led_elsewhere_redirects_with_the_leaders_address(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """Core §2.8.18 / 000 §4: link redirect whose info names where to attach instead."""
    memory.set_remote("clicks", 2, RemoteLeader("n2", "node-2.example", 5673))
    sender = client.sender("clicks", properties={symbol("event-streams-partition"): symbol("2")})
    rig.pump()
    name, _, info = condition(sender)
    assert name == "amqp:link:redirect"
    assert {str(k): v for k, v in info.items()} == {
        "hostname": "node-2.example",
        "network-host": "node-2.example",
        "port": 5673,
        "address": "clicks",
    }


# -- publishing: accepted only once durable (BRIEF §2.2)


def test_a_transfer_is_accepted_only_after_the_broker_commits_it(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """002 §3.4: accepted is the outcome; Spate gives it only once the append is durable."""
    sender = client.sender("orders")
    rig.pump()
    assert sender.credit > 0, "the broker grants credit on attach (core §2.6.7)"
    delivery = client.send(sender, encode(body="m0"))
    rig.pump()
    assert delivery.remote_state == 0 and not delivery.settled, "no outcome before the commit"
    assert rig.release() == 1
    assert delivery.remote_state == Delivery.ACCEPTED
    partition = memory.partition(StreamName("orders"), PartitionId(0), write=False)
    assert partition.end_offset() == 1


def test_a_presettled_transfer_is_stored_without_an_outcome(rig: PumpRig, client: Client) -> None:
    sender = client.sender("orders")
    rig.pump()
    client.send(sender, encode(body="fire-and-forget"), settled=True)
    rig.pump()
    rig.release()
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=10)
    rig.pump()
    assert [decode(d).body for d, _ in client.received(receiver)] == ["fire-and-forget"]


def test_bytes_that_are_not_a_message_are_rejected_and_the_link_stays_usable(
    rig: PumpRig, client: Client
) -> None:
    """002 §3.2: a bare message is a sequence of sections; garbage is rejected with
    amqp:decode-error and nothing is stored."""
    sender = client.sender("orders")
    rig.pump()
    bad = client.send(sender, b"\x00\x53\x77\xa1\x05hello" + b"\xff" * 3)
    good = client.send(sender, encode(body="fine"))
    rig.pump()
    rig.release()
    assert bad.remote_state == Delivery.REJECTED
    assert bad.remote.condition is not None and bad.remote.condition.name == "amqp:decode-error"
    assert good.remote_state == Delivery.ACCEPTED


def test_an_oversize_message_is_rejected_and_another_connection_is_unaffected(
    rig: PumpRig, client: Client
) -> None:
    sender = client.sender("orders")
    rig.pump()
    assert sender.remote_max_message_size == limits.message_bytes_max
    other = rig.connect()
    other_sender = other.sender("orders")
    rig.pump()
    big = client.send(sender, encode(body=b"x" * (limits.message_bytes_max + 1)))
    small = other.send(other_sender, encode(body="small"))
    rig.pump()
    rig.release()
    assert big.remote_state == Delivery.REJECTED
    assert big.remote.condition.name == "amqp:link:message-size-exceeded"
    assert small.remote_state == Delivery.ACCEPTED
    assert client.send(sender, encode(body="after")) is not None
    rig.pump()
    rig.release()


def test_a_partition_agnostic_sender_routes_by_target_partition_annotation(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """000 §4.2: event-streams-target-partition in the delivery annotations picks the
    partition of a message sent on an unbound link."""
    sender = client.sender("clicks")
    rig.pump()
    for partition in (2, 0, 2):
        data = encode(
            body=f"p{partition}",
            instructions={symbol("event-streams-target-partition"): symbol(str(partition))},
        )
        client.send(sender, data)
    rig.pump()
    rig.release()
    ends = [
        memory.partition(StreamName("clicks"), PartitionId(p), write=False).end_offset()
        for p in range(3)
    ]
    assert ends == [1, 0, 2]


def test_a_partition_agnostic_sender_routes_by_group_key(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """000 §4.6.7: events with one event-streams-group-key SHOULD be partitioned together, on
    the same partition at all times: on an agnostic link a keyed message goes to
    `hash_partition(key, partitions)` (where a super stream of as many partitions puts it), on
    the fast path and with delivery annotations alike; a key that is no routing key is
    rejected. Regression: the key was ignored, so one key's batches went round-robin."""
    group_key = symbol("event-streams-group-key")
    sender = client.sender("clicks")
    rig.pump()
    keys = ["k1", "k2", "k3", "k4", "k5"]
    for n in range(2):
        for key in keys:
            client.send(sender, encode(body=f"{key}/{n}", annotations={group_key: key}))
            rig.pump()  # one batch per message: a round-robin turn would move on each time
    with_da = encode(
        body="k1/da", annotations={group_key: symbol("k1")}, instructions={symbol("x-da"): 1}
    )
    client.send(sender, with_da)
    bad = client.send(sender, encode(body="bad", annotations={group_key: 1.5}))
    rig.pump()
    rig.release()
    assert bad.remote_state == Delivery.REJECTED
    assert bad.remote.condition.name == "amqp:invalid-field"
    where: dict[str, set[int]] = {}
    for p in range(3):
        partition = memory.partition(StreamName("clicks"), PartitionId(p), write=False)
        for chunk in partition.read(Offset(0), 1 << 20):
            for record in chunk.records:
                key = str(decode(bytes(record)).body).split("/")[0]
                where.setdefault(key, set()).add(p)
    assert where == {key: {hash_partition(key, 3)} for key in keys}


# -- consuming: credit, filters, annotations


def test_deliveries_never_exceed_credit_and_drain_ends_it(rig: PumpRig, client: Client) -> None:
    """Core §2.6.7: the sender sends no more than the link credit; with drain set it uses up
    or gives back all of it (delivery-count advanced, credit 0)."""
    publish(rig, client, "orders", [f"m{i}" for i in range(10)])
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=3)
    rig.pump()
    got = client.received(receiver)
    assert [decode(d).body for d, _ in got] == ["m0", "m1", "m2"]
    assert receiver.credit == 0
    receiver.drain(4)
    rig.pump()
    assert [decode(d).body for d, _ in client.received(receiver)] == [f"m{i}" for i in (3, 4, 5, 6)]
    receiver.drain(100)
    rig.pump()
    assert len(client.received(receiver)) == 3
    assert receiver.credit == 0, "drained: the rest of the credit is given back"


def test_every_delivery_carries_its_offset_and_timestamp(rig: PumpRig, client: Client) -> None:
    """000 §5.1: event-streams-offset (a symbol ordered like the log) and event-streams-timestamp
    delivery annotations on every message."""
    publish(rig, client, "orders", ["a", "b", "c"])
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=10)
    rig.pump()
    got = client.received(receiver)
    assert offsets(got) == [0, 1, 2]
    for data, _ in got:
        instructions = decode(data).instructions or {}
        assert isinstance(instructions[symbol("event-streams-timestamp")], int)


@pytest.mark.parametrize(
    ("start", "expected"),
    [("first", [0, 1, 2, 3, 4]), ("last", [3, 4]), (2, [2, 3, 4]), (-2, [3, 4]), ("next", [])],
)
def test_offset_filters_choose_where_a_consumer_starts(
    rig: PumpRig, client: Client, start: Any, expected: list[int]
) -> None:
    """000 §5.2.1 and Spate's simple forms: first, last (the last chunk, as RabbitMQ streams),
    next, an offset, -N."""
    publish(rig, client, "orders", [f"m{i}" for i in range(3)])  # one chunk: 0-2
    publish(rig, client, "orders", ["m3", "m4"])  # the last chunk: 3-4
    receiver = client.receiver("orders", filters=offset_filter(start), credit=10)
    rig.pump()
    assert offsets(client.received(receiver)) == expected


def test_a_timestamp_filter_starts_after_the_instant(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    partition = memory.partition(StreamName("orders"), PartitionId(0), write=False)
    partition.clock_ms = lambda: 1_000
    publish(rig, client, "orders", ["old"])
    partition.clock_ms = lambda: 5_000
    publish(rig, client, "orders", ["new"])
    start = datetime.fromtimestamp(2.0, UTC)
    receiver = client.receiver("orders", filters=offset_filter(start), credit=10)
    rig.pump()
    assert [decode(d).body for d, _ in client.received(receiver)] == ["new"]


def test_a_consumer_follows_the_tail_as_appends_commit(rig: PumpRig, client: Client) -> None:
    """A `next` consumer gets each message once it is committed, not before."""
    receiver = client.receiver("orders", filters=offset_filter("next"), credit=10)
    rig.pump()
    sender = client.sender("orders")
    rig.pump()
    client.send(sender, encode(body="live"))
    rig.pump()
    assert client.received(receiver) == [], "not committed yet: not readable"
    rig.release()
    assert [decode(d).body for d, _ in client.received(receiver)] == ["live"]


def test_info_source_sends_runtime_information(rig: PumpRig, client: Client) -> None:
    """000 §6: `<stream>/$info` yields a message describing the stream's partitions."""
    publish(rig, client, "clicks", ["x"])
    receiver = client.receiver("clicks/$info", credit=1)
    rig.pump()
    got = client.received(receiver)
    assert len(got) == 1
    body = decode(got[0][0]).body
    assert isinstance(body, dict) and body, body


def test_closing_one_connection_leaves_the_other_serving(rig: PumpRig, client: Client) -> None:
    other = rig.connect()
    receiver = other.receiver("orders", filters=offset_filter("first"), credit=10)
    rig.pump()
    client.close()
    rig.pump()
    assert client.server.closed or client.server_transport.closed
    publish(rig, other, "orders", ["still here"])
    assert [decode(d).body for d, _ in other.received(receiver)] == ["still here"]


def test_the_node_id_names_the_container(memory: MemoryBroker) -> None:
    rig = PumpRig(memory, node_id=NodeId("n7"))
    try:
        assert rig.connect().connection.remote_container == "n7"
    finally:
        rig.close()
