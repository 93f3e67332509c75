"""Replica-set changes in the partition Raft core (ADR 0022), scenario by scenario: a learner
catches up without counting, is promoted, an old voter leaves; one change at a time; the
leader never removes itself; leadership transfer; a restart and a snapshot keep the
membership; a truncated membership entry is reverted."""

from __future__ import annotations

import random

from replication.harness import Group
from spate.core.ids import NodeId, Term
from spate.node.replication.messages import (
    Append,
    Entry,
    HardState,
    Membership,
    Proposed,
    Refusal,
    RefusalReason,
    SnapshotMeta,
    TimeoutNow,
)
from spate.node.replication.raft import Raft, Role

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))
OLD = Membership.of([N1, N2, N3])


def _group() -> Group:
    """Four cores; the group's members are n1-n3, n4 is a spare node outside it."""
    group = Group(4)
    for node in group.ids:
        group.nodes[node] = Raft(node, OLD, group.config, random.Random(f"m/{node}"))
        group.nodes[node].readers = group.readers  # followers get commit updates (ADR 0044)
    return group


def _propose(group: Group, node: str, payload: bytes) -> Proposed:
    result = group[node].propose(payload)
    assert isinstance(result, Proposed), result
    group.stabilize()
    return result


def test_a_learner_catches_up_without_counting_then_replaces_a_voter() -> None:
    group = _group()
    group.elect("n1")
    _propose(group, "n1", b"before")
    group["n4"].tick()  # outside the group: it never campaigns
    assert group["n4"].role is Role.FOLLOWER and group["n4"].term == 0

    learner = Membership.of([N1, N2, N3], [N4])
    assert isinstance(group["n1"].propose_membership(learner), Proposed)
    group.stabilize()
    # Every voter had b"before", so the leader dropped it from memory (ADR 0049): the learner
    # is sent a snapshot, restored as the shell restores it after the segment transfer, then
    # gets the membership entry by Append.
    request = group.snapshot_requests[N4]
    assert request.snapshot.index == group["n1"].log.snapshot.index == 2  # barrier, b"before"
    assert group["n4"].restore(request.snapshot.index, request.snapshot.term, OLD)
    group.process(N4)
    group.tick_all(3)
    group.stabilize()
    assert group["n4"].log.committed == group["n1"].log.committed
    assert group.applied_payloads("n4") == group.applied_payloads("n1")[1:] != []
    assert group["n4"].membership == learner and not group["n4"].is_voter
    group.tick("n4", 50)  # a learner never campaigns either
    assert group["n4"].role is Role.FOLLOWER

    # A learner's acknowledgement does not count: with n2 and n3 cut off nothing commits.
    group.cut = {N2, N3}
    result = group["n1"].propose(b"needs-a-voter")
    assert isinstance(result, Proposed)
    group.stabilize()
    assert group["n1"].log.committed < result.index
    assert group["n4"].log.last_index == result.index  # replicated all the same
    group.cut = set()
    group.tick_all(3)
    group.stabilize()
    assert b"needs-a-voter" in group.applied_payloads("n1")

    promoted = Membership.of([N1, N2, N3, N4])
    assert isinstance(group["n1"].propose_membership(promoted), Proposed)
    group.stabilize()
    assert all(group[n].membership == promoted for n in ("n1", "n2", "n3", "n4"))
    assert group["n1"].quorum == 3

    moved = Membership.of([N1, N2, N4])
    assert isinstance(group["n1"].propose_membership(moved), Proposed)
    group.stabilize()
    # The leader stops replicating to n3 at once, so n3 never hears of its own removal (as
    # in etcd; its node closes the replica when the metadata says so). n1 and n4 commit
    # without it.
    assert group["n3"].membership == promoted
    group.cut = {N2}
    _propose(group, "n1", b"after")
    assert b"after" in group.applied_payloads("n4")
    assert b"after" not in group.applied_payloads("n3")
    # Its campaigns cannot disrupt the group: pre-votes for a shorter log are refused.
    group.cut = set()
    term = group.term("n1")
    for _ in range(60):
        group.tick("n3")
        group.stabilize()
    assert group.leaders() == [N1] and group.term("n1") == term


def test_one_voter_at_a_time_one_change_at_a_time_never_the_leader() -> None:
    group = _group()
    group.elect("n1")
    leader = group["n1"]
    two_at_once = Membership.of([N1, N4])  # n2 and n3 out, n4 in
    refused = leader.propose_membership(two_at_once)
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.MEMBERSHIP_INVALID
    without_leader = Membership.of([N2, N3])
    refused = leader.propose_membership(without_leader)
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.MEMBERSHIP_INVALID
    # A membership payload smuggled in as data is refused too.
    refused = leader.propose(Membership.of([N1]).encode())
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.MEMBERSHIP_INVALID

    assert isinstance(leader.propose_membership(Membership.of([N1, N2, N3], [N4])), Proposed)
    pending = leader.propose_membership(Membership.of([N1, N2, N3, N4]))
    assert isinstance(pending, Refusal) and pending.reason is RefusalReason.MEMBERSHIP_PENDING
    refused_at_follower = group["n2"].propose_membership(Membership.of([N1, N2]))
    assert isinstance(refused_at_follower, Refusal)
    assert refused_at_follower.reason is RefusalReason.NOT_LEADER
    group.stabilize()
    assert isinstance(leader.propose_membership(Membership.of([N1, N2, N3, N4])), Proposed)


def test_leadership_transfer_brings_the_target_up_to_date_then_hands_over() -> None:
    group = _group()
    group.elect("n1")
    _propose(group, "n1", b"one")
    # n3 misses an entry, then the leader is asked to hand over to it.
    group.cut = {N3}
    _propose(group, "n1", b"two")
    group.cut = set()
    assert group["n1"].transfer_leadership(N3) is None
    refused = group["n1"].propose(b"during")
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.TRANSFERRING
    assert refused.error().retryable
    group.stabilize()
    assert any(t.startswith("n1->n3 TimeoutNow") for t in group.trace)
    assert group.leaders() == [N3]
    assert group.term("n3") == 2
    _propose(group, "n3", b"three")
    assert group.applied_payloads("n1") == [b"one", b"two", b"three"]
    # Only a voter can take over; a transfer to the leader itself is a no-op.
    refused_target = group["n3"].transfer_leadership(N4)
    assert isinstance(refused_target, Refusal)
    assert group["n3"].transfer_leadership(N3) is None


def test_a_transfer_the_target_cannot_take_is_abandoned() -> None:
    group = _group()
    group.elect("n1")
    group.cut = {N2}
    assert group["n1"].transfer_leadership(N2) is None
    group.stabilize()
    group.tick("n1", group.config.election_timeout_ticks)
    group.stabilize()
    assert group.leaders() == [N1]
    assert isinstance(group["n1"].propose(b"leads-on"), Proposed)


def test_timeout_now_overrides_the_lease_voters_keep_against_others() -> None:
    group = _group()
    group.elect("n1")
    assert group["n1"].transfer_leadership(N2) is None
    group.stabilize()
    votes = [t for t in group.trace if "VoteRequest" in t and t.startswith("n2->")]
    assert votes and all("transfer" in v and "pre" not in v for v in votes)
    assert group.leaders() == [N2]


def test_restart_and_snapshot_keep_the_membership() -> None:
    group = _group()
    group.elect("n1")
    new = Membership.of([N1, N2, N3], [N4])
    result = group["n1"].propose_membership(new)
    assert isinstance(result, Proposed)
    group.stabilize()
    # What the hard state records: the membership as of the commit point.
    leader = group["n1"]
    hard_state = HardState(leader.term, leader.vote, leader.log.committed)
    assert leader._hard_state().membership == new
    # A restart from the commit point (the shell's way) with the recorded membership...
    snapshot = SnapshotMeta(
        leader.log.committed, leader.log.last_term, leader._hard_state().membership
    )
    restarted = Raft(
        N2, OLD, group.config, random.Random(1), hard_state=hard_state, snapshot=snapshot
    )
    assert restarted.membership == new
    # ...or from the whole log (the membership entry is read back from it).
    entries = [group.disk[N2][i] for i in sorted(group.disk[N2])]
    replayed = Raft(N2, OLD, group.config, random.Random(1), entries=entries)
    assert replayed.membership == new
    # A snapshot restore takes the leader's membership.
    fresh = Raft(N4, Membership.of([N4]), group.config, random.Random(1))
    fresh.step(Append(leader.term, N1, N4, 0, Term(0), (), 0))
    assert fresh.restore(leader.log.committed, leader.log.last_term, new)
    assert fresh.membership == new and not fresh.is_voter


def test_a_truncated_membership_entry_is_reverted() -> None:
    group = _group()
    group.elect("n1")
    _propose(group, "n1", b"base")
    # n1 appends a membership entry that reaches n2 only (n3 cut off) and that n1's own disk
    # has not synced: not committed, and n1 cannot tell n2 that it commits once n2 holds it
    # (ADR 0050: n1's and n2's copies would make a quorum).
    group.cut = {N3}
    group.hold("n1")
    assert isinstance(group["n1"].propose_membership(Membership.of([N1, N2, N3], [N4])), Proposed)
    group.process_all()
    group.deliver(lambda m: m.target == N2)
    follower = group["n2"]
    assert follower.membership.learners == (N4,)
    index = follower.membership_index
    assert follower.log.committed < index
    # A leader of a later term that never had the entry (n3) overwrites it there.
    later = Term(follower.term + 1)
    prev_term = follower.log.term(index - 1)
    assert prev_term is not None
    follower.step(Append(later, N3, N2, index - 1, prev_term, (Entry(index, later, b""),), 0))
    assert follower.membership == OLD
    assert follower.membership_index == 0


def test_timeout_now_from_anyone_but_the_leader_is_ignored() -> None:
    group = _group()
    group.elect("n1")
    group["n3"].step(TimeoutNow(group.term("n3"), N2, N3))
    assert group["n3"].role is Role.FOLLOWER
