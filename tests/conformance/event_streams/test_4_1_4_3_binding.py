"""000 §4.1 (binding producer links), §4.3 (binding consumer links) and §4.6.1 (the
`event-streams-partition` link property), with python-qpid-proton and rhea, over every broker.

Spate's partition identifiers are the decimal partition numbers as symbols ('0'..'N-1'); the
node answers a partition-bound link with `event-streams-partition` (and, on replicated
partitions, `spate:leader-epoch`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, symbol
from support.amqp_clients import RunningGateway, blocking, publish, run_rhea, unique
from support.event_streams import (
    PARTITION,
    SOURCE_PARTITION,
    answer,
    bound,
    read,
    refused,
    stored_counts,
)
from support.memory_broker import MemoryBroker, RemoteLeader

CLIENTS = pytest.mark.parametrize("client", ["proton", "rhea"])
FIRST = {"f": {"descriptor": 0x200, "type": "symbol", "value": "first"}}


def fill_partitions(gateway: RunningGateway, stream: str, partitions: int, count: int) -> None:
    """`count` messages `p<i>-<k>` into each partition i, through partition-bound senders."""
    for p in range(partitions):
        publish(gateway, stream, [f"p{p}-{k}" for k in range(count)], {PARTITION: symbol(str(p))})


def rhea_attach_error(gateway: RunningGateway, address: str, role: str, partition: str) -> Any:
    step = {"op": "attach", "address": address, "role": role}
    report = run_rhea(gateway, [step | {"properties": {"event-streams-partition": partition}}])
    assert "error" not in report, report
    return report["steps"][0].get("error")


# -- 4.1 producers ------------------------------------------------------------------------------


@pytest.mark.routing
@CLIENTS
def test_4_1_unknown_partition_refuses_the_producer_link(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """000 §4.1: "If the requested partition does not exist or if the event log node denies
    the request, attaching the link MUST be rejected (attached and immediately detached) by
    the event log node." Partitions '3' and 'x' of a three-partition stream: the refusing attach
    carries a null target, the detach `amqp:not-found`; the connection goes on."""
    stream = make_stream(partitions=3)
    for requested in ("3", "x"):
        if client == "rhea":
            error = rhea_attach_error(gateway, stream, "sender", requested)
            assert error is not None and error["condition"] == "amqp:not-found", error
            continue
        refusal = refused(gateway, stream, sender=True, options=bound(symbol(requested)))
        assert refusal.condition.name == "amqp:not-found"
        assert refusal.terminus_address is None
    assert stored_counts(gateway, stream) == [0, 0, 0]


def test_4_1_denied_partition_refuses_the_producer_link(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: MemoryBroker
) -> None:
    """000 §4.1: "... or if the event log node denies the request, attaching the link MUST be
    rejected (attached and immediately detached)". A node does not take a producer for a
    partition another node leads: attach with a null target, detach with `amqp:link:redirect`
    naming the leader (000 §4 "composes with AMQP link-level redirects"). In-memory broker:
    only it can pretend another node leads a partition."""
    stream = make_stream(partitions=3)
    broker.set_remote(stream, 1, RemoteLeader("n2", "127.0.0.1", 5999))
    refusal = refused(gateway, stream, sender=True, options=bound(symbol("1")))
    assert refusal.condition.name == "amqp:link:redirect"
    assert refusal.condition.info[symbol("port")] == 5999
    assert refusal.terminus_address is None


@pytest.mark.routing
@CLIENTS
def test_4_1_bound_producer_link_is_answered_with_its_partition(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """000 §4.1: "If the link becomes partition-bound, the event log node MUST set the
    event-streams-partition link property to the bound partition." A sender asking for '2' of
    three partitions is answered '2' (a symbol), and what it sends is stored in partition 2."""
    stream = make_stream(partitions=3)
    if client == "rhea":
        step = {"op": "publish", "address": stream, "bodies": ["a", "b"]}
        report = run_rhea(gateway, [step | {"properties": {"event-streams-partition": "2"}}])
        assert "error" not in report, report
        [published] = report["steps"]
        assert published["outcomes"] == ["accepted", "accepted"]
        assert published["attach_properties"]["event-streams-partition"] == "2"
    else:
        with blocking(gateway) as conn:
            sender = conn.create_sender(stream, name=unique("tx"), options=bound(symbol("2")))
            answered = answer(sender)[PARTITION]
            assert answered == "2" and isinstance(answered, symbol), answered
            for body in ("a", "b"):
                sender.send(Message(body=body))
    assert stored_counts(gateway, stream) == [0, 0, 2]


@pytest.mark.routing
@CLIENTS
def test_4_1_may_node_binds_an_unbound_producer_on_a_one_partition_stream_to_0(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """000 §4.1: "The event log node MAY bind the link a partition when none has been requested
    by the producer." Spate's choice (docs/amqp.md, Publishing): a sender that names no
    partition on a one-partition stream is bound to partition 0 — so, by the MUST above
    ("If the link becomes partition-bound, the event log node MUST set the
    event-streams-partition link property"), it is answered with `event-streams-partition` '0'."""
    stream = make_stream(partitions=1)
    if client == "rhea":
        report = run_rhea(gateway, [{"op": "publish", "address": stream, "bodies": ["a"]}])
        assert "error" not in report, report
        assert report["steps"][0]["attach_properties"].get("event-streams-partition") == "0"
    else:
        with blocking(gateway) as conn:
            sender = conn.create_sender(stream, name=unique("tx"))
            assert answer(sender).get(PARTITION) == symbol("0"), answer(sender)
            sender.send(Message(body="a"))
    assert stored_counts(gateway, stream) == [1]


# -- 4.3 consumers ------------------------------------------------------------------------------


@pytest.mark.routing
@CLIENTS
def test_4_3_unknown_partition_refuses_the_consumer_link(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """000 §4.3: "If the requested partition does not exist or if the event log node denies
    the request, attaching the link MUST be rejected by the event log node." Partitions '3' and
    'x' of a three-partition stream: attached with a null source and detached with
    `amqp:not-found`."""
    stream = make_stream(partitions=3)
    for requested in ("3", "x"):
        if client == "rhea":
            error = rhea_attach_error(gateway, stream, "receiver", requested)
            assert error is not None and error["condition"] == "amqp:not-found", error
            continue
        refusal = refused(gateway, stream, sender=False, options=bound(symbol(requested)))
        assert refusal.condition.name == "amqp:not-found"
        assert refusal.terminus_address is None


def test_4_3_denied_partition_refuses_the_consumer_link(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: MemoryBroker
) -> None:
    """000 §4.3: "... or if the event log node denies the request, attaching the link MUST be
    rejected". A node that has no replica of the partition refuses a bound consumer with
    `amqp:link:redirect` to one that has (in-memory broker: the only one that can pretend)."""
    stream = make_stream(partitions=3)
    broker.set_remote(stream, 2, RemoteLeader("n2", "127.0.0.1", 5998))
    refusal = refused(gateway, stream, sender=False, options=bound(symbol("2")))
    assert refusal.condition.name == "amqp:link:redirect"
    assert refusal.condition.info[symbol("port")] == 5998
    assert refusal.terminus_address is None


@pytest.mark.routing
@CLIENTS
def test_4_3_bound_consumer_link_is_answered_with_its_partition(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """000 §4.3: "If the link becomes partition-bound, the event log node MUST set the
    event-streams-partition link property to the bound partition." A receiver asking for '1'
    is answered '1' and gets partition 1's messages only."""
    stream = make_stream(partitions=3)
    fill_partitions(gateway, stream, 3, 2)
    if client == "rhea":
        step = {"op": "consume", "address": stream, "count": 2, "filter": FIRST}
        report = run_rhea(gateway, [step | {"properties": {"event-streams-partition": "1"}}])
        assert "error" not in report, report
        [consumed] = report["steps"]
        assert consumed["attach_properties"]["event-streams-partition"] == "1"
        assert [m["body"] for m in consumed["messages"]] == ["p1-0", "p1-1"]
        return
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=2, options=[bound(symbol("1"))]
        )
        answered = answer(receiver)[PARTITION]
        assert answered == "1" and isinstance(answered, symbol), answered
    assert [m.body for m in read(gateway, stream, 2, partition="1")] == ["p1-0", "p1-1"]


@pytest.mark.routing
@CLIENTS
def test_4_3_may_node_binds_an_unbound_consumer_on_a_one_partition_stream_to_0(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """000 §4.3: "The event log node MAY bind the link a partition when none has been requested
    by the consumer." Spate's choice (docs/amqp.md, Consuming): a receiver that names no
    partition on a one-partition stream is bound to partition 0 and, by the MUST ("If the link
    becomes partition-bound, the event log node MUST set the event-streams-partition link
    property"), answered with `event-streams-partition` '0'."""
    stream = make_stream(partitions=1)
    publish(gateway, stream, ["a"])
    if client == "rhea":
        step = {"op": "consume", "address": stream, "count": 1, "filter": FIRST}
        report = run_rhea(gateway, [step])
        assert "error" not in report, report
        assert report["steps"][0]["attach_properties"].get("event-streams-partition") == "0"
        assert [m["body"] for m in report["steps"][0]["messages"]] == ["a"]
        return
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(stream, name=unique("rx"), credit=1)
        assert answer(receiver).get(PARTITION) == symbol("0"), answer(receiver)


# -- 4.6.1 the property -------------------------------------------------------------------------


@pytest.mark.routing
@CLIENTS
def test_4_6_1_partition_property_is_a_symbol_reflecting_the_effective_binding(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """000 §4.6.1: "The event-streams-partition link property is a symbol value and describes
    the partition to which the link is bound. When set by the producer or consumer, the
    property value is a request for the link to be bound to the given partition. When set by
    the event log node, the value reflects the effective association." Requested as a symbol,
    a string or an int, the answer is the symbol of the partition the link then uses."""
    stream = make_stream(partitions=3)
    if client == "rhea":  # rhea sends it as a symbol (tests/js/client.js)
        steps = [
            {"op": "publish", "address": stream, "bodies": ["x"]},
            {"op": "consume", "address": stream, "count": 1, "filter": FIRST},
        ]
        props = {"properties": {"event-streams-partition": "1"}}
        report = run_rhea(gateway, [step | props for step in steps])
        assert "error" not in report, report
        published, consumed = report["steps"]
        assert published["attach_properties"]["event-streams-partition"] == "1"
        assert consumed["attach_properties"]["event-streams-partition"] == "1"
        assert consumed["messages"][0]["source_partition"] == "1"
        assert stored_counts(gateway, stream) == [0, 1, 0]
        return
    for requested in (symbol("1"), "1", 1):
        with blocking(gateway) as conn:
            sender = conn.create_sender(stream, name=unique("tx"), options=bound(requested))
            receiver = conn.create_receiver(
                stream, name=unique("rx"), credit=1, options=[bound(requested)]
            )
            for link in (sender, receiver):
                answered = answer(link)[PARTITION]
                assert answered == "1" and isinstance(answered, symbol), (requested, answered)
            sender.send(Message(body=f"as-{type(requested).__name__}"))
            got = receiver.receive(timeout=10)
            receiver.accept()
            assert got.instructions[SOURCE_PARTITION] == "1"
    assert stored_counts(gateway, stream) == [0, 3, 0]


@pytest.mark.routing
@CLIENTS
def test_4_6_1_link_answered_without_the_property_is_partition_agnostic(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """000 §4.6.1: "When not set on the negotiated link, the link is partition-agnostic." On
    three partitions, a sender and a receiver that ask for none are answered without
    `event-streams-partition`, and they are agnostic: the receiver gets every partition's
    messages; the proton sender, publishing one message per batch, reaches every partition
    (Spate spreads unkeyed batches round-robin, src/gateway/README.md)."""
    stream = make_stream(partitions=3)
    fill_partitions(gateway, stream, 3, 1)
    if client == "rhea":
        steps = [
            {"op": "publish", "address": stream, "bodies": ["r"]},
            {"op": "consume", "address": stream, "count": 4, "filter": FIRST},
        ]
        report = run_rhea(gateway, steps)
        assert "error" not in report, report
        published, consumed = report["steps"]
        assert "event-streams-partition" not in published["attach_properties"]
        assert "event-streams-partition" not in consumed["attach_properties"]
        assert {m["source_partition"] for m in consumed["messages"]} == {"0", "1", "2"}
        return
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        receiver = conn.create_receiver(stream, name=unique("rx"), credit=1)
        assert PARTITION not in answer(sender) and PARTITION not in answer(receiver)
        for i in range(3):
            sender.send(Message(body=f"agnostic-{i}"))
    counts = stored_counts(gateway, stream)
    assert sum(counts) == 6 and min(counts) == 2, counts  # one agnostic message in each
    sources = {m.instructions[SOURCE_PARTITION] for m in read(gateway, stream, 6)}
    assert sources == {"0", "1", "2"}
