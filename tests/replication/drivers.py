"""Production `ReplicationDriver`s with production `Replica`s over the simulator's in-memory
files, frames carried by hand: a test decides every delivery, every batch (a Ready written,
then its fsync) and every tick.

`Nodes.deliver(to=...)` hands the queued frames for some nodes to their drivers, `discard`
drops the frames to or from a node (a node cut off), `batch`/`finish` split a batch around its
fsync.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from spate.core.errors import BrokerError
from spate.core.frames import Frame, frame_bytes
from spate.core.ids import NodeId, Offset, PartitionId, StreamName
from spate.node.log import LogConfig
from spate.node.replication import codec
from spate.node.replication.driver import Batch, ReplicationDriver
from spate.node.replication.raft import RaftConfig, Role
from spate.node.replication.replica import Replica
from spate.node.replication.storage import RaftStore
from spate.sim.files import SimReplicaFiles

IDS = [NodeId("n1"), NodeId("n2"), NodeId("n3")]
STREAM = StreamName("s")


class Nodes:
    def __init__(self, *, readers: bool = True) -> None:
        """`readers`: every replica has a reader waiting for commits, so followers get commit
        updates of their own (ADR 0044)."""
        self.frames: list[tuple[NodeId, NodeId, bytes]] = []
        self.drivers: dict[NodeId, ReplicationDriver[Replica]] = {}
        self.replicas: dict[NodeId, Replica] = {}
        for node in IDS:
            driver: ReplicationDriver[Replica] = ReplicationDriver(
                node,
                send=lambda peer, frame, node=node: self._queue(node, peer, frame),
                wake=lambda: None,
                monotonic_ms=lambda: 0.0,
                wall_ms=lambda: 1_700_000_000_000,
            )
            files = SimReplicaFiles(f"{node}/s/0", random.Random(node))
            replica = Replica(
                node,
                stream=STREAM,
                partition=PartitionId(0),
                replicas=IDS,
                store=RaftStore(files, LogConfig()),  # type: ignore[arg-type]
                raft_config=RaftConfig(),
                rng=random.Random(f"raft/{node}"),
                wake=lambda: None,
                clock_ms=lambda: 1_700_000_000_000,
                monotonic_ms=lambda: 0.0,
            )
            if readers:
                replica.add_listener(lambda: None)
            driver.add(replica)  # n1, the preferred leader of a new group, campaigns
            self.drivers[node] = driver
            self.replicas[node] = replica

    def batch(self, node: NodeId) -> Batch[Replica] | None:
        """Step 1 of a batch (the fsync starts)."""
        return self.drivers[node].begin_batch()

    def finish(self, node: NodeId, batch: Batch[Replica] | None) -> None:
        """Steps 2 and 3: the fsync is done."""
        if batch is not None:
            driver = self.drivers[node]
            driver.finish_batch(batch, driver.run_syncs(batch))

    def _queue(self, source: NodeId, target: NodeId, frame: Frame) -> bool:
        self.frames.append((source, target, frame_bytes(frame)))
        return True

    def run(self, node: NodeId) -> None:
        for _ in range(10):
            batch = self.batch(node)
            if batch is None:
                return
            self.finish(node, batch)

    def deliver(self, to: Sequence[NodeId] = IDS) -> int:
        """Hand every queued frame for `to` to its driver (the others stay queued)."""
        frames, self.frames = self.frames, []
        delivered = 0
        for source, target, frame in frames:
            if target not in to:
                self.frames.append((source, target, frame))
                continue
            body = memoryview(frame)[5:]  # length (4) and kind (1)
            self.drivers[target].receive(source, frame[4], body)
            delivered += 1
        return delivered

    def discard(self, node: NodeId) -> int:
        """Drop the queued frames to or from `node` (cut off); returns how many."""
        kept = [f for f in self.frames if node not in (f[0], f[1])]
        dropped = len(self.frames) - len(kept)
        self.frames = kept
        return dropped

    def settle(self) -> None:
        for _ in range(50):
            for node in IDS:
                self.run(node)
            if not self.deliver():
                return
        raise AssertionError("the group did not settle")

    def elect(self) -> tuple[NodeId, NodeId, NodeId]:
        """Tick until a leader is elected (a new directory refuses votes for its first
        `vote_embargo_ticks`); (leader, follower, follower)."""
        for _ in range(200):
            for driver in self.drivers.values():
                driver.tick()
            self.settle()
            leaders = [n for n in IDS if self.replicas[n].raft.role is Role.LEADER]
            if leaders:
                leader = leaders[0]
                self.settle()
                a, b = (n for n in IDS if n != leader)
                return leader, a, b
        raise AssertionError("no leader")

    def raft_frames(self, source: NodeId) -> list[object]:
        return [
            codec.decode_raft(memoryview(f)[5:])[1]
            for s, _, f in self.frames
            if s == source and f[4] == codec.KIND_RAFT
        ]


def outcomes() -> tuple[list[Offset | BrokerError], object]:
    got: list[Offset | BrokerError] = []
    return got, got.append
