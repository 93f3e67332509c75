"""The refusal table of src/gateway/README.md through the pump rig: every row with its AMQP
condition, and what went over the wire. Clauses: "core" is the AMQP 1.0 core specification
(transport: attach, detach, links), 000 the Event Streams extension
(../shared/seeds/000_e36e0ffc94de3955.txt), 002 AMQP 1.0 messaging
(../shared/seeds/002_97824e4f1076426d.txt)."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Delivery, Described, symbol, ulong
from spate.core.errors import BrokerError, NotLeader, StorageFailure, Unavailable
from spate.gateway.driver import LINKS_PER_CONNECTION_MAX
from support.memory_broker import MemoryBroker, RemoteLeader
from support.pump import Client, PumpRig, condition, encode, properties

PARTITION = symbol("event-streams-partition")
TARGET_PARTITION = symbol("event-streams-target-partition")
DA_FILTER = symbol("amqp:event-streams-delivery-annotations-filter")
SQL_FILTER = symbol("amqp:event-streams-sql-filter")


def refused(rig: PumpRig, link: Any) -> tuple[str | None, str | None, dict[Any, Any]]:
    rig.pump()
    return condition(link)


# -- attach + detach (core §2.6.3: a refusal is an attach with a null terminus, then a detach)


@pytest.mark.parametrize(
    ("address", "properties_", "expected"),
    [
        ("nope", None, "amqp:not-found"),  # unknown stream
        ("$foo", None, "amqp:not-found"),
        ("orders/$bar", None, "amqp:not-found"),
        ("orders/x", None, "amqp:not-found"),
        ("clicks", {PARTITION: symbol("3")}, "amqp:not-found"),  # 000 §4.3: does not exist
        ("clicks", {PARTITION: symbol("two")}, "amqp:not-found"),  # not a number
        ("clicks", {PARTITION: -1}, "amqp:not-found"),
    ],
)
def test_a_consumer_is_refused_with_the_condition_of_the_table(
    rig: PumpRig,
    client: Client,
    address: str,
    properties_: dict[Any, Any] | None,
    expected: str,
) -> None:
    """000 §4.3: if the requested partition does not exist the attach MUST be rejected
    (attached and immediately detached); unknown nodes likewise (core §2.6.3)."""
    receiver = client.receiver(address, properties=properties_, credit=10)
    name, description, _ = refused(rig, receiver)
    assert name == expected, (name, description)
    assert receiver.remote_source.address is None, "the refusing attach has a null source"
    assert client.received(receiver) == []


def test_a_refused_partition_names_the_ones_that_exist(rig: PumpRig, client: Client) -> None:
    sender = client.sender("clicks", properties={PARTITION: symbol("9")})
    _, description, _ = refused(rig, sender)
    assert description is not None and "'0'..'2'" in description, description


def test_the_refusing_attach_and_its_detach_go_out_in_one_flush(
    rig: PumpRig, client: Client
) -> None:
    """core §2.6.3: the refusing attach carries a null terminus and is followed at once by the
    detach, in the same write, so no client ever sees the link open without its error."""
    receiver = client.receiver("nope")
    rig.pump()
    attach = next(f for f in client.heard_of("attach") if f.field(0) == receiver.name)
    detach = client.heard_of("detach")[-1]
    assert attach.flush == detach.flush
    assert attach.field(5) is None, "source (field 5) is null: the node does not exist"
    assert detach.field(1) is True, "closed"
    error = detach.field(2)
    assert isinstance(error, Described) and error.value[0] == symbol("amqp:not-found")


@pytest.mark.parametrize("role", ["sender", "receiver"])
def test_a_terminus_without_address_is_invalid_field(
    rig: PumpRig, client: Client, role: str
) -> None:
    link = client.sender(None) if role == "sender" else client.receiver(None)
    assert refused(rig, link)[0] == "amqp:invalid-field"


@pytest.mark.parametrize("role", ["sender", "receiver"])
def test_a_dynamic_node_is_not_implemented(rig: PumpRig, client: Client, role: str) -> None:
    """002 §3.5.3/§3.5.4 (source/target `dynamic`): Spate creates no nodes on demand."""
    link = (
        client.sender(None, dynamic=True)
        if role == "sender"
        else client.receiver(None, dynamic=True)
    )
    assert refused(rig, link)[0] == "amqp:not-implemented"


@pytest.mark.parametrize(
    ("value", "descriptor"),
    [
        ("bogus", ulong(0x200)),
        ({symbol("event-streams-offset"): symbol("not-an-offset")}, ulong(0x200)),
        ({symbol("colour"): "red"}, DA_FILTER),
        ("d.event-streams-offset < ", ulong(0x201)),
        ("a.colour = 'red' AND", ulong(0x201)),
        ("SELECT *", SQL_FILTER),
    ],
)
def test_an_unparsable_filter_is_invalid_field_naming_the_accepted_forms(
    rig: PumpRig, client: Client, value: Any, descriptor: Any
) -> None:
    """000 §5.2.1 / §5.2.2: a filter of ours the node cannot honour refuses the attach."""
    receiver = client.receiver(
        "orders", filters={symbol("offset"): Described(descriptor, value)}, credit=1
    )
    name, description, _ = refused(rig, receiver)
    assert name == "amqp:invalid-field", (name, description)
    assert description


@pytest.mark.parametrize("role", ["sender", "receiver"])
def test_a_partition_led_elsewhere_redirects_either_role(
    rig: PumpRig, client: Client, memory: MemoryBroker, role: str
) -> None:
    """core §2.8.18 / 000 §4: redirect, info naming the leader's listener and the address."""
    memory.set_remote("clicks", 1, RemoteLeader("n3", "node-3.example", 5999))
    bound = {PARTITION: symbol("1")}
    link = (
        client.sender("clicks", properties=bound)
        if role == "sender"
        else client.receiver("clicks", properties=bound)
    )
    name, _, info = refused(rig, link)
    assert name == "amqp:link:redirect"
    info = {str(k): v for k, v in info.items()}
    assert info["network-host"] == "node-3.example" and info["port"] == 5999
    assert type(info["port"]).__name__ == "ushort", "core §2.8.18: port is a ushort"
    assert info["address"] == "clicks"


def test_an_agnostic_link_with_a_partition_led_elsewhere_is_resource_locked(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """000 §4: an unbound link over partitions of several leaders cannot be served here; the
    client binds it to be redirected. The bound links to local partitions still attach."""
    memory.set_remote("clicks", 2, RemoteLeader("n2", "node-2.example", 5673))
    agnostic = client.sender("clicks")
    bound = client.sender("clicks", properties={PARTITION: symbol("0")})
    rig.pump()
    assert condition(agnostic)[0] == "amqp:resource-locked"
    assert condition(bound)[0] is None


def test_links_beyond_the_per_connection_limit_are_refused(rig: PumpRig, client: Client) -> None:
    for _ in range(LINKS_PER_CONNECTION_MAX):
        client.sender("orders")
    rig.pump()
    one_too_many = client.sender("orders")
    assert refused(rig, one_too_many)[0] == "amqp:resource-limit-exceeded"


def test_broker_errors_carry_their_code_and_retry_flag(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """Refusals from the broker name `spate:code` and `spate:retryable` in the error info (a
    redirect's info is exactly core §2.8.18's fields: see the redirect tests)."""
    memory.set_remote("clicks", 2, RemoteLeader("n2", "node-2.example", 5673))
    for address, retryable in (("nope", False), ("clicks", True)):
        _, _, info = refused(rig, client.sender(address))
        info = {str(k): v for k, v in info.items()}
        assert info["spate:retryable"] is retryable, (address, info)
        assert isinstance(info["spate:code"], str) and info["spate:code"]


# -- accepted links: what the attach answer says


def test_a_bound_link_is_answered_with_its_partition(rig: PumpRig, client: Client) -> None:
    """000 §4.1 / §4.3: if the link becomes partition-bound, the node MUST set the
    event-streams-partition link property to the bound partition (a symbol)."""
    for requested in (symbol("2"), "2", 2):
        sender = client.sender("clicks", properties={PARTITION: requested})
        receiver = client.receiver("clicks", properties={PARTITION: requested})
        rig.pump()
        for link in (sender, receiver):
            answered = properties(link)
            assert answered["event-streams-partition"] == symbol("2"), answered
            assert isinstance(answered["event-streams-partition"], symbol)


def test_an_unbound_link_is_answered_without_a_partition(rig: PumpRig, client: Client) -> None:
    sender = client.sender("clicks")
    rig.pump()
    assert condition(sender)[0] is None
    assert "event-streams-partition" not in properties(sender)


def test_an_unbound_link_on_one_partition_is_answered_with_partition_0(
    rig: PumpRig, client: Client
) -> None:
    """000 §4.1 / §4.3: we bind a link that asks for no partition on a one-partition stream to
    partition 0 (a MAY), so we MUST answer with event-streams-partition '0'. Regression: the
    answer used to carry the property only when the client had asked for a partition."""
    sender = client.sender("orders")
    receiver = client.receiver("orders")
    rig.pump()
    for link in (sender, receiver):
        assert condition(link)[0] is None
        answered = properties(link)
        assert answered["event-streams-partition"] == symbol("0"), answered
        assert isinstance(answered["event-streams-partition"], symbol)


# -- rejected transfers: the delivery fails, the link stays


def test_a_target_partition_not_matching_the_bound_one_is_rejected(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """000 §4.2: on a partition-bound link a target-partition annotation MUST match the link's
    partition, otherwise the transfer MUST be rejected. An unknown one is not-found."""
    sender = client.sender("clicks", properties={PARTITION: symbol("1")})
    rig.pump()
    wrong = client.send(sender, encode(body="x", instructions={TARGET_PARTITION: symbol("2")}))
    right = client.send(sender, encode(body="y", instructions={TARGET_PARTITION: symbol("1")}))
    agnostic = client.sender("clicks")
    rig.pump()
    unknown = client.send(agnostic, encode(body="z", instructions={TARGET_PARTITION: symbol("7")}))
    rig.pump()
    rig.release()
    assert wrong.remote_state == Delivery.REJECTED
    assert wrong.remote.condition.name == "amqp:invalid-field"
    assert right.remote_state == Delivery.ACCEPTED
    assert unknown.remote_state == Delivery.REJECTED
    assert unknown.remote.condition.name == "amqp:not-found"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (StorageFailure("disk full"), "amqp:internal-error"),
        (Unavailable("no quorum"), "amqp:resource-locked"),
        (
            NotLeader("moved", leader_host="node-2.example", leader_port=5673, leader_node="n2"),
            "amqp:link:redirect",
        ),
    ],
)
def test_a_failed_append_is_rejected_never_accepted(
    rig: PumpRig, client: Client, memory: MemoryBroker, error: BrokerError, expected: str
) -> None:
    """002 §3.4 (rejected outcome): an append that fails rejects every delivery of its batch
    with the mapped condition; the next batch on the same link is accepted."""
    memory.fail_appends("orders", 0, error)
    sender = client.sender("orders")
    rig.pump()
    batch = [client.send(sender, encode(body=f"m{i}")) for i in range(3)]
    rig.pump()
    rig.release()
    assert [d.remote_state for d in batch] == [Delivery.REJECTED] * 3
    assert {d.remote.condition.name for d in batch} == {expected}
    later = client.send(sender, encode(body="later"))
    rig.pump()
    rig.release()
    assert later.remote_state == Delivery.ACCEPTED
