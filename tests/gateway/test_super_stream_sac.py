"""Single active consumer on a super stream's address (issue 8, ADR 0034; 004 "Super Streams"
and "Single Active Consumer"), through python-qpid-proton, rhea and spate.client, against
every broker of the gateway suite (memory, node, proxy).

Contract (docs/amqp.md "Super streams"): a receiver attached to the super stream's name with
`spate:consumer-name` and `spate:single-active-consumer` = true is a member of that name's
single-active-consumer group on every partition stream; partition i's active member is member
i % size in joining order (004 "Single Active Consumer Support", RabbitMQ's rule), so the
partitions spread over the links of one name. The attach reply says where the link is active
(`spate:active`, `spate:active-partitions`); each delivery carries its partition stream
(`spate:stream`) and index (`event-streams-source-partition`) with its offset; the first from a
partition the link took over carries `spate:active` = true, and the first after the link's
active partitions changed (taken or handed over) lists them in
`event-streams-associated-partitions-changed` (000 §4.6.5). When a link goes, each of
its partitions is taken over after the group's stored offset: no gap, no repeat beyond what it
had not settled.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, Timeout, symbol
from spate.client import Consumer
from spate.core.superstreams import SuperStream
from support.amqp_clients import (
    ACTIVE,
    LinkProperties,
    LoopThread,
    RunningGateway,
    blocking,
    da,
    offset_filter,
    receive,
    run_rhea,
    unique,
)
from support.amqp_clients import CONSUMER_NAME as NAME
from support.amqp_clients import SINGLE_ACTIVE as SAC
from support.amqp_clients import sac_member as member
from support.memory_broker import MemoryBroker

ACTIVE_PARTITIONS = symbol("spate:active-partitions")
ASSOCIATED = "event-streams-associated-partitions-changed"


def associated(message: Message) -> list[str] | None:
    """`event-streams-associated-partitions-changed` (an array of symbols), if present."""
    value = da(message, ASSOCIATED)
    return None if value is None else [str(p) for p in value.elements]


def put(gateway: RunningGateway, stream: str, *bodies: str) -> None:
    """Publish to one partition stream, each message confirmed."""
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for body in bodies:
            sender.send(Message(body=body))


def where(message: Message) -> tuple[str, str, int]:
    """(partition stream, its index, offset) as the delivery says."""
    return (
        da(message, "spate:stream"),
        str(da(message, "event-streams-source-partition")),
        int(da(message, "event-streams-offset")),
    )


def first() -> Any:
    return offset_filter("first")


def flush(conn: Any, stream: str) -> None:
    """Put what the blocking connection has queued (dispositions) on the wire; then a round
    trip on it (a sender attached to `stream` and detached: the node answers frames in order),
    so the node has taken the dispositions however loaded the machine (a fixed wait alone
    failed once in CI in test_consumer_groups.py)."""
    with contextlib.suppress(Timeout):
        conn.wait(lambda: False, timeout=0.2)
    conn.create_sender(stream, name=unique("sync")).close()


def nothing_arrives(receiver: Any, wait_s: float = 0.3) -> bool:
    try:
        receiver.receive(timeout=wait_s)
    except Timeout:
        return True
    return False


def test_one_link_receives_every_partition_and_each_delivery_names_its_stream(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=3)
    for index, stream in enumerate(topology.partitions):
        put(gateway, stream, f"p{index}-a", f"p{index}-b")
    with blocking(gateway) as conn:
        link = conn.create_receiver(
            topology.name, name=unique("rx"), credit=20, options=[member("billing"), first()]
        )
        properties = link.link.remote_properties
        assert properties[ACTIVE] is True
        assert list(properties[ACTIVE_PARTITIONS]) == list(topology.partitions)
        assert list(properties[symbol("spate:partition-streams")]) == list(topology.partitions)
        got = receive(link, 6)
        by_stream: dict[str, list[tuple[str, int]]] = {}
        for message in got:
            stream, index, offset = where(message)
            assert stream == topology.partitions[int(index)]
            by_stream.setdefault(stream, []).append((message.body, offset))
            assert da(message, "spate:active") is None  # active from the attach: said there
            assert associated(message) is None
        assert by_stream == {
            stream: [(f"p{i}-a", 0), (f"p{i}-b", 1)] for i, stream in enumerate(topology.partitions)
        }


def test_a_second_link_takes_partition_one_and_the_first_keeps_the_others(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    """004 "Single Active Consumer Support": with two members, partition i goes to member
    i % 2 in joining order — the second link takes partition 1 over after what the first
    accepted of it (stored when it stepped down), and announces it on its first delivery."""
    topology = make_super(partitions=3)
    p0, p1, p2 = topology.partitions
    put(gateway, p1, "one-0")
    with blocking(gateway) as one, blocking(gateway) as two:
        a = one.create_receiver(
            topology.name, name=unique("a"), credit=10, options=[member("spread"), first()]
        )
        assert [m.body for m in receive(a, 1)] == ["one-0"]  # accepted: stored on step-down
        flush(one, p1)
        b = two.create_receiver(
            topology.name, name=unique("b"), credit=10, options=[member("spread")]
        )
        # partition 1 is the first's until it has stepped down: the second is told by delivery
        assert b.link.remote_properties[ACTIVE] is False
        assert list(b.link.remote_properties[ACTIVE_PARTITIONS]) == []
        put(gateway, p1, "one-1", "one-2")
        put(gateway, p0, "zero-0")
        put(gateway, p2, "two-0")
        took = receive(b, 2)
        assert [(m.body, where(m)) for m in took] == [
            ("one-1", (p1, "1", 1)),
            ("one-2", (p1, "1", 2)),
        ]
        assert da(took[0], "spate:active") is True
        assert associated(took[0]) == ["1"]  # where it is active now (000 §4.6.5)
        assert da(took[1], "spate:active") is None and associated(took[1]) is None
        kept = receive(a, 2)
        assert sorted(m.body for m in kept) == ["two-0", "zero-0"]
        # the first's next delivery says it handed partition 1 over
        assert associated(kept[0]) == ["0", "2"]
        assert associated(kept[1]) is None
        assert nothing_arrives(a) and nothing_arrives(b)


def test_a_detached_link_hands_each_partition_over_after_what_it_accepted(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=2)
    p0, p1 = topology.partitions
    with blocking(gateway) as one, blocking(gateway) as two:
        a = one.create_receiver(
            topology.name, name=unique("a"), credit=10, options=[member("handover"), first()]
        )
        b = two.create_receiver(
            topology.name, name=unique("b"), credit=10, options=[member("handover")]
        )
        put(gateway, p0, "z0", "z1", "z2")
        put(gateway, p1, "o0", "o1")
        assert sorted(m.body for m in receive(a, 3)) == ["z0", "z1", "z2"]  # partition 0: a's
        assert [m.body for m in receive(b, 2)] == ["o0", "o1"]  # partition 1: b's
        a.close()  # stores 2 on partition 0, then leaves both groups
        put(gateway, p0, "z3")
        took = receive(b, 1)
        assert [(m.body, where(m)) for m in took] == [("z3", (p0, "0", 3))]
        assert da(took[0], "spate:active") is True
        put(gateway, p1, "o2")
        assert [m.body for m in receive(b, 1)] == ["o2"]


def test_a_lost_connection_hands_over_with_only_its_unsettled_deliveries_again(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=2)
    p0, _ = topology.partitions
    put(gateway, p0, *(f"z{i}" for i in range(6)))
    with blocking(gateway) as two:
        with blocking(gateway) as one:
            a = one.create_receiver(
                topology.name, name=unique("a"), credit=10, options=[member("lost"), first()]
            )
            b = two.create_receiver(
                topology.name, name=unique("b"), credit=10, options=[member("lost")]
            )
            assert [m.body for m in receive(a, 2)] == ["z0", "z1"]  # accepted
            for _ in range(2):
                a.receive(timeout=10)  # z2, z3 delivered, never settled
            # leaving the block closes the connection without detaching the link
        got = receive(b, 4)
        assert [m.body for m in got] == ["z2", "z3", "z4", "z5"]  # z2, z3 again: unsettled
        assert da(got[0], "spate:active") is True


def test_a_partition_stream_member_and_a_super_stream_member_share_the_group(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    """The groups are the partition streams' own (ADR 0013): a link attached to one partition
    stream with the same name is a member there like any other, and a plain named link of the
    name is refused while the group exists."""
    topology = make_super(partitions=2)
    _, p1 = topology.partitions
    with blocking(gateway) as conn:
        whole = conn.create_receiver(
            topology.name, name=unique("w"), credit=10, options=[member("mixed"), first()]
        )
        direct = conn.create_receiver(p1, name=unique("d"), credit=10, options=[member("mixed")])
        # member 2 of partition 1's group: 1 % 2 = 1, so it takes partition 1 over
        put(gateway, p1, "o0")
        got = receive(direct, 1)
        assert got[0].body == "o0" and da(got[0], "spate:active") is True
        assert nothing_arrives(whole)
        with pytest.raises(Exception, match="precondition-failed") as refused:
            conn.create_receiver(p1, name=unique("p"), options=[LinkProperties({NAME: "mixed"})])
        assert "single-active-consumer" in str(refused.value)
        direct.close()  # partition 1 comes back to the super-stream link, after o0
        put(gateway, p1, "o1")
        back = receive(whole, 1)
        assert back[0].body == "o1" and da(back[0], "spate:active") is True


def test_misuse_is_refused_naming_what_to_change_and_members_go_on(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=3)
    streams = repr(topology.partitions[0])
    with blocking(gateway) as conn:
        active = conn.create_receiver(
            topology.name, name=unique("a"), credit=10, options=[member("m"), first()]
        )
        cases: list[tuple[list[Any], str, list[str]]] = [
            ([], "invalid-field", [streams, "'spate:consumer-name' and"]),
            (
                [LinkProperties({NAME: "m"})],
                "invalid-field",
                [streams, "attach here with 'spate:single-active-consumer' = true"],
            ),
            ([LinkProperties({SAC: True})], "invalid-field", ["needs 'spate:consumer-name'"]),
            (
                [member("m"), offset_filter(5)],
                "invalid-field",
                ["an offset filter names a message of one partition stream", streams],
            ),
            (
                [
                    LinkProperties(
                        {NAME: "m", SAC: True, symbol("event-streams-partition"): symbol("1")}
                    )
                ],
                "invalid-field",
                ["'event-streams-partition' is not taken on super stream", streams],
            ),
            (
                [
                    LinkProperties(
                        {NAME: "m", SAC: True, symbol("event-streams-consumer-group"): "g"}
                    )
                ],
                "invalid-field",
                ["'event-streams-consumer-group' is not taken on super stream"],
            ),
        ]
        for options, condition, words in cases:
            with pytest.raises(Exception, match=condition) as refused:
                conn.create_receiver(topology.name, name=unique("x"), options=options)
            for word in words:
                assert word in str(refused.value), (word, str(refused.value))
        with pytest.raises(Exception, match="amqp:not-found") as refused:
            conn.create_receiver(unique("ghost"), name=unique("x"), options=[member("m")])
        assert "does not exist" in str(refused.value)
        put(gateway, topology.partitions[2], "still")
        assert [m.body for m in receive(active, 1)] == ["still"]  # unaffected


def test_rhea_consumes_a_super_stream_and_a_proton_link_takes_over_after_it(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=2)
    p0, p1 = topology.partitions
    put(gateway, p0, "z0", "z1")
    put(gateway, p1, "o0")
    props = {"spate:consumer-name": "rhea-ss", "spate:single-active-consumer": True}
    first_filter = {"rabbitmq:stream-offset-spec": {"type": "string", "value": "first"}}
    report = run_rhea(
        gateway,
        [
            {
                "op": "consume",
                "address": topology.name,
                "count": 3,
                "properties": props,
                "filter": first_filter,
                "exact": True,
            }
        ],
    )
    assert "error" not in report, report
    (done,) = report["steps"]
    assert done["attach_properties"]["spate:active"] == "true"
    seen = sorted(
        (m["stream"], m["source_partition"], int(m["offset"]), m["body"]) for m in done["messages"]
    )
    assert seen == [(p0, "0", 0, "z0"), (p0, "0", 1, "z1"), (p1, "1", 0, "o0")]
    put(gateway, p0, "z2")
    put(gateway, p1, "o1")
    with blocking(gateway) as conn:  # rhea's accepts were stored when it detached
        link = conn.create_receiver(
            topology.name, name=unique("p"), credit=10, options=[member("rhea-ss"), first()]
        )
        assert sorted(m.body for m in receive(link, 2)) == ["o1", "z2"]
        assert nothing_arrives(link)


def test_client_consumers_of_a_super_stream_spread_and_take_over(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=2)
    p0, p1 = topology.partitions
    options = {"name": "svc", "single_active": True, "timeout_s": 10}
    with Consumer(gateway.url, topology.name, start="first", **options) as one:
        assert one.active and one.active_streams == {p0, p1}
        two = Consumer(gateway.url, topology.name, **options)
        try:
            assert not two.active and two.active_streams == frozenset()
            put(gateway, p0, "z0")
            put(gateway, p1, "o0")
            event = two.receive(timeout=10)
            assert (event.body, event.stream, event.partition, event.offset) == ("o0", p1, "1", 0)
            assert two.active and two.active_streams == {p1} and two.assignment == {1}
            event = one.receive(timeout=10)
            assert (event.body, event.stream, event.partition) == ("z0", p0, "0")
            assert one.active_streams == {p0} and one.assignment == {0}  # said by z0
            one.close()  # z0 finished: stored, then partition 0 is two's
            put(gateway, p0, "z1")
            event = two.receive(timeout=10)
            assert (event.body, event.stream, event.offset) == ("z1", p0, 1)
            assert two.active_streams == {p0, p1} and two.assignment == {0, 1}
        finally:
            two.close()


def test_many_links_of_one_name_each_receive_their_share_exactly_once(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    """Three links and three partitions: each partition ends with one active link (member
    i % 3 in joining order), and every message arrives once, from its stream."""
    topology = make_super(partitions=3)
    with blocking(gateway) as conn:
        links = [
            conn.create_receiver(
                topology.name, name=unique("r"), credit=20, options=[member("three")]
            )
            for _ in range(3)
        ]
        for index, stream in enumerate(topology.partitions):
            put(gateway, stream, *(f"{index}-{i}" for i in range(4)))
        received: dict[int, list[str]] = {}
        for number, link in enumerate(links):
            got = receive(link, 4)
            received[number] = [m.body for m in got]
            assert len({where(m)[0] for m in got}) == 1, "one link, one partition"
            assert nothing_arrives(link)
        assert sorted(b for bodies in received.values() for b in bodies) == sorted(
            f"{i}-{n}" for i in range(3) for n in range(4)
        )


def gather(receivers: list[Any], wanted: set[str], wait_s: float = 20.0) -> list[list[Message]]:
    """What each receiver gets (accepted) until `wanted` were all received by some."""
    got: list[list[Message]] = [[] for _ in receivers]
    deadline = time.monotonic() + wait_s
    while not wanted <= {m.body for messages in got for m in messages}:
        assert time.monotonic() < deadline, [[m.body for m in g] for g in got]
        for receiver, messages in zip(receivers, got, strict=True):
            with contextlib.suppress(Timeout):
                messages.append(receiver.receive(timeout=0.1))
                receiver.accept()
    return got


@pytest.mark.memory_broker_only
def test_a_partition_streams_leader_change_rejoins_its_group_and_the_others_go_on(
    gateway: RunningGateway,
    broker: MemoryBroker,
    loop_thread: LoopThread,
    make_super: Callable[..., SuperStream],
) -> None:
    """When one partition stream's leadership moves, its groups are disbanded and their waiting
    members told NotLeader (ADR 0013); a super-stream link joins that group again at the new
    leader and keeps its other partitions (ADR 0034) — it is not ended. One link is active on
    the partition again, after its stored offset."""
    topology = make_super(partitions=2)
    p0, p1 = topology.partitions
    with blocking(gateway) as one, blocking(gateway) as two:
        a = one.create_receiver(
            topology.name, name=unique("a"), credit=10, options=[member("moving"), first()]
        )
        b = two.create_receiver(
            topology.name, name=unique("b"), credit=10, options=[member("moving")]
        )
        put(gateway, p0, "z0")
        put(gateway, p1, "o0")
        assert [m.body for m in receive(a, 1)] == ["z0"]
        assert [m.body for m in receive(b, 1)] == ["o0"]
        loop_thread.run(lambda: broker.lose_leadership(p1))
        put(gateway, p1, "o1", "o2")
        put(gateway, p0, "z1")
        got_a, got_b = gather([a, b], {"o1", "o2", "z1"})
        assert [m.body for m in got_a if where(m)[0] == p0] == ["z1"]  # partition 0 untouched
        assert not [m for m in got_b if where(m)[0] == p0]
        from_p1 = [where(m)[2] for m in got_a + got_b if where(m)[0] == p1]
        assert set(from_p1) >= {1, 2} and set(from_p1) <= {0, 1, 2}  # o0 again if not stored
        # one active link on each partition again
        put(gateway, p1, "o3")
        put(gateway, p0, "z2")
        got_a, got_b = gather([a, b], {"o3", "z2"})
        bodies = sorted(m.body for m in got_a + got_b)
        assert bodies.count("o3") == 1 and bodies.count("z2") == 1, bodies
        assert "z2" in [m.body for m in got_a]
