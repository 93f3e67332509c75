"""Partition placement: which nodes host each partition of a new stream. Pure and deterministic.

Algorithm (docs/adr/0006-placement-and-leadership.md, hosts: docs/adr/0032-node-shards.md):

Each node belongs to a **host** (its failure domain: the machine it runs on; a node run as
several shard processes registers one host for all of them; a node that names none is its own
host). The candidates, sorted, are laid on one **ring that interleaves the hosts**: hosts sorted
by name, the nodes of a host sorted by id, and the ring takes the first node of every host, then
the second node of every host that has two, and so on. With one node per host (every cluster
before shards) this ring is the sorted node ids, and the result is exactly what earlier builds
computed, so replaying an old metadata log places every stream where it was placed then.

A stream's partitions continue a cluster-wide round robin: partition p of the new stream starts
at ring position `(start + p) mod k`, where `start` is the number of partitions the cluster
already holds. Its replica set is built by walking the ring from there: a node is taken when its
host holds no replica of the set yet; when a whole lap leaves the set short (fewer hosts than
replicas), a second lap takes the nodes not taken yet, in ring order. The first replica is the
preferred leader.

So: the replicas of a partition are on distinct hosts whenever there are at least R hosts; every
node (shard) is preferred leader of floor(P/k) or ceil(P/k) partitions of one stream, so the
shards of a host share its load; with one node per host every node holds between R*floor(P/k)
and R*ceil(P/k) replicas (exactly P*R/k when k divides P). Successive streams keep filling the
ring where the previous one stopped. Deleting streams or adding nodes does not move existing
partitions (moving is a separate, operator-driven command).

Examples. 3 nodes, one per host, R=2, start 0: p0 [n1 n2], p1 [n2 n3], p2 [n3 n1], p3 [n1 n2].
Host A with shards a0 a1, hosts B (b0) and C (c0), R=3: ring [a0 b0 c0 a1]; p0 [a0 b0 c0],
p1 [b0 c0 a1], p2 [c0 a1 b0], p3 [a1 b0 c0]: every set spans the three hosts, B and C hold a
replica of every partition, A's two shards share A's replicas and lead one partition each.
One host with shards a0 a1, R=2: p0 [a0 a1], p1 [a1 a0] (two replicas on one host: no host
diversity is possible; `hosts_spanned` lets the caller say so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spate.core.ids import NodeId

ReplicaSet = tuple[NodeId, ...]
"""The nodes hosting one partition, preferred leader first."""


def host_of(node: NodeId, hosts: Mapping[NodeId, str | None]) -> str:
    """The host (failure domain) of `node`: its registered one, else its own id."""
    return hosts.get(node) or node


def ring(nodes: Sequence[NodeId], hosts: Mapping[NodeId, str | None] | None = None) -> list[NodeId]:
    """The candidates in ring order: hosts interleaved, first shard of every host first."""
    by_host: dict[str, list[NodeId]] = {}
    for node in sorted(nodes):
        by_host.setdefault(host_of(node, hosts or {}), []).append(node)
    groups = [by_host[h] for h in sorted(by_host)]
    rounds = max((len(g) for g in groups), default=0)
    return [g[r] for r in range(rounds) for g in groups if r < len(g)]


def place(
    partitions: int,
    replicas: int,
    nodes: Sequence[NodeId],
    start: int,
    hosts: Mapping[NodeId, str | None] | None = None,
) -> tuple[ReplicaSet, ...]:
    """Replica sets for partitions 0..partitions-1 over `nodes` (any order; sorted here);
    `hosts` maps a node to its host (absent or None: the node is its own host)."""
    order = ring(nodes, hosts)
    assert len(order) == len(nodes) == len(set(nodes)), "candidate nodes must be distinct"
    assert 1 <= replicas <= len(order), (replicas, len(order))
    assert partitions >= 1 and start >= 0, (partitions, start)
    return tuple(
        _replica_set(order, (start + p) % len(order), replicas, hosts or {})
        for p in range(partitions)
    )


def _replica_set(
    order: list[NodeId], first: int, replicas: int, hosts: Mapping[NodeId, str | None]
) -> ReplicaSet:
    k = len(order)
    walk = [order[(first + i) % k] for i in range(k)]
    chosen: list[NodeId] = []
    used: set[str] = set()
    for node in walk:  # lap 1: one replica per host
        if len(chosen) < replicas and host_of(node, hosts) not in used:
            chosen.append(node)
            used.add(host_of(node, hosts))
    for node in walk:  # lap 2: fewer hosts than replicas
        if len(chosen) < replicas and node not in chosen:
            chosen.append(node)
    assert len(chosen) == replicas == len(set(chosen)), (chosen, replicas)
    return tuple(chosen)


def hosts_spanned(replica_set: Sequence[NodeId], hosts: Mapping[NodeId, str | None]) -> int:
    """How many distinct hosts a replica set spans."""
    return len({host_of(n, hosts) for n in replica_set})


def best_target(
    candidates: Sequence[NodeId],
    keep: Sequence[NodeId],
    hosted: Mapping[NodeId, int],
    hosts: Mapping[NodeId, str | None],
) -> NodeId:
    """Where a replica moving off a node goes (drain, remove): among `candidates`, prefer a
    node whose host holds none of the replicas that stay (`keep`), then the host holding the
    fewest of them, then the node hosting the fewest replicas, then the smallest id."""
    assert candidates, "no candidate"
    kept = [host_of(n, hosts) for n in keep]
    return min(candidates, key=lambda n: (kept.count(host_of(n, hosts)), hosted.get(n, 0), n))


def better_hosts_than(
    target: NodeId,
    keep: Sequence[NodeId],
    candidates: Sequence[NodeId],
    hosts: Mapping[NodeId, str | None],
) -> list[NodeId]:
    """For a move of one replica to `target` (`keep`: the replicas that stay): when `target`'s
    host already holds one of them, the `candidates` on hosts holding none (the move would
    needlessly put two replicas on one host); otherwise []."""
    kept = {host_of(n, hosts) for n in keep}
    if host_of(target, hosts) not in kept:
        return []
    return [n for n in candidates if n not in keep and host_of(n, hosts) not in kept]
