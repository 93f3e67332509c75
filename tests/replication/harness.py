"""A hand-driven group of Raft cores for scenario tests (etcd's rafttest, in small).

Every node's Ready is handled the way the shell must: persist (here: append to a list that
stands for the synced disk), then send, then apply, then advance. Messages wait in `pending`
until a test delivers them, so a test decides every interleaving.

`hold(node)` makes a node's disk slow: its next Ready's messages go out at once but the Ready is
persisted (and advanced) only at `release(node)`. That is only legal for a leader, whose Appends
may be sent while its own write is in flight (Raft thesis §10.2.1) because its commit counts its
own *persisted* index; for a follower it would be the ack-before-persist bug.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from spate.core.ids import NodeId, Term
from spate.node.replication.messages import (
    Append,
    Entry,
    LeaderChange,
    Message,
    Proposed,
    Ready,
    SnapshotRequest,
    describe,
)
from spate.node.replication.raft import Raft, RaftConfig, Role


class Group:
    def __init__(
        self,
        size: int = 3,
        *,
        seed: int = 1,
        config: RaftConfig | None = None,
        readers: bool = True,
    ) -> None:
        """`readers`: every node has readers waiting for commits (`Raft.readers`), so followers
        get commit updates of their own (ADR 0044); False: they learn the commit index from the
        next Append or heartbeat."""
        self.ids = [NodeId(f"n{i}") for i in range(1, size + 1)]
        self.config = config or RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=1)
        self.readers = readers
        self.nodes = {
            node: Raft(node, self.ids, self.config, random.Random(f"{seed}/{node}"))
            for node in self.ids
        }
        for raft in self.nodes.values():
            raft.readers = readers
        self.pending: list[Message] = []
        self.disk: dict[NodeId, dict[int, Entry]] = {node: {} for node in self.ids}
        self.applied: dict[NodeId, list[Entry]] = {node: [] for node in self.ids}
        self.held: dict[NodeId, Ready | None] = {}
        self.cut: set[NodeId] = set()
        self.trace: list[str] = []
        self.leader_changes: dict[NodeId, list[LeaderChange]] = {n: [] for n in self.ids}
        self.snapshot_requests: dict[NodeId, SnapshotRequest] = {}

    def __getitem__(self, node: str) -> Raft:
        return self.nodes[NodeId(node)]

    # -- driving

    def process(self, node: NodeId) -> None:
        raft = self.nodes[node]
        if node in self.held:
            if self.held[node] is None and raft.has_ready():
                ready = raft.ready()  # handed to a disk that has not synced yet
                self.pending.extend(ready.messages)
                self.held[node] = ready
            return
        while raft.has_ready():
            self._handle(node, raft.ready())

    def _handle(self, node: NodeId, ready: Ready, *, send: bool = True) -> None:
        disk = self.disk[node]
        if ready.snapshot is not None:
            disk.clear()
        if ready.entries:
            for index in [i for i in disk if i >= ready.entries[0].index]:
                del disk[index]
            disk.update((e.index, e) for e in ready.entries)
        if send:
            self.pending.extend(ready.messages)
        self.applied[node].extend(ready.committed)
        if ready.leader_change is not None:
            self.leader_changes[node].append(ready.leader_change)
        if ready.snapshot_request is not None:
            self.snapshot_requests[node] = ready.snapshot_request
        self.nodes[node].advance(ready)

    def hold(self, node: str) -> None:
        self.held[NodeId(node)] = None

    def release(self, node: str) -> None:
        ready = self.held.pop(NodeId(node))
        if ready is not None:
            self._handle(NodeId(node), ready, send=False)
        self.process(NodeId(node))

    def process_all(self) -> None:
        for node in self.ids:
            self.process(node)

    def deliver(self, keep: Callable[[Message], bool] = lambda m: True) -> int:
        """Deliver every pending message that `keep` accepts (others are dropped), in order;
        messages to or from a cut node are dropped. Returns how many were delivered."""
        batch, self.pending = self.pending, []
        delivered = 0
        for message in batch:
            if message.source in self.cut or message.target in self.cut or not keep(message):
                self.trace.append("drop " + describe(message))
                continue
            self.trace.append(describe(message))
            self.nodes[message.target].step(message)
            delivered += 1
        self.process_all()
        return delivered

    def stabilize(self, rounds_max: int = 200) -> None:
        self.process_all()
        for _ in range(rounds_max):
            if not self.pending:
                return
            self.deliver()
        raise AssertionError("group did not stabilize")

    def tick(self, node: str, times: int = 1) -> None:
        for _ in range(times):
            self.nodes[NodeId(node)].tick()
        self.process(NodeId(node))

    def tick_all(self, times: int = 1) -> None:
        for _ in range(times):
            for node in self.ids:
                if node not in self.cut:
                    self.nodes[node].tick()
            self.process_all()
            self.deliver()

    def propose(self, node: str, payload: bytes) -> int:
        """Propose `payload` on `node` (a leader) and process its Ready; the entry's index."""
        result = self.nodes[NodeId(node)].propose(payload)
        assert isinstance(result, Proposed), result
        self.process(NodeId(node))
        return result.index

    def empty_appends(self) -> list[Append]:
        """Pending Appends without entries: commit updates, probes, ADR 0050's updates."""
        return [m for m in self.pending if isinstance(m, Append) and not m.entries]

    def elect(self, node: str) -> None:
        self.nodes[NodeId(node)].campaign()
        self.stabilize()
        assert self.nodes[NodeId(node)].role is Role.LEADER, self.trace[-10:]

    # -- reading

    def leaders(self) -> list[NodeId]:
        return [n for n in self.ids if self.nodes[n].role is Role.LEADER and n not in self.cut]

    def applied_payloads(self, node: str) -> list[bytes]:
        return [e.payload for e in self.applied[NodeId(node)] if e.payload]

    def term(self, node: str) -> Term:
        return self.nodes[NodeId(node)].term
