"""Client-side helpers of the Event Streams conformance suite (tests/conformance/event_streams):
the 000 names as proton symbols, and python-qpid-proton calls that return what went over the
wire (outcomes, attach answers, refusals, runtime information) instead of raising.

Every wait polls the connection with a timeout (BlockingConnection.wait); nothing sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proton import Condition, Delivery, Message, symbol
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender, LinkDetached

from support.amqp_clients import (
    LinkProperties,
    RunningGateway,
    blocking,
    offset_filter,
    receive,
    unique,
)

CAPABILITY = symbol("AMQP_EVENT_STREAMS_V1_0")
PARTITION = symbol("event-streams-partition")
TARGET_PARTITION = symbol("event-streams-target-partition")
SOURCE_PARTITION = symbol("event-streams-source-partition")
GROUP_KEY = symbol("event-streams-group-key")
OFFSET = symbol("event-streams-offset")
TIMESTAMP = symbol("event-streams-timestamp")
WAIT_S = 10.0


def bound(partition: Any) -> LinkProperties:
    """The `event-streams-partition` link property (000 §4.6.1), as given (symbol, str, int)."""
    return LinkProperties({PARTITION: partition})


@dataclass(frozen=True)
class Refusal:
    """A link the node attached and immediately detached (000 §4.1, §4.3)."""

    condition: Condition
    terminus_address: str | None
    """The address of the terminus the refusing attach carried (None: a null terminus)."""
    terminus_type: int


def refused(
    gateway: RunningGateway,
    address: str,
    *,
    sender: bool,
    options: LinkOption | list[LinkOption] | None = None,
) -> Refusal:
    """Attach a link the node must refuse; returns how it did. The connection must survive."""
    with blocking(gateway) as conn:
        try:
            if sender:
                conn.create_sender(address, name=unique("tx"), options=options)
            else:
                conn.create_receiver(address, name=unique("rx"), options=options)
        except LinkDetached as detached:
            link = detached.link
            terminus = link.remote_target if sender else link.remote_source
            assert conn.conn.state & conn.conn.REMOTE_ACTIVE, "a refused link closed the connection"
            return Refusal(link.remote_condition, terminus.address, terminus.type)
        raise AssertionError(f"the attach to {address!r} was not refused")


def answer(link: BlockingSender | BlockingReceiver) -> dict[Any, Any]:
    """The properties of the node's attach answer."""
    return dict(link.link.remote_properties or {})


def outcome(conn: BlockingConnection, sender: BlockingSender, message: Message) -> Delivery:
    """Send and wait for the outcome (accepted or rejected: no exception); the delivery."""
    delivery = sender.link.send(message)
    conn.wait(lambda: bool(delivery.remote_state), WAIT_S, f"an outcome for {message.body!r}")
    return delivery


def outcomes(conn: BlockingConnection, deliveries: list[Delivery]) -> list[Delivery]:
    """Wait until every one of these (pipelined) deliveries has its outcome; returns them."""
    conn.wait(lambda: all(d.remote_state for d in deliveries), WAIT_S, "outcomes")
    return deliveries


def hinted(body: str, target: Any) -> Message:
    """A message with the `event-streams-target-partition` delivery annotation (000 §4.6.6)."""
    return Message(body=body, instructions={TARGET_PARTITION: target})


def keyed(body: str, key: Any) -> Message:
    """A message with the `event-streams-group-key` message annotation (000 §4.6.7)."""
    return Message(body=body, annotations={GROUP_KEY: key})


def read(
    gateway: RunningGateway,
    stream: str,
    count: int,
    *,
    partition: str | None = None,
    start: Any = "first",
) -> list[Message]:
    """`count` messages of `stream` (one partition when given) from `start` (a 0x200 value)."""
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream,
            name=unique("rx"),
            credit=max(count, 1),
            options=[offset_filter(start)] + ([bound(symbol(partition))] if partition else []),
        )
        return receive(receiver, count, WAIT_S)


def runtime_information(gateway: RunningGateway, stream: str) -> dict[Any, Any]:
    """The body of one message from `<stream>/$info` (000 §6)."""
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(stream + "/$info", name=unique("info"), credit=1)
        message = receiver.receive(timeout=WAIT_S)
        receiver.accept()
    assert isinstance(message.body, dict), message.body
    return message.body


def stored_counts(gateway: RunningGateway, stream: str) -> list[int]:
    """Messages stored per partition: the `messages` entry Spate adds to each partition of the
    runtime information (000 §6 allows application-specific entries; src/gateway/info.py)."""
    return [int(entry["messages"]) for entry in runtime_information(gateway, stream)["partitions"]]


def bodies_by_partition(messages: list[Message]) -> dict[str, list[Any]]:
    """Bodies grouped by their `event-streams-source-partition` annotation, in delivery order."""
    out: dict[str, list[Any]] = {}
    for message in messages:
        out.setdefault(str((message.instructions or {})[SOURCE_PARTITION]), []).append(message.body)
    return out
