"""RaftLog bookkeeping and the Ready contract, one rule at a time."""

from __future__ import annotations

import random

import pytest
from spate.core.ids import NodeId, Term
from spate.node.replication.log import RaftLog
from spate.node.replication.messages import (
    Append,
    AppendResponse,
    Entry,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    SnapshotMeta,
    VoteRequest,
    VoteResponse,
)
from spate.node.replication.raft import Raft, RaftConfig

T1, T2, T3 = Term(1), Term(2), Term(3)
N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def entries(terms: list[Term], start: int = 1) -> list[Entry]:
    return [Entry(start + i, term, b"e%d" % (start + i)) for i, term in enumerate(terms)]


def test_find_conflict_by_term_skips_a_whole_term() -> None:
    log = RaftLog(SnapshotMeta(), entries([T1, T1, T2, T2, T2, T3]), committed=0)
    assert log.find_conflict_by_term(6, T2) == (5, T2)
    assert log.find_conflict_by_term(6, T1) == (2, T1)
    assert log.find_conflict_by_term(4, T3) == (4, T2)
    assert log.find_conflict_by_term(9, T3) == (6, T3)  # clamped to the last index


def test_truncation_while_a_ready_is_outstanding_caps_what_becomes_stable() -> None:
    """Entries 3-5 are handed to the disk; before the write completes an Append truncates from
    4. Advancing with the old Ready must not call 4-5 durable: they will be rewritten."""
    log = RaftLog(SnapshotMeta(), entries([T1, T1]), committed=1)
    log.append(entries([T1, T1, T1], start=3))
    handed = log.unstable()
    log.handed_to_disk(handed[-1].index)
    assert log.maybe_append(3, T1, entries([T2, T2], start=4)) == 5
    log.stable_to(handed[-1].index)
    assert log.stable == 3
    assert [e.index for e in log.unstable()] == [4, 5]
    assert [e.term for e in log.unstable()] == [T2, T2]


def test_committed_entries_are_never_truncated() -> None:
    log = RaftLog(SnapshotMeta(), entries([T1, T1, T1]), committed=2)
    with pytest.raises(AssertionError, match="truncating committed"):
        log.maybe_append(1, T1, entries([T2], start=2))


def test_compaction_keeps_unapplied_and_unpersisted_entries() -> None:
    log = RaftLog(SnapshotMeta(), entries([T1] * 10), committed=8)
    log.applied_to(6)
    log.stable = 5
    log.compact(keep_bytes=0)
    assert log.snapshot == SnapshotMeta(5, T1)  # min(applied, stable)
    assert log.first_index == 6 and log.last_index == 10
    assert log.term(5) == T1 and log.term(4) is None
    assert log.entries_from(5, 1 << 20, 100) is None  # compacted: a snapshot is needed


def test_a_candidate_ready_syncs_term_and_vote_before_its_vote_requests() -> None:
    """The vote must be on disk before any VoteRequest leaves, or a restarted node could vote
    twice in one term; the Ready says so with hard_state and must_sync."""
    raft = Raft(N1, [N1, N2, N3], RaftConfig(pre_vote=False), random.Random(1))
    raft.campaign()
    ready = raft.ready()
    assert ready.hard_state == HardState(T1, N1, 0)
    assert ready.must_sync and ready.hard_state_sync
    assert {m.target for m in ready.messages if isinstance(m, VoteRequest)} == {N2, N3}
    assert ready.messages_before_sync() == ()
    assert ready.messages_after_sync() == ready.messages


def test_a_follower_ack_travels_with_the_entries_it_acknowledges() -> None:
    """The AppendResponse produced by stepping an Append is in the same Ready as the entries,
    so the shell (persist, then send) can only send it once they are synced."""
    raft = Raft(N2, [N1, N2, N3], RaftConfig(), random.Random(1))
    raft.step(Append(T1, N1, N2, 0, Term(0), tuple(entries([T1, T1])), 0))
    ready = raft.ready()
    assert [e.index for e in ready.entries] == [1, 2]
    assert ready.must_sync
    assert ready.messages == (AppendResponse(T1, N2, N1, 2),)
    assert ready.messages_before_sync() == ()
    assert ready.messages_after_sync() == ready.messages
    raft.advance(ready)
    assert raft.status().persisted == 2


def _elected_leader() -> Raft:
    """n1 leads term 1 over n2 and n3 (pre-vote off), its barrier entry committed."""
    raft = Raft(N1, [N1, N2, N3], RaftConfig(pre_vote=False), random.Random(1))
    raft.campaign()
    raft.advance(raft.ready())
    raft.step(VoteResponse(T1, N2, N1, True, False))
    raft.advance(raft.ready())  # the barrier entry (index 1) and the probing Appends
    for peer in (N2, N3):
        raft.step(AppendResponse(T1, peer, N1, 1))
    raft.advance(raft.ready())  # the commit of 1: both followers now replicate
    assert raft.log.committed == 1
    return raft


def test_a_leader_ready_lets_its_appends_leave_before_its_own_sync() -> None:
    """The leader's Appends carry entries its disk has not synced yet: they may leave at once
    (ADR 0005), because the commit counts the leader's *persisted* index, never its written
    one; a follower's ack alone cannot commit while the leader's own index lags."""
    raft = _elected_leader()
    raft.propose(b"x")
    ready = raft.ready()
    assert [e.index for e in ready.entries] == [2] and ready.must_sync
    assert not ready.hard_state_sync
    early = ready.messages_before_sync()
    assert {m.target for m in early if isinstance(m, Append)} == {N2, N3}
    assert ready.messages_after_sync() == ()
    # One follower acknowledges 2 before the leader's sync: no quorum of *persisted* copies.
    raft.step(AppendResponse(T1, N2, N1, 2))
    assert raft.log.committed < 2
    raft.advance(ready)  # the leader's own sync done: n1 and n2 hold index 2
    assert raft.log.committed == 2


def test_acks_and_heartbeat_answers_wait_for_the_sync_that_covers_them() -> None:
    """A follower stepping an Append (entries to sync) and a Heartbeat in one Ready: both the
    AppendResponse and the HeartbeatResponse wait for the sync; with nothing to sync, a
    Ready's messages need not wait at all."""
    raft = Raft(N2, [N1, N2, N3], RaftConfig(), random.Random(1))
    raft.step(Append(T1, N1, N2, 0, Term(0), tuple(entries([T1])), 0))
    raft.step(Heartbeat(T1, N1, N2, 0))
    ready = raft.ready()
    assert ready.hard_state_sync  # the term (and the leader) are new
    assert ready.messages_before_sync() == ()
    assert {type(m) for m in ready.messages_after_sync()} == {AppendResponse, HeartbeatResponse}
    raft.advance(ready)
    raft.step(Heartbeat(T1, N1, N2, 1))  # only the commit moves: nothing to sync
    ready = raft.ready()
    assert not ready.must_sync
    assert ready.messages_before_sync() == (HeartbeatResponse(T1, N2, N1),)
    assert ready.messages_after_sync() == ()
    assert [e.index for e in ready.committed] == [1]


def test_a_commit_learned_during_a_sync_is_applied_at_once_and_only_once() -> None:
    """While the leader's Ready with entry 3 is being synced, an ack for entry 2 commits it:
    `take_committed` hands entry 2 over now (a producer's confirm need not wait for the fsync
    of entry 3), and no later Ready hands it again."""
    raft = _elected_leader()
    raft.propose(b"x")
    raft.advance(raft.ready())  # entry 2 written and synced on the leader
    assert raft.take_committed() == ()  # nothing committed that is not applied
    raft.propose(b"y")
    ready = raft.ready()  # entry 3, its sync in flight
    assert [e.index for e in ready.entries] == [3] and ready.committed == ()
    raft.step(AppendResponse(T1, N2, N1, 2))
    assert raft.log.committed == 2
    assert [e.index for e in raft.take_committed()] == [2]
    assert raft.take_committed() == ()
    raft.advance(ready)
    assert raft.status().applied == 2
    assert all(e.index != 2 for e in raft.ready().committed)
