"""000 §4.2 (partition annotations in producer transfers) and §4.4 (partition annotations in
consumer transfers), on a three-partition stream over every broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Delivery, Message, symbol
from support.amqp_clients import RunningGateway, blocking, offset_filter, publish, unique
from support.event_streams import (
    PARTITION,
    SOURCE_PARTITION,
    WAIT_S,
    answer,
    bodies_by_partition,
    bound,
    hinted,
    outcome,
    read,
    stored_counts,
)


def fill_partitions(gateway: RunningGateway, stream: str, count: int) -> None:
    for p in range(3):
        publish(gateway, stream, [f"p{p}-{k}" for k in range(count)], {PARTITION: symbol(str(p))})


@pytest.mark.routing
def test_4_2_target_partition_on_a_bound_link_must_match_its_partition(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.2: "If the event-streams-target-partition delivery annotation is added to a
    transfer on a partition-bound link, its value MUST match the event-streams-partition link
    property's value. Otherwise, the transfer MUST be rejected." On a link bound to '1': a
    transfer annotated '2' is rejected (`amqp:invalid-field`) and stored nowhere; one annotated
    '1' is accepted; the link goes on."""
    stream = make_stream(partitions=3)
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=bound(symbol("1")))
        wrong = outcome(conn, sender, hinted("wrong", symbol("2")))
        right = outcome(conn, sender, hinted("right", symbol("1")))
        plain = outcome(conn, sender, Message(body="plain"))
    assert wrong.remote_state == Delivery.REJECTED
    assert wrong.remote.condition.name == "amqp:invalid-field"
    assert right.remote_state == Delivery.ACCEPTED and plain.remote_state == Delivery.ACCEPTED
    assert stored_counts(gateway, stream) == [0, 2, 0]
    assert [m.body for m in read(gateway, stream, 2, partition="1")] == ["right", "plain"]


@pytest.mark.routing
def test_4_4_source_partition_on_every_transfer_over_agnostic_links(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.4: "The event-streams-source-partition delivery annotation MUST be added to all
    transfers to consumers made over partition-agnostic links." An agnostic receiver (answered
    without event-streams-partition) gets three messages of each partition from the history,
    then one from the live tail: each carries the partition it was stored in."""
    stream = make_stream(partitions=3)
    fill_partitions(gateway, stream, 3)
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=20, options=[offset_filter("first")]
        )
        assert PARTITION not in answer(receiver)
        got = [receiver.receive(timeout=WAIT_S) for _ in range(9)]
        publish(gateway, stream, ["tail"], {PARTITION: symbol("2")})
        got.append(receiver.receive(timeout=WAIT_S))
        receiver.accept()
    assert all(SOURCE_PARTITION in (m.instructions or {}) for m in got), got
    assert bodies_by_partition(got) == {
        "0": ["p0-0", "p0-1", "p0-2"],
        "1": ["p1-0", "p1-1", "p1-2"],
        "2": ["p2-0", "p2-1", "p2-2", "tail"],
    }


@pytest.mark.routing
def test_4_4_source_partition_on_a_bound_link_equals_its_partition(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.4: "The annotation is OPTIONAL for transfers over partition-bound links, and if
    present, its value MUST be equal to the event-streams-partition link property value."
    Spate adds it on every partitioned stream (§4.6.4); on a link bound to '2' it is '2' on
    every delivery, history and tail."""
    stream = make_stream(partitions=3)
    fill_partitions(gateway, stream, 2)
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream,
            name=unique("rx"),
            credit=10,
            options=[offset_filter("first"), bound(symbol("2"))],
        )
        bound_to = answer(receiver)[PARTITION]
        got = [receiver.receive(timeout=WAIT_S) for _ in range(2)]
        publish(gateway, stream, ["tail"], {PARTITION: symbol("2")})
        got.append(receiver.receive(timeout=WAIT_S))
        receiver.accept()
    assert [m.body for m in got] == ["p2-0", "p2-1", "tail"]
    for message in got:
        present = (message.instructions or {}).get(SOURCE_PARTITION)
        assert present is None or present == bound_to, (present, bound_to)
