"""Redirect mode of the gateway tier: a Broker that serves no partition and sends every link to
the node that leads it (issue 7; ADR 0008 for the proxy mode to come).

`Routes` is the gateway's picture of the cluster, built from the metadata service (streams,
each partition's leader and epoch, each node's advertised AMQP address) at one metadata
`version`; `RoutingTable.update` keeps the newest and refuses an older picture (a node that is
behind answered: revision fencing). `RedirectBroker` implements spate.core.backend.Broker over
it: `stream()` answers from the picture, `partition()` always raises NotLeader naming the
leader's advertised host and port, which the listener turns into `amqp:link:redirect`
(core §2.8.18) with `hostname`, `network-host`, `port` and `address` — the listener code is the
node's, unchanged. A partition without a known, live leader is refused as retryable
(`amqp:resource-locked`, `spate:retryable`), so clients retry after the election. A stream
the picture does not hold (created since the last refresh, or not at all) is redirected to a
node, which knows for sure.

What redirect mode cannot do (proxy mode will): a partition-agnostic sender on a stream of
several partitions (refused: bind the link with `event-streams-partition`), clients that do not
follow redirects, and `$info` with offsets (it lists each partition's leader instead). A
sender on a super stream (ADR 0014) reaches several leaders: it is proxied when the gateway
has the cluster secret (`relay`), else redirected to a node, which routes its messages. A
consumer group's member link (ADR 0015) is relayed to its coordinator the same way, else
redirected to the leader of the stream's partition 0 (the groups' home), which serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from spate.core import groups, superstreams
from spate.core.backend import Broker, Partition
from spate.core.coordinator import GroupCoordinator
from spate.core.errors import NotFound, NotLeader, Unavailable
from spate.core.groups import GroupDefinition, GroupKey
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream


@dataclass(frozen=True, slots=True)
class Route:
    leader: NodeId | None
    epoch: LeaderEpoch | None
    leader_alive: bool
    replicas: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class Routes:
    """The cluster as the gateway sees it, at one metadata version."""

    version: int
    streams: Mapping[StreamName, StreamConfig] = field(default_factory=dict)
    partitions: Mapping[tuple[StreamName, PartitionId], Route] = field(default_factory=dict)
    amqp: Mapping[NodeId, tuple[str, int]] = field(default_factory=dict)
    """Each node's advertised AMQP host and port."""
    replication: Mapping[NodeId, tuple[str, int]] = field(default_factory=dict)
    """Each node's replication port, where gateways open wire sessions (proxy mode)."""
    super_streams: Mapping[StreamName, SuperStream] = field(default_factory=dict)
    """Super-stream topologies (ADR 0014), each with the metadata version that created it."""
    groups: Mapping[GroupKey, GroupDefinition] = field(default_factory=dict)
    """Consumer groups defined ahead (ADR 0015), by (stream, group name)."""

    def consumer_group(self, stream: StreamName, group: str) -> GroupDefinition | None:
        return groups.find(self.groups, stream, group)

    def super_stream(self, name: StreamName) -> SuperStream:
        """The topology; NotFound naming it when this picture does not hold it."""
        return superstreams.find(self.super_streams, name)

    def super_stream_version(self, name: StreamName) -> int | None:
        return superstreams.version_of(self.super_streams, name)

    def super_stream_of(self, stream: StreamName) -> SuperStream | None:
        return superstreams.owner_of(self.super_streams, stream)


class RoutingTable:
    """The newest Routes seen; older pictures are refused (revision fencing)."""

    def __init__(self) -> None:
        self.routes = Routes(version=-1)
        self.updates = 0
        self.stale_refused = 0
        self.listeners: list[Callable[[], None]] = []
        """Called after every accepted update."""

    def update(self, routes: Routes) -> bool:
        if routes.version < self.routes.version:
            self.stale_refused += 1
            return False
        self.routes = routes
        self.updates += 1
        for listener in list(self.listeners):
            listener()
        return True


def super_stream_redirect(name: str) -> str:
    return (
        f"{name!r} is a super stream: its links reach several partitions' leaders, so a "
        "node serves them (or use proxy mode: the 'spate:gateway-mode' property 'proxy')"
    )


class RedirectBroker:
    """spate.core.backend.Broker for a gateway in redirect mode (see the module docstring)."""

    def __init__(self, table: RoutingTable, relay: Broker | None = None) -> None:
        self.table = table
        self.relay = relay
        """Serves partition-agnostic links (which cannot be redirected to one leader): the
        gateway's proxy broker, when it has the cluster secret."""
        self.require_groups = False
        """`--require-defined-groups` without a proxy broker (else the proxy broker's)."""

    async def lookup(self, name: StreamName) -> StreamConfig:
        if self.relay is not None and name not in self.table.routes.streams:
            return await self.relay.lookup(name)  # ask a node (proxy available)
        return self.stream(name)

    def stream(self, name: StreamName) -> StreamConfig:
        routes = self.table.routes
        config = routes.streams.get(name)
        if config is None:
            if name in routes.super_streams:
                raise self._to_a_node(super_stream_redirect(name))
            # Created since the last refresh, or not at all: a node knows for sure.
            raise self._to_a_node(f"stream {name!r} is not known to this gateway yet; ask a node")
        return config

    def _to_a_node(self, why: str) -> NotLeader | Unavailable:
        routes = self.table.routes
        if routes.version < 0 or not routes.amqp:
            return Unavailable("the gateway has not reached the metadata service yet; retry")
        node = min(routes.amqp)
        host, port = routes.amqp[node]
        return NotLeader(why, leader_host=host, leader_port=port, leader_node=node)

    async def super_stream(self, name: StreamName) -> SuperStream:
        """Served through the proxy broker when this gateway has one; otherwise the link goes
        to a node, which routes each message to its partition's leader (one redirect cannot
        name several leaders)."""
        if self.relay is not None:
            return await self.relay.super_stream(name)
        raise self._to_a_node(super_stream_redirect(name))

    async def super_stream_of(self, stream: StreamName) -> SuperStream | None:
        if self.relay is not None:
            return await self.relay.super_stream_of(stream)
        return self.table.routes.super_stream_of(stream)

    def super_stream_version(self, name: StreamName) -> int | None:
        if self.relay is not None:
            return self.relay.super_stream_version(name)
        return self.table.routes.super_stream_version(name)

    @property
    def groups_required(self) -> bool:
        return self.relay.groups_required if self.relay is not None else self.require_groups

    async def consumer_group(self, stream: StreamName, group: str) -> GroupDefinition | None:
        if self.relay is not None:
            return await self.relay.consumer_group(stream, group)
        return self.table.routes.consumer_group(stream, group)

    def group_coordinator(self, stream: StreamName) -> GroupCoordinator:
        """Through the proxy broker when this gateway has one (a member link is partition-
        agnostic); otherwise the link goes to the home's leader, which coordinates there."""
        if self.relay is not None:
            return self.relay.group_coordinator(stream)
        raise self._to_leader(stream, PartitionId(0), write=True)

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool, relay: bool = False
    ) -> Partition:
        if relay and self.relay is not None:
            return self.relay.partition(name, partition, write=write, relay=True)
        raise self._to_leader(name, partition, write=write)

    def _to_leader(
        self, name: StreamName, partition: PartitionId, *, write: bool
    ) -> NotLeader | Unavailable:
        """Where a link on the partition goes (NotFound, or a refusal, raised here)."""
        config = self.stream(name)
        if not 0 <= partition < config.partitions:
            raise NotFound(
                f"stream {name!r} has partitions 0..{config.partitions - 1}; "
                f"there is no partition {partition}"
            )
        routes = self.table.routes
        route = routes.partitions.get((name, partition))
        if route is None or route.leader is None or not route.leader_alive:
            return Unavailable(f"partition {partition} of {name!r} has no leader right now; retry")
        address = routes.amqp.get(route.leader)
        if address is None:
            return Unavailable(
                f"the leader {route.leader} of {name}/{partition} has no address yet"
            )
        role = "led" if write else "served"
        return NotLeader(
            f"partition {partition} of {name!r} is {role} by {route.leader}",
            leader_host=address[0],
            leader_port=address[1],
            leader_node=route.leader,
        )
