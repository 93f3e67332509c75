"""A commit is applied where it is learned, and its commit point is written lazily (ADR 0043).

The core: a commit point that moved alone is no Ready of its own until a tick; a commit that
passes a membership entry is. The shell (production drivers and replicas over the simulator's
files, frames carried by hand, tests/replication/drivers.py): one batch per replicated append
on every node, the producer's confirm and a follower's readers served on the loop turn that
learned the commit, and a replica closed cleanly reopens at the commit point it reached.
"""

from __future__ import annotations

import random

from replication.drivers import IDS, STREAM, Nodes, outcomes
from spate.core.ids import NodeId, Offset, PartitionId, Term
from spate.node.log import LogConfig
from spate.node.replication import raft as raft_module
from spate.node.replication.messages import Append, Entry, Membership
from spate.node.replication.raft import Raft, RaftConfig
from spate.node.replication.replica import Replica
from spate.node.replication.storage import RaftStore

T1 = Term(1)
N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def _follower_with_entry() -> Raft:
    """A follower holding entry 1 of term 1 (written and synced), not yet committed."""
    raft = Raft(N2, [N1, N2, N3], RaftConfig(), random.Random(2))
    raft.step(Append(T1, N1, N2, 0, Term(0), (_entry(1),), 0))
    raft.advance(raft.ready())
    assert raft.log.committed == 0 and not raft.has_ready()
    return raft


def _entry(index: int, payload: bytes = b"x") -> Entry:
    return Entry(index, T1, payload)


def test_a_commit_point_that_moved_alone_waits_for_a_tick() -> None:
    raft = _follower_with_entry()
    raft.step(Append(T1, N1, N2, 1, T1, (), 1, quiet=True))  # the commit update (ADR 0042)
    assert raft.log.committed == 1
    assert raft.has_ready()  # entry 1 is committed and not applied yet
    assert [e.index for e in raft.take_committed()] == [1]  # no Ready outstanding (ADR 0043)
    assert raft.take_committed() == ()
    assert not raft.has_ready()  # the commit point alone: no Ready of its own
    raft.tick()
    assert raft.has_ready()  # ... until a tick: it goes with the next Ready
    ready = raft.ready()
    assert ready.hard_state is not None and ready.hard_state.commit == 1
    assert not ready.must_sync and ready.committed == ()  # applied already, not handed again
    raft.advance(ready)
    assert not raft.has_ready()


def test_a_commit_passing_a_membership_entry_is_a_ready_at_once() -> None:
    raft = _follower_with_entry()
    joint = Membership.of([N1, N2, N3, NodeId("n4")])
    member = _entry(2, joint.encode())
    raft.step(Append(T1, N1, N2, 1, T1, (member,), 1))
    raft.advance(raft.ready())
    raft.take_committed()
    raft.step(Append(T1, N1, N2, 2, T1, (), 2, quiet=True))
    assert [e.index for e in raft.take_committed()] == [2]
    assert raft.has_ready()  # the hard state's membership moves: synced at once (ADR 0022)
    ready = raft.ready()
    assert ready.hard_state is not None and ready.hard_state.membership == joint


def test_one_batch_per_replicated_append_on_every_node() -> None:
    nodes = Nodes()
    n1, n2, n3 = nodes.elect()
    leader = nodes.replicas[n1]
    got, done = outcomes()
    batches = dict.fromkeys(IDS, 0)
    for n in range(5):
        leader.propose([b"r%d" % n], done)  # type: ignore[arg-type]
        for _ in range(6):  # until quiet: batches where there is work, then deliveries
            for node in IDS:
                while (batch := nodes.batch(node)) is not None:
                    batches[node] += 1
                    nodes.finish(node, batch)
            if not nodes.deliver():
                break
        assert got == [Offset(i) for i in range(n + 1)]  # confirmed without another batch
        for follower in (n2, n3):  # the commit update applied where it was received
            assert nodes.replicas[follower].end_offset() == Offset(n + 1), follower
    assert batches == dict.fromkeys(IDS, 5), batches  # before ADR 0043: 10 on each node


def test_a_clean_close_writes_the_commit_point_reached() -> None:
    nodes = Nodes()
    n1, n2, _ = nodes.elect()
    got, done = outcomes()
    nodes.replicas[n1].propose([b"a"], done)  # type: ignore[arg-type]
    nodes.settle()
    assert got == [Offset(0)]
    for node in (n1, n2):
        replica = nodes.replicas[node]
        committed = replica.raft.log.committed
        assert replica.store.hard.state is not None
        assert replica.store.hard.state.commit < committed  # written lazily: not yet
        files = replica.store.files
        nodes.drivers[node].remove(STREAM, PartitionId(0))
        replica.close()
        reopened = Replica(
            node,
            stream=STREAM,
            partition=PartitionId(0),
            replicas=IDS,
            store=RaftStore(files, LogConfig()),
            raft_config=RaftConfig(),
            rng=random.Random(f"raft/{node}"),
            wake=lambda: None,
            clock_ms=lambda: 1_700_000_000_000,
            monotonic_ms=lambda: 0.0,
        )
        assert reopened.raft.log.committed == committed, node
        assert reopened.end_offset() == Offset(1), node  # readable before any election
        reopened.close()


def test_a_ready_with_entries_leaves_a_lone_commit_point_for_later() -> None:
    """Not written before the entries' fsync (on the way of their ack), but at the latest once
    it trails by COMMIT_LAG_ENTRIES_MAX entries."""
    raft = _follower_with_entry()
    index = 1
    for _ in range(raft_module.COMMIT_LAG_ENTRIES_MAX - 1):
        raft.step(Append(T1, N1, N2, index, T1, (_entry(index + 1),), index))
        raft.take_committed()
        ready = raft.ready()
        assert [e.index for e in ready.entries] == [index + 1]
        assert ready.hard_state is None, index  # the commit point (index) waits
        raft.advance(ready)
        index += 1
    raft.step(Append(T1, N1, N2, index, T1, (_entry(index + 1),), index))
    raft.take_committed()
    ready = raft.ready()
    assert ready.hard_state is not None and ready.hard_state.commit == index  # 8 behind: now
