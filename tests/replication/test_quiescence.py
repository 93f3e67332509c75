"""Quiet groups and node liveness (ADR 0026): the Raft core's quiescence, pumped by hand
(harness.py), and the replication driver's PING-based suspicion that wakes quiet groups."""

from __future__ import annotations

from replication.harness import Group
from spate.core.ids import NodeId
from spate.node.replication import codec
from spate.node.replication.messages import Heartbeat, Proposed
from spate.node.replication.raft import RaftConfig, Role

QUIET = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1, quiesce=True)


def quiet_group() -> Group:
    group = Group(3, config=QUIET)
    group.elect("n1")
    group.tick_all(4)  # two idle heartbeat rounds answered by both followers
    group.stabilize()  # the answers to the quiesce heartbeat
    return group


def test_an_idle_group_goes_quiet_and_sends_nothing_while_quiet() -> None:
    group = quiet_group()
    assert all(group[n].quiesced for n in ("n1", "n2", "n3"))
    quiesce = [line for line in group.trace if "quiesce" in line or "Heartbeat" in line]
    assert quiesce, group.trace[-10:]
    before = len(group.trace)
    group.tick_all(100)  # ten election timeouts: no election, no message at all
    assert group.trace[before:] == []
    assert group.leaders() == [NodeId("n1")]
    assert {group.term(n) for n in ("n1", "n2", "n3")} == {group.term("n1")}


def test_a_bare_core_without_quiesce_keeps_heartbeating() -> None:
    group = Group(3)  # the default config: a shell without node liveness never goes quiet
    group.elect("n1")
    group.tick_all(20)
    assert not any(group[n].quiesced for n in ("n1", "n2", "n3"))
    before = len(group.trace)
    group.tick_all(5)
    assert len(group.trace) > before


def test_a_proposal_wakes_the_group_commits_everywhere_and_it_goes_quiet_again() -> None:
    group = quiet_group()
    result = group["n1"].propose(b"after a quiet spell")
    assert isinstance(result, Proposed)
    group.stabilize()
    for node in ("n1", "n2", "n3"):
        assert group.applied_payloads(node) == [b"after a quiet spell"]
    group.tick_all(4)
    assert all(group[n].quiesced for n in ("n1", "n2", "n3"))


def test_the_leader_stays_awake_while_a_follower_is_behind_until_it_is_suspected() -> None:
    group = Group(3, config=QUIET)
    group.elect("n1")
    group.cut.add(NodeId("n3"))
    assert isinstance(group["n1"].propose(b"n3 misses this"), Proposed)
    group.tick_all(30)
    assert not group["n1"].quiesced  # n3 lacks an entry: it must keep being sent heartbeats
    assert group.leaders() == [NodeId("n1")]
    group["n1"].dead_peers = {NodeId("n3")}  # node liveness gives up on n3
    group.tick_all(3)
    assert group["n1"].quiesced


def test_the_leader_goes_quiet_without_a_follower_node_liveness_suspects() -> None:
    """A dead follower must not keep every partition it followed awake: once the shell's node
    liveness suspects it, a quorum up to date is enough; with both followers suspected the
    leader stays awake (and check-quorum deposes it)."""
    group = Group(3, config=QUIET)
    group.elect("n1")
    group.cut.add(NodeId("n3"))
    group["n1"].dead_peers = {NodeId("n3")}
    group.tick_all(5)
    assert group["n1"].quiesced and group["n2"].quiesced
    group["n1"].dead_peers = {NodeId("n2"), NodeId("n3")}
    group.cut.add(NodeId("n2"))
    group["n1"].wake()
    group.tick("n1", 11)
    assert not group["n1"].quiesced and group["n1"].role is Role.FOLLOWER


def test_a_lost_quiesce_heartbeat_is_repaired_by_the_followers_campaign() -> None:
    """n3 misses the quiesce heartbeat: its election timer runs, its pre-vote wakes the
    leader (which answers with heartbeats), and nobody's term moves."""
    group = Group(3, config=QUIET)
    group.elect("n1")
    for _ in range(5):
        group["n1"].tick()
        group.process(NodeId("n1"))
        group.deliver(lambda m: not (isinstance(m, Heartbeat) and m.quiesce and m.target == "n3"))
    group.stabilize()
    assert group["n1"].quiesced and group["n2"].quiesced and not group["n3"].quiesced
    term = group.term("n1")
    before = len(group.trace)
    group.tick_all(60)
    assert group.leaders() == [NodeId("n1")]
    assert {group.term(n) for n in ("n1", "n2", "n3")} == {term}
    campaign = [line for line in group.trace[before:] if line.startswith("n3->n1 VoteRequest")]
    assert campaign and "pre" in campaign[0], group.trace[before:]
    assert all(group[n].quiesced for n in ("n1", "n2", "n3"))


def test_waking_followers_whose_leader_died_elects_a_new_leader() -> None:
    """What node liveness does when the leader's node goes silent: the quiet followers are
    woken, keep their lease for an election timeout, then elect one of them."""
    group = quiet_group()
    term = group.term("n1")
    group.cut.add(NodeId("n1"))
    group.tick_all(50)
    roles = {n: group[n].role for n in ("n2", "n3")}
    assert roles == {"n2": Role.FOLLOWER, "n3": Role.FOLLOWER}  # quiet: they never notice
    group["n2"].wake()
    group["n3"].wake()
    group.tick_all(9)
    assert group.leaders() == []  # the lease holds for one election timeout
    group.tick_all(40)
    leaders = group.leaders()
    assert len(leaders) == 1 and leaders[0] != NodeId("n1")
    assert group.term(leaders[0]) > term


def test_a_woken_leader_cut_from_both_followers_steps_down_by_check_quorum() -> None:
    group = quiet_group()
    group.cut.update({NodeId("n2"), NodeId("n3")})
    group["n1"].dead_peers = {NodeId("n2"), NodeId("n3")}  # what node liveness concludes
    group["n1"].wake()
    group.tick("n1", 9)
    assert group["n1"].role is Role.LEADER
    group.tick("n1", 2)
    assert group["n1"].role is Role.FOLLOWER  # within one election timeout of waking


def test_the_heartbeat_codec_carries_the_quiesce_flag_and_reads_old_frames() -> None:
    key = ("s", 0)
    for quiesce in (False, True):
        message = Heartbeat(3, NodeId("n1"), NodeId("n2"), 7, quiesce)
        frame = codec.encode_raft(key, message)
        assert codec.decode_raft(memoryview(frame)[5:]) == (key, message)
    old = codec.encode_raft(key, Heartbeat(3, NodeId("n1"), NodeId("n2"), 7))
    assert (
        len(old)
        == len(codec.encode_raft(key, Heartbeat(3, NodeId("n1"), NodeId("n2"), 7, True))) - 1
    )


def test_a_follower_woken_for_a_suspected_leader_settles_again_if_nothing_happened() -> None:
    """ADR 0026 addendum: node liveness wakes n2 because n1's node is late; n1's node is
    heard from again before n2's election timeout: n2 goes back to sleep with its lease on n1,
    nothing sent, and stays asleep."""
    group = quiet_group()
    group["n2"].wake(leader_suspected=True)
    assert not group["n2"].quiesced
    group.tick_all(5)  # within the lease: n2 does nothing yet
    assert group["n2"].settle_again()
    assert group["n2"].quiesced and group["n2"].leader == NodeId("n1")
    assert not group["n2"].settle_again()  # once
    before = len(group.trace)
    group.tick_all(100)
    assert group.trace[before:] == []
    assert group.leaders() == [NodeId("n1")]


def test_a_woken_follower_that_did_something_does_not_settle_again() -> None:
    """Only liveness's own wake-up is undone: a follower that campaigned, stepped a message
    or was woken for work stays awake and finishes what it started."""
    group = quiet_group()
    group["n2"].wake(leader_suspected=True)
    group.tick("n2", 25)  # past its election timeout: it campaigns (a pre-vote)
    assert group["n2"].role is Role.PRE_CANDIDATE
    assert not group["n2"].settle_again()

    group = quiet_group()
    group["n2"].wake(leader_suspected=True)
    group["n3"].wake()
    group.tick("n3", 25)  # n3's pre-vote reaches n2 (and wakes n1)
    group.deliver(lambda m: m.target == NodeId("n2"))
    assert not group["n2"].settle_again()

    group = quiet_group()
    group["n2"].wake(leader_suspected=True)
    group["n2"].wake()  # something else woke it too (a proposal, a transfer)
    assert not group["n2"].settle_again()

    group = quiet_group()
    group["n2"].wake()  # woken for a reason other than its leader's node
    assert not group["n2"].settle_again()


def test_a_quiet_leader_lags_a_peer_it_went_quiet_without() -> None:
    group = Group(3, config=QUIET)
    group.elect("n1")
    group.cut.add(NodeId("n3"))
    group["n1"].dead_peers = {NodeId("n3")}
    assert isinstance(group["n1"].propose(b"n3 misses this"), Proposed)
    group.stabilize()
    group.tick_all(5)
    assert group["n1"].quiesced
    assert group["n1"].lags(NodeId("n3")) and not group["n1"].lags(NodeId("n2"))
    assert not group["n2"].lags(NodeId("n3"))  # a follower lags nobody


def test_a_follower_whose_leaders_node_is_late_holds_its_campaign_until_it_is_suspected() -> None:
    """Issue 16 (RESULTS §42): n1's node is silent, and node liveness finds it late (it was
    heard from again after long silences lately), not dead. Its followers' election timers run
    out but they do not campaign, however long it lasts; once node liveness suspects n1 they
    campaign within an election timeout, each at a random tick, and elect one of them.
    (Before: a follower campaigned after its election timeout whatever node liveness knew, and
    a node whose loop stalled for a second lost the leadership of every busy group it led.)"""
    group = Group(3)  # a busy group: heartbeats every tick, election timers running
    group.elect("n1")
    term = group.term("n1")
    n1 = NodeId("n1")
    group["n2"].late_peers = {n1}
    group["n3"].late_peers = {n1}
    group.cut.add(n1)
    before = len(group.trace)
    group.tick_all(60)  # three times the longest election timeout
    assert [line for line in group.trace[before:] if "VoteRequest" in line] == []
    assert group["n2"].role is group["n3"].role is Role.FOLLOWER
    assert group["n2"].leader == group["n3"].leader == n1 and group.term("n2") == term
    assert group["n2"].campaigns_held > 0 and group["n3"].campaigns_held > 0
    group["n2"].late_peers = group["n3"].late_peers = set()  # suspected now
    group.tick_all(10)  # each campaigns within an election timeout, at a tick of its own
    campaigns = [line for line in group.trace[before:] if "VoteRequest" in line and "pre" in line]
    assert campaigns, group.trace[-10:]
    leaders = group.leaders()
    assert len(leaders) == 1 and leaders[0] != n1 and group.term(leaders[0]) > term


def test_a_follower_whose_leaders_node_is_late_grants_no_vote() -> None:
    """The lease follows the hold: n3 does not find n1 late (it has not learned n1's lateness)
    and campaigns; n2 does, and refuses it as within its lease, so n1 keeps the group until
    n2 suspects n1 too."""
    group = Group(3)
    group.elect("n1")
    term = group.term("n1")
    n1 = NodeId("n1")
    group["n2"].late_peers = {n1}
    group.cut.add(n1)
    before = len(group.trace)
    group.tick_all(60)
    campaign = [line for line in group.trace[before:] if line.startswith("n3->n2 VoteRequest")]
    assert campaign, group.trace[before:][-10:]
    assert group.leaders() == [] and group.term("n2") == term and group["n2"].leader == n1
    group["n2"].late_peers = set()
    group.tick_all(40)
    leaders = group.leaders()
    assert len(leaders) == 1 and leaders[0] != n1 and group.term(leaders[0]) > term
