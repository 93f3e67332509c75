"""A gateway's proxy-mode broker (spate.gateway.remote.RemoteBroker) in front of the node's real
broker (support.node_broker) over the real gateway wire on 127.0.0.1 (the node's replication
port, cluster-secret handshake, spate.core.wire frames): the listener runs over it exactly as in
a gateway process, so the gateway suite proves proxy mode against the same tests as the node."""

from __future__ import annotations

from pathlib import Path

from spate.core.groups import GroupDefinition
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream, unknown
from spate.gateway.remote import (
    RemoteBroker,
    RemoteCoordinator,
    RemoteReader,
    RemoteWriter,
    Sessions,
)
from spate.gateway.routes import Route, Routes, RoutingTable
from spate.node.wire_server import WireServer

from support.node_broker import NodeBroker

SECRET = "test"


class ProxyBroker:
    def __init__(self, data_dir: Path, node: str = "n1") -> None:
        self.node = NodeBroker(data_dir, node)
        self.wire = WireServer(self.node._broker)
        self.node.host.transport.on_session = self.wire.open
        self.table = RoutingTable()
        self.sessions: Sessions | None = None
        self.remote: RemoteBroker | None = None
        self.version = 0
        self.routes_hold_groups = True
        """False: the next refreshes leave the groups out (a gateway behind the metadata)."""

    async def create_stream(self, config: StreamConfig) -> None:
        await self.node.create_stream(config)
        if self.remote is None:
            self.sessions = Sessions("gateway-test", SECRET, self.table)
            self.remote = RemoteBroker(self.table, self.sessions)
        self.refresh()

    def refresh(self) -> None:
        """What a gateway's next metadata refresh would see."""
        node = self.node.node
        port = self.node.port
        partitions = {}
        for config in self.node._configs.values():
            for p in range(config.partitions):
                replica = self.node.host.partition(config.name, PartitionId(p))
                partitions[(config.name, PartitionId(p))] = Route(
                    node, LeaderEpoch(replica.leader_epoch), True, (node,)
                )
        self.version += 1
        self.table.update(
            Routes(
                self.version,
                dict(self.node._configs),
                partitions,
                {node: ("127.0.0.1", 0)},
                {NodeId(node): ("127.0.0.1", port)},
                dict(self.node.super_streams),
                dict(self.node.groups) if self.routes_hold_groups else {},
            )
        )

    async def create_super_stream(self, topology: SuperStream) -> None:
        await self.node.create_super_stream(topology)
        if self.remote is None:
            self.sessions = Sessions("gateway-test", SECRET, self.table)
            self.remote = RemoteBroker(self.table, self.sessions)
        self.refresh()

    async def super_stream(self, name: StreamName) -> SuperStream:
        if self.remote is None:
            raise unknown(name)
        return await self.remote.super_stream(name)

    def super_stream_version(self, name: StreamName) -> int | None:
        return None if self.remote is None else self.remote.super_stream_version(name)

    async def super_stream_of(self, stream: StreamName) -> SuperStream | None:
        return None if self.remote is None else await self.remote.super_stream_of(stream)

    def define_group(self, group: GroupDefinition) -> None:
        """Defined at the node; the gateway's routes hold it after their next refresh."""
        self.node.define_group(group)

    @property
    def groups_required(self) -> bool:
        return self.remote is not None and self.remote.groups_required

    @groups_required.setter
    def groups_required(self, required: bool) -> None:
        assert self.remote is not None, "create a stream first"
        self.remote.groups_required = required

    async def consumer_group(self, stream: StreamName, group: str) -> GroupDefinition | None:
        return None if self.remote is None else await self.remote.consumer_group(stream, group)

    async def close(self) -> None:
        if self.sessions is not None:
            await self.sessions.close()
        await self.node.close()

    async def lookup(self, name: StreamName) -> StreamConfig:
        if self.remote is None:
            return self.node.stream(name)  # nothing created yet: the node answers NotFound
        return await self.remote.lookup(name)

    def stream(self, name: StreamName) -> StreamConfig:
        return self.node.stream(name)

    def group_coordinator(self, stream: StreamName) -> RemoteCoordinator:
        if self.remote is None:
            self.node.stream(stream)  # raises NotFound
        assert self.remote is not None
        return self.remote.group_coordinator(stream)

    async def close_sessions(self) -> None:
        """The gateway loses its wire sessions (as if it died, from the node's side)."""
        assert self.sessions is not None
        await self.sessions.close()

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool, relay: bool = False
    ) -> RemoteWriter | RemoteReader:
        if self.remote is None:
            self.node.stream(name)  # raises NotFound
        assert self.remote is not None
        return self.remote.partition(name, partition, write=write)
