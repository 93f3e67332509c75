"""Consumer groups over AMQP (issue 9, ADR 0015; 000 §4.5, §4.5.1, §4.5.2, §4.6.2, §4.6.3)
through python-qpid-proton, against every broker of the gateway suite (memory, node, proxy).

Contract: a receiver attaching with `event-streams-consumer-group` is its group's receiver of
one partition (the one it binds with `event-streams-partition`, or the first one free, which
the reply names); at most one per (partition, group); the reply carries the epoch
(`event-streams-epoch`, ulong); a competing attach is refused unless its epoch is greater, and
then the owner is detached with `amqp:link:stolen` after storing what it finished, and the new
link starts after the group's committed offset. Epochs never go back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from proton import Message, Timeout, symbol, ulong
from proton.utils import LinkDetached
from spate.core import groups, ownership
from spate.core.errors import AlreadyExists, FailedPrecondition, Unavailable
from spate.core.ids import PartitionId, StreamName
from spate.core.streams import StreamConfig
from support.amqp_clients import (
    LinkProperties,
    RunningGateway,
    blocking,
    fill,
    offset_filter,
    publish,
    receive,
    run_rhea,
    unique,
)
from support.group_crew import define_group
from support.memory_broker import MemoryBroker

GROUP = symbol("event-streams-consumer-group")
EPOCH = symbol("event-streams-epoch")
PARTITION = symbol("event-streams-partition")
STORED = symbol("spate:stored-offset")
NAME = symbol("spate:consumer-name")


def grouped(group: str, partition: str | None = "0", epoch: Any = None) -> LinkProperties:
    props: dict[Any, Any] = {GROUP: group}
    if partition is not None:
        props[PARTITION] = symbol(partition)
    if epoch is not None:
        props[EPOCH] = epoch
    return LinkProperties(props)


def pump(conn: Any, stream: str, seconds: float = 0.2) -> None:
    """Let a blocking connection send what it queued (dispositions) and read what came; then
    a round trip on it (a sender attached and detached: the node answers frames in order), so
    the node has taken the dispositions in however long a loaded machine needs (the wait alone
    was not enough once in CI)."""
    with contextlib.suppress(Timeout):
        conn.wait(lambda: False, timeout=seconds)
    conn.create_sender(stream, name=unique("sync")).close()


def test_one_receiver_per_partition_and_group_with_its_epoch_echoed(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """§4.5: "the event log node MUST allow at most one active 'receive' link for each
    combination of partition and consumer group"; §4.5.2: the epoch "is seeded with the value
    zero and is returned in the event-streams-epoch link property"; §4.3: the bound partition
    is set on the reply."""
    stream = make_stream(partitions=2)
    with blocking(gateway) as conn:
        owner = conn.create_receiver(stream, name=unique("a"), options=[grouped("g")])
        props = owner.link.remote_properties
        assert props[GROUP] == "g"
        assert props[EPOCH] == 0 and isinstance(props[EPOCH], ulong)
        assert props[PARTITION] == "0" and isinstance(props[PARTITION], symbol)
        with pytest.raises(Exception, match="resource-locked") as refused:
            conn.create_receiver(stream, name=unique("b"), options=[grouped("g")])
        assert "epoch" in str(refused.value)
        with pytest.raises(Exception, match="resource-locked"):  # not above: refused too
            conn.create_receiver(stream, name=unique("b"), options=[grouped("g", epoch=0)])
        # another group, or another partition of the same group, is free
        conn.create_receiver(stream, name=unique("c"), options=[grouped("h")]).close()
        other = conn.create_receiver(stream, name=unique("d"), options=[grouped("g", "1")])
        assert other.link.remote_properties[PARTITION] == "1"
        other.close()
        owner.close()
        # the partition is free again: an attach without an epoch gets the current one
        again = conn.create_receiver(stream, name=unique("e"), options=[grouped("g")])
        assert again.link.remote_properties[EPOCH] == 0


@pytest.mark.parametrize("epoch_type", [ulong, int], ids=["ulong", "long"])
def test_a_greater_epoch_takes_over_after_the_owner_committed_what_it_finished(
    gateway: RunningGateway, make_stream: Callable[..., str], epoch_type: Callable[[int], Any]
) -> None:
    """§4.5.2: "If the epoch counter is provided and greater than the current epoch value, any
    existing link for the given partition and consumer group is closed by the node, the new
    link is attached, and the new epoch counter value is recorded." (§4.5.2 names ulong,
    §4.6.3 long: both are accepted; the reply is a ulong.)"""
    stream = make_stream()
    fill(gateway, stream, 6)
    with blocking(gateway) as one, blocking(gateway) as two:
        old = one.create_receiver(
            stream, name=unique("old"), credit=3, options=[grouped("g"), offset_filter("first")]
        )
        assert [m.body for m in receive(old, 3)] == ["m0", "m1", "m2"]
        pump(one, stream)  # the accepts reach the node
        new = two.create_receiver(
            stream, name=unique("new"), credit=10, options=[grouped("g", epoch=epoch_type(7))]
        )
        assert new.link.remote_properties[EPOCH] == 7
        assert isinstance(new.link.remote_properties[EPOCH], ulong)
        assert new.link.remote_properties[STORED] == 2  # the old owner's commit
        assert [m.body for m in receive(new, 3)] == ["m3", "m4", "m5"]
        late = []  # sent to the old owner before it stepped down, never accepted by it
        with pytest.raises(LinkDetached) as stolen:
            for _ in range(10):
                late.append(old.receive(timeout=5).body)
        assert set(late) <= {"m3", "m4", "m5"}  # only its unsettled window is delivered twice
        assert "amqp:link:stolen" in str(stolen.value)
        assert "greater epoch" in str(stolen.value)
        # and the stale epoch is refused from now on, even with no owner
        new.close()
        pump(two, stream)
        with pytest.raises(Exception, match="precondition-failed") as stale:
            one.create_receiver(stream, name=unique("z"), options=[grouped("g", epoch=3)])
        assert "stale" in str(stale.value)
        back = one.create_receiver(stream, name=unique("y"), options=[grouped("g")])
        assert back.link.remote_properties[EPOCH] == 7  # never reset


def test_group_links_resume_after_the_committed_offset_and_deliveries_say_their_partition(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream(partitions=2)
    publish(gateway, stream, [f"m{i}" for i in range(4)], {PARTITION: symbol("1")})
    with blocking(gateway) as conn:
        first = conn.create_receiver(
            stream, name=unique("a"), credit=2, options=[grouped("g", "1"), offset_filter("first")]
        )
        got = receive(first, 2)
        assert [m.body for m in got] == ["m0", "m1"]
        assert got[0].instructions["event-streams-source-partition"] == "1"
        first.close()
        later = conn.create_receiver(
            stream, name=unique("b"), credit=5, options=[grouped("g", "1")]
        )
        assert later.link.remote_properties[STORED] == 1
        assert [m.body for m in receive(later, 2)] == ["m2", "m3"]


def test_misuse_is_refused_with_a_clear_condition(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream(partitions=2)
    cases: list[tuple[dict[Any, Any], str]] = [
        ({EPOCH: 1, PARTITION: symbol("0")}, "needs 'event-streams-consumer-group'"),
        ({GROUP: "g", PARTITION: symbol("0"), EPOCH: -1}, "outside"),
        ({GROUP: "g", PARTITION: symbol("0"), EPOCH: True}, "integer"),
        ({GROUP: "g", EPOCH: 1}, "is per partition"),
        ({GROUP: "$g", PARTITION: symbol("0")}, "must not start with"),
        ({GROUP: "g", NAME: "n", PARTITION: symbol("0")}, "stores the group's offsets"),
        ({GROUP: "", PARTITION: symbol("0")}, "non-empty string"),
        ({NAME: "$group/g", PARTITION: symbol("0")}, "reserved"),
    ]
    with blocking(gateway) as conn:
        owner = conn.create_receiver(stream, name=unique("o"), options=[grouped("g")])
        for props, says in cases:
            with pytest.raises(Exception, match="invalid-field") as refused:
                conn.create_receiver(stream, name=unique("x"), options=[LinkProperties(props)])
            assert says in str(refused.value), (props, str(refused.value))
        fill(gateway, stream, 1)
        assert owner.link.remote_properties[EPOCH] == 0  # the owner is unaffected


def test_commits_from_a_displaced_owner_are_refused() -> None:
    """Zombie fencing at the partition (ADR 0015): once another link took the partition over,
    the displaced owner's stores are refused, and a stale epoch cannot claim it back."""

    async def scenario() -> None:
        broker = MemoryBroker(commit_delay_s=0.0)
        broker.create_stream(StreamConfig(StreamName("s"), partitions=1))
        part: Any = broker.partition(StreamName("s"), PartitionId(0), write=True)
        name = groups.committed_name("g").encode()
        first = await part.claim(name, None)
        assert (first.active, first.epoch) == (True, 0)
        await part.store_offset(name, 4, first.member)
        with pytest.raises(AlreadyExists):
            await part.claim(name, 0)
        second = await part.claim(name, 2)
        assert not second.active  # the owner steps down first
        await part.step_down(name, first.member, 5)  # still the owner: stored
        now = await part.until_active(name, second.member)
        assert now.active and now.stored is not None and now.stored.offset == 5
        with pytest.raises(FailedPrecondition, match="no longer owns"):
            await part.store_offset(name, 9, first.member)
        await part.consumer_detach(name, 9, first.member)  # fenced: not stored, no error
        assert part.offsets[name].offset == 5
        assert part.offsets[ownership.epoch_name(name)].offset == 2
        with pytest.raises(FailedPrecondition, match="stale"):
            await part.claim(name, 1)

    asyncio.run(scenario())


def rhea_group(group: str, epoch: int | None = None) -> dict[str, Any]:
    props: dict[str, Any] = {
        "event-streams-consumer-group": {"type": "string", "value": group},
        "event-streams-partition": "0",
    }
    if epoch is not None:
        props["event-streams-epoch"] = {"type": "ulong", "value": epoch}
    return props


def test_rhea_takes_over_a_proton_owner_with_a_greater_epoch(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """§4.5.2 with rhea on the attaching side: the epoch travels as a ulong both ways."""
    stream = make_stream()
    fill(gateway, stream, 4)
    with blocking(gateway) as conn:
        owner = conn.create_receiver(
            stream, name=unique("o"), credit=2, options=[grouped("rg"), offset_filter("first")]
        )
        assert [m.body for m in receive(owner, 2)] == ["m0", "m1"]
        pump(conn, stream)
        step = {"op": "consume", "address": stream, "count": 2, "exact": True}
        report = run_rhea(gateway, [step | {"properties": rhea_group("rg", 5)}])
        (done,) = report["steps"]
        assert done["attach_properties"]["event-streams-epoch"] == "5", done
        assert done["attach_properties"]["event-streams-partition"] == "0"
        assert [m["body"] for m in done["messages"]] == ["m2", "m3"]  # after the commit
        with pytest.raises(LinkDetached, match="amqp:link:stolen"):
            for _ in range(10):
                owner.receive(timeout=5)


def test_a_proton_attach_with_a_greater_epoch_steals_a_rhea_owners_link(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    for attempt in range(3):
        group = f"rp{attempt}"
        report = _steal_from_rhea(gateway, stream, group)
        (done,) = report["steps"]
        if done.get("error", {}).get("condition") == "amqp:resource-locked":
            continue  # a probe of ours held the partition as rhea attached: again
        assert done["error"]["condition"] == "amqp:link:stolen", done
        assert "greater epoch" in done["error"]["description"]
        return
    raise AssertionError("rhea never got to own the partition")


def _steal_from_rhea(gateway: RunningGateway, stream: str, group: str) -> dict[str, Any]:
    """rhea owns partition 0 for `group` (probed by attaching without an epoch, which is
    refused once it does), then a proton link with epoch 1 takes it over."""
    report: dict[str, Any] = {}
    step = {"op": "consume", "address": stream, "count": 100, "properties": rhea_group(group)}

    def rhea() -> None:
        report.update(run_rhea(gateway, [step]))

    thread = threading.Thread(target=rhea)
    thread.start()
    try:
        with blocking(gateway) as conn:
            deadline = time.monotonic() + 20
            while thread.is_alive():
                try:
                    conn.create_receiver(stream, name=unique("p"), options=[grouped(group)]).close()
                except Exception as refused:
                    assert "resource-locked" in str(refused)
                    thief = conn.create_receiver(
                        stream, name=unique("t"), options=[grouped(group, epoch=1)]
                    )
                    assert thief.link.remote_properties[EPOCH] == 1
                    break
                assert time.monotonic() < deadline, "the rhea link never owned the partition"
                time.sleep(0.05)
    finally:
        thread.join(30)
    return report


def test_client_group_consumers_commit_and_one_takes_over_with_an_epoch(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    from spate.client import Consumer

    stream = make_stream(partitions=2)
    publish(gateway, stream, [f"m{i}" for i in range(6)], {PARTITION: symbol("1")})
    first = Consumer(gateway.url, stream, group="cg", partition=1, start="first")
    try:
        assert (first.epoch, first.partition) == (0, 1)
        assert [first.receive().offset for _ in range(3)] == [0, 1, 2]
    finally:
        first.close()  # commits what it finished: offsets 0, 1 (2 was taken, not finished)
    second = Consumer(gateway.url, stream, group="cg", partition=1, epoch=4)
    try:
        assert (second.epoch, second.stored_offset) == (4, 2)
        assert [second.receive().offset for _ in range(3)] == [3, 4, 5]
    finally:
        second.close()
    with pytest.raises(ValueError, match="epoch"):
        Consumer(gateway.url, stream, epoch=1)


# partition-agnostic group links: members of the group's coordinator (000 §4.5.1, 003) ------------

ASSOCIATED = "event-streams-associated-partitions-changed"


def associated(message: Any) -> list[str] | None:
    """The message's `event-streams-associated-partitions-changed` (an array of symbols)."""
    value = (message.instructions or {}).get(ASSOCIATED)
    return None if value is None else [str(p) for p in value.elements]


def publish_to(gateway: RunningGateway, stream: str, partition: int, bodies: list[str]) -> None:
    publish(gateway, stream, bodies, {PARTITION: symbol(str(partition))})


def take(receiver: Any, count: int) -> list[Any]:
    out = []
    for _ in range(count):
        out.append(receiver.receive(timeout=15))
        receiver.accept()
    return out


def test_agnostic_members_share_the_partitions_and_are_told_when_theirs_change(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """000 §4.5.1: "The event log node MAY also attach consumer group links while leaving them
    partition-agnostic ... the event log SHOULD use the event-streams-associated-partitions-
    changed delivery annotation on the next transfer to notify the consumer of the new
    association"; 003 round-robin with a rebalance when a member joins and when it leaves."""
    stream = make_stream(partitions=4)
    define_group(broker, loop_thread, stream, "g")
    for p in range(4):
        publish_to(gateway, stream, p, [f"a{p}"])
    with blocking(gateway) as one, blocking(gateway) as two:
        a = one.create_receiver(
            stream,
            name=unique("a"),
            credit=50,
            options=[grouped("g", None), offset_filter("first")],
        )
        assert PARTITION not in (a.link.remote_properties or {})  # partition-agnostic
        got = take(a, 4)
        assert sorted(m.body for m in got) == ["a0", "a1", "a2", "a3"]
        assert associated(got[0]) == ["0", "1", "2", "3"]
        assert all(associated(m) is None for m in got[1:])
        assert {m.instructions["event-streams-source-partition"] for m in got} == {
            "0",
            "1",
            "2",
            "3",
        }
        pump(one, stream)
        b = two.create_receiver(stream, name=unique("b"), credit=50, options=[grouped("g", None)])
        for p in range(4):
            publish_to(gateway, stream, p, [f"b{p}"])
        got_b = take(b, 2)
        assert sorted(m.body for m in got_b) == ["b1", "b3"]  # after what `a` committed
        assert associated(got_b[0]) == ["1", "3"]
        got_a = take(a, 2)
        assert sorted(m.body for m in got_a) == ["b0", "b2"]
        assert associated(got_a[0]) == ["0", "2"]
        b.close()  # leaves: `a` gets every partition back
        pump(two, stream)
        for p in range(4):
            publish_to(gateway, stream, p, [f"c{p}"])
        got_a = take(a, 4)
        assert sorted(m.body for m in got_a) == ["c0", "c1", "c2", "c3"]
        # the first transfer after the change says so (messages of partitions it held
        # all along may come before it)
        told = [associated(m) for m in got_a if associated(m) is not None]
        assert told == [["0", "1", "2", "3"]]


def test_a_surplus_member_waits_attached_until_a_partition_frees_up(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """000 §4.5.1 scenario 2: "keep further incoming attach requests pending and complete those
    only once a partition becomes again available for assignment"."""
    stream = make_stream(partitions=2)
    define_group(broker, loop_thread, stream, "w")
    with blocking(gateway) as conn, blocking(gateway, timeout_s=30) as later:
        first = conn.create_receiver(stream, name=unique("m"), options=[grouped("w", None)])
        conn.create_receiver(stream, name=unique("m"), options=[grouped("w", None)])
        attached: list[Any] = []
        thread = threading.Thread(
            target=lambda: attached.append(
                later.create_receiver(stream, name=unique("m"), options=[grouped("w", None)])
            )
        )
        thread.start()
        time.sleep(0.5)
        assert not attached  # pending: two members hold the two partitions
        first.close()
        pump(conn, stream)
        thread.join(20)
        assert attached, "the pending attach never completed"
        publish_to(gateway, stream, 0, ["x"])
        publish_to(gateway, stream, 1, ["y"])
        assert attached[0].receive(timeout=15).body in ("x", "y")


def test_a_member_that_goes_hands_its_partitions_over_after_its_commits(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """003 "Consumer Group Rebalancing": a member leaving triggers a rebalance; the member
    taking over starts after the group's committed offset (no gap, nothing twice)."""
    stream = make_stream(partitions=2)
    define_group(broker, loop_thread, stream, "h", "sticky")
    for p in range(2):
        publish_to(gateway, stream, p, [f"m{p}-{i}" for i in range(3)])
    with blocking(gateway) as one, blocking(gateway) as two:
        a = one.create_receiver(
            stream,
            name=unique("a"),
            credit=50,
            options=[grouped("h", None), offset_filter("first")],
        )
        first = take(a, 6)
        assert sorted(m.body for m in first) == sorted(
            f"m{p}-{i}" for p in range(2) for i in range(3)
        )
        pump(one, stream)
        b = two.create_receiver(stream, name=unique("b"), credit=50, options=[grouped("h", None)])
        a.close()  # b now holds both, starting after a's commits
        pump(one, stream)
        for p in range(2):
            publish_to(gateway, stream, p, [f"n{p}"])
        assert sorted(m.body for m in take(b, 2)) == ["n0", "n1"]


def test_an_unbound_client_consumer_gets_every_partitions_messages(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """Regression: offsets are per partition; the client dropped a partition's messages whose
    offsets were not above the last one seen on another partition as repeats."""
    from spate.client import Consumer

    stream = make_stream(partitions=2)
    publish_to(gateway, stream, 0, [f"p0-{i}" for i in range(3)])
    publish_to(gateway, stream, 1, [f"p1-{i}" for i in range(3)])
    with Consumer(gateway.url, stream, start="first") as consumer:
        got = sorted((e.partition, e.offset) for e in (consumer.receive() for _ in range(6)))
    assert got == [(p, o) for p in ("0", "1") for o in range(3)]


def test_client_group_consumers_rebalance_and_report_their_partitions(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    from spate.client import GroupConsumer

    stream = make_stream(partitions=4)
    define_group(broker, loop_thread, stream, "gc", "range")
    seen: list[frozenset[int]] = []
    one = GroupConsumer(gateway.url, stream, "gc", start="first", on_assignment=seen.append)
    try:
        for p in range(4):
            publish_to(gateway, stream, p, [f"a{p}"])
        assert sorted(one.receive().partition for _ in range(4)) == ["0", "1", "2", "3"]
        assert one.assignment == {0, 1, 2, 3} and seen == [frozenset({0, 1, 2, 3})]
        two = GroupConsumer(gateway.url, stream, "gc")
        try:
            for p in range(4):
                publish_to(gateway, stream, p, [f"b{p}"])
            # range: `two` holds 2 and 3, from where `one` finished (what `one` took last and
            # had not finished comes again first)
            taken = []
            while not {"b2", "b3"} <= {e.body for e in taken}:
                taken.append(two.receive())
            assert {e.partition for e in taken} == {"2", "3"}
            assert sorted(one.receive().partition for _ in range(2)) == ["0", "1"]
            assert one.assignment == {0, 1} and two.assignment == {2, 3}
        finally:
            two.close()
        for p in range(4):
            publish_to(gateway, stream, p, [f"c{p}"])
        assert sorted(one.receive().body for _ in range(4)) == ["c0", "c1", "c2", "c3"]
    finally:
        one.close()


def test_three_then_five_then_two_members_lose_nothing(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """The three-node test's membership changes at this tier (tests/integration
    test_consumer_groups.py): every message reaches a member, and the group settles balanced
    after each change."""
    from support.group_crew import Crew, settle

    stream = make_stream(partitions=6)
    define_group(broker, loop_thread, stream, "crew")
    published = dict.fromkeys(range(6), 0)
    with blocking(gateway) as conn:
        senders = [
            conn.create_sender(
                stream, name=f"tx-{p}", options=LinkProperties({PARTITION: symbol(str(p))})
            )
            for p in range(6)
        ]

        def publish_round() -> None:
            for p, sender in enumerate(senders):
                sender.send(Message(body=f"{p}-{published[p]}"))
                published[p] += 1

        crew = Crew(gateway.url, stream, "crew")
        try:
            for size in (3, 5, 2):
                if size > len(crew.members):
                    crew.add(size - len(crew.members))
                else:
                    crew.remove(len(crew.members) - size)
                settle(crew, publish_round, 6, timeout_s=60)
            crew.wait_delivered(published, 30)
        finally:
            crew.close()


def test_a_claim_after_the_groups_were_disbanded_is_not_taken_for_a_plain_link() -> None:
    """Regression (benchmarks/consumer_groups.py under load): a partition that stopped leading
    disbanded its groups while the links' counts lingered (their detaches went to the new
    leader); when it led again, every claim was refused as if plain links held the name."""

    async def scenario() -> None:
        broker = MemoryBroker(commit_delay_s=0.0)
        broker.create_stream(StreamConfig(StreamName("s"), partitions=1))
        part: Any = broker.partition(StreamName("s"), PartitionId(0), write=True)
        name = groups.committed_name("g").encode()
        first = await part.claim(name, None, 3)
        assert first.active
        part.groups.disband()  # leadership went elsewhere; the link's count stays here
        again = await part.claim(name, None, 4)
        assert again.active and again.epoch == first.epoch + 1
        with pytest.raises(Unavailable, match="fenced by a newer rebalance"):
            await part.claim(name, None, 2)  # retryable for a member: it rejoins

    asyncio.run(scenario())


def test_a_group_consumer_commits_explicitly_and_the_next_member_resumes_after_it(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """003 "Committing Offsets" through spate.client: `commit="manual"` stores only on
    `commit()`, which returns once every partition's offset is stored (rcv-settle-mode second,
    per partition on a coordinator member's link)."""
    from spate.client import GroupConsumer

    stream = make_stream(partitions=2)
    define_group(broker, loop_thread, stream, "mc")
    for p in range(2):
        publish_to(gateway, stream, p, [f"m{p}-{i}" for i in range(3)])
    first = GroupConsumer(gateway.url, stream, "mc", start="first", commit="manual")
    try:
        got = sorted(first.receive().body for _ in range(4))
        first.commit()  # the four taken: stored on both partitions before it returns
        rest = sorted(first.receive().body for _ in range(2))  # taken, never committed
    finally:
        first.close()
    assert sorted(got + rest) == sorted(f"m{p}-{i}" for p in range(2) for i in range(3))
    second = GroupConsumer(gateway.url, stream, "mc")
    try:
        again = sorted(second.receive().body for _ in range(2))
    finally:
        second.close()
    assert again == rest  # exactly what was not committed


def test_members_beyond_the_pending_limit_are_refused_detach_forced(
    gateway: RunningGateway, make_stream: Callable[..., str], broker: Any, loop_thread: Any
) -> None:
    """000 §4.5.1 scenario 1: "consumers MAY see their attach requests immediately rejected
    with a detach-forced error since there are no partitions left to assign" — past the
    group's pending limit (`spate group create --pending-max 0` here)."""
    stream = make_stream(partitions=2)
    define_group(broker, loop_thread, stream, "full", pending_max=0)
    with blocking(gateway) as conn:
        for _ in range(2):
            conn.create_receiver(stream, name=unique("m"), options=[grouped("full", None)])
        with pytest.raises(LinkDetached, match="amqp:link:detach-forced") as refused:
            conn.create_receiver(stream, name=unique("m"), options=[grouped("full", None)])
        assert "waiting for one" in str(refused.value)


def test_a_client_consumer_whose_partition_is_taken_with_a_greater_epoch_stops_at_once(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """`amqp:link:stolen` ends a reconnecting client consumer with `LinkStolen`: attaching
    again with its old epoch could only be refused as stale (it used to try, and fail, once)."""
    from spate.client import Consumer, LinkStolen

    stream = make_stream(partitions=1)
    publish(gateway, stream, ["s0", "s1"], {PARTITION: symbol("0")})
    first = Consumer(
        gateway.url, stream, group="st", partition=0, start="first", reconnect_timeout_s=10
    )
    try:
        assert first.receive().offset == 0
        second = Consumer(gateway.url, stream, group="st", partition=0, epoch=2, start="first")
        try:
            assert second.epoch == 2
            assert second.receive().offset == 0  # first finished nothing: nothing stored
        finally:
            second.close()
        with pytest.raises(LinkStolen, match="amqp:link:stolen"):
            for _ in range(3):
                first.receive(timeout=10)
        assert first.reconnects == 0
    finally:
        first.close()
