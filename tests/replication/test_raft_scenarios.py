"""Scenario tests for the partition Raft core, pumped by hand (see harness.py).

Section references are to the Raft paper (Ongaro & Ousterhout, "In Search of an Understandable
Consensus Algorithm", 2014) and Ongaro's thesis (2014) for pre-vote and check-quorum.
"""

from __future__ import annotations

import random

import pytest
from replication.harness import Group
from spate.core.errors import MessageSizeExceeded, NotLeader, ResourceLimitExceeded
from spate.core.ids import LeaderEpoch, NodeId, Term
from spate.node.replication import limits
from spate.node.replication import raft as raft_module
from spate.node.replication.messages import (
    Append,
    AppendResponse,
    Entry,
    HardState,
    Heartbeat,
    LeaderChange,
    Message,
    Proposed,
    Refusal,
    RefusalReason,
    VoteRequest,
)
from spate.node.replication.progress import ProgressState
from spate.node.replication.raft import Raft, RaftConfig, Role

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def propose(group: Group, node: str, payload: bytes) -> Proposed:
    result = group[node].propose(payload)
    assert isinstance(result, Proposed), result
    group.process(NodeId(node))
    return result


def test_election_by_timeout_yields_one_leader_known_to_all() -> None:
    """§5.2: a follower that hears nothing campaigns; a majority of votes makes it leader."""
    group = Group(3, seed=7)
    group.tick_all(25)
    leaders = group.leaders()
    assert len(leaders) == 1
    leader = leaders[0]
    for node in group.ids:
        assert group.nodes[node].leader == leader
        assert group.nodes[node].term == group.nodes[leader].term
    # The barrier entry of the new term commits everywhere.
    assert all(group.nodes[n].status().commit == 1 for n in group.ids)


def test_proposals_commit_and_apply_in_order_on_every_replica() -> None:
    group = Group(3)
    group.elect("n1")
    for i in range(20):
        propose(group, "n1", b"m%d" % i)
    group.stabilize()
    expected = [b"m%d" % i for i in range(20)]
    for node in ("n1", "n2", "n3"):
        assert group.applied_payloads(node) == expected


def test_follower_refuses_proposals_and_names_the_leader() -> None:
    group = Group(3)
    group.elect("n1")
    refusal = group["n2"].propose(b"x")
    assert refusal == Refusal(RefusalReason.NOT_LEADER, N1)
    assert isinstance(refusal, Refusal)
    error = refusal.error()
    assert isinstance(error, NotLeader) and error.leader_node == "n1"
    too_large = group["n1"].propose(bytes(limits.entry_bytes_max + 1))
    assert isinstance(too_large, Refusal)
    assert isinstance(too_large.error(), MessageSizeExceeded)
    assert group["n1"].propose(b"") == Refusal(RefusalReason.EMPTY, N1)


def test_pre_vote_keeps_a_rejoining_node_from_disrupting_the_leader() -> None:
    """Thesis §9.6: with pre-vote, a node cut off from the group campaigns without raising its
    term, so on its return it neither bumps the term nor deposes the working leader."""
    group = Group(3)
    group.elect("n1")
    group.cut.add(N3)
    group.tick("n3", 60)  # several election timeouts alone: pre-campaigns that go nowhere
    group.deliver()
    assert group.term("n3") == 1
    group.cut.clear()
    group["n3"].campaign()  # it is still trying when it comes back
    group.process(N3)
    group.stabilize()
    assert group["n1"].role is Role.LEADER and group.term("n1") == 1
    group.tick_all(5)
    assert group.leaders() == [N1]
    assert {group.term(n) for n in ("n1", "n2", "n3")} == {Term(1)}
    assert group["n3"].leader == N1


def test_without_pre_vote_the_rejoining_node_does_disrupt() -> None:
    """The contrast that shows the previous test can fail: plain Raft raises the term."""
    config = RaftConfig(election_timeout_ticks=10, pre_vote=False, check_quorum=False)
    group = Group(3, config=config)
    group.elect("n1")
    group.cut.add(N3)
    group.tick("n3", 60)
    group.deliver()
    assert group.term("n3") > 1
    group.cut.clear()
    group["n3"].campaign()
    group.process(N3)
    group.stabilize()
    assert group.term("n1") > 1  # the leader of term 1 was deposed
    assert group["n1"].role is not Role.LEADER or group.term("n1") > 1


def test_check_quorum_makes_an_isolated_leader_step_down() -> None:
    """Thesis §6.2: a leader that has not heard from a quorum within an election timeout
    steps down, so clients stop being served by a leader that cannot commit."""
    group = Group(3)
    group.elect("n1")
    group.cut.add(N1)
    group.tick("n1", 2 * group.config.election_timeout_ticks)
    assert group["n1"].role is Role.FOLLOWER
    assert group["n1"].leader is None
    assert isinstance(group["n1"].propose(b"x"), Refusal)
    # The other two elect a new leader of a later term.
    group.tick_all(40)
    (leader,) = group.leaders()
    assert leader != N1 and group.nodes[leader].term > 1


def test_divergent_follower_tail_is_repaired_with_few_round_trips() -> None:
    """§5.3: a leader forces followers' logs to duplicate its own; conflicting uncommitted
    entries are overwritten. The rejection hint (etcd's conflict term) lets the leader skip all
    the follower's term-1 tail in one round trip instead of one probe per entry."""
    group = Group(3)
    group.elect("n1")
    propose(group, "n1", b"common")
    group.stabilize()
    group.cut.add(N1)
    for i in range(30):  # n1 appends a tail nobody else will see
        propose(group, "n1", b"lost%d" % i)
    group.tick("n1", 2 * group.config.election_timeout_ticks)  # check-quorum: it steps down
    group.tick_all(40)
    (first,) = group.leaders()
    for i in range(5):
        propose(group, str(first), b"kept%d" % i)
    group.stabilize()
    # A second new leader, elected with n1's vote, probes n1 at its own last index (term 2),
    # where n1 holds a term-1 entry.
    (second,) = [n for n in (N2, N3) if n != first]
    group.cut = {first}
    group.nodes[second].campaign()
    group.process(second)
    group.stabilize()
    assert group.nodes[second].role is Role.LEADER
    group.cut.clear()
    group.stabilize()
    rejections = [
        line
        for line in group.trace
        if line.startswith("n1->") and "AppendResponse" in line and " reject " in line
    ]
    assert len(rejections) == 1, rejections
    expected = [b"common"] + [b"kept%d" % i for i in range(5)]
    for node in ("n1", "n2", "n3"):
        assert group.applied_payloads(node) == expected
    assert [e.payload for e in group.disk[N1].values() if e.payload] == expected


def test_commit_needs_a_majority_of_persisted_copies_counting_the_leader_disk() -> None:
    """The leader counts its own persisted index, not its appended one: with its disk slow and
    one follower's ack, 1 of 3 copies is durable and nothing commits; when the second follower
    acks, 2 of 3 are durable and it commits though the leader's own write is still pending."""
    group = Group(3)
    group.elect("n1")
    group.hold("n1")
    entry = propose(group, "n1", b"x")
    group.deliver(lambda m: m.target != N3)  # only n2 gets the Append
    group.deliver(lambda m: m.target != N3)  # n2's ack reaches n1
    assert group["n1"].progress(N2).match == entry.index
    assert group["n1"].status().persisted < entry.index
    assert group["n1"].status().commit < entry.index
    # Releasing the leader's disk makes it 2 of 3.
    group.release("n1")
    assert group["n1"].status().commit == entry.index
    group.stabilize()  # n3 catches up

    group.hold("n1")
    second = propose(group, "n1", b"y")
    group.deliver()  # both followers persist and ack
    group.deliver()
    assert group["n1"].status().persisted < second.index
    assert group["n1"].status().commit == second.index
    group.release("n1")


def test_a_leaders_appends_and_commit_advances_leave_while_its_ready_is_outstanding() -> None:
    """Issue 16, ADR 0033: between `ready()` and `advance()` (its fsync running) a leader's new
    entries, and the commit its followers' acks made, come out of `take_leader_messages` at
    once rather than in the next Ready; the followers commit while the leader's disk has not
    synced either entry. Nothing else leaves early: a follower's acks wait for its Ready."""
    group = Group(3)
    group.elect("n1")
    group.hold("n1")
    propose(group, "n1", b"x")  # in the held Ready: its Appends are pending already
    second = propose(group, "n1", b"y")  # proposed while that Ready is outstanding
    early = group["n1"].take_leader_messages()
    assert sorted((m.target, m.entries[-1].index) for m in early if isinstance(m, Append)) == [
        (N2, second.index),
        (N3, second.index),
    ]
    assert group["n1"].take_leader_messages() == ()
    group.pending.extend(early)
    group.deliver()  # the followers persist both entries and ack
    assert group["n2"].take_leader_messages() == ()
    group.deliver()  # the acks: 2 of 3 copies persisted without the leader's
    assert group["n1"].status().persisted < second.index
    assert group["n1"].status().commit == second.index
    commit = group["n1"].take_leader_messages()
    assert sorted((m.target, m.commit) for m in commit if isinstance(m, Append)) == [
        (N2, second.index),
        (N3, second.index),
    ]
    group.pending.extend(commit)
    group.deliver()
    assert group["n2"].status().commit == group["n3"].status().commit == second.index
    assert group.applied_payloads("n2") == [b"x", b"y"]
    group.release("n1")
    group.stabilize()
    assert group.applied_payloads("n1") == [b"x", b"y"]


def test_a_follower_answers_the_appends_of_one_ready_with_one_ack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """§5.3: an accepted AppendResponse tells the leader the follower's log matches its own up
    to `index`, so a later one says all an earlier one does. Appends a follower took while its
    sync ran (here: before its next Ready) are answered by one ack, for the last, after the
    sync; the leader commits them all from it (issue 16: the leader stepped one ack per
    Append)."""
    monkeypatch.setattr(raft_module, "FOLD_ACKS", True)  # whatever the switch says
    group = Group(3)
    group.elect("n1")
    coalesced = group["n2"].acks_coalesced, group["n3"].acks_coalesced
    indexes = [propose(group, "n1", b"m%d" % i).index for i in range(3)]
    appends = [
        m for m in group.pending if isinstance(m, Append) and m.target == N2 and m.entries
    ]  # (the empty ones: ADR 0050's commit-with updates)
    assert [m.entries[-1].index for m in appends] == indexes  # one Append per Ready of n1
    group.deliver()  # each follower steps its three Appends, then takes one Ready
    acks = [m for m in group.pending if isinstance(m, AppendResponse)]
    assert sorted((m.source, m.index) for m in acks) == [(N2, indexes[-1]), (N3, indexes[-1])]
    assert (group["n2"].acks_coalesced, group["n3"].acks_coalesced) == (
        coalesced[0] + 2,
        coalesced[1] + 2,
    )
    group.deliver()
    assert group["n1"].status().commit == indexes[-1]
    group.stabilize()
    assert group.applied_payloads("n2") == [b"m0", b"m1", b"m2"]


def test_a_commit_update_to_a_replicating_follower_is_quiet_and_not_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ADR 0042: once a quorum acknowledged an entry, the leader tells the followers the new
    commit index in an empty Append. To a follower in REPLICATE state it is `quiet`, and the
    follower, accepting it, does not answer (the answer told the leader nothing its acks and
    heartbeat answers do not); the entries still commit and apply everywhere."""
    monkeypatch.setattr(raft_module, "QUIET_COMMITS", True)
    # Without ADR 0050 the followers with readers (all, here) need the update; with it they
    # commit by themselves once they hold the entry (test_commit_with.py).
    monkeypatch.setattr(raft_module, "COMMIT_WITH_YOU", False)
    group = Group(3)
    group.elect("n1")
    group.stabilize()
    index = propose(group, "n1", b"m").index
    group.deliver()  # the Appends
    group.deliver()  # the acks: n1 commits and tells the followers
    updates = [m for m in group.pending if isinstance(m, Append) and not m.entries]
    assert sorted(m.target for m in updates) == [N2, N3]
    assert all(m.quiet and m.commit == index for m in updates)
    group.deliver()
    assert not [m for m in group.pending if isinstance(m, AppendResponse)], "not answered"
    assert group["n2"].log.committed == group["n3"].log.committed == index
    group.stabilize()
    assert group.applied_payloads("n2") == group.applied_payloads("n3") == [b"m"]


def test_a_quiet_commit_update_is_answered_when_rejected_and_off_when_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quiet Append the follower cannot accept (a gap) is answered like any: the leader must
    back off (§5.3). `QUIET_COMMITS` off: the update is not quiet, and answered."""
    group = Group(3)
    group.elect("n1")
    group.stabilize()
    follower = group["n2"]
    term, last = follower.term, follower.log.last_index
    follower.step(Append(term, N1, N2, last + 5, term, (), last, quiet=True))
    answers = [m for m in follower.ready().messages if isinstance(m, AppendResponse)]
    assert [(m.index, m.rejected) for m in answers] == [(last + 5, True)]

    monkeypatch.setattr(raft_module, "QUIET_COMMITS", False)
    monkeypatch.setattr(raft_module, "COMMIT_WITH_YOU", False)  # as above
    group = Group(3)
    group.elect("n1")
    group.stabilize()
    propose(group, "n1", b"m")
    group.deliver()
    group.deliver()
    updates = [m for m in group.pending if isinstance(m, Append) and not m.entries]
    assert updates and not any(m.quiet for m in updates)
    group.deliver()
    assert len([m for m in group.pending if isinstance(m, AppendResponse)]) == 2


def test_a_rejection_between_two_acks_keeps_its_place() -> None:
    """Only an accepted ack directly after another to the same leader is replaced: a rejection
    (the leader backs off on it, §5.3) and the acks around it leave as they were made."""
    group = Group(3)
    group.elect("n1")
    group.stabilize()
    follower = group["n2"]
    coalesced = follower.acks_coalesced
    term, last = follower.term, follower.log.last_index
    entry = Entry(last + 1, term, b"a")

    def append(prev_index: int, prev_term: Term, *entries: Entry) -> Append:
        return Append(term, N1, N2, prev_index, prev_term, entries, last)

    follower.step(append(last, term, entry))
    follower.step(append(last + 5, term))  # a gap: rejected
    follower.step(append(last + 1, term, Entry(last + 2, term, b"b")))
    messages = follower.ready().messages
    acks = [m for m in messages if isinstance(m, AppendResponse)]
    assert len(acks) == len(messages)
    assert [(m.index, m.rejected) for m in acks] == [
        (last + 1, False),
        (last + 5, True),
        (last + 2, False),
    ]
    assert follower.acks_coalesced == coalesced


def test_a_leadership_check_is_confirmed_by_a_quorum_answering_heartbeats_sent_after_it() -> None:
    """Thesis §6.4 (ReadIndex): a read may be answered from the leader's log only once a
    quorum has answered a heartbeat sent after the read began; answers to earlier heartbeats
    do not count, however late they arrive."""
    group = Group(3)
    group.elect("n1")
    group.stabilize()
    leader = group["n1"]
    assert leader.leadership_confirmed == 0
    group.tick("n1")  # heartbeats of no check (round 0)
    before = [m for m in group.pending if isinstance(m, Heartbeat)]
    assert [m.round for m in before] == [0, 0]
    check = leader.confirm_leadership()
    group.process(N1)  # the check's heartbeats leave at once, not at the next tick
    assert sorted((m.target, m.round) for m in group.pending if isinstance(m, Heartbeat)) == [
        (N2, 0),
        (N2, check),
        (N3, 0),
        (N3, check),
    ]
    group.deliver(lambda m: not isinstance(m, Heartbeat) or m.round == 0)
    group.deliver()  # the answers to the round-0 heartbeats only
    assert leader.leadership_confirmed < check
    group.tick("n1")  # lost: the next heartbeats carry the round again
    group.deliver(lambda m: m.target != N3)  # n2 answers: with the leader, a quorum
    group.deliver()
    assert leader.leadership_confirmed == check
    single = Group(1)  # a single voter: nobody else can lead
    single.elect("n1")
    assert single["n1"].confirm_leadership() == single["n1"].leadership_confirmed


def test_a_leader_left_behind_by_a_transfer_never_confirms_its_leadership() -> None:
    """§6.4: a transfer's vote waives the voters' lease, so the new leader is elected at once;
    an old leader that has not heard its new term yet (the vote request to it lost) still
    believes it leads, and check-quorum would not tell it otherwise for an election timeout
    or two. Its leadership check is never confirmed: the voters answer its heartbeats with
    their new term, and it steps down."""
    group = Group(3)
    group.elect("n1")
    group.stabilize()
    old = group["n1"]
    assert old.transfer_leadership(N2) is None
    group.process(N1)
    group.deliver(lambda m: m.target != N1)  # TimeoutNow; then nothing reaches n1
    for _ in range(5):
        group.deliver(lambda m: m.target != N1)
    assert group["n2"].role is Role.LEADER and group.term("n2") > group.term("n1")
    assert old.role is Role.LEADER  # it has heard nothing
    check = old.confirm_leadership()
    group.process(N1)
    for _ in range(5):
        group.deliver(lambda m: m.source != N1 or isinstance(m, Heartbeat))
        assert old.leadership_confirmed < check
    assert old.role is Role.FOLLOWER and old.term == group.term("n2")


def test_leader_epoch_increases_with_every_new_leader_and_is_reported() -> None:
    group = Group(3)
    group.elect("n1")
    assert [c for c in group.leader_changes[N2] if c.leader] == [LeaderChange(N1, LeaderEpoch(1))]
    group.cut.add(N1)
    group.tick_all(40)
    (leader,) = group.leaders()
    epoch = group.nodes[leader].leader_epoch
    assert epoch > 1
    group.cut.clear()
    group.tick_all(3)
    group.stabilize()
    for node in group.ids:
        assert group.nodes[node].leader_epoch == epoch
        epochs = [c.epoch for c in group.leader_changes[node]]
        assert epochs == sorted(epochs), epochs
        assert group.leader_changes[node][-1] == LeaderChange(leader, epoch)


def test_a_follower_behind_the_compacted_log_gets_snapshot_needed_then_catches_up() -> None:
    """The leader has dropped entries from memory (log_cache_bytes=0); the lagging follower is
    told to fetch segments up to the snapshot index and, once restored, replicates normally."""
    group = Group(3, config=RaftConfig(election_timeout_ticks=10, log_cache_bytes=0))
    group.elect("n1")
    group.cut.add(N3)
    for i in range(10):
        propose(group, "n1", b"old%d" % i)
    group.stabilize()
    snapshot = group["n1"].log.snapshot
    assert snapshot.index == 11  # barrier + 10 entries, all applied and dropped from memory
    group.cut.clear()
    group.tick_all(2)
    group.stabilize()
    assert any(line.startswith("n1->n3 SnapshotNeeded") for line in group.trace)
    request = group.snapshot_requests[N3]
    assert request.leader == N1 and request.snapshot == snapshot
    assert group["n1"].progress(N3).state is ProgressState.SNAPSHOT
    # The shell transfers the segments (not modelled here), then restores the core.
    assert group["n3"].restore(snapshot.index, snapshot.term)
    group.process(N3)
    # Its ack is lost: the leader keeps asking, and the follower answers with how far it is.
    assert group.deliver(lambda m: not isinstance(m, AppendResponse)) == 0
    assert group["n1"].progress(N3).state is ProgressState.SNAPSHOT
    assert not group["n3"].restore(snapshot.index, snapshot.term)  # a duplicate transfer
    group.process(N3)
    group.pending.clear()  # whose ack is lost too
    group.tick_all(3)
    group.stabilize()
    assert group["n3"].status().commit == snapshot.index
    assert group["n1"].progress(N3).state is ProgressState.REPLICATE
    propose(group, "n1", b"new")
    group.stabilize()
    assert group.applied_payloads("n3") == [b"new"]


def test_pipeline_and_batching_are_bounded() -> None:
    """At most inflight_appends_max Appends are outstanding per follower, each carrying at most
    append_bytes_max of entries."""
    config = RaftConfig(election_timeout_ticks=10, inflight_appends_max=3, append_bytes_max=1000)
    group = Group(3, config=config)
    group.elect("n1")
    for i in range(100):  # proposed between two Readies: batched into few messages
        assert isinstance(group["n1"].propose(bytes([i]) * 100), Proposed)
    group.process(N1)
    appends = [m for m in group.pending if isinstance(m, Append) and m.target == N2]
    assert len(appends) == 3
    assert all(sum(len(e.payload) for e in m.entries) <= 1000 for m in appends)
    assert sum(len(m.entries) for m in appends) == 30
    group.stabilize()
    assert len(group.applied_payloads("n2")) == 100


def test_proposals_are_refused_past_the_unapplied_byte_limit() -> None:
    group = Group(3)
    group.elect("n1")
    group.cut.update((N2, N3))  # nothing commits, so nothing is applied
    payload = bytes(limits.entry_bytes_max)
    accepted = 0
    while isinstance(group["n1"].propose(payload), Proposed):
        accepted += 1
    assert accepted == limits.log_unapplied_bytes_max // limits.entry_bytes_max
    refusal = group["n1"].propose(payload)
    assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.BACKPRESSURE
    assert isinstance(refusal.error(), ResourceLimitExceeded)


def test_a_stale_leader_learns_the_new_term_from_a_rejection() -> None:
    """A leader cut off in an old term gets an AppendResponse carrying the current term and
    steps down, even though pre-vote kept the others from telling it through votes."""
    group = Group(3)
    group.elect("n1")
    group.cut.add(N1)
    group.tick_all(40)
    group.cut.clear()
    group.pending.clear()
    group.tick("n1")  # heartbeats in term 1
    seen: list[Message] = []

    def record(message: Message) -> bool:
        seen.append(message)
        return True

    group.deliver(record)
    group.deliver(record)
    assert any(isinstance(m, AppendResponse) and m.target == N1 and m.term > 1 for m in seen)
    assert group["n1"].role is Role.FOLLOWER and group.term("n1") > 1


def test_a_candidate_with_a_stale_log_is_not_elected() -> None:
    """§5.4.1: a voter denies its vote to a candidate whose log is less up to date."""
    group = Group(3)
    group.elect("n1")
    group.cut.add(N3)
    propose(group, "n1", b"x")
    group.stabilize()
    group.cut = {N1}
    group.tick("n3", 25)  # well past its election timeout: n3 will campaign
    group.tick("n2", 25)
    for _ in range(10):
        group.deliver(lambda m: not (isinstance(m, VoteRequest) and m.source == N2))
    assert group["n3"].role is not Role.LEADER


def test_restart_from_persisted_state_keeps_term_vote_and_log() -> None:
    """A replica rebuilt from its synced hard state and log is the same voter: same term, same
    vote (so it cannot vote twice in a term), same log; committed entries are re-applied."""
    group = Group(3)
    group.elect("n1")
    propose(group, "n1", b"x")
    group.stabilize()
    old = group["n2"]
    hard_state = HardState(old.term, old.vote, old.log.committed)
    restarted = Raft(
        N2,
        group.ids,
        group.config,
        random.Random(1),
        hard_state=hard_state,
        entries=sorted(group.disk[N2].values(), key=lambda e: e.index),
    )
    assert restarted.term == old.term and restarted.vote == N1
    assert restarted.log.last_index == old.log.last_index
    assert [e.payload for e in restarted.ready().committed if e.payload] == [b"x"]
