"""000 §4.5 (consumer groups), §4.5.1 (node-assigned ownership), §4.5.2 (consumer-negotiated
ownership), §4.6.2, §4.6.3 and §4.6.5, with python-qpid-proton and (for the group-epoch
clauses) rhea, over the in-memory broker and a proxy gateway in front of a real node.

Spate's design: docs/adr/0015-consumer-groups.md. Two documented choices:
- §4.5 and §4.6.2 say a group link MUST be partition-bound, while §4.5.1 lets the node "attach
  consumer group links while leaving them partition-agnostic". Spate binds a group link that
  names a partition (negotiated ownership, epochs) and makes one that does not a
  partition-agnostic member of the group's coordinator (§4.5.1's last paragraph): the tests
  below check each half.
- §4.5.2's epoch "MAY be reset to zero" when no link remains: Spate never resets it (an
  epoch never goes backwards; a stale one is refused).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
from proton import Timeout, symbol, ulong
from proton.utils import LinkDetached
from support.amqp_clients import (
    LinkProperties,
    RunningGateway,
    blocking,
    offset_filter,
    publish,
    run_rhea,
    unique,
)
from support.event_streams import PARTITION, SOURCE_PARTITION
from support.group_crew import define_group

GROUP = symbol("event-streams-consumer-group")
EPOCH = symbol("event-streams-epoch")
ASSOCIATED = "event-streams-associated-partitions-changed"


def group_link(group: str, partition: str | None = "0", epoch: Any = None) -> LinkProperties:
    props: dict[Any, Any] = {GROUP: group}
    if partition is not None:
        props[PARTITION] = symbol(partition)
    if epoch is not None:
        props[EPOCH] = epoch
    return LinkProperties(props)


def associated(message: Any) -> list[str] | None:
    value = (message.instructions or {}).get(ASSOCIATED)
    return None if value is None else [str(p) for p in value.elements]


def pump(conn: Any, seconds: float = 0.2) -> None:
    """Let a blocking connection send what it queued (a detach, dispositions)."""
    with contextlib.suppress(Timeout):
        conn.wait(lambda: False, timeout=seconds)


@pytest.mark.routing
def test_4_5_the_node_never_puts_a_link_in_a_group_on_its_own(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """§4.5: "The event log node MUST NOT assign a consumer group on its own. Consumer group
    membership claims MUST be made by the consumer." Two receivers without the property on one
    partition both receive; neither is answered with a group."""
    stream = make_stream(partitions=2)
    publish(gateway, stream, ["x"], {PARTITION: symbol("0")})
    with blocking(gateway) as conn:
        links = [
            conn.create_receiver(
                stream,
                name=unique("r"),
                options=[LinkProperties({PARTITION: symbol("0")}), offset_filter("first")],
            )
            for _ in range(2)
        ]
        for link in links:
            assert GROUP not in (link.link.remote_properties or {})
            assert link.receive(timeout=10).body == "x"


@pytest.mark.routing
def test_4_5_at_most_one_active_receiver_per_partition_and_group(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """§4.5: "If consumer groups are being used, the event log node MUST allow at most one
    active 'receive' link for each combination of partition and consumer group." """
    stream = make_stream(partitions=2)
    with blocking(gateway) as conn:
        conn.create_receiver(stream, name=unique("a"), options=[group_link("g")])
        with pytest.raises(LinkDetached, match="resource-locked"):
            conn.create_receiver(stream, name=unique("b"), options=[group_link("g")])
        # another partition, or another group, is another combination
        conn.create_receiver(stream, name=unique("c"), options=[group_link("g", "1")])
        conn.create_receiver(stream, name=unique("d"), options=[group_link("h")])


@pytest.mark.routing
def test_4_5_and_4_6_2_a_group_link_naming_a_partition_is_bound_to_it(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """§4.5: "Links that are bound to consumer groups MUST also be bound to a partition";
    §4.6.2: "A negotiated link carrying this property MUST be partition-bound." The reply names
    the partition (a symbol), and every transfer comes from it."""
    stream = make_stream(partitions=3)
    publish(gateway, stream, ["x", "y"], {PARTITION: symbol("2")})
    with blocking(gateway) as conn:
        link = conn.create_receiver(
            stream, name=unique("a"), options=[group_link("g", "2"), offset_filter("first")]
        )
        assert link.link.remote_properties[PARTITION] == symbol("2")
        for _ in range(2):
            assert link.receive(timeout=10).instructions[SOURCE_PARTITION] == "2"
            link.accept()


def test_4_5_1_a_group_link_without_a_partition_is_served_by_the_node(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """§4.5.1: "If the consumer attaches a link scoped to a consumer group without specifying a
    partition, the event log node MAY bind a partition to the link" — or (last paragraph) "MAY
    also attach consumer group links while leaving them partition-agnostics", which Spate does:
    the link is a member of the group's coordinator and receives from what it is given."""
    stream = make_stream(partitions=2)
    define_group(broker, loop_thread, stream, "g")
    publish(gateway, stream, ["a"], {PARTITION: symbol("0")})
    publish(gateway, stream, ["b"], {PARTITION: symbol("1")})
    with blocking(gateway) as conn:
        link = conn.create_receiver(
            stream, name=unique("m"), options=[group_link("g", None), offset_filter("first")]
        )
        assert PARTITION not in (link.link.remote_properties or {})
        got = sorted(link.receive(timeout=10).body for _ in range(2))
        assert got == ["a", "b"]


def test_4_5_1_surplus_attaches_are_kept_pending_until_a_partition_frees_up(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """§4.5.1 scenario 2: the node "MAY instead choose not to deny attaching the link outright,
    but keep further incoming attach requests pending and complete those only once a
    partition becomes again available for assignment"."""
    stream = make_stream(partitions=1 + 1)
    define_group(broker, loop_thread, stream, "w")
    with blocking(gateway) as conn, blocking(gateway, timeout_s=30) as later:
        first = conn.create_receiver(stream, name=unique("m"), options=[group_link("w", None)])
        conn.create_receiver(stream, name=unique("m"), options=[group_link("w", None)])
        done = threading.Event()
        thread = threading.Thread(
            target=lambda: (
                later.create_receiver(stream, name=unique("m"), options=[group_link("w", None)]),
                done.set(),
            )
        )
        thread.start()
        assert not done.wait(0.5)  # pending
        first.close()
        pump(conn)
        thread.join(20)
        assert done.is_set()


def test_4_5_1_and_4_6_5_an_agnostic_group_link_is_told_when_its_partitions_change(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """§4.5.1: "the event log SHOULD use the event-streams-associated-partitions-changed
    delivery annotation on the next transfer"; §4.6.5: "For all partition-agnostic consumer
    links, the event log node SHOULD add this annotation to the next transfer to the consumer
    every time the association of partitions with the link changes." (an array of symbols)"""
    stream = make_stream(partitions=2)
    define_group(broker, loop_thread, stream, "g")
    with blocking(gateway) as one, blocking(gateway) as two:
        a = one.create_receiver(
            stream, name=unique("a"), credit=20, options=[group_link("g", None)]
        )
        publish(gateway, stream, ["x0"], {PARTITION: symbol("0")})
        first = a.receive(timeout=10)
        a.accept()
        assert associated(first) == ["0", "1"]
        b = two.create_receiver(
            stream, name=unique("b"), credit=20, options=[group_link("g", None)]
        )
        publish(gateway, stream, ["y0"], {PARTITION: symbol("0")})
        publish(gateway, stream, ["y1"], {PARTITION: symbol("1")})
        after_a, after_b = a.receive(timeout=10), b.receive(timeout=10)
        assert (after_a.body, associated(after_a)) == ("y0", ["0"])
        assert (after_b.body, associated(after_b)) == ("y1", ["1"])
        a.accept()
        b.accept()
        publish(gateway, stream, ["z0"], {PARTITION: symbol("0")})
        assert associated(a.receive(timeout=10)) is None  # only when it changes


@pytest.mark.routing
def test_4_5_2_the_epoch_starts_at_zero_and_is_returned_on_attach(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """§4.5.2: the epoch "is seeded with the value zero and is returned in the
    event-streams-epoch link property to the receiver during a successful attempt to attach"
    (a ulong, as §4.5.2 names it)."""
    stream = make_stream(partitions=2)
    with blocking(gateway) as conn:
        link = conn.create_receiver(stream, name=unique("a"), options=[group_link("g")])
        epoch = link.link.remote_properties[EPOCH]
        assert epoch == 0 and isinstance(epoch, ulong)


@pytest.mark.routing
@pytest.mark.parametrize("client", ["proton", "rhea"])
def test_4_5_2_a_competing_attach_is_rejected_unless_its_epoch_is_greater(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """§4.5.2: "Any subsequent attempt to attach a link to the same combination of partition and
    consumer group of an already active link MUST be rejected UNLESS the newly attaching
    receiver provides an epoch counter greater than the current epoch counter value"."""
    stream = make_stream(partitions=2)
    with blocking(gateway) as conn:
        conn.create_receiver(stream, name=unique("a"), options=[group_link("g", epoch=ulong(4))])
        if client == "proton":
            # refused: owned (not above), or stale (below the epoch the partition recorded)
            for epoch in (None, ulong(3), ulong(4)):
                with pytest.raises(LinkDetached, match=r"resource-locked|precondition-failed"):
                    conn.create_receiver(
                        stream, name=unique("b"), options=[group_link("g", epoch=epoch)]
                    )
            return
        props = {
            "event-streams-consumer-group": {"type": "string", "value": "g"},
            "event-streams-partition": "0",
            "event-streams-epoch": {"type": "ulong", "value": 4},
        }
        report = run_rhea(
            gateway, [{"op": "attach", "address": stream, "role": "receiver", "properties": props}]
        )
        (step,) = report["steps"]
        assert step["error"]["condition"] == "amqp:resource-locked", step


@pytest.mark.routing
@pytest.mark.parametrize("client", ["proton", "rhea"])
def test_4_5_2_a_greater_epoch_closes_the_existing_link_and_is_recorded(
    gateway: RunningGateway, make_stream: Callable[..., str], client: str
) -> None:
    """§4.5.2: "If the epoch counter is provided and greater than the current epoch value, any
    existing link for the given partition and consumer group is closed by the node, the new
    link is attached, and the new epoch counter value is recorded." """
    stream = make_stream(partitions=2)
    with blocking(gateway) as conn:
        old = conn.create_receiver(stream, name=unique("a"), options=[group_link("g")])
        if client == "proton":
            with blocking(gateway) as other:
                new = other.create_receiver(
                    stream, name=unique("b"), options=[group_link("g", epoch=ulong(9))]
                )
                assert new.link.remote_properties[EPOCH] == 9
        else:
            props = {
                "event-streams-consumer-group": {"type": "string", "value": "g"},
                "event-streams-partition": "0",
                "event-streams-epoch": {"type": "ulong", "value": 9},
            }
            step = {"op": "consume", "address": stream, "count": 0, "properties": props}
            report = run_rhea(gateway, [step | {"op": "attach", "role": "receiver"}])
            assert report["steps"][0].get("opened"), report
        with pytest.raises(LinkDetached, match="amqp:link:stolen"):
            old.receive(timeout=10)
        # recorded: an attach now needs more than 9 to take over
        conn.create_receiver(stream, name=unique("c"), options=[group_link("g")]).close()
        with pytest.raises(LinkDetached, match="precondition-failed"):
            conn.create_receiver(stream, name=unique("d"), options=[group_link("g", epoch=8)])


@pytest.mark.routing
def test_4_6_3_the_epoch_may_be_sent_as_a_long(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """§4.6.3: "The event-streams-epoch link property is a long integer value" (§4.5.2 says
    ulong): an attach carrying a long is accepted; the reply is the ulong §4.5.2 names."""
    stream = make_stream(partitions=2)
    with blocking(gateway) as conn:
        link = conn.create_receiver(stream, name=unique("a"), options=[group_link("g", epoch=5)])
        epoch = link.link.remote_properties[EPOCH]
        assert epoch == 5 and isinstance(epoch, ulong)


def test_4_6_2_a_node_requiring_configured_groups_refuses_an_unknown_one(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """§4.6.2: "An implementation MAY require for the group identifier to correspond to a
    configured item on the event stream engine and otherwise refuse to attach the link."
    (`--require-defined-groups`)"""
    stream = make_stream(partitions=2)
    loop_thread.run(lambda: setattr(broker, "groups_required", True))
    with blocking(gateway) as conn:
        with pytest.raises(LinkDetached, match="not-found") as refused:
            conn.create_receiver(stream, name=unique("a"), options=[group_link("nope")])
        assert "spate group create" in str(refused.value)
        define_group(broker, loop_thread, stream, "yes")
        conn.create_receiver(stream, name=unique("b"), options=[group_link("yes")]).close()
