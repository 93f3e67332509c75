"""000 §6: runtime information, the `<event log node>/$info` source, over every broker (the
proxy gateway answers it from the partitions' replicas over the gateway wire)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, symbol
from support.amqp_clients import RunningGateway, blocking, publish, unique
from support.event_streams import (
    OFFSET,
    PARTITION,
    WAIT_S,
    bound,
    read,
    refused,
    runtime_information,
)

INFO = "$info"


def info_message(gateway: RunningGateway, address: str) -> tuple[Message, Any]:
    """One message from an info source, and the source address the attach was answered with."""
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(address, name=unique("info"), credit=1)
        answered = receiver.link.remote_source.address
        message = receiver.receive(timeout=WAIT_S)
        receiver.accept()
    return message, answered


@pytest.mark.routing
def test_6_every_event_log_node_has_an_info_source(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §6: "Each event log node MUST implement a special, subordinate source address named
    $info that allows producers and consumers to obtain information about the configuration
    and state of the event log, most importantly the current number of partitions and the
    offset boundaries for each partition." Streams of one and of three partitions both have
    one, listing as many partitions."""
    for partitions in (1, 3):
        stream = make_stream(partitions=partitions)
        body = runtime_information(gateway, stream)
        assert len(body["partitions"]) == partitions


@pytest.mark.routing
def test_6_info_address_is_the_node_address_slash_dollar_info(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §6: "If the container-relative source address of an event log node is "example",
    the information source address MUST be "example/$info"." The attach to `<stream>/$info` is
    answered with that source address; `$info` alone, `<stream>/info` and `<stream>/$info/x`
    are no such source (`amqp:not-found`), and `$info` is a source only (a sender to it is
    refused)."""
    stream = make_stream(partitions=2)
    message, answered = info_message(gateway, f"{stream}/{INFO}")
    assert answered == f"{stream}/{INFO}"
    assert isinstance(message.body, dict)
    for wrong in (INFO, f"{stream}/info", f"{stream}/{INFO}/x"):
        refusal = refused(gateway, wrong, sender=False)
        assert refusal.condition.name == "amqp:not-found", wrong
    refusal = refused(gateway, f"{stream}/{INFO}", sender=True)
    assert refusal.condition.name == "amqp:invalid-field"


@pytest.mark.routing
def test_6_info_message_is_an_amqp_value_map_with_partitions(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §6: "the producer or consumer opens a receive link and flows at least one unit of
    link credit. The information source responds with transferring a message that contains the
    desired information in its amqp-value section. The amqp-value section of the message
    contains an AMQP map at the top level. The map has one reserved entry with the key
    partitions ... The partitions entry's value is a list, with one entry for each partition."
    Checked on the encoded message: its body section is amqp-value (0x77) holding a map."""
    stream = make_stream(partitions=3)
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(f"{stream}/{INFO}", name=unique("info"), credit=1)
        message = receiver.receive(timeout=WAIT_S)
        receiver.accept()
    encoded = message.encode()
    assert b"\x00\x53\x77" in encoded and b"\x00\x53\x75" not in encoded  # value, not data
    assert isinstance(message.body, dict)
    partitions = message.body["partitions"]
    assert isinstance(partitions, list) and len(partitions) == 3
    assert all(isinstance(entry, dict) for entry in partitions)


@pytest.mark.routing
def test_6_unpartitioned_log_lists_its_main_partition(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §6: "The list MUST carry an entry for the "main partition" if the log is
    unpartitioned." A one-partition stream lists one entry, partition '0', with the offsets of
    its messages."""
    stream = make_stream(partitions=1)
    publish(gateway, stream, ["a", "b"])
    [entry] = runtime_information(gateway, stream)["partitions"]
    assert entry["partition"] == symbol("0")
    delivered = [m.instructions[OFFSET] for m in read(gateway, stream, 2)]
    assert [entry["earliest-offset"], entry["latest-offset"]] == delivered


@pytest.mark.routing
def test_6_partition_entries_carry_partition_earliest_and_latest_offset(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §6: "The entries in the partitions list are map objects and MUST contain the
    following reserved entries for each partition": `partition` (symbol, "The opaque identifier
    of the partition"), `earliest-offset` and `latest-offset` (symbol, "MAY be null"). On three
    partitions, one empty: the keys are there, the offsets are those of the first and last
    delivered message (null when empty), and each identifier binds a link to that partition
    (§4: "Consumers and producers learn about an event log node's available partitions and
    their identifiers using a runtime information request")."""
    stream = make_stream(partitions=3)
    publish(gateway, stream, ["a0", "a1", "a2"], {PARTITION: symbol("0")})
    publish(gateway, stream, ["c0"], {PARTITION: symbol("2")})
    entries = runtime_information(gateway, stream)["partitions"]
    for entry in entries:
        assert {"partition", "earliest-offset", "latest-offset"} <= set(entry), entry
        assert isinstance(entry["partition"], symbol), entry
    ids = [entry["partition"] for entry in entries]
    assert len(set(ids)) == 3
    for entry, count in zip(entries, (3, 0, 1), strict=True):
        if count == 0:
            assert entry["earliest-offset"] is None and entry["latest-offset"] is None
            continue
        assert isinstance(entry["earliest-offset"], symbol)
        assert isinstance(entry["latest-offset"], symbol)
        got = read(gateway, stream, count, partition=str(entry["partition"]))
        offsets = [m.instructions[OFFSET] for m in got]
        assert [entry["earliest-offset"], entry["latest-offset"]] == [offsets[0], offsets[-1]]
    with blocking(gateway) as conn:  # the identifier as learned binds a link
        sender = conn.create_sender(stream, name=unique("tx"), options=bound(ids[1]))
        sender.send(Message(body="b0"))
    assert runtime_information(gateway, stream)["partitions"][1]["latest-offset"] is not None


def test_6_may_space_info_messages_over_several_credits(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §6: "If multiple link credits are granted, the information source MAY choose to put
    reasonable, application-defined temporal separation between transfers." Spate's choice
    (src/gateway/README.md, Links): one message per unit of credit, at most one per
    `info.INTERVAL_S` (1 s). Two credits: the second message comes, and it reflects a message
    published after the first one was sent (so it was made fresh, not sent with the first)."""
    stream = make_stream()
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(f"{stream}/{INFO}", name=unique("info"), credit=2)
        first = receiver.receive(timeout=WAIT_S)
        publish(gateway, stream, ["new"])
        second = receiver.receive(timeout=WAIT_S)
        receiver.accept()
    assert first.body["partitions"][0]["latest-offset"] is None
    assert second.body["partitions"][0]["latest-offset"] is not None
