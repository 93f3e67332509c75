"""The Broker a node's own AMQP listener runs over: the node's replicas, and for
partition-agnostic links the partitions it does not serve, relayed over the gateway wire.

A partition-agnostic sender on a stream of several partitions (000 §4.1-4.2, the default for a
generic client) cannot be redirected to one leader. Through `NodeFront` a node serves it the way
a proxy gateway does: partitions it leads are appended locally, the others go to their leaders
through a `RemoteBroker` (spate.gateway.remote) whose routes come from this node's own metadata
replica. Bound links keep the node's behaviour (served here, or redirected to the leader).
Consumer-group members (ADR 0015) are partition-agnostic too: their coordinator is this node's
when it leads the stream's partition 0, else reached at that leader over the wire.
"""

from __future__ import annotations

from collections.abc import Callable

from spate.core.backend import ConsumerOffset, Partition
from spate.core.coordinator import GroupCoordinator
from spate.core.errors import NotLeader, Unavailable
from spate.core.groups import GroupDefinition
from spate.core.ids import PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream
from spate.gateway.remote import RemoteBroker
from spate.node.manager import LocalBroker


class NodeFront:
    def __init__(
        self, local: LocalBroker, remote: RemoteBroker, refresh: Callable[[], None]
    ) -> None:
        self.local = local
        self.remote = remote
        self.refresh = refresh
        """Brings the remote broker's routes up to this node's metadata replica."""
        self.relayed = 0

    async def lookup(self, name: StreamName) -> StreamConfig:
        return await self.local.lookup(name)

    def stream(self, name: StreamName) -> StreamConfig:
        return self.local.stream(name)

    async def super_stream(self, name: StreamName) -> SuperStream:
        """From this node's metadata replica (its partitions are served like an agnostic
        link's: here when led here, relayed otherwise)."""
        self.refresh()
        return self.remote.table.routes.super_stream(name)

    async def super_stream_of(self, stream: StreamName) -> SuperStream | None:
        self.refresh()
        return self.remote.table.routes.super_stream_of(stream)

    def super_stream_version(self, name: StreamName) -> int | None:
        """As of the last metadata change this node applied to its routes."""
        return self.remote.table.routes.super_stream_version(name)

    @property
    def groups_required(self) -> bool:
        return self.local.groups_required

    async def consumer_group(self, stream: StreamName, group: str) -> GroupDefinition | None:
        return await self.local.consumer_group(stream, group)

    def group_coordinator(self, stream: StreamName) -> GroupCoordinator:
        try:
            return self.local.group_coordinator(stream)
        except (NotLeader, Unavailable):
            pass
        self.refresh()
        self.relayed += 1
        return self.remote.group_coordinator(stream)

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool, relay: bool = False
    ) -> Partition:
        try:
            return self.local.partition(name, partition, write=write)
        except (NotLeader, Unavailable):
            if not relay:
                raise
        self.refresh()
        self.relayed += 1
        return self.remote.partition(name, partition, write=write)

    # -- offset tracking for the admin server (spate.cluster.admin.providers.ConsumersProvider;
    # `group_coordinator` above is its CoordinatorsProvider)

    def list(self, stream: StreamName) -> dict[PartitionId, list[ConsumerOffset]]:
        return self.local.consumer_offsets(stream)

    async def reset(
        self, stream: StreamName, partition: PartitionId, name: bytes, offset: int
    ) -> None:
        """At the leader: here, or relayed over the gateway wire."""
        target = self.partition(stream, partition, write=True, relay=True)
        try:
            await target.reset_offset(name, offset)
        finally:
            target.detach()
