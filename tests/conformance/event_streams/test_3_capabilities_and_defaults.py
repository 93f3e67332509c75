"""000 §3: the connection capability (§3.1) and the default behaviours (§3.2): a client that
uses none of the extensions is served like by any AMQP 1.0 node."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Message, symbol
from proton.utils import BlockingConnection
from spate.core.ids import Offset, offset_to_symbol
from support.amqp_clients import RunningGateway, blocking, fill, offset_filter, run_rhea, unique
from support.event_streams import (
    CAPABILITY,
    OFFSET,
    SOURCE_PARTITION,
    WAIT_S,
    read,
    stored_counts,
)


@pytest.mark.parametrize("client", ["proton", "rhea"])
def test_3_1_node_offers_the_event_streams_capability(gateway: RunningGateway, client: str) -> None:
    """000 §3.1: "On connection establishment, the event log node MUST indicate its support of
    this specification through the exchange of a connection capability" —
    `AMQP_EVENT_STREAMS_V1_0` in the offered-capabilities of the node's open."""
    if client == "rhea":
        report = run_rhea(gateway, [])
        assert "error" not in report, report
        assert "AMQP_EVENT_STREAMS_V1_0" in report["offered_capabilities"]
        return
    with blocking(gateway) as conn:
        offered = conn.conn.remote_offered_capabilities
        assert offered is not None and CAPABILITY in list(offered), offered


def test_3_1_client_desiring_the_capability_is_offered_it_and_served(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §3.1: "If present in the desired-capabilities field of the open frame, the sender of
    the open MUST use the event streams extensions if the receiver of the open offers this
    capability, and it MAY shut down the connection if the capability is not offered." A client
    that desires the capability is offered it (it has no reason to shut down), and the
    extensions it is then bound to use work on that connection: an offset filter and the
    offset annotation."""
    stream = make_stream()
    fill(gateway, stream, 3)
    conn = BlockingConnection(gateway.url, timeout=WAIT_S, desired_capabilities=[CAPABILITY])
    try:
        assert CAPABILITY in list(conn.conn.remote_offered_capabilities or [])
        after_first = {OFFSET: symbol(offset_to_symbol(Offset(0)))}
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=2, options=[offset_filter(after_first)]
        )
        got = [receiver.receive(timeout=WAIT_S) for _ in range(2)]
        receiver.accept()
        assert [m.body for m in got] == ["m1", "m2"]
        assert [m.instructions[OFFSET] for m in got] == [
            offset_to_symbol(Offset(1)),
            offset_to_symbol(Offset(2)),
        ]
    finally:
        conn.close()


@pytest.mark.routing
def test_3_2_plain_producer_is_served_on_a_partitioned_stream(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §3.2: "a producer or consumer MUST be able to successfully interact with a conforming
    event log implementation just as with any regular AMQP node, for instance: Producers and
    consumers that do not choose a partition on a partitioned event log are either assigned a
    partition by the event log node, or their links are left to be partition-agnostic.
    Producers are not required to annotate events with partition hints, even on
    partition-agnostic links. The event log node chooses the partition in absence of such
    hints." A plain sender (no link property, no annotation) on three partitions: every message
    is accepted and stored exactly once, in some partition."""
    stream = make_stream(partitions=3)
    bodies = [f"plain-{i}" for i in range(9)]
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for body in bodies:
            sender.send(Message(body=body))  # raises unless accepted
    assert sum(stored_counts(gateway, stream)) == len(bodies)
    got = read(gateway, stream, len(bodies))
    assert sorted(m.body for m in got) == sorted(bodies)
    assert {m.instructions[SOURCE_PARTITION] for m in got} <= {"0", "1", "2"}


def test_3_2_consumer_without_filter_receives_only_events_accepted_after_attach(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §3.2: "Consumers are not required to provide offset filter information. If no filter
    is provided, the consumer is eligible to receive events accepted by the event log node
    after the link was attached, equivalent to the 'latest' offset filter." Three messages
    before the attach, two after: the consumer's first two deliveries are the two after."""
    stream = make_stream()
    fill(gateway, stream, 3)
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(stream, name=unique("rx"), credit=10)
        fill(gateway, stream, 2, start=3)
        got = [receiver.receive(timeout=WAIT_S) for _ in range(2)]
        receiver.accept()
    assert [m.body for m in got] == ["m3", "m4"]


def test_3_2_consumer_relies_on_link_state_without_tracking_offsets(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §3.2: "Consumers can rely on all existing AMQP mechanisms for delivery-state tracking
    provided by the AMQP source terminus of the event log node. This means that after attaching
    a link, the consumer is not required to keep track of offsets for initiating further
    transfers while the link exists." One link, one unit of credit at a time, follows the log
    through history and the live tail without a gap or a repeat."""
    stream = make_stream()
    fill(gateway, stream, 4)
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=1, options=[offset_filter("first")]
        )
        got = []
        for _ in range(4):
            got.append(receiver.receive(timeout=WAIT_S).body)
            receiver.accept()
        fill(gateway, stream, 4, start=4)
        for _ in range(4):
            got.append(receiver.receive(timeout=WAIT_S).body)
            receiver.accept()
    assert got == [f"m{i}" for i in range(8)]
