"""Node liveness against a late node (issue 16, ADR 0026 addendum): a node whose loop stalls
for longer than an election timeout is suspected by its peers, but once it is heard from again
the quiet groups go back to rest without a campaign or a heartbeat; a node that stays silent
still has its partitions' leadership moved to the others.

Three production `ReplicationDriver`s, each with one production `Replica` of every partition
over the simulator's in-memory files, frames carried by hand (as in test_early_sends.py).
Before the change, the stall below (14 ticks: suspected after 10, heard from again before a
woken follower's election timeout) made every follower of the late node's groups campaign,
and the peers woke every group they led with it: at 5,000 partitions per node that work made
the nodes late again, and they never came to rest (RESULTS §29).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from spate.core.frames import Frame, frame_bytes
from spate.core.ids import NodeId, Offset, PartitionId, StreamName
from spate.node.log import LogConfig
from spate.node.replication import codec, limits
from spate.node.replication.driver import ReplicationDriver
from spate.node.replication.messages import Message, VoteRequest
from spate.node.replication.raft import RaftConfig, Role
from spate.node.replication.replica import Replica
from spate.node.replication.storage import RaftStore
from spate.sim.files import SimReplicaFiles

IDS = [NodeId("n1"), NodeId("n2"), NodeId("n3")]
STREAM = StreamName("s")
PARTITIONS = 12
"""Four groups led by each node (the preferred leader of partition p is IDS[p % 3])."""
QUIET = RaftConfig(quiesce=True)  # election timeout 10 ticks, heartbeat every tick


class Nodes:
    def __init__(self) -> None:
        self.frames: list[tuple[NodeId, NodeId, bytes]] = []
        self.sent: list[tuple[NodeId, Message]] = []
        """Every Raft message sent, by sender (PINGs are not Raft messages)."""
        self.stalled: set[NodeId] = set()
        """Nodes whose loop does nothing: no tick, no batch, nothing read; frames to them wait."""
        self.dropping: set[NodeId] = set()
        """Nodes to which frames are lost."""
        self.drivers: dict[NodeId, ReplicationDriver[Replica]] = {}
        self.replicas: dict[tuple[NodeId, PartitionId], Replica] = {}
        for node in IDS:
            driver: ReplicationDriver[Replica] = ReplicationDriver(
                node,
                send=lambda peer, frame, node=node: self._send(node, peer, frame),
                wake=lambda: None,
                monotonic_ms=lambda: 0.0,
                wall_ms=lambda: 1_700_000_000_000,
            )
            self.drivers[node] = driver
            for p in range(PARTITIONS):
                partition = PartitionId(p)
                files = SimReplicaFiles(f"{node}/s/{p}", random.Random(f"{node}/{p}"))
                replica = Replica(
                    node,
                    stream=STREAM,
                    partition=partition,
                    replicas=IDS[p % 3 :] + IDS[: p % 3],
                    store=RaftStore(files, LogConfig()),  # type: ignore[arg-type]
                    raft_config=QUIET,
                    rng=random.Random(f"raft/{node}/{p}"),
                    wake=lambda: None,
                    clock_ms=lambda: 1_700_000_000_000,
                    monotonic_ms=lambda: 0.0,
                )
                driver.add(replica)
                self.replicas[(node, partition)] = replica

    def _send(self, source: NodeId, target: NodeId, data: Frame) -> bool:
        frame = frame_bytes(data)
        if frame[4] == codec.KIND_RAFT:
            self.sent.append((source, codec.decode_raft(memoryview(frame)[5:])[1]))
        self.frames.append((source, target, frame))
        return True

    def deliver(self) -> int:
        frames, self.frames = self.frames, []
        delivered = 0
        for source, target, frame in frames:
            if target in self.dropping:
                continue
            if target in self.stalled:
                self.frames.append((source, target, frame))  # waits in the socket
                continue
            self.drivers[target].receive(source, frame[4], memoryview(frame)[5:])
            delivered += 1
        return delivered

    def settle(self) -> None:
        for _ in range(50):
            for node in IDS:
                if node not in self.stalled:
                    for _ in range(10):
                        batch = self.drivers[node].begin_batch()
                        if batch is None:
                            break
                        self.drivers[node].finish_batch(batch, self.drivers[node].run_syncs(batch))
            if not self.deliver():
                return
        raise AssertionError("frames kept flowing")

    def tick(self, rounds: int = 1) -> None:
        for _ in range(rounds):
            for node in IDS:
                if node not in self.stalled:
                    self.drivers[node].tick()
            self.settle()

    def until(self, predicate: Callable[[], bool], what: str, rounds: int = 300) -> None:
        for _ in range(rounds):
            if predicate():
                return
            self.tick()
        raise AssertionError(f"not within {rounds} ticks: {what}")

    def replica(self, node: NodeId, partition: int) -> Replica:
        return self.replicas[(node, PartitionId(partition))]

    def leader_of(self, partition: int) -> NodeId | None:
        leaders = [
            n
            for n in IDS
            if n not in self.stalled and self.replica(n, partition).raft.role is Role.LEADER
        ]
        assert len(leaders) <= 1, leaders
        return leaders[0] if leaders else None

    def all_quiet(self, nodes: list[NodeId] = IDS) -> bool:
        return all(self.replica(n, p).raft.quiesced for n in nodes for p in range(PARTITIONS))

    def at_rest(self) -> None:
        """Every partition led by its preferred leader, every replica quiet, not visited."""
        self.until(lambda: all(self.leader_of(p) is not None for p in range(PARTITIONS)), "leaders")
        for p in range(PARTITIONS):  # new replicas refuse votes for a while: any may win
            leader = self.leader_of(p)
            assert leader is not None
            if leader != IDS[p % 3]:
                assert self.replica(leader, p).transfer_leadership(IDS[p % 3]) is None
        self.until(
            lambda: all(self.leader_of(p) == IDS[p % 3] for p in range(PARTITIONS)),
            "each partition led by its preferred leader",
        )
        self.until(self.all_quiet, "every group quiet")
        self.tick()
        assert all(d.awake == 0 for d in self.drivers.values())


def votes(sent: list[tuple[NodeId, Message]]) -> list[Message]:
    return [m for _, m in sent if isinstance(m, VoteRequest)]


def test_a_late_node_heard_again_leaves_every_group_at_rest() -> None:
    """n1's loop stalls for 14 ticks (a long batch, a GC pause): n2 and n3 suspect it after 10
    and wake the followers of its groups; n1 is heard from again before any of them times
    out. No group campaigns, no leader heartbeats, and every woken follower sleeps again."""
    nodes = Nodes()
    nodes.at_rest()
    n1, n2, n3 = IDS
    terms = {key: r.raft.term for key, r in nodes.replicas.items()}
    nodes.sent.clear()
    nodes.stalled.add(n1)
    nodes.tick(14)
    assert n1 in nodes.drivers[n2].suspected and n1 in nodes.drivers[n3].suspected
    woken = [
        (n, p) for n in (n2, n3) for p in range(PARTITIONS) if not nodes.replica(n, p).raft.quiesced
    ]
    # The followers of n1's groups, and nothing else (n2's and n3's leaders keep a quorum).
    assert sorted(woken) == [(n, p) for n in (n2, n3) for p in range(0, PARTITIONS, 3)], woken
    nodes.stalled.discard(n1)
    nodes.tick(60)  # six election timeouts
    assert votes(nodes.sent) == [], votes(nodes.sent)[:5]
    assert nodes.sent == [], nodes.sent[:5]  # not even a heartbeat: every group stayed asleep
    assert nodes.all_quiet()
    assert all(d.awake == 0 and not d.suspected for d in nodes.drivers.values())
    assert {key: r.raft.term for key, r in nodes.replicas.items()} == terms
    assert nodes.drivers[n2].settled == nodes.drivers[n3].settled == PARTITIONS // 3


def test_a_node_that_stays_silent_loses_its_leaderships_and_rejoins_on_return() -> None:
    """Failure detection is unchanged for a node that does not come back in time: the
    followers of its groups elect new leaders among themselves; on its return it follows them
    and every group goes quiet again."""
    nodes = Nodes()
    nodes.at_rest()
    n1, n2, n3 = IDS
    nodes.stalled.add(n1)
    nodes.until(
        lambda: all(nodes.leader_of(p) in (n2, n3) for p in range(0, PARTITIONS, 3)),
        "n1's partitions led by n2 or n3",
        rounds=60,  # suspicion (10 ticks) plus an election timeout (10-20) plus the election
    )
    assert votes(nodes.sent)
    nodes.stalled.discard(n1)
    nodes.until(
        lambda: all(
            nodes.replica(n1, p).raft.role is Role.FOLLOWER
            and nodes.replica(n1, p).raft.leader in (n2, n3)
            for p in range(0, PARTITIONS, 3)
        ),
        "n1 follows the new leaders",
    )
    nodes.until(nodes.all_quiet, "every group quiet again")


def test_a_peer_back_gets_the_entries_its_leaders_went_quiet_without() -> None:
    """n1's loop stalls and what is sent to it meanwhile is lost (its connections reset). n2,
    leading partition 1, commits a record with n3 and goes quiet without n1's acknowledgement
    (n1 is suspected). When n1 is heard from again, that group wakes and sends n1 the record
    (n1's replica, quiet, would never ask); n2's groups that n1 had acknowledged to the end
    stay asleep."""
    nodes = Nodes()
    nodes.at_rest()
    n1, n2, _ = IDS
    nodes.stalled.add(n1)
    nodes.dropping.add(n1)
    nodes.until(lambda: n1 in nodes.drivers[n2].suspected, "n2 suspects n1", rounds=20)
    got: list[object] = []
    nodes.replica(n2, 1).propose([b"while n1 was away"], got.append)  # type: ignore[arg-type]
    nodes.until(lambda: got == [Offset(0)], "the record committed by n2 and n3", rounds=10)
    nodes.until(lambda: nodes.replica(n2, 1).raft.quiesced, "n2 quiet without n1", rounds=10)
    raft = nodes.replica(n2, 1).raft
    assert (raft.match_of(n1) or 0) < raft.log.last_index  # quiet without n1's acknowledgement
    assert nodes.replica(n1, 1).raft.quiesced and nodes.replica(n1, 1).end_offset() == Offset(0)
    nodes.stalled.discard(n1)
    nodes.dropping.discard(n1)
    nodes.tick()  # n1 PINGs; n2 hears it
    led_by_n2 = range(1, PARTITIONS, 3)
    assert [p for p in led_by_n2 if not nodes.replica(n2, p).raft.quiesced] == [1]
    nodes.until(lambda: nodes.replica(n1, 1).end_offset() == Offset(1), "n1 gets the record")
    nodes.until(nodes.all_quiet, "every group quiet again")
    assert all(nodes.replica(n, 1).end_offset() == Offset(1) for n in IDS)


def test_both_peers_late_wake_none_of_the_leaders_that_lost_their_quorum() -> None:
    """n2 and n3 stall together for 14 ticks: n1 suspects both, so its leaders have no quorum
    of unsuspected voters; they are not woken (their heartbeats would wake every replica), and
    once n2 and n3 are heard from within an election timeout nothing was sent at all."""
    nodes = Nodes()
    nodes.at_rest()
    n1, n2, n3 = IDS
    terms = {key: r.raft.term for key, r in nodes.replicas.items()}
    nodes.sent.clear()
    nodes.stalled.update({n2, n3})
    nodes.tick(14)
    assert nodes.drivers[n1].suspected == {n2, n3}
    assert all(nodes.replica(n1, p).raft.quiesced for p in range(0, PARTITIONS, 3))
    nodes.stalled.clear()
    nodes.tick(60)
    assert nodes.sent == [], nodes.sent[:5]
    assert nodes.all_quiet()
    assert {key: r.raft.term for key, r in nodes.replicas.items()} == terms
    assert nodes.drivers[n1].quorum_back == PARTITIONS // 3


def test_a_leader_cut_off_from_its_quorum_steps_down_when_check_quorum_would() -> None:
    """n2 and n3 stay silent: n1 suspects them after 10 ticks and its quiet leaders step down
    an election timeout later, counting the tick of the suspicion: the tick on which a leader
    woken then was deposed by check-quorum (ADR 0015's settle rule relies on it)."""
    nodes = Nodes()
    nodes.at_rest()
    n1, n2, n3 = IDS
    led = range(0, PARTITIONS, 3)
    nodes.stalled.update({n2, n3})
    nodes.tick(18)  # suspected at tick 10; tick 18 is the ninth of the window
    assert all(nodes.replica(n1, p).raft.role is Role.LEADER for p in led)
    nodes.tick()
    assert all(nodes.replica(n1, p).raft.role is not Role.LEADER for p in led)
    assert nodes.drivers[n1].wakes_by_reason["quorum_suspected"] == len(led)


def learn_lateness(nodes: Nodes, node: NodeId, ticks: int = 16) -> None:
    """`node`'s loop stalls for `ticks` and is heard from again (its peers learn it is late)."""
    nodes.stalled.add(node)
    nodes.tick(ticks)
    nodes.stalled.discard(node)
    nodes.tick(30)
    nodes.until(nodes.all_quiet, "every group quiet again")


def test_a_node_late_lately_keeps_its_leaders_through_a_longer_stall() -> None:
    """Issue 16 (RESULTS §42): n1 was heard from again after a 16-tick stall, so its peers now
    allow it 1.5 times that before suspecting it. It stalls again for 22 ticks while leading a
    busy group (its followers' election timers running) and three quiet ones: silent after 10,
    late, never suspected. The busy group's followers hold their campaigns, the quiet groups
    are not even woken, and nothing changes hands. Before, the busy group's followers
    campaigned after their election timeout (10-19 ticks) and elected one of them."""
    nodes = Nodes()
    nodes.at_rest()
    n1, n2, n3 = IDS
    learn_lateness(nodes, n1)
    got: list[object] = []
    nodes.replica(n1, 0).propose([b"busy"], got.append)  # type: ignore[arg-type]
    nodes.tick()
    assert got == [Offset(0)] and not nodes.replica(n2, 0).raft.quiesced
    terms = {key: r.raft.term for key, r in nodes.replicas.items()}
    suspicions = [nodes.drivers[n].suspicions for n in (n2, n3)]
    nodes.sent.clear()
    nodes.stalled.add(n1)
    nodes.tick(22)
    assert not any(n1 in nodes.drivers[n].suspected for n in (n2, n3))
    late = all(n1 in nodes.drivers[n].liveness.late for n in (n2, n3))
    nodes.stalled.discard(n1)
    nodes.tick(60)
    assert votes(nodes.sent) == [], votes(nodes.sent)[:5]
    assert [nodes.drivers[n].suspicions for n in (n2, n3)] == suspicions
    assert all(nodes.leader_of(p) == IDS[p % 3] for p in range(PARTITIONS))
    assert {key: r.raft.term for key, r in nodes.replicas.items()} == terms
    nodes.until(nodes.all_quiet, "every group quiet again")
    assert late and all(nodes.drivers[n].liveness.suspect_after(n1) >= 24 for n in (n2, n3))
    assert sum(nodes.replica(n, 0).raft.campaigns_held for n in (n2, n3)) > 0


def test_a_late_node_that_stays_silent_is_replaced_after_its_allowance() -> None:
    """A node late lately that then goes silent for good is suspected once its allowance (at
    most `liveness_ticks_max`) runs out, and loses its leaderships as a dead one does."""
    nodes = Nodes()
    nodes.at_rest()
    n1, n2, n3 = IDS
    learn_lateness(nodes, n1)
    allowance = min(nodes.drivers[n].liveness.suspect_after(n1) for n in (n2, n3))
    assert allowance <= limits.liveness_ticks_max
    nodes.sent.clear()
    nodes.stalled.add(n1)
    nodes.tick(allowance - 1)
    assert votes(nodes.sent) == [] and not nodes.drivers[n2].suspected
    nodes.until(
        lambda: all(nodes.leader_of(p) in (n2, n3) for p in range(0, PARTITIONS, 3)),
        "n1's partitions led by n2 or n3",
        rounds=40,  # suspicion, an election timeout (10-20 ticks), the election
    )


def test_a_late_node_whose_process_closed_its_links_is_suspected_after_an_election_timeout() -> (
    None
):
    """A dead process's sockets close, a stalled one's do not: once the transport reports n1's
    link closed, its peers forget the lateness they learned and suspect it after 10 ticks."""
    nodes = Nodes()
    nodes.at_rest()
    n1, n2, n3 = IDS
    learn_lateness(nodes, n1)
    nodes.stalled.add(n1)
    for n in (n2, n3):
        nodes.drivers[n].link_closed(n1)
    nodes.tick(limits.liveness_ticks)
    assert all(n1 in nodes.drivers[n].suspected for n in (n2, n3))
    nodes.until(
        lambda: all(nodes.leader_of(p) in (n2, n3) for p in range(0, PARTITIONS, 3)),
        "n1's partitions led by n2 or n3",
        rounds=40,
    )
