"""Three ReplicationHosts in one process: real sockets on 127.0.0.1, real files with fsync.

Brief §2.3 (replication): election, acknowledged appends, reads from followers up to the commit
index, leader epochs, failures of a minority and a majority, and catch-up of a wiped replica by
replay and by segment transfer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from spate.core.backend import OffsetSpec
from spate.core.coordination import GroupSettings, generation_name
from spate.core.errors import BrokerError, NotLeader
from spate.core.groups import committed_name
from spate.core.ids import LeaderEpoch, NodeId, Offset, PartitionId, StreamName
from spate.core.streams import Retention
from spate.node.log import LogConfig
from spate.node.replication.host import ReplicationHost
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.raft import RaftConfig

STREAM = StreamName("orders")
P0 = PartitionId(0)
IDS = [NodeId("n1"), NodeId("n2"), NodeId("n3")]
SECRET = "cluster-secret"
TICK_MS = 20
WAIT_S = 15.0


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll until `predicate` holds; a liveness bound, not a timing assertion."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {WAIT_S}s: {what}")
        await asyncio.sleep(0.01)


class Cluster:
    def __init__(self, root: Path, config: LogConfig, raft_config: RaftConfig) -> None:
        self.root = root
        self.config = config
        self.raft_config = raft_config
        self.addresses: dict[NodeId, tuple[str, int]] = {}
        self.hosts: dict[NodeId, ReplicationHost] = {}
        self.parts: dict[NodeId, ReplicatedPartition] = {}
        self.leader_events: list[tuple[NodeId, NodeId | None, LeaderEpoch]] = []

    async def start(self, node: NodeId) -> ReplicatedPartition:
        host = ReplicationHost(
            node,
            self.root / node,
            host="127.0.0.1",
            port=0,
            secret=SECRET,
            peers=self.addresses.get,
            tick_ms=TICK_MS,
            rng_seed=IDS.index(node),
            raft_config=self.raft_config,
        )
        self.addresses[node] = ("127.0.0.1", await host.start())
        self.hosts[node] = host

        def record(s: StreamName, p: PartitionId, leader: NodeId | None, e: LeaderEpoch) -> None:
            self.leader_events.append((node, leader, e))

        host.add_leader_listener(record)
        part = await host.open_partition(STREAM, P0, IDS, self.config)
        self.parts[node] = part
        return part

    async def stop(self, node: NodeId) -> None:
        await self.hosts.pop(node).stop()
        del self.parts[node]
        del self.addresses[node]

    async def leader(self) -> ReplicatedPartition:
        await until(lambda: any(p.is_leader for p in self.parts.values()), "a leader is elected")
        return next(p for p in self.parts.values() if p.is_leader)

    async def append_retrying(self, records: list[bytes]) -> Offset:
        """Append through whichever replica leads, retrying retryable refusals."""
        for _ in range(500):
            part = await self.leader()
            try:
                return await part.append(records)
            except BrokerError as error:
                assert error.retryable, error
                await asyncio.sleep(0.02)
        raise AssertionError("no append succeeded")


def all_records(part: ReplicatedPartition) -> list[bytes]:
    out: list[bytes] = []
    start = part.resolve(OffsetSpec.first())
    while start < part.end_offset():
        views = part.read(start, 1 << 20)
        assert views
        for view in views:
            for i, record in enumerate(view.records):
                if view.first_offset + i >= start:
                    out.append(bytes(record))
            start = Offset(view.first_offset + len(view.records))
    return out


@contextlib.asynccontextmanager
async def three_nodes(
    root: Path, config: LogConfig | None = None, raft_config: RaftConfig | None = None
) -> AsyncIterator[Cluster]:
    c = Cluster(root, config or LogConfig(), raft_config or RaftConfig())
    try:
        for node in IDS:
            await c.start(node)
        yield c
    finally:
        for node in list(c.hosts):
            await c.stop(node)


def run(
    body: Callable[[Cluster], Coroutine[None, None, None]],
    root: Path,
    config: LogConfig | None = None,
    raft_config: RaftConfig | None = None,
) -> None:
    async def main() -> None:
        async with three_nodes(root, config, raft_config) as c:
            await body(c)

    asyncio.run(main())


def test_leader_acks_and_followers_serve_up_to_commit(tmp_path: Path) -> None:
    run(_leader_acks_and_followers_serve_up_to_commit, tmp_path)


async def _leader_acks_and_followers_serve_up_to_commit(cluster: Cluster) -> None:
    """Brief §2.3: appends resolve once committed; followers read what is committed; producers
    on a follower are told where the leader is; the leader epoch is visible."""
    leader = await cluster.leader()
    offsets = await asyncio.gather(*(leader.append([b"m%d" % i, b"n%d" % i]) for i in range(200)))
    assert sorted(offsets) == list(range(0, 400, 2))
    await until(
        lambda: all(p.end_offset() == 400 for p in cluster.parts.values()), "followers commit"
    )
    expected = [r for i in range(200) for r in (b"m%d" % i, b"n%d" % i)]
    for part in cluster.parts.values():
        assert sorted(all_records(part)) == sorted(expected)
        assert all_records(part) == all_records(leader)
        assert part.leader == leader.node
        assert part.leader_epoch == leader.leader_epoch > 0
        assert part.info().leader == leader.node
    # info() counts what this replica has fsynced (the log's durable end); a follower may serve
    # committed records before its own sync of them ends
    await until(
        lambda: all(p.info().messages == 400 for p in cluster.parts.values()), "followers sync"
    )
    follower = next(p for p in cluster.parts.values() if not p.is_leader)
    with pytest.raises(NotLeader) as refused:
        await follower.append([b"x"])
    assert refused.value.leader_node == leader.node
    assert (follower.node, leader.node, leader.leader_epoch) in cluster.leader_events


def test_majority_lost_refuses_then_recovers(tmp_path: Path) -> None:
    run(_majority_lost_refuses_then_recovers, tmp_path)


async def _majority_lost_refuses_then_recovers(cluster: Cluster) -> None:
    """With two of three replicas down an append fails with a retryable error, never a false
    ack; once a majority is back appends succeed and nothing acknowledged is lost."""
    leader = await cluster.leader()
    await leader.append([b"before"])
    survivor = leader.node
    others = [n for n in IDS if n != survivor]
    for node in others:
        await cluster.stop(node)
    part = cluster.parts[survivor]
    outcomes: list[BrokerError] = []
    for _ in range(3):
        try:
            await part.append([b"lonely"])
        except BrokerError as error:
            assert error.retryable, error
            outcomes.append(error)
    assert len(outcomes) == 3  # no ack without a majority
    await until(lambda: not part.is_leader, "the cut-off leader steps down (check-quorum)")
    await cluster.start(others[0])
    await cluster.append_retrying([b"after"])
    for p in cluster.parts.values():
        await until(lambda p=p: b"after" in all_records(p), "the majority commits")
        records = all_records(p)
        assert records[0] == b"before" and records.count(b"after") == 1


def test_wiped_follower_is_rebuilt_by_replay(tmp_path: Path) -> None:
    run(_wiped_follower_is_rebuilt_by_replay, tmp_path)


async def _wiped_follower_is_rebuilt_by_replay(cluster: Cluster) -> None:
    """A replica whose directory was wiped catches up by Append replay from index 1 while the
    leader still holds every entry in memory."""
    leader = await cluster.leader()
    for i in range(50):
        await leader.append([b"r%d" % i])
    victim = next(n for n in IDS if n != leader.node)
    await cluster.stop(victim)
    shutil.rmtree(cluster.root / victim)
    part = await cluster.start(victim)
    await cluster.append_retrying([b"tail"])
    await until(lambda: part.end_offset() == 51, "the wiped replica catches up")
    assert all_records(part) == [b"r%d" % i for i in range(50)] + [b"tail"]
    assert not (cluster.root / victim / "partitions" / STREAM / "0" / "catchup").exists()


def test_wiped_follower_is_rebuilt_by_segment_transfer_after_retention(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="spate.node.replication.driver")
    config = LogConfig(segment_bytes=64 * 1024, retention=Retention(max_bytes=256 * 1024))
    run(
        lambda c: _segment_transfer(c, tmp_path, caplog),
        tmp_path,
        config,
        RaftConfig(log_cache_bytes=0),
    )


async def _segment_transfer(c: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """When the leader no longer keeps the prefix in memory (log cache 0) and retention has
    deleted the first segments, a wiped replica is rebuilt from the leader's segment files."""
    if True:
        leader = await c.leader()
        record = b"z" * 4000
        for i in range(200):  # ~800 KB: 12+ segments of 64 KiB
            await leader.append([record + b"%d" % i])
        for host in c.hosts.values():
            host.apply_retention(host.partition(STREAM, P0))
        first = leader.resolve(OffsetSpec.first())
        assert first > 0, "retention removed the prefix"
        victim = next(n for n in IDS if n != leader.node)
        await c.stop(victim)
        shutil.rmtree(tmp_path / victim)
        part = await c.start(victim)
        await c.append_retrying([b"tail"])
        await until(lambda: part.end_offset() == 201, "the wiped replica catches up")
        assert "by segment transfer" in caplog.text
        assert part.resolve(OffsetSpec.first()) == first
        assert all_records(part) == all_records(leader)
        assert all_records(part)[-1] == b"tail"


def test_single_replica_group_commits_after_local_fsync(tmp_path: Path) -> None:
    """A group of one (single-node clusters use the same path) leads itself and acks."""
    asyncio.run(_single_replica(tmp_path))


async def _single_replica(tmp_path: Path) -> None:
    host = ReplicationHost(
        IDS[0],
        tmp_path,
        host="127.0.0.1",
        port=0,
        secret=SECRET,
        peers=lambda n: None,
        tick_ms=TICK_MS,
    )
    await host.start()
    try:
        part = await host.open_partition(STREAM, P0, [IDS[0]], LogConfig())
        await until(lambda: part.is_leader, "a single replica elects itself")
        assert await part.append([b"a", b"b"]) == 0
        assert await part.append([b"c"]) == 2
        assert all_records(part) == [b"a", b"b", b"c"]
        assert host.fsyncs > 0
    finally:
        await host.stop()
    host = ReplicationHost(
        IDS[0],
        tmp_path,
        host="127.0.0.1",
        port=0,
        secret=SECRET,
        peers=lambda n: None,
        tick_ms=TICK_MS,
    )
    await host.start()
    try:
        part = await host.open_partition(STREAM, P0, [IDS[0]], LogConfig())
        assert all_records(part) == [b"a", b"b", b"c"]  # the commit point survived
        await until(lambda: part.is_leader, "re-elected after restart")
        assert await part.append([b"d"]) == 3
    finally:
        await host.stop()


def test_the_home_of_consumer_groups_disbands_when_its_leader_steps_down(tmp_path: Path) -> None:
    run(_home_disbands_when_its_leader_steps_down, tmp_path)


async def _home_disbands_when_its_leader_steps_down(cluster: Cluster) -> None:
    """ADR 0015: the leader of partition 0 hosts the stream's group coordinators; when it
    stops leading, a waiting poll fails with NotLeader, and the next leader's coordinators
    start from the generation stored in the partition's log (it never goes back)."""
    settings = GroupSettings(rebalance_delay_ms=0)
    leader = await cluster.leader()
    coordinators = leader.group_coordinators(2)
    assert leader.group_coordinators(2) is coordinators
    member = await coordinators.join("g", settings)
    had = await coordinators.sync("g", member, None, 0.0)
    while had.partitions != frozenset({0, 1}):
        had = await coordinators.sync("g", member, had, 1.0)
    stored = await leader.stored_offset(generation_name("g"))
    assert stored is not None and stored.offset == had.generation
    follower = next(p for p in cluster.parts.values() if not p.is_leader)
    with pytest.raises(NotLeader):
        follower.group_coordinators(2)

    waiting = asyncio.ensure_future(coordinators.sync("g", member, had, 60.0))
    survivor = leader.node
    others = [n for n in IDS if n != survivor]
    for node in others:
        await cluster.stop(node)
    with pytest.raises(NotLeader):
        await waiting  # check-quorum: the cut-off leader steps down
    assert leader.coordinators is None
    with pytest.raises(NotLeader):
        await coordinators.join("g", settings)

    await cluster.start(others[0])
    await cluster.append_retrying([b"a new term"])
    home = await cluster.leader()
    again = home.group_coordinators(2)
    assert again is not coordinators
    member = await again.join("g", settings)
    now = await again.sync("g", member, None, 0.0)
    while now.partitions != frozenset({0, 1}):
        now = await again.sync("g", member, now, 1.0)
    assert now.generation == had.generation + 1


def test_a_new_leader_grants_group_claims_only_once_settled(tmp_path: Path) -> None:
    # The scenario needs two windows it can only observe in wall time: the partition's first
    # leader must still be its first (barrier 1) when the test looks, and the new leader must
    # still be settling (one election timeout and a margin) when the test claims. The host's
    # ticker catches up after a stall, so a stall of the process longer than a window closes
    # it: with the default 10 ticks (200-400 ms) a run with two xdist workers at load 8 found
    # barrier 2. 100 ticks (2-4 s) leaves both windows open through multi-second stalls; the
    # assertions are unchanged. (Runs at load 15-18 also found the new leader "already
    # settled": that was a bug, fixed and pinned by the test below.)
    run(_new_leader_settles_before_claims, tmp_path, raft_config=SLOW_ELECTIONS)


def test_a_leader_whose_new_term_is_not_yet_on_disk_is_settling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window the parallel suite found under load: a replica's Raft role is leader as soon
    as it wins, but `report_leader` (which records when it began to lead) runs only after the
    new term's fsync. A claim in between must wait like any other: made deterministic here by
    holding report_leader back 0.5 s, as a slow disk does (before the fix the claim was granted
    at once: `settling()` compared against the previous leadership's tick)."""
    original = ReplicatedPartition.report_leader

    def slow(self: ReplicatedPartition, ready: Any) -> None:
        if ready.leader_change is not None and self.is_leader:
            asyncio.get_running_loop().call_later(0.5, original, self, ready)
            return
        original(self, ready)

    monkeypatch.setattr(ReplicatedPartition, "report_leader", slow)
    run(_new_leader_settles_before_claims, tmp_path, raft_config=SLOW_ELECTIONS)


SLOW_ELECTIONS = RaftConfig(election_timeout_ticks=100)


async def _new_leader_settles_before_claims(cluster: Cluster) -> None:
    """ADR 0015 "Leader changes": the first leader of a new partition grants a consumer group's
    claim at once; a later leader only after one election timeout and a margin of leading, by
    when the leader before it has stepped down (check-quorum) and told its holders to stop —
    so two holders of one partition never overlap across a leader change."""
    name = committed_name("g").encode()
    first = await cluster.leader()
    assert first.raft.barrier == 1 and not first.settling()
    held = await first.claim(name, 1)
    assert held.active and held.epoch == 1

    deposed = first.until_deposed(name, held.member)
    await cluster.stop(first.node)
    with pytest.raises(NotLeader):
        await deposed  # the holder is told, and its link stops sending
    new = await cluster.leader()
    assert new.raft.barrier > 1
    claimed = asyncio.ensure_future(new.claim(name, 2))
    await asyncio.sleep(0)
    assert not claimed.done() and new.settling()
    granted = await claimed
    assert granted.active and granted.epoch == 2
    assert new.ticks - new._led_since >= new.settle_ticks()


QUIET = RaftConfig(quiesce=True)


def test_a_quiet_partition_survives_its_leader_s_node_going_silent(tmp_path: Path) -> None:
    run(_quiet_partition_survives_its_leader_going_silent, tmp_path, raft_config=QUIET)


async def _quiet_partition_survives_its_leader_going_silent(cluster: Cluster) -> None:
    """ADR 0026 on real hosts and sockets: an idle partition goes quiet on every replica;
    its leader's host stops; node liveness (PINGs) wakes the followers, which elect a new
    leader that takes appends; the old node comes back, learns the leader and catches up;
    the group goes quiet again."""
    leader = await cluster.leader()
    await cluster.append_retrying([b"before"])
    await until(
        lambda: all(p.raft.quiesced for p in cluster.parts.values()), "the group goes quiet"
    )
    # Issue 16: no tick visits a quiet group, whose replicas still count ticks (settle rules
    # read them), and no replica holds its hard-state file open while idle.
    await until(
        lambda: all(h.driver.awake == 0 for h in cluster.hosts.values()), "the ticks skip it"
    )
    ticks = {node: p.ticks for node, p in cluster.parts.items()}
    await asyncio.sleep(4 * TICK_MS / 1000)
    assert all(p.ticks >= ticks[node] + 2 for node, p in cluster.parts.items())
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # (the listing's own descriptor)
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    assert not [path for path in held if path.endswith("raft.state")], held
    old = leader.node
    await cluster.stop(old)
    await until(
        lambda: any(p.is_leader for p in cluster.parts.values()), "the survivors elect a leader"
    )
    survivors = list(cluster.parts)
    assert all(old in cluster.hosts[n].driver.suspected for n in survivors)
    assert await cluster.append_retrying([b"after"]) == 1
    back = await cluster.start(old)
    await until(lambda: back.end_offset() == 2, "the old leader catches up as a follower")
    assert not back.is_leader
    await until(lambda: all(p.raft.quiesced for p in cluster.parts.values()), "quiet again")
    assert not any(old in h.driver.suspected for h in cluster.hosts.values())
    assert sorted(all_records(back)) == [b"after", b"before"]
