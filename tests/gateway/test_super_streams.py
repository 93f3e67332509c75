"""Publishing to a super stream (issue 8, ADR 0014; 004 "Super Streams") through
python-qpid-proton and rhea, against every broker of the gateway suite (memory, node, proxy).

Contract: a sender attached to the super stream's name routes each message to one partition
stream — hash routing: unsigned 32-bit MurmurHash3 (seed 104729) of the routing key modulo the
partition count, as RabbitMQ's stream clients; key routing: the partition whose binding key is
the routing key. The routing key is the `event-streams-group-key` message annotation, else the
message-id property. A message is `accepted` once its partition stored it; one with no routing
key, or no matching binding, is `rejected` and the link goes on.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from proton import Delivery, Message, symbol
from proton.utils import LinkDetached
from spate.client import Producer, PublishRefused
from spate.core.superstreams import SuperStream, define, hash_partition
from spate.gateway import sections
from support.amqp_clients import (
    LinkProperties,
    LoopThread,
    RunningGateway,
    blocking,
    run_rhea,
    stream_bodies,
    unique,
)
from support.memory_broker import MemoryBroker
from support.node_broker import NodeBroker
from support.proxy_broker import ProxyBroker

GROUP_KEY = symbol("event-streams-group-key")


def keyed(body: str, key: str) -> Message:
    return Message(body=body, annotations={GROUP_KEY: key})


def rejected(sender: Any, msg: Message) -> tuple[str, str]:
    delivery = sender.link.send(msg)
    sender.connection.wait(lambda: bool(delivery.remote_state), 5)
    assert delivery.remote_state == Delivery.REJECTED, delivery.remote_state
    condition = delivery.remote.condition
    return condition.name, condition.description


def ended(sender: Any, msg: Message) -> tuple[str, str]:
    """Send and expect the message rejected and the link detached with the same error."""
    delivery = sender.link.send(msg)
    with pytest.raises(LinkDetached) as detached:
        sender.connection.wait(lambda: False, 5)
    assert delivery.remote_state == Delivery.REJECTED, delivery.remote_state
    assert delivery.remote.condition.name == detached.value.link.remote_condition.name
    condition = detached.value.link.remote_condition
    return condition.name, condition.description


def test_hash_routing_sends_each_key_where_rabbitmq_clients_do(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=3)
    keys = [f"hello{i}" for i in range(1, 11)] + ["hello88"]
    with blocking(gateway) as conn:
        sender = conn.create_sender(topology.name, name=unique("tx"))
        for key in keys:
            assert sender.send(keyed(f"m-{key}", key)).remote_state == Delivery.ACCEPTED
        # no annotation: the message-id is the routing key (a string, or a uuid's text)
        assert sender.send(Message(id="hello4", body="by-id")).remote_state == Delivery.ACCEPTED
        ident = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
        assert sender.send(Message(id=ident, body="by-uuid")).remote_state == Delivery.ACCEPTED
    expected: list[list[str]] = [[], [], []]
    for key in keys:
        expected[hash_partition(key, 3)].append(f"m-{key}")
    expected[2].append("by-id")  # hello4 -> partition 2 (the go client's table)
    expected[hash_partition(str(ident), 3)].append("by-uuid")
    assert expected[0][0] == "m-hello2" and "m-hello1" in expected[1]
    for index, stream in enumerate(topology.partitions):
        assert stream_bodies(gateway, stream, len(expected[index])) == expected[index]


def test_key_routing_and_unroutable_messages(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(binding_keys=("amer", "emea", "apac"))
    with blocking(gateway) as conn:
        sender = conn.create_sender(topology.name, name=unique("tx"))
        for body, key in (("a1", "emea"), ("a2", "apac"), ("a3", "emea")):
            assert sender.send(keyed(body, key)).remote_state == Delivery.ACCEPTED
        name, text = rejected(sender, keyed("lost", "asia"))
        assert name == "amqp:not-found"
        assert f"super stream {topology.name!r} has no binding key 'asia'" in text
        name, text = rejected(sender, Message(body="no key"))
        assert name == "amqp:invalid-field" and "no routing key" in text
        name, text = rejected(sender, Message(body="bad", annotations={GROUP_KEY: 1.5}))
        assert name == "amqp:invalid-field" and "event-streams-group-key" in text
        # the link goes on
        assert sender.send(keyed("a4", "amer")).remote_state == Delivery.ACCEPTED
    assert stream_bodies(gateway, topology.partitions[0], 1) == ["a4"]
    assert stream_bodies(gateway, topology.partitions[1], 2) == ["a1", "a3"]
    assert stream_bodies(gateway, topology.partitions[2], 1) == ["a2"]


def test_attach_refusals_name_the_problem(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=2)
    with blocking(gateway) as conn:
        with pytest.raises(Exception) as refused:
            conn.create_sender(unique("ghost"), name=unique("tx"))
        assert "amqp:not-found" in str(refused.value)
        assert "stream or super stream 'ghost" in str(refused.value)
        for key, value in (
            ("event-streams-partition", symbol("1")),
            ("spate:producer-name", "p"),
        ):
            with pytest.raises(Exception) as refused:
                conn.create_sender(
                    topology.name,
                    name=unique("tx"),
                    options=LinkProperties({symbol(key): value}),
                )
            assert "amqp:invalid-field" in str(refused.value)
            assert f"'{key}' is not taken on super stream" in str(refused.value)
        with pytest.raises(Exception) as refused:  # a plain receiver: see ADR 0034
            conn.create_receiver(topology.name, name=unique("rx"))
        assert "amqp:invalid-field" in str(refused.value)
        assert "is a super stream: consume from its partition streams" in str(refused.value)
        # consuming: a partition stream is an ordinary stream
        conn.create_receiver(topology.partitions[1], name=unique("rx"))


def test_rhea_publishes_to_a_super_stream(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=3)
    keys = ["hello1", "hello2", "hello4", None]
    report = run_rhea(
        gateway,
        [
            {
                "op": "publish",
                "address": topology.name,
                "bodies": ["r1", "r2", "r4", "no-key"],
                "group_keys": keys,
                "message_ids": [None, None, None, "hello2"],
            },
            {
                "op": "consume",
                "address": topology.partitions[0],
                "count": 2,
                "filter": {"f": {"descriptor": 0x200, "type": "string", "value": "first"}},
            },
        ],
    )
    assert "error" not in report, report
    publish, consume = report["steps"]
    assert publish["outcomes"] == ["accepted"] * 4
    assert [m["body"] for m in consume["messages"]] == ["r2", "no-key"]  # hello2 -> 0
    assert stream_bodies(gateway, topology.partitions[1], 1) == ["r1"]
    assert stream_bodies(gateway, topology.partitions[2], 1) == ["r4"]


def test_a_redirect_gateway_without_proxy_sends_super_stream_links_to_a_node() -> None:
    import asyncio

    from spate.core.errors import NotLeader, Unavailable
    from spate.core.ids import NodeId
    from spate.gateway.routes import RedirectBroker, Routes, RoutingTable

    topology = define("invoices", partitions=2)
    table = RoutingTable()
    broker = RedirectBroker(table)
    with pytest.raises(Unavailable, match="not reached the metadata service"):
        asyncio.run(broker.lookup(topology.name))
    amqp = {NodeId("n2"): ("10.0.0.2", 5672), NodeId("n1"): ("10.0.0.1", 5672)}
    table.update(Routes(3, amqp=amqp, super_streams={topology.name: topology}))
    for call in (broker.lookup, broker.super_stream):
        with pytest.raises(NotLeader, match="'invoices' is a super stream") as redirected:
            asyncio.run(call(topology.name))
        assert (redirected.value.leader_node, redirected.value.leader_host) == ("n1", "10.0.0.1")
    # a super stream's single active consumer (ADR 0034) goes to a node the same way
    from spate.gateway import links

    member = {"spate:consumer-name": "billing", "spate:single-active-consumer": True}
    address = links.parse_address(topology.name, terminus="source")
    with pytest.raises(NotLeader, match="a node serves them") as redirected:
        asyncio.run(links.plan_consumer(broker, address, member, None))
    assert redirected.value.leader_node == "n1"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (Message(body="x"), (None, None)),
        (Message(body="x", id="m-1"), (None, "m-1")),
        (Message(body="x", id=7), (None, 7)),
        (Message(body="x", id=b"raw"), (None, b"raw")),
        (
            Message(body="x", id=uuid.UUID(int=5)),
            (None, uuid.UUID("00000000-0000-0000-0000-000000000005")),
        ),
        (Message(body="x", id="m-1", annotations={GROUP_KEY: "eu"}), ("eu", "m-1")),
        (Message(body="x", subject="no id", annotations={GROUP_KEY: "eu"}), ("eu", None)),
        (Message(body="x", durable=True, id="with-header"), (None, "with-header")),
    ],
)
def test_routing_fields_read_the_group_key_and_the_message_id(
    message: Message, expected: tuple[Any, Any]
) -> None:
    from spate.gateway import sections

    assert sections.routing_fields(message.encode()) == expected


def test_routing_fields_read_large_and_symbolic_layouts() -> None:
    from spate.gateway import codec, sections

    properties = codec.encode(codec.Described(codec.Symbol("amqp:properties:list"), ["big" * 100]))
    body = codec.encode(codec.Described(codec.ULong(0x77), "b"))
    assert sections.routing_fields(properties + body) == (None, "big" * 100)
    with pytest.raises(sections.MalformedMessage):
        sections.routing_fields(codec.encode(codec.Described(codec.ULong(0x73), "not a list")))


def test_a_link_routing_by_a_stale_topology_is_ended(
    loop_thread: LoopThread,
    broker: MemoryBroker | NodeBroker | ProxyBroker,
    gateway: RunningGateway,
    make_super: Callable[..., SuperStream],
) -> None:
    """Versions (ADR 0014): a link keeps the topology it attached with; once the broker knows
    another version (the super stream was recreated) or none (deleted), its next batch is
    rejected and the link ended; a new link routes by the current topology."""
    from dataclasses import replace

    topology = make_super(partitions=3)
    held = broker.node.super_streams if isinstance(broker, ProxyBroker) else broker.super_streams

    def change(version: int | None) -> None:
        if version is None:
            del held[topology.name]
        else:
            held[topology.name] = replace(topology, version=version)
        if isinstance(broker, ProxyBroker):
            broker.refresh()

    with blocking(gateway) as conn:
        sender = conn.create_sender(topology.name, name=unique("tx"))
        assert sender.send(keyed("v0", "hello1")).remote_state == Delivery.ACCEPTED
        loop_thread.run(lambda: change(topology.version + 1))
        name, text = ended(sender, keyed("stale", "hello1"))
        assert name == "amqp:precondition-failed"
        assert f"super stream {topology.name!r} was recreated" in text and "attach again" in text
        sender = conn.create_sender(topology.name, name=unique("tx"))
        assert sender.send(keyed("v1", "hello1")).remote_state == Delivery.ACCEPTED
        loop_thread.run(lambda: change(None))
        name, text = ended(sender, keyed("gone", "hello1"))
        assert (name, text) == ("amqp:not-found", f"super stream {topology.name!r} was deleted")
    assert stream_bodies(gateway, topology.partitions[1], 2) == ["v0", "v1"]


def test_single_active_consumers_spread_over_the_partitions(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    """004 "Single Active Consumer Support" with super streams: two application instances each
    attach one member per partition stream under one name; partition i's group makes member
    number i % size active (RabbitMQ's rule, ADR 0013), so each instance receives one partition
    — the second instance takes partition 1 over from the first, which joined it first."""
    topology = make_super(partitions=2)
    assert [hash_partition(k, 2) for k in ("hello2", "hello3")] == [0, 1]
    properties = LinkProperties(
        {symbol("spate:consumer-name"): "billing", symbol("spate:single-active-consumer"): True}
    )
    with blocking(gateway) as one, blocking(gateway) as two:
        links = {
            (instance, p): conn.create_receiver(
                stream, name=unique("rx"), credit=10, options=[properties]
            )
            for instance, conn in (("one", one), ("two", two))
            for p, stream in enumerate(topology.partitions)
        }
        assert links[("one", 0)].link.remote_properties[symbol("spate:active")] is True
        assert links[("two", 0)].link.remote_properties[symbol("spate:active")] is False
        with blocking(gateway) as conn:
            sender = conn.create_sender(topology.name, name=unique("tx"))
            for body, key in (("to-0", "hello2"), ("to-1", "hello3")):
                assert sender.send(keyed(body, key)).remote_state == Delivery.ACCEPTED
        assert links[("one", 0)].receive(timeout=10).body == "to-0"
        links[("one", 0)].accept()
        took_over = links[("two", 1)].receive(timeout=10)
        assert took_over.body == "to-1"
        assert (took_over.instructions or {}).get(symbol("spate:active")) is True
        links[("two", 1)].accept()


def test_a_target_partition_annotation_names_the_partition(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    topology = make_super(partitions=3)
    with blocking(gateway) as conn:
        sender = conn.create_sender(topology.name, name=unique("tx"))
        message = keyed("pinned", "hello1")  # hello1 would go to partition 1
        message.instructions = {symbol("event-streams-target-partition"): symbol("2")}
        assert sender.send(message).remote_state == Delivery.ACCEPTED
        message = keyed("nowhere", "hello1")
        message.instructions = {symbol("event-streams-target-partition"): symbol("3")}
        name, text = rejected(sender, message)
        assert name == "amqp:not-found" and "'0'..'2'" in text
    assert stream_bodies(gateway, topology.partitions[2], 1) == ["pinned"]


@pytest.mark.memory_broker_only
def test_each_message_gets_its_partitions_outcome(
    gateway: RunningGateway,
    broker: MemoryBroker,
    loop_thread: LoopThread,
    make_super: Callable[..., SuperStream],
) -> None:
    """A failed append on one partition rejects only that partition's messages."""
    from spate.core.errors import Unavailable

    topology = make_super(partitions=3)
    failing = topology.partitions[1]
    loop_thread.run(lambda: broker.fail_appends(failing, 0, Unavailable("no quorum")))
    with blocking(gateway) as conn:
        sender = conn.create_sender(topology.name, name=unique("tx"))
        name, text = rejected(sender, keyed("lost", "hello1"))  # -> partition 1
        assert name == "amqp:resource-locked" and "no quorum" in text
        assert sender.send(keyed("kept", "hello2")).remote_state == Delivery.ACCEPTED  # -> 0
        assert sender.send(keyed("again", "hello1")).remote_state == Delivery.ACCEPTED
    assert stream_bodies(gateway, topology.partitions[0], 1) == ["kept"]
    assert stream_bodies(gateway, topology.partitions[1], 1) == ["again"]


@pytest.mark.memory_broker_only
def test_a_topology_ahead_of_its_streams_is_refused_as_retryable(
    gateway: RunningGateway, broker: MemoryBroker, loop_thread: LoopThread
) -> None:
    """A broker that knows the topology before the partition streams (a node that has not
    applied the creation yet) refuses the attach as retryable rather than unknown."""
    topology = define(unique("ss"), partitions=2)
    loop_thread.run(lambda: broker.super_streams.__setitem__(topology.name, topology))
    with blocking(gateway) as conn:
        with pytest.raises(LinkDetached) as refused:
            conn.create_sender(topology.name, name=unique("tx"))
        condition = refused.value.link.remote_condition
        assert condition.name == "amqp:resource-locked"
        assert condition.info[symbol("spate:retryable")] is True
        assert f"{topology.partitions[0]!r} is not known here yet; retry" in condition.description


def test_the_group_key_fast_read_agrees_with_routing_fields() -> None:
    """ADR 0014: a super-stream link reads the group key after one `startswith` on the bytes
    before it; where `group_key_at` says the key is, `routing_fields` (the section walk) finds
    the same key, on valid layouts and on a seeded sweep of corruptions of them."""
    layouts = [
        keyed("x", "hello1"),
        Message(body=b"x" * 300, durable=True, annotations={GROUP_KEY: "k" * 200}),
        Message(body="x", durable=True, annotations={GROUP_KEY: symbol("sym-key")}),
        Message(body="x", annotations={GROUP_KEY: "first", symbol("other"): 1}),
        Message(body="x", annotations={symbol("other"): 1, GROUP_KEY: "second"}),  # not first
        Message(body="x", id="by-id"),
    ]
    raws = [bytes(m.encode()) for m in layouts]
    assert [sections.group_key_at(raw) > 0 for raw in raws] == [True] * 4 + [False] * 2
    rng = random.Random(20261125)
    fast_reads = 0
    for raw in raws:
        for _ in range(400):
            i = rng.randrange(len(raw))
            bad = raw[:i] + bytes((rng.randrange(256),)) + raw[i + 1 :]
            at = sections.group_key_at(bad)
            if at < 0 or not sections.is_plain(bad):
                continue
            fast_reads += 1
            key = bad[at + 2 : at + 2 + bad[at + 1]]
            try:
                walked, _ = sections.routing_fields(bad)
            except sections.MalformedMessage:
                continue  # a later map entry is broken: like any plain message's path, the
                # fast path checks the section structure only (is_plain), not every value
            if isinstance(walked, str):
                assert key.decode("utf-8") == walked, (raw, i)
    assert fast_reads > 500


def test_a_partition_changes_hands_through_the_stored_offset_as_instances_come_and_go(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    """ADR 0013's spread groups: when a second instance joins, the first steps down from
    partition 1 after storing what it accepted, and the second starts right after it; when the
    second leaves, the first takes partition 1 back after what the second accepted. What either
    accepted is never delivered to the other; only what was in flight unsettled may be."""
    topology = make_super(partitions=2)
    properties = LinkProperties(
        {symbol("spate:consumer-name"): "ledger", symbol("spate:single-active-consumer"): True}
    )
    active = symbol("spate:active")

    def publish(*bodies: str) -> None:
        with blocking(gateway) as conn:
            sender = conn.create_sender(topology.name, name=unique("tx"))
            for body in bodies:  # hello3 -> partition 1 of 2
                assert sender.send(keyed(body, "hello3")).remote_state == Delivery.ACCEPTED

    with blocking(gateway) as one, blocking(gateway) as two:
        first = {
            p: one.create_receiver(stream, name=unique("rx"), credit=10, options=[properties])
            for p, stream in enumerate(topology.partitions)
        }
        publish("a")
        assert first[1].receive(timeout=10).body == "a"
        first[1].accept()  # done: stored when it steps down
        second = {
            p: two.create_receiver(stream, name=unique("rx"), credit=10, options=[properties])
            for p, stream in enumerate(topology.partitions)
        }
        assert second[1].link.remote_properties[active] is False  # the first still holds it
        publish("b")
        got = second[1].receive(timeout=10)  # after the first's stored offset: b, never a
        assert (got.body, (got.instructions or {}).get(active)) == ("b", True)
        second[1].accept()
        second[1].close()  # stores b, leaves: the first is designated again
        publish("c")
        seen = []
        while True:  # anything the first had in flight before stepping down comes first
            message = first[1].receive(timeout=10)
            seen.append(message.body)
            first[1].accept()
            if (message.instructions or {}).get(active):
                break
        assert seen[-1] == "c" and set(seen[:-1]) <= {"b"}, seen


def test_spate_client_publishes_to_a_super_stream_by_message_id_or_group_key(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    """spate.client's Producer attaches to the super stream's address like any stream; a
    `proton.Message` carries the routing key (its id, or the group-key annotation)."""
    topology = make_super(partitions=3)
    with Producer(gateway.url, topology.name, timeout_s=10) as producer:
        producer.send(Message(id="hello4", body="by-id"))  # hello4 -> 2 of 3 (RabbitMQ's table)
        producer.send(keyed("by-key", "hello2"))  # hello2 -> 0
        with pytest.raises(PublishRefused, match="no routing key"):
            producer.send(b"no key")
    assert stream_bodies(gateway, topology.partitions[2], 1) == ["by-id"]
    assert stream_bodies(gateway, topology.partitions[0], 1) == ["by-key"]


def test_a_super_streams_info_names_its_partition_streams(
    gateway: RunningGateway, make_super: Callable[..., SuperStream]
) -> None:
    """`<super stream>/$info`: the partition streams in partition order with their binding
    keys and the routing — how a reader (the Spark connector's superStream option) finds
    partition streams named by binding keys. Each is then an ordinary stream with its own
    `$info`."""
    by_keys = make_super(binding_keys=("amer", "emea", "apac"))
    by_count = make_super(partitions=2)
    with blocking(gateway) as conn:
        for topology, routing in ((by_keys, "key"), (by_count, "hash")):
            receiver = conn.create_receiver(f"{topology.name}/$info", name=unique("i"), credit=1)
            body = receiver.receive(timeout=10).body
            receiver.accept()
            assert body["super-stream"] == topology.name
            assert body["routing"] == routing
            assert body["partition-streams"] == list(topology.partitions)
            assert body["binding-keys"] == list(topology.binding_keys)
            assert body["partition-count"] == len(topology.partitions)
        assert by_keys.partitions[1] == f"{by_keys.name}-emea"
        partition = conn.create_receiver(f"{by_keys.partitions[1]}/$info", name=unique("i"))
        assert partition.receive(timeout=10).body["stream"] == by_keys.partitions[1]
