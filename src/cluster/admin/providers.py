"""What the admin server asks of the process that hosts it (supplied by spate.server)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from spate.core.backend import ConsumerOffset, PartitionInfo, ProducerInfo
from spate.core.coordinator import GroupCoordinator
from spate.core.ids import PartitionId, StreamName


class StatsProvider(Protocol):
    """Runtime facts of the partitions of `stream` that this process serves (possibly none).

    May return the list or an awaitable of it. Raising NotFound means "not served here" and is
    shown as partitions without stats, because the node can lag the metadata by a moment.
    """

    def __call__(
        self, stream: StreamName, /
    ) -> Sequence[PartitionInfo] | Awaitable[Sequence[PartitionInfo]]: ...


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """One process as ClusterStatus shows it."""

    node_id: str
    role: str  # "node", "gateway", ...
    pid: int
    endpoints: Mapping[str, str] = field(default_factory=dict)  # {"amqp": "127.0.0.1:5672", ...}
    partitions: int = 0  # partitions served by this process
    streams: int = 0  # streams with a partition served by this process


class StatusProvider(Protocol):
    """Facts about the hosting process (and any it knows of), for ClusterStatus."""

    def __call__(self) -> Sequence[ProcessFacts]: ...


class ProducersProvider(Protocol):
    """Producer names of the partitions of `stream` this process hosts, per partition
    (raises NotFound for an unknown stream)."""

    def __call__(self, stream: StreamName, /) -> Mapping[PartitionId, Sequence[ProducerInfo]]: ...


class ConsumersProvider(Protocol):
    """Offset tracking (ADR 0012) as the hosting process serves it: `list` the consumer names
    of the partitions of `stream` hosted here, per partition (NotFound for an unknown stream);
    `reset` stores a name's offset at the partition's leader, wherever it is."""

    def list(self, stream: StreamName, /) -> Mapping[PartitionId, Sequence[ConsumerOffset]]: ...

    def reset(
        self, stream: StreamName, partition: PartitionId, name: bytes, offset: int, /
    ) -> Awaitable[None]: ...


class CoordinatorsProvider(Protocol):
    """The coordinator of a stream's consumer groups (ADR 0015) as the hosting process's
    broker reaches it: its own when it leads the stream's partition 0, else that leader's over
    the gateway wire (NotLeader/Unavailable/NotFound when it cannot)."""

    def group_coordinator(self, stream: StreamName, /) -> GroupCoordinator: ...


@dataclass(frozen=True, slots=True)
class ReplicaFacts:
    """One replica of one partition as its node's Raft core sees it (ADR 0022)."""

    stream: StreamName
    partition: PartitionId
    node: str
    role: str  # "leader", "follower", "pre-candidate", "candidate"
    term: int
    leader: str | None
    leader_epoch: int
    commit_index: int
    applied_index: int
    last_index: int
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    membership_index: int
    progress: Mapping[str, int] = field(default_factory=dict)
    """On a leader: each other member's match index."""
    transferring_to: str | None = None


class ReplicaControl(Protocol):
    """This node's partition replicas, for the cluster operations (ADR 0022). Every method
    raises NotFound when the partition is not hosted here; the two actions need this replica
    to lead (FailedPrecondition naming the leader otherwise)."""

    def facts(self, stream: StreamName, partition: PartitionId, /) -> ReplicaFacts: ...

    def transfer_leader(
        self, stream: StreamName, partition: PartitionId, to: str, /
    ) -> ReplicaFacts: ...

    def change_membership(
        self,
        stream: StreamName,
        partition: PartitionId,
        voters: Sequence[str],
        learners: Sequence[str],
        /,
    ) -> ReplicaFacts: ...
