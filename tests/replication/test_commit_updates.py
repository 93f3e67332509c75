"""ADR 0044: a leader sends a commit update of its own (an empty Append carrying a new commit
index) only to a follower whose last accepted ack said it has readers; the others learn the
commit index from the next Append or heartbeat, as Raft lets them."""

from __future__ import annotations

import pytest
from replication.drivers import IDS, Nodes, outcomes
from replication.harness import Group
from spate.core.ids import NodeId, Offset
from spate.node.replication import raft as raft_module
from spate.node.replication.messages import Append, AppendResponse

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def test_a_follower_without_readers_learns_the_commit_from_the_next_append_or_heartbeat() -> None:
    group = Group(3, readers=False)
    group.elect("n1")
    group.stabilize()
    first = group.propose("n1", b"a")
    group.deliver()  # the Appends
    group.deliver()  # the acks: n1 commits
    assert group["n1"].log.committed == first
    assert group.empty_appends() == [], "no commit update of its own to a follower without readers"
    group.stabilize()
    assert group["n2"].log.committed < first and group["n3"].log.committed < first
    second = group.propose("n1", b"b")
    appends = [m for m in group.pending if isinstance(m, Append)]
    assert appends and all(m.entries and m.commit == first for m in appends)
    group.deliver()  # the next Append carries the commit index
    assert group["n2"].log.committed == group["n3"].log.committed == first
    group.stabilize()
    assert group["n1"].log.committed == second
    group.tick("n1")  # the heartbeat carries it too
    group.stabilize()
    assert group["n2"].log.committed == group["n3"].log.committed == second
    assert group.applied_payloads("n2") == group.applied_payloads("n3") == [b"a", b"b"]


def test_a_follower_says_in_its_acks_whether_it_has_readers() -> None:
    group = Group(3, readers=False)
    group.elect("n1")
    group.stabilize()
    group["n2"].readers = True  # a consumer attached on n2
    index = group.propose("n1", b"a")
    group.deliver()
    acks = {m.source: m.readers for m in group.pending if isinstance(m, AppendResponse)}
    assert acks == {N2: True, N3: False}
    group.deliver()
    assert [(m.target, m.commit, m.quiet) for m in group.empty_appends()] == [(N2, index, True)]
    group.stabilize()
    assert group["n2"].log.committed == index > group["n3"].log.committed

    group["n2"].readers = False  # the consumer left: its next ack says so
    index = group.propose("n1", b"b")
    group.deliver()
    group.deliver()
    assert group.empty_appends() == []
    group.stabilize()
    assert group["n3"].log.committed < index
    # (n2 had been told before its ack arrived that `b` commits once it holds it, ADR 0050.)
    assert not group["n1"].progress(N2).readers
    index = group.propose("n1", b"c")
    group.deliver()
    group.deliver()
    assert group.empty_appends() == []
    group.stabilize()
    assert group["n2"].log.committed < index and group["n3"].log.committed < index


def test_switched_to_all_every_follower_gets_its_commit_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(raft_module, "COMMIT_UPDATES_TO_ALL", True)
    group = Group(3, readers=False)
    group.elect("n1")
    group.stabilize()
    index = group.propose("n1", b"a")
    group.deliver()
    group.deliver()
    assert sorted(m.target for m in group.empty_appends()) == [N2, N3]
    group.stabilize()
    assert group["n2"].log.committed == group["n3"].log.committed == index


def test_a_replica_with_listeners_gets_commits_on_the_spot_and_others_at_the_tick() -> None:
    """The shell side: `Replica.add_listener` (a consumer waiting on this node) sets
    `Raft.readers`; removing the last listener clears it."""
    nodes = Nodes(readers=False)
    n1, n2, n3 = nodes.elect()
    waiting = nodes.replicas[n2]

    def wake() -> None:
        pass

    waiting.add_listener(wake)
    assert waiting.raft.readers
    got, done = outcomes()
    for n in range(3):
        nodes.replicas[n1].propose([b"r%d" % n], done)  # type: ignore[arg-type]
        nodes.settle()
        assert got[-1] == Offset(n)
        assert nodes.replicas[n2].end_offset() == Offset(n + 1)  # learned on the spot
        assert nodes.replicas[n3].end_offset() == Offset(n)  # from the next Append
    for node in IDS:
        nodes.drivers[node].tick()
    nodes.settle()
    assert nodes.replicas[n3].end_offset() == Offset(3)  # the heartbeat's commit
    waiting.remove_listener(wake)
    assert not waiting.raft.readers


def test_a_commit_for_entries_a_follower_has_not_written_is_counted_and_applied_after() -> None:
    """RESULTS §60: the reader's follower learns a commit (from the other follower's ack) for
    an entry it holds but has not yet handed to disk; it can apply it only after its next
    write. `commits_ahead_of_write` counts such messages (/metrics)."""
    nodes = Nodes()
    leader, slow, fast = nodes.elect()
    before = nodes.drivers[slow].commits_ahead_of_write
    got, done = outcomes()
    nodes.replicas[leader].propose([b"x"], done)  # type: ignore[arg-type]
    nodes.run(leader)  # written, the Appends sent (the leader's own sync done too)
    nodes.deliver(to=[fast, slow])  # both hold the entry; only `fast` writes and acks
    nodes.run(fast)
    nodes.deliver(to=[leader])  # the leader commits, and sends `slow` its commit update
    assert len(got) == 1
    end = nodes.replicas[slow].end_offset()
    nodes.deliver(to=[slow])
    assert nodes.drivers[slow].commits_ahead_of_write == before + 1
    assert nodes.replicas[slow].end_offset() == end  # not applied: not written here yet
    nodes.run(slow)  # its write: now applied
    assert nodes.replicas[slow].end_offset() == end + 1
    assert nodes.drivers[fast].commits_ahead_of_write == 0
