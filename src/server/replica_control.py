"""`spate.cluster.admin.providers.ReplicaControl` over this node's replicas (ADR 0022): the
facts of a local Raft core, and the two leader-side actions the cluster operations need
(leadership transfer, a membership entry). Runs on the node's event loop, like the driver."""

from __future__ import annotations

from collections.abc import Sequence

from spate.cluster.admin.providers import ReplicaFacts
from spate.core.errors import NotFound
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.node.manager import PartitionManager
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.raft import Role


class LocalReplicaControl:
    def __init__(self, manager: PartitionManager) -> None:
        self._manager = manager

    def _replica(self, stream: StreamName, partition: PartitionId) -> ReplicatedPartition:
        replica = self._manager.replica(stream, partition)
        if replica is None:
            raise NotFound(f"{self._manager.node_id} does not host {stream}/{partition}")
        return replica

    def facts(self, stream: StreamName, partition: PartitionId) -> ReplicaFacts:
        replica = self._replica(stream, partition)
        raft = replica.raft
        status = raft.status()
        progress: dict[str, int] = {}
        if raft.role is Role.LEADER:
            for peer in raft.peers:
                match = raft.match_of(peer)
                if match is not None:
                    progress[peer] = match
        return ReplicaFacts(
            stream=stream,
            partition=partition,
            node=replica.node,
            role=status.role.value,
            term=status.term,
            leader=status.leader,
            leader_epoch=status.leader_epoch,
            commit_index=status.commit,
            applied_index=status.applied,
            last_index=status.last_index,
            voters=status.membership.voters,
            learners=status.membership.learners,
            membership_index=raft.membership_index,
            progress=progress,
            transferring_to=status.transferring_to,
        )

    def transfer_leader(self, stream: StreamName, partition: PartitionId, to: str) -> ReplicaFacts:
        error = self._replica(stream, partition).transfer_leadership(NodeId(to))
        if error is not None:
            raise error
        return self.facts(stream, partition)

    def change_membership(
        self,
        stream: StreamName,
        partition: PartitionId,
        voters: Sequence[str],
        learners: Sequence[str],
    ) -> ReplicaFacts:
        result = self._replica(stream, partition).propose_membership(
            [NodeId(v) for v in voters], [NodeId(n) for n in learners]
        )
        if not isinstance(result, int):
            raise result
        return self.facts(stream, partition)
