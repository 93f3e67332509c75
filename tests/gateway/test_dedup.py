"""Producer deduplication over AMQP (issue 8, ADR 0011; 004 "Message Deduplication"), through
python-qpid-proton and rhea, against every broker of the gateway suite (memory, node, proxy).

Contract: a sender link with the link property `spate:producer-name` deduplicates; each message
carries its publishing id in the message annotation `x-opt-publishing-id` (ulong); one not above
the name's last stored id is accepted and not stored again; the attach reply carries
`spate:last-publishing-id` (004 `getLastPublishingId`) once the name has stored a message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Delivery, Message, symbol, ulong
from proton.utils import LinkDetached
from spate.core.errors import Unavailable
from support.amqp_clients import (
    LinkProperties,
    RunningGateway,
    blocking,
    offset_filter,
    receive,
    run_rhea,
    stream_bodies,
    unique,
)
from support.memory_broker import MemoryBroker

NAME = symbol("spate:producer-name")
LAST = symbol("spate:last-publishing-id")
PID = symbol("x-opt-publishing-id")


def named(name: str) -> LinkProperties:
    return LinkProperties({NAME: name})


def message(publishing_id: int | None, body: str) -> Message:
    annotations = None if publishing_id is None else {PID: ulong(publishing_id)}
    return Message(body=body, annotations=annotations)


def test_each_publishing_id_is_stored_once_and_the_attach_answers_the_last(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=named("orders-app"))
        assert LAST not in (sender.link.remote_properties or {})  # never published
        for i in range(5):
            delivery = sender.send(message(i, f"m{i}"))
            assert delivery.remote_state == delivery.ACCEPTED
        # a producer that restarts resends from 3: the attach says 4 was the last stored
        again = conn.create_sender(stream, name=unique("tx"), options=named("orders-app"))
        assert again.link.remote_properties[LAST] == 4
        assert isinstance(again.link.remote_properties[LAST], ulong)
        for i in range(3, 8):
            delivery = again.send(message(i, f"m{i}"))
            assert delivery.remote_state == delivery.ACCEPTED  # duplicates are accepted too
        # another name is another producer: its ids are its own
        other = conn.create_sender(stream, name=unique("tx"), options=named("billing"))
        assert LAST not in (other.link.remote_properties or {})
        other.send(message(0, "b0"))
    assert stream_bodies(gateway, stream, 9) == [f"m{i}" for i in range(8)] + ["b0"]


def test_a_batch_of_only_duplicates_is_accepted_after_its_originals(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """Pipelined: the resends go out before the originals are confirmed; every one is accepted
    and the stream holds each id once."""
    stream = make_stream()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=named("p"))
        resend = conn.create_sender(stream, name=unique("tx"), options=named("p"))
        deliveries = [sender.link.send(message(i, f"m{i}")) for i in range(50)]
        deliveries += [resend.link.send(message(i, f"m{i}")) for i in range(50)]
        conn.wait(lambda: all(d.remote_state for d in deliveries), 10)
        assert {d.remote_state for d in deliveries} == {deliveries[0].ACCEPTED}
    assert stream_bodies(gateway, stream, 50) == [f"m{i}" for i in range(50)]


def rejected(sender: Any, msg: Message) -> tuple[str, str]:
    """Send and expect a rejection: (condition, description)."""
    delivery = sender.link.send(msg)
    sender.connection.wait(lambda: bool(delivery.remote_state), 5)
    assert delivery.remote_state == delivery.REJECTED, delivery.remote_state
    condition = delivery.remote.condition
    return condition.name, condition.description


@pytest.mark.parametrize("base", [0, 2**40], ids=["smallulong", "ulong"])
def test_misuse_is_rejected_with_invalid_field_and_the_link_goes_on(
    gateway: RunningGateway, make_stream: Callable[..., str], base: int
) -> None:
    """proton encodes ids below 256 as smallulong, larger ones as ulong: the second run goes
    through the offset the link learns from its first message (ADR 0011's hot path)."""
    stream = make_stream()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=named("p"))
        assert sender.send(message(base + 5, "five")).remote_state == Delivery.ACCEPTED
        name, text = rejected(sender, message(None, "no id"))
        assert name == "amqp:invalid-field" and "x-opt-publishing-id" in text
        name, text = rejected(sender, message(base + 5, "five again"))
        assert name == "amqp:invalid-field" and f"not above {base + 5}" in text
        name, text = rejected(sender, message(base + 2, "backwards"))
        assert name == "amqp:invalid-field" and f"not above {base + 5}" in text
        wrong = Message(body="text id", annotations={PID: "7"})
        name, text = rejected(sender, wrong)
        assert name == "amqp:invalid-field" and "ulong" in text
        delivery = sender.send(message(base + 6, "six"))  # the link still works
        assert delivery.remote_state == delivery.ACCEPTED
    assert stream_bodies(gateway, stream, 2) == ["five", "six"]


def test_names_that_cannot_deduplicate_are_refused_at_attach(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    single, several = make_stream(), make_stream(partitions=3)
    with blocking(gateway) as conn:
        for stream, properties, expected in (
            (several, {NAME: "p"}, "partition-bound"),
            (single, {NAME: ""}, "non-empty string"),
            (single, {NAME: ulong(5)}, "string"),
            (single, {NAME: "x" * 300}, "limit is 256"),
        ):
            with pytest.raises(Exception) as refused:
                conn.create_sender(stream, name=unique("tx"), options=LinkProperties(properties))
            assert "amqp:invalid-field" in str(refused.value), refused.value
            assert expected in str(refused.value)
        # bound to one partition of the three, a name deduplicates there
        bound = LinkProperties({NAME: "p", symbol("event-streams-partition"): symbol("1")})
        sender = conn.create_sender(several, name=unique("tx"), options=bound)
        assert sender.send(message(0, "x")).remote_state == Delivery.ACCEPTED


def test_rhea_producer_resumes_after_the_last_publishing_id(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    props = {"spate:producer-name": "rhea-app"}
    report = run_rhea(
        gateway,
        [
            {
                "op": "publish",
                "address": stream,
                "bodies": {"prefix": "r", "count": 5},
                "properties": props,
                "first_publishing_id": 0,
            },
            {
                "op": "publish",
                "address": stream,
                "bodies": ["r3", "r4", "r5"],
                "properties": props,
                "first_publishing_id": 3,
            },
        ],
    )
    first, second = report["steps"]
    assert "spate:last-publishing-id" not in first["attach_properties"]
    assert first["outcomes"] == ["accepted"] * 5
    assert second["attach_properties"]["spate:last-publishing-id"] == "4"
    assert second["outcomes"] == ["accepted"] * 3
    assert stream_bodies(gateway, stream, 6) == [f"r{i}" for i in range(6)]


def test_a_named_producers_messages_are_stored_without_an_annotation_that_holds_only_the_id(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """ADR 0011: the id lives in the chunk's producer section, so a message-annotations section
    holding nothing but `x-opt-publishing-id` is not stored (36 bytes less per message); other
    annotations are kept with it, and an unnamed link's messages are stored as sent."""
    stream = make_stream()
    big = 2**40  # a ulong, not a smallulong: the layout the hot path learns
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=named("strip"))
        for i in range(3):
            sender.send(message(big + i, f"only-{i}"))
        sender.send(Message(body="more", annotations={PID: ulong(big + 3), symbol("k"): "v"}))
        sender.send(message(big + 4, "after"))
        plain = conn.create_sender(stream, name=unique("tx"))
        plain.send(message(7, "unnamed"))
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=10, options=[offset_filter("first")]
        )
        got = receive(receiver, 6)
    assert [m.body for m in got] == ["only-0", "only-1", "only-2", "more", "after", "unnamed"]
    assert [m.annotations for m in got[:3]] == [None, None, None]
    assert got[3].annotations == {PID: big + 3, symbol("k"): "v"}
    assert got[4].annotations is None
    assert got[5].annotations == {PID: 7}


@pytest.mark.memory_broker_only
def test_a_failed_append_ends_a_named_link_saying_how_to_resume(
    gateway: RunningGateway, broker: MemoryBroker, loop_thread: Any, make_stream: Callable[..., str]
) -> None:
    """ADR 0011: a named producer's stored messages stay a prefix of what it sent, so a failed
    append ends its link; the detach says the message was refused (its outcome may be unknown:
    not "not stored") and how to resume. The resend on a new link is stored once."""
    stream = make_stream()
    loop_thread.run(lambda: broker.fail_appends(stream, 0, Unavailable("no quorum")))
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=named("p"))
        delivery = sender.link.send(message(0, "m0"))
        with pytest.raises(LinkDetached) as ended:
            conn.wait(lambda: False, timeout=5)
        assert delivery.remote_state == Delivery.REJECTED
        text = str(ended.value)
        assert "amqp:resource-locked" in text and "producer 'p' was refused (no quorum)" in text
        assert "read 'spate:last-publishing-id' and resend after it" in text
        again = conn.create_sender(stream, name=unique("tx"), options=named("p"))
        assert LAST not in (again.link.remote_properties or {})
        assert again.send(message(0, "m0")).remote_state == Delivery.ACCEPTED
    assert stream_bodies(gateway, stream, 1) == ["m0"]
