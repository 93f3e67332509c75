"""Partition placement: which nodes host each partition of a new stream. Pure and deterministic.

Algorithm (docs/adr/0006-placement-and-leadership.md): the candidate nodes are the live
registered nodes sorted by id, `nodes[0..k-1]`. A stream's partitions continue a cluster-wide
round robin: partition p of the new stream starts at node `(start + p) mod k`, where `start` is the
number of partitions the cluster already holds, and its replica set is the next R nodes of the
ring from there. The first replica is the preferred leader.

So, for one stream of P partitions on k nodes, every node is preferred leader of floor(P/k) or
ceil(P/k) partitions and holds between R*floor(P/k) and R*ceil(P/k) replicas (exactly P*R/k when
k divides P); successive streams keep filling the ring where the previous one stopped, so many
one-partition streams spread their leaders and replicas too.
Deleting streams or adding nodes does not move existing partitions (moving is a separate,
operator-driven command).

Example, 3 nodes, R=2, start 0: p0 [n1 n2], p1 [n2 n3], p2 [n3 n1], p3 [n1 n2].
"""

from __future__ import annotations

from collections.abc import Sequence

from spate.core.ids import NodeId

ReplicaSet = tuple[NodeId, ...]
"""The nodes hosting one partition, preferred leader first."""


def place(
    partitions: int, replicas: int, nodes: Sequence[NodeId], start: int
) -> tuple[ReplicaSet, ...]:
    """Replica sets for partitions 0..partitions-1 over `nodes` (any order; sorted here)."""
    ring = sorted(set(nodes))
    assert len(ring) == len(nodes), "candidate nodes must be distinct"
    assert 1 <= replicas <= len(ring), (replicas, len(ring))
    assert partitions >= 1 and start >= 0, (partitions, start)
    k = len(ring)
    return tuple(
        tuple(ring[(start + p + j) % k] for j in range(replicas)) for p in range(partitions)
    )
