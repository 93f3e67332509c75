"""`Broker.group_coordinator` (ADR 0015) against every broker of the gateway suite: the
in-memory fake, the node's own Coordinators at the leader of the stream's partition 0, and a
proxy gateway's RemoteCoordinator reaching them over the gateway wire (GROUP frames). Driven
directly, as a member link will drive it: join, sync in a loop, released, leave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from spate.core.coordination import generation_name
from spate.core.coordinator import Assignment, GroupCoordinator, GroupSettings, GroupState
from spate.core.errors import FailedPrecondition, NotFound, NotLeader, Unavailable
from spate.core.ids import MemberId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from support.amqp_clients import LoopThread, unique
from support.memory_broker import MemoryBroker
from support.node_broker import NodeBroker
from support.proxy_broker import ProxyBroker

NOW = GroupSettings(rebalance_delay_ms=0, session_timeout_ms=10_000)
"""Rebalance at once; a member polls well within its session."""
POLL_S = 1.0
WAIT_S = 10.0


def ps(*partitions: int) -> frozenset[PartitionId]:
    return frozenset(PartitionId(p) for p in partitions)


async def sync_until(
    coordinator: GroupCoordinator,
    group: str,
    member: MemberId,
    want: Callable[[Assignment], bool],
) -> Assignment:
    """Poll like a member link (each answer is the next poll's `known`) until `want` holds; a
    liveness bound, not a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    known: Assignment | None = None
    while True:
        known = await coordinator.sync(group, member, known, POLL_S)
        if want(known):
            return known
        assert loop.time() < deadline, f"member {member} still has {known}"


def home(broker: Any, stream: str) -> Any:
    """The home partition's replica (partition 0, at its leader), where generations are
    stored."""
    if isinstance(broker, ProxyBroker):
        broker = broker.node
    return broker.partition(StreamName(stream), PartitionId(0), write=True)


async def stored_generation(broker: Any, stream: str, group: str) -> int | None:
    stored = await home(broker, stream).stored_offset(generation_name(group))
    return None if stored is None else stored.offset


def test_two_members_share_the_partitions_with_revoke_before_assign(
    loop_thread: LoopThread,
    broker: MemoryBroker | NodeBroker | ProxyBroker,
    make_stream: Callable[..., str],
) -> None:
    """Round robin over 4 partitions: the first member gets everything; when a second joins,
    the first is told to release 1 and 3, which go to the second only after `released`; each
    generation is stored at the home partition before a member sees it; a leave gives its
    partitions back."""
    stream = make_stream(partitions=4)

    async def scenario() -> None:
        coordinator = broker.group_coordinator(StreamName(stream))
        first = await coordinator.join("g", NOW)
        alone = await sync_until(coordinator, "g", first, lambda a: a.partitions == ps(0, 1, 2, 3))
        assert alone.release == ps()
        assert await stored_generation(broker, stream, "g") == alone.generation >= 1

        second = await coordinator.join("g", NOW)
        assert second != first
        told = await sync_until(coordinator, "g", first, lambda a: bool(a.release))
        assert (told.partitions, told.release) == (ps(0, 2), ps(1, 3))
        assert told.generation == alone.generation + 1
        assert await stored_generation(broker, stream, "g") == told.generation
        waiting = await coordinator.sync("g", second, None, 0.0)
        assert waiting == Assignment(told.generation, ps(), ps())  # not before the release

        await coordinator.released("g", first, told.release, told.generation)
        given = await sync_until(coordinator, "g", second, lambda a: a.partitions == ps(1, 3))
        assert given.generation == told.generation
        kept = await coordinator.sync("g", first, None, 0.0)
        assert (kept.partitions, kept.release) == (ps(0, 2), ps())

        await coordinator.leave("g", second)
        back = await sync_until(coordinator, "g", first, lambda a: a.partitions == ps(0, 1, 2, 3))
        assert back.generation == told.generation + 1
        assert await stored_generation(broker, stream, "g") == back.generation
        with pytest.raises(NotFound):
            await coordinator.sync("g", second, None, 0.0)  # it left: join again
        await coordinator.leave("g", first)

    loop_thread.call(scenario(), timeout_s=60)


def test_describe_shows_members_holders_and_the_generation(
    loop_thread: LoopThread,
    broker: MemoryBroker | NodeBroker | ProxyBroker,
    make_stream: Callable[..., str],
) -> None:
    """`describe` (what `spate group describe` asks, no member needed): None before the first
    member and after the last leaves; in between, the members in joining order with what they
    hold and must release, the stored generation, the state and heartbeat times on the
    coordinator's clock."""
    stream = make_stream(partitions=3)

    async def scenario() -> None:
        coordinator = broker.group_coordinator(StreamName(stream))
        assert await coordinator.describe("g") is None
        first = await coordinator.join("g", NOW)
        await sync_until(coordinator, "g", first, lambda a: a.partitions == ps(0, 1, 2))
        second = await coordinator.join("g", NOW)
        told = await sync_until(coordinator, "g", first, lambda a: bool(a.release))
        view = await coordinator.describe("g")
        assert view is not None
        assert (view.strategy, view.partitions, view.generation) == ("round-robin", 3, 2)
        assert view.state is GroupState.REBALANCING  # 1 waits for its release
        assert [m.member for m in view.members] == [first, second]
        assert (view.members[0].partitions, view.members[0].release) == (ps(0, 2), ps(1))
        assert (view.members[1].partitions, view.members[1].release) == (ps(), ps())
        assert view.awaiting_release == ps(1) and view.unassigned == ps()
        for member in view.members:
            assert member.session_timeout_ms == NOW.session_timeout_ms
            assert 0 <= view.now_ms - member.last_heartbeat_ms < WAIT_S * 1000
        assert await stored_generation(broker, stream, "g") == view.generation

        await coordinator.released("g", first, told.release, told.generation)
        await sync_until(coordinator, "g", second, lambda a: a.partitions == ps(1))
        stable = await coordinator.describe("g")
        assert stable is not None and stable.state is GroupState.STABLE
        assert [(m.partitions, m.release) for m in stable.members] == [
            (ps(0, 2), ps()),
            (ps(1), ps()),
        ]
        await coordinator.leave("g", first)
        await coordinator.leave("g", second)
        gone = await coordinator.describe("g")
        while gone is not None:  # the generation of the empty group is stored, then it goes
            assert gone.members == () and gone.state is GroupState.REBALANCING
            await asyncio.sleep(0.01)
            gone = await coordinator.describe("g")
        # one generation per leave, or one for both when the second leave came before the
        # first one's generation was stored (timing: both happen)
        stored = await stored_generation(broker, stream, "g")
        assert stored in (stable.generation + 1, stable.generation + 2), stored
        assert await coordinator.describe("other") is None

    loop_thread.call(scenario(), timeout_s=60)


def test_an_unknown_stream_or_a_strategy_change_is_refused(
    loop_thread: LoopThread,
    broker: MemoryBroker | NodeBroker | ProxyBroker,
    make_stream: Callable[..., str],
) -> None:
    stream = make_stream(partitions=2)

    async def scenario() -> None:
        with pytest.raises(NotFound):
            await broker.group_coordinator(StreamName(unique("missing"))).join("g", NOW)
        coordinator = broker.group_coordinator(StreamName(stream))
        member = await coordinator.join("g", NOW)
        with pytest.raises(FailedPrecondition, match="assigns with 'round-robin'"):
            await coordinator.join("g", GroupSettings(strategy="sticky", rebalance_delay_ms=0))
        await coordinator.leave("g", member)

    loop_thread.call(scenario(), timeout_s=30)


def test_a_waiting_sync_fails_with_not_leader_when_the_home_moves(
    loop_thread: LoopThread,
) -> None:
    """The memory broker's stand-in for partition 0's leader change (the node's own is in
    tests/replication/test_shell_cluster.py): polls fail with NotLeader, and the groups start
    over at the next coordinator from the stored generation."""
    broker = MemoryBroker("n1")

    async def scenario() -> None:
        broker.create_stream(StreamConfig(StreamName("s"), partitions=2))
        coordinator = broker.group_coordinator(StreamName("s"))
        member = await coordinator.join("g", NOW)
        had = await sync_until(coordinator, "g", member, lambda a: a.partitions == ps(0, 1))
        waiting = asyncio.ensure_future(coordinator.sync("g", member, had, 30.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        broker.lose_home("s")
        with pytest.raises(NotLeader):
            await waiting
        with pytest.raises(NotLeader):
            await coordinator.join("g", NOW)
        again = broker.group_coordinator(StreamName("s"))
        assert again is not coordinator
        member = await again.join("g", NOW)
        now = await sync_until(again, "g", member, lambda a: a.partitions == ps(0, 1))
        assert now.generation == had.generation + 1  # never back

    loop_thread.call(scenario(), timeout_s=30)


def test_a_gateway_whose_session_closes_leaves_its_members(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """Over the proxy: one member joined through the gateway's wire session, one at the node
    itself. When the session closes, the gateway's waiting poll fails (Unavailable: its link
    ends) and the node lets its member go at once, so the other gets every partition without
    waiting for a session timeout (longer than the test's wait here)."""
    broker = ProxyBroker(tmp_path / "node", "n1")

    async def scenario() -> None:
        await broker.create_stream(StreamConfig(StreamName("s"), partitions=4))
        local = broker.node.group_coordinator(StreamName("s"))
        remote = broker.group_coordinator(StreamName("s"))
        settings = GroupSettings(rebalance_delay_ms=0, session_timeout_ms=int(WAIT_S * 6000))
        here = await local.join("g", settings)
        there = await remote.join("g", settings)
        mine = await sync_until(local, "g", here, lambda a: a.partitions == ps(0, 2))
        if mine.release:
            await local.released("g", here, mine.release, mine.generation)
        theirs = await sync_until(remote, "g", there, lambda a: a.partitions == ps(1, 3))
        waiting = asyncio.ensure_future(remote.sync("g", there, theirs, 30.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await broker.close_sessions()
        with pytest.raises(Unavailable):
            await waiting
        with pytest.raises(Unavailable):
            await remote.sync("g", there, None, 0.0)
        everything = await sync_until(local, "g", here, lambda a: a.partitions == ps(0, 1, 2, 3))
        assert everything.generation > theirs.generation
        await remote.leave("g", there)  # gone already: nothing to do
        await local.leave("g", here)

    try:
        loop_thread.call(scenario(), timeout_s=60)
    finally:
        loop_thread.call(broker.close())


def test_a_proxy_member_is_only_known_over_the_session_it_joined(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """A member number belongs to the coordinator (and session) that gave it: another
    coordinator object, or a sync for a member the node's session did not join, is NotFound."""
    broker = ProxyBroker(tmp_path / "node", "n1")

    async def scenario() -> None:
        await broker.create_stream(StreamConfig(StreamName("s"), partitions=1))
        local = broker.node.group_coordinator(StreamName("s"))
        here = await local.join("g", NOW)
        remote = broker.group_coordinator(StreamName("s"))
        with pytest.raises(NotFound, match="did not join through this coordinator"):
            await remote.sync("g", here, None, 0.0)
        assert broker.sessions is not None
        remote.members[("g", here)] = await broker.sessions.connected(broker.node.node)
        with pytest.raises(NotFound, match="did not join over this session"):
            await remote.sync("g", here, None, 0.0)
        assert ("g", here) not in remote.members
        assert (await local.sync("g", here, None, 0.0)).generation >= 0  # untouched
        await local.leave("g", here)

    try:
        loop_thread.call(scenario(), timeout_s=60)
    finally:
        loop_thread.call(broker.close())
