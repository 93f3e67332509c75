"""000 §4.6.4 (event-streams-source-partition), §4.6.6 (event-streams-target-partition) and
§4.6.7 (event-streams-group-key) on a three-partition stream over every broker. (§4.6.1 is in
test_4_1_4_3_binding.py; §4.6.2, §4.6.3 and §4.6.5 in test_4_5_groups.py.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from proton import Delivery, Message, symbol
from proton.reactor import AtMostOnce
from support.amqp_clients import RunningGateway, blocking, offset_filter, publish, unique
from support.event_streams import (
    GROUP_KEY,
    OFFSET,
    PARTITION,
    SOURCE_PARTITION,
    TARGET_PARTITION,
    WAIT_S,
    bodies_by_partition,
    bound,
    hinted,
    keyed,
    outcome,
    outcomes,
    read,
    stored_counts,
)

# -- 4.6.4 event-streams-source-partition -------------------------------------------------------


@pytest.mark.routing
def test_4_6_4_partitioned_log_annotates_every_delivery_with_its_source_partition(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.6.4: "The event-streams-source-partition delivery annotation is a symbol value
    ... If the event log is partitioned, the delivery annotation MUST be added by the event
    log node before delivery to consumers." On a partitioned stream every delivery carries it
    as a symbol: agnostic and bound links, unsettled and pre-settled."""
    stream = make_stream(partitions=3)
    for p in range(3):
        publish(gateway, stream, [f"p{p}"], {PARTITION: symbol(str(p))})
    with blocking(gateway) as conn:
        links = {
            "agnostic": conn.create_receiver(
                stream, name=unique("rx"), credit=3, options=[offset_filter("first")]
            ),
            "bound": conn.create_receiver(
                stream, name=unique("rx"), credit=1, options=[offset_filter("first"), bound("1")]
            ),
            "presettled": conn.create_receiver(
                stream,
                name=unique("rx"),
                credit=3,
                options=[offset_filter("first"), AtMostOnce()],
            ),
        }
        got = {
            kind: [link.receive(timeout=WAIT_S) for _ in range(1 if kind == "bound" else 3)]
            for kind, link in links.items()
        }
        links["agnostic"].accept()
        links["bound"].accept()
    for kind, messages in got.items():
        for message in messages:
            source = (message.instructions or {}).get(SOURCE_PARTITION)
            assert isinstance(source, symbol), (kind, message)
            assert message.body == f"p{source}", (kind, message)


@pytest.mark.routing
def test_4_6_4_forwarded_source_partition_annotation_is_not_stored(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.6.4: "A consumer MUST strip the annotation if it forwards the message onwards."
    That is the consumer's duty; the node's part is never to keep a stale one: delivery
    annotations are hop-by-hop and not stored (docs/amqp.md, Publishing). A message read from
    partition 2 of one stream and sent on unchanged (annotations and all) to partition 0 of
    another is delivered from there as partition 0's, at that stream's offset."""
    origin, onward = make_stream(partitions=3), make_stream(partitions=3)
    publish(gateway, origin, ["x", "forwarded"], {PARTITION: symbol("2")})
    [_, message] = read(gateway, origin, 2, partition="2")
    assert message.instructions[SOURCE_PARTITION] == "2"
    publish_as_is = message  # the consumer that forgets to strip
    with blocking(gateway) as conn:
        sender = conn.create_sender(onward, name=unique("tx"), options=bound(symbol("0")))
        assert outcome(conn, sender, publish_as_is).remote_state == Delivery.ACCEPTED
    [again] = read(gateway, onward, 1)
    assert again.body == "forwarded"
    assert again.instructions[SOURCE_PARTITION] == "0"
    assert again.instructions[OFFSET] != message.instructions[OFFSET]  # onward's first
    assert stored_counts(gateway, onward) == [1, 0, 0]


# -- 4.6.6 event-streams-target-partition -------------------------------------------------------


@pytest.mark.routing
def test_4_6_6_target_partition_routes_the_transfer(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.6.6: "The event-streams-target-partition delivery annotation is a symbol value
    and describes the partition to which the transfer MUST be routed." On an agnostic link,
    each message goes to the partition it names, whether sent one by one or pipelined."""
    stream = make_stream(partitions=3)
    targets = ["2", "0", "2", "1", "2", "0"]
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for i, target in enumerate(targets[:3]):  # one per batch
            sender.send(hinted(f"h{i}", symbol(target)))
        pipelined = [
            sender.link.send(hinted(f"h{i}", symbol(target)))
            for i, target in enumerate(targets[3:], start=3)
        ]
        assert all(d.remote_state == Delivery.ACCEPTED for d in outcomes(conn, pipelined))
    assert stored_counts(gateway, stream) == [2, 1, 3]
    assert bodies_by_partition(read(gateway, stream, 6)) == {
        "0": ["h1", "h5"],
        "1": ["h3"],
        "2": ["h0", "h2", "h4"],
    }


@pytest.mark.routing
def test_4_6_6_target_partition_other_than_the_bound_one_is_rejected(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.6.6: "If the link is not partition-agnostic and if the link is not bound to the
    exact same partition, the transfer MUST be rejected." On a link bound to '0', transfers
    naming '1' or '2' (as symbol or string) are rejected and stored nowhere; the link goes on."""
    stream = make_stream(partitions=3)
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=bound(symbol("0")))
        for target in (symbol("1"), symbol("2"), "2"):
            delivery = outcome(conn, sender, hinted(f"to-{target}", target))
            assert delivery.remote_state == Delivery.REJECTED, target
        sender.send(hinted("same", symbol("0")))
    assert stored_counts(gateway, stream) == [1, 0, 0]


@pytest.mark.routing
def test_4_6_6_target_partition_that_does_not_exist_is_rejected(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.6.6: "If the partition does not exist, the transfer MUST be rejected." Targets
    '3' and 'x' of three partitions are rejected (`amqp:not-found`) on agnostic and bound
    links, nothing is stored, and the links go on."""
    stream = make_stream(partitions=3)
    with blocking(gateway) as conn:
        agnostic = conn.create_sender(stream, name=unique("tx"))
        bound_link = conn.create_sender(stream, name=unique("tx"), options=bound(symbol("1")))
        for sender in (agnostic, bound_link):
            for target in ("3", "x"):
                delivery = outcome(conn, sender, hinted(f"to-{target}", symbol(target)))
                assert delivery.remote_state == Delivery.REJECTED, target
                assert delivery.remote.condition.name == "amqp:not-found"
        bound_link.send(Message(body="still-open"))
    assert stored_counts(gateway, stream) == [0, 1, 0]


@pytest.mark.routing
def test_4_6_6_target_partition_annotation_is_stripped(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.6.6: "The event log MUST strip the annotation once it has evaluated it." What a
    consumer reads carries no event-streams-target-partition, in any section, whether it came
    on an agnostic link (routed by it) or on a bound one (checked against it)."""
    stream = make_stream(partitions=3)
    with blocking(gateway) as conn:
        agnostic = conn.create_sender(stream, name=unique("tx"))
        bound_link = conn.create_sender(stream, name=unique("tx"), options=bound(symbol("1")))
        agnostic.send(hinted("routed", symbol("1")))
        bound_link.send(hinted("checked", symbol("1")))
    got = read(gateway, stream, 2, partition="1")
    assert [m.body for m in got] == ["routed", "checked"]
    for message in got:
        assert TARGET_PARTITION not in (message.instructions or {}), message
        assert TARGET_PARTITION not in (message.annotations or {}), message
        assert TARGET_PARTITION not in (message.properties or {}), message


# -- 4.6.7 event-streams-group-key --------------------------------------------------------------

KEYS = ["alpha", "beta", "gamma", "delta", "epsilon"]
"""Five keys: not a multiple of the three partitions, so round-robin would split each key."""


def partitions_of_keys(gateway: RunningGateway, stream: str, count: int) -> dict[str, set[str]]:
    """key -> the partitions its messages (bodies `<key>/<n>`) were stored in."""
    out: dict[str, set[str]] = {}
    for message in read(gateway, stream, count):
        key = str(message.body).split("/")[0]
        out.setdefault(key, set()).add(str(message.instructions[SOURCE_PARTITION]))
        assert message.annotations[GROUP_KEY] == key  # the annotation is kept
    return out


@pytest.mark.routing
def test_4_6_7_events_with_one_group_key_are_partitioned_together(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.6.7: "The event-streams-group-key message annotation is a string value and is a
    grouping key that identifies events that are related and SHOULD therefore be treated as a
    group for partitioning purposes." On an agnostic link, five keys' messages, interleaved and
    sent one per batch (which unkeyed would go round-robin), land one partition per key."""
    stream = make_stream(partitions=3)
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for n in range(3):
            for key in KEYS:
                sender.send(keyed(f"{key}/{n}", key))
    placed = partitions_of_keys(gateway, stream, 3 * len(KEYS))
    assert set(placed) == set(KEYS)
    assert all(len(partitions) == 1 for partitions in placed.values()), placed


@pytest.mark.routing
def test_4_6_7_group_key_keeps_its_partition_across_links_and_connections(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.6.7: "When set by the producer and used over a partition-agnostic link, the value
    of the annotation MAY be used by the event log node to bind the transfer to a partition. If
    the key is used in this way, the event log SHOULD bind transfers with the key to the same
    partition at all times and until the number of partitions changes." Spate uses it (docs/
    amqp.md, Publishing); the same keys sent later on other links and connections, pipelined
    with unkeyed messages, go where they went the first time. (Round r first sends r unkeyed
    messages one per batch, so a round-robin turn would differ in each round.)"""
    stream = make_stream(partitions=3)
    for round_ in range(3):
        with blocking(gateway) as conn:
            sender = conn.create_sender(stream, name=unique("tx"))
            for _ in range(round_):
                sender.send(Message(body=f"unkeyed/{round_}"))
            deliveries = []
            for key in KEYS:
                deliveries.append(sender.link.send(keyed(f"{key}/{round_}", key)))
                deliveries.append(sender.link.send(Message(body=f"unkeyed/{round_}")))
            assert all(d.remote_state == Delivery.ACCEPTED for d in outcomes(conn, deliveries))
    placed: dict[str, set[str]] = {}
    for message in read(gateway, stream, 3 * 2 * len(KEYS) + 3):
        key = str(message.body).split("/")[0]
        if key != "unkeyed":
            placed.setdefault(key, set()).add(str(message.instructions[SOURCE_PARTITION]))
    assert set(placed) == set(KEYS)
    assert all(len(partitions) == 1 for partitions in placed.values()), placed
