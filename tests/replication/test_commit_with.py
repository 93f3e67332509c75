"""ADR 0050: the leader tells each voter what commits once that voter holds it
(`Append.commit_with_you`); a follower commits that far as soon as its own log is persisted,
without waiting for its ack's round trip to the leader and the commit update back. Safety:
only entries of the leader's term, a quorum counted the leader's way with the follower's vote
given, within what the follower's log matched, never past what it persisted."""

from __future__ import annotations

import random

import pytest
from replication.drivers import Nodes, outcomes
from replication.harness import Group
from spate.core.frames import CodecError, frame_bytes
from spate.core.ids import NodeId, Offset, Term
from spate.node.replication import codec
from spate.node.replication import raft as raft_module
from spate.node.replication.messages import (
    Append,
    AppendResponse,
    Entry,
    Membership,
)
from spate.node.replication.raft import Raft, RaftConfig

N1, N2, N3, N4 = NodeId("n1"), NodeId("n2"), NodeId("n3"), NodeId("n4")
KEY = ("s", 0)


def test_a_follower_commits_at_the_end_of_its_own_sync_before_the_leader_hears_its_ack() -> None:
    group = Group(3)  # every replica has readers
    group.elect("n1")
    group.stabilize()
    index = group.propose("n1", b"a")
    # The leader persisted the entry after sending it: each follower is told that its copy
    # completes the quorum, in an empty Append it does not answer.
    updates = group.empty_appends()
    assert sorted((m.target, m.commit_with_you, m.quiet) for m in updates) == [
        (N2, index, True),
        (N3, index, True),
    ]
    group.deliver()  # the Appends and the updates: each follower persists, then commits
    assert group["n1"].log.committed < index
    assert group["n2"].log.committed == group["n3"].log.committed == index
    assert group.applied_payloads("n2") == group.applied_payloads("n3") == [b"a"]
    acks = [m for m in group.pending if isinstance(m, AppendResponse)]
    assert sorted((m.source, m.index) for m in acks) == [(N2, index), (N3, index)]
    group.deliver()  # the acks: the leader commits; no commit update, they know already
    assert group["n1"].log.committed == index
    assert group.empty_appends() == []
    group.stabilize()
    assert group.applied_payloads("n1") == [b"a"]


def test_nothing_commits_on_a_follower_while_the_quorum_lacks_a_disk() -> None:
    """The leader's own disk has not synced the entry: a follower's copy alone is not a
    quorum, so the leader promises nothing; the followers' acks commit it as before."""
    group = Group(3)
    group.elect("n1")
    group.stabilize()
    group.hold("n1")
    index = group.propose("n1", b"a")
    appends = [m for m in group.pending if isinstance(m, Append)]
    assert appends and all(m.commit_with_you < index for m in appends)
    later = [m for m in group.pending if m.target == N3]  # n3's Append waits
    group.deliver(lambda m: m.target == N2)
    assert group["n2"].log.committed < index
    group.deliver(lambda m: m.source == N2)  # n2's ack: n1 (unsynced) + n2 is no quorum
    assert group["n1"].log.committed < index
    # ... but with n2's ack counted, n3's copy completes one: n3 (readers) is told so, at
    # once (what the driver sends between batches: `take_leader_messages`).
    updates = [m for m in group["n1"].take_leader_messages() if isinstance(m, Append)]
    assert [(m.target, m.entries, m.commit_with_you) for m in updates] == [(N3, (), index)]
    group.pending = later + updates
    group.deliver()
    assert group["n3"].log.committed == index  # its sync completed the quorum {n2, n3}
    assert group["n1"].log.committed < index
    group.release("n1")
    group.stabilize()
    assert [group[n].log.committed for n in ("n1", "n2", "n3")] == [index] * 3


def test_a_follower_without_readers_gets_no_update_of_its_own() -> None:
    group = Group(3, readers=False)
    group.elect("n1")
    group.stabilize()
    group.propose("n1", b"a")
    assert group.empty_appends() == []


def test_a_learner_is_never_told_that_its_copy_completes_a_quorum() -> None:
    group = Group(4)
    group.nodes = {
        node: Raft(node, Membership.of([N1, N2, N3], [N4]), group.config, random.Random(node))
        for node in group.ids
    }
    for raft in group.nodes.values():
        raft.readers = True
    group.elect("n1")
    group.stabilize()
    for payload in (b"a", b"b"):
        group.propose("n1", payload)
        sent = [m for m in group.pending if isinstance(m, Append)]
        assert {m.target for m in sent} == {N2, N3, N4}
        assert all(m.commit_with_you == 0 for m in sent if m.target == N4)
        assert any(m.commit_with_you for m in sent if m.target != N4)
        group.stabilize()
    assert group.applied_payloads("n4") == [b"a", b"b"]


def _follower() -> Raft:
    return Raft(N2, [N1, N2, N3], RaftConfig(), random.Random(2))


def _persist(raft: Raft) -> None:
    while raft.has_ready():
        raft.advance(raft.ready())


def test_a_follower_commits_no_further_than_the_append_matched_nor_than_it_persisted() -> None:
    follower = _follower()
    t = Term(2)
    entries = tuple(Entry(i, t, b"x%d" % i) for i in (1, 2, 3))
    # The leader says 9 commits with us, but this Append matched up to 3 only.
    follower.step(Append(t, N1, N2, 0, Term(0), entries, 0, commit_with_you=9))
    assert follower.log.committed == 0  # nothing persisted yet
    ready = follower.ready()
    assert ready.entries and follower.log.committed == 0
    follower.advance(ready)  # the sync is done
    assert follower.log.committed == 3
    # An entry beyond it, from an Append with an older commit_with_you: not committed.
    follower.step(Append(t, N1, N2, 3, t, (Entry(4, t, b"x4"),), 0, commit_with_you=3))
    _persist(follower)
    assert follower.log.committed == 3


def test_a_new_term_forgets_what_the_old_leader_said() -> None:
    follower = _follower()
    old, new = Term(2), Term(3)
    entries = tuple(Entry(i, old, b"x%d" % i) for i in (1, 2))
    follower.step(Append(old, N1, N2, 0, Term(0), entries, 0, commit_with_you=2))
    ready = follower.ready()  # written, not yet synced...
    # ... when another leader takes over (the old one's promise came from its quorum count,
    # which its successor need not share) and sends nothing new.
    follower.step(Append(new, N3, N2, 2, old, (), 0))
    follower.advance(ready)
    _persist(follower)
    assert follower.log.committed == 0


def test_switched_off_the_leader_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raft_module, "COMMIT_WITH_YOU", False)
    group = Group(3)
    group.elect("n1")
    group.stabilize()
    index = group.propose("n1", b"a")
    assert all(
        m.commit_with_you == 0 for m in group.pending if isinstance(m, Append)
    )  # and no update of its own
    assert group.empty_appends() == []
    group.deliver()
    assert group["n2"].log.committed < index  # it waits for the leader's commit update
    group.stabilize()
    assert group["n2"].log.committed == index


@pytest.mark.parametrize(
    "message",
    [
        Append(Term(4), N1, N2, 9, Term(3), (Entry(10, Term(4), b"abc"),), 8, False, 10),
        Append(Term(4), N1, N2, 9, Term(3), (Entry(10, Term(4), b""),), 8, False, 10),
        Append(Term(4), N1, N2, 10, Term(4), (), 9, True, 10),
        Append(Term(4), N1, N2, 10, Term(4), (), 9, False, 10),
        Append(Term(4), N1, N2, 10, Term(4), (), 9, True, 0),
    ],
)
def test_commit_with_you_round_trips(message: Append) -> None:
    body = frame_bytes(codec.encode_raft(KEY, message))[5:]
    assert codec.decode_raft(body) == (KEY, message)


def test_bad_append_flags_are_refused() -> None:
    with_entries = Append(Term(4), N1, N2, 9, Term(3), (Entry(10, Term(4), b"abc"),), 8)
    body = frame_bytes(codec.encode_raft(KEY, with_entries))[5:]
    for flags in (b"\x00", b"\x01", b"\x04"):  # none, quiet with entries, unknown bit
        with pytest.raises(CodecError):
            codec.decode_raft(body + flags + (b"" if flags != b"\x04" else bytes(8)))


def test_production_drivers_a_reader_follower_applies_before_its_ack_reaches_the_leader() -> None:
    """Through the production drivers and replicas: the follower's batch that syncs the entry
    applies it (its listeners are woken, its committed end moves) while the leader, which has
    not stepped the ack yet, has not."""
    nodes = Nodes()
    n1, n2, _ = nodes.elect()
    leader, follower = nodes.replicas[n1], nodes.replicas[n2]
    woken: list[int] = []
    follower.add_listener(lambda: woken.append(follower.end_offset()))
    got, done = outcomes()
    before = follower.end_offset()
    leader.propose([b"record"], done)  # type: ignore[arg-type]
    nodes.run(n1)  # the Append leaves, the leader syncs, then tells n2 its copy completes
    frames = [m for m in nodes.raft_frames(n1) if isinstance(m, Append) and m.target == n2]
    assert [bool(m.entries) for m in frames] == [True, False]
    assert frames[1].commit_with_you == frames[0].entries[-1].index
    nodes.deliver(to=[n2])
    nodes.run(n2)  # n2 writes, syncs, and commits at the end of its batch
    assert follower.end_offset() == before + 1 and woken == [before + 1]
    assert got == [] and leader.end_offset() == before  # n1 has not heard an ack
    nodes.deliver(to=[n1])
    nodes.run(n1)
    assert got == [Offset(before)]
    nodes.settle()
