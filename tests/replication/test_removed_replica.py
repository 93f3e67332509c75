"""A replica removed from its node's driver (the partition is closing or deleted) while its
batch's fsync runs gets no further batch: the host closes its files once the syncs handed out so
far have returned (`ReplicationHost.close_partition`), so a batch begun after the removal would
write to, or sync, files being closed.

Before the fix, `finish_batch` marked every replica of the finished batch for the next one
again, and a proposal to the removed replica woke it back into the dirty set, so the next
`begin_batch` wrote its entry and handed its sync to the fsync thread while
`close_partition` was closing its files (a closed descriptor synced, or a reused one closed).
"""

from __future__ import annotations

from replication.drivers import Nodes, outcomes
from spate.core.errors import BrokerError, Unavailable
from spate.node.replication.raft import Role


def test_a_replica_removed_while_its_fsync_runs_is_not_batched_again() -> None:
    nodes = Nodes()
    n1, n2, n3 = nodes.elect()
    driver, leader = nodes.drivers[n1], nodes.replicas[n1]
    got, done = outcomes()
    leader.propose([b"a"], done)  # type: ignore[arg-type]
    running = nodes.batch(n1)  # written, its fsync running
    assert running is not None and running.syncs
    end = leader.store.log.end_offset
    assert driver.remove(leader.stream, leader.partition) is leader
    # Still open (close waits for the fsync): a producer's proposal reaches it meanwhile.
    leader.propose([b"b"], done)  # type: ignore[arg-type]
    nodes.finish(n1, running)
    assert driver.begin_batch() is None  # nothing may touch the replica's files now
    assert leader.store.log.end_offset == end
    leader.close()
    assert got and all(isinstance(g, Unavailable) for g in got), got
    # The other replicas go on without it: a new leader commits.
    nodes.discard(n1)
    for _ in range(200):
        for node in (n2, n3):
            nodes.drivers[node].tick()
        nodes.deliver(to=[n2, n3])
        for node in (n2, n3):
            nodes.run(node)
        nodes.deliver(to=[n2, n3])
        if any(nodes.replicas[n].raft.role is Role.LEADER for n in (n2, n3)):
            break
    successor = next(n for n in (n2, n3) if nodes.replicas[n].raft.role is Role.LEADER)
    after, done_after = outcomes()
    nodes.replicas[successor].propose([b"c"], done_after)  # type: ignore[arg-type]
    for _ in range(5):
        for node in (n2, n3):
            nodes.run(node)
        nodes.discard(n1)
        nodes.deliver(to=[n2, n3])
    assert after and not isinstance(after[0], BrokerError), after
