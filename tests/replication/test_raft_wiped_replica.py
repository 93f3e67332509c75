"""Core scenario: a follower whose data directory was wiped comes back with an empty log.

The leader still believes it matched; without the `lost` answer the follower would assert on
the heartbeat's commit (etcd panics there) and the leader would ignore its rejections as stale.
ADR 0005 ("Wiped replicas in the core")."""

from __future__ import annotations

import random

from replication.harness import Group
from spate.core.ids import NodeId
from spate.node.replication.messages import AppendResponse, Heartbeat, Proposed
from spate.node.replication.raft import Raft


def test_wiped_follower_is_probed_from_scratch_and_catches_up() -> None:
    group = Group()
    group.elect("n1")
    for i in range(5):
        assert isinstance(group["n1"].propose(b"p%d" % i), Proposed)
    group.stabilize()
    assert group.applied_payloads("n3") == [b"p%d" % i for i in range(5)]
    assert group["n1"].progress(NodeId("n3")).match == 6
    # Wipe n3: a fresh core with no hard state and no entries.
    n3 = NodeId("n3")
    group.nodes[n3] = Raft(n3, group.ids, group.config, random.Random("wiped"))
    group.disk[n3].clear()
    group.applied[n3].clear()
    group.tick("n1")  # heartbeat with commit = min(match 6, committed 6)
    heartbeats = [m for m in group.pending if isinstance(m, Heartbeat) and m.target == n3]
    assert heartbeats and heartbeats[0].commit == 6
    group.deliver()
    lost = [m for m in group.pending if isinstance(m, AppendResponse) and m.lost]
    assert lost and lost[0].source == n3 and lost[0].hint_index == 0
    group.stabilize()
    # Every peer had acknowledged 1-6, so the leader no longer holds them in memory (ADR
    # 0049): the wiped follower is sent a snapshot, which its shell fetches as segments.
    request = group.snapshot_requests[n3]
    assert request.snapshot.index == 6 == group["n1"].log.snapshot.index
    assert group["n3"].restore(request.snapshot.index, request.snapshot.term)
    group.process(n3)
    group.tick_all(3)
    group.stabilize()
    assert group["n1"].progress(n3).match == 6
    assert isinstance(group["n1"].propose(b"after"), Proposed)
    group.stabilize()
    group.tick_all(1)  # n3 has no readers: it learns the commit from the next heartbeat
    group.stabilize()
    assert group.applied_payloads("n3") == [b"after"]
    assert sorted(group.disk[n3]) == [7]


def test_a_stale_lost_answer_does_not_reset_a_caught_up_follower() -> None:
    group = Group()
    group.elect("n1")
    assert isinstance(group["n1"].propose(b"x"), Proposed)
    group.stabilize()
    n2 = NodeId("n2")
    match = group["n1"].progress(n2).match
    group["n1"].step(
        AppendResponse(
            group.term("n1"), n2, NodeId("n1"), 0, rejected=True, hint_index=match, lost=True
        )
    )
    assert group["n1"].progress(n2).match == match
