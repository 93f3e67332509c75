"""The node's real Broker (PartitionManager + LocalBroker over a ReplicationHost with one-replica
Raft groups on real files with fsync), with the same `create_stream` hook as the in-memory broker
so the gateway suite runs against both."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from spate.core import groups, superstreams
from spate.core.backend import Partition
from spate.core.coordination import Coordinators
from spate.core.groups import GroupDefinition, GroupKey
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream
from spate.node.manager import Assignment, LocalBroker, PartitionManager
from spate.node.replication.host import ReplicationHost


class NodeBroker:
    def __init__(self, data_dir: Path, node: str = "n1") -> None:
        self.node = NodeId(node)
        self.host = ReplicationHost(
            self.node, data_dir, host="127.0.0.1", port=0, secret="test", peers=lambda _: None
        )
        self.manager = PartitionManager(self.host)
        self.groups: dict[GroupKey, GroupDefinition] = {}
        """What the node's metadata replica would hold (`define_group`)."""
        self._broker = LocalBroker(
            self.manager,
            lambda _s, _p: [],
            lambda _n: None,
            find_group=lambda stream, group: groups.find(self.groups, stream, group),
        )
        self._configs: dict[StreamName, StreamConfig] = {}
        self.super_streams: dict[StreamName, SuperStream] = {}
        self._started = False
        self.port = 0
        """The replication port (where gateways open wire sessions) once started."""

    async def create_stream(self, config: StreamConfig) -> None:
        config.validate()
        if not self._started:
            self.port = await self.host.start()
            self._started = True
        self._configs[config.name] = config
        assignments = [
            Assignment(c, PartitionId(p), (self.node,))
            for c in self._configs.values()
            for p in range(c.partitions)
        ]
        await self.manager.apply(self._configs.values(), assignments)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        for a in assignments:  # a one-replica group elects itself within its election timeout
            replica = self.host.partition(a.config.name, a.partition)
            while not replica.is_leader:
                assert loop.time() < deadline, f"{a.config.name}/{a.partition} elected no leader"
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        await self.manager.close()
        if self._started:
            await self.host.stop()

    async def create_super_stream(self, topology: SuperStream) -> None:
        for stream in topology.partitions:
            await self.create_stream(StreamConfig(stream))
        self.super_streams[topology.name] = topology

    async def super_stream(self, name: StreamName) -> SuperStream:
        return superstreams.find(self.super_streams, name)

    def super_stream_version(self, name: StreamName) -> int | None:
        return superstreams.version_of(self.super_streams, name)

    async def super_stream_of(self, stream: StreamName) -> SuperStream | None:
        return superstreams.owner_of(self.super_streams, stream)

    def define_group(self, group: GroupDefinition) -> None:
        self.stream(group.stream)  # NotFound
        version = max((g.version for g in self.groups.values()), default=0) + 1
        self.groups[group.key] = dataclasses.replace(group, version=version)

    @property
    def groups_required(self) -> bool:
        return self._broker.groups_required

    @groups_required.setter
    def groups_required(self, required: bool) -> None:
        self._broker.groups_required = required

    async def consumer_group(self, stream: StreamName, group: str) -> GroupDefinition | None:
        return await self._broker.consumer_group(stream, group)

    async def lookup(self, name: StreamName) -> StreamConfig:
        return self.stream(name)

    def stream(self, name: StreamName) -> StreamConfig:
        return self._broker.stream(name)

    def group_coordinator(self, stream: StreamName) -> Coordinators:
        return self._broker.group_coordinator(stream)

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool, relay: bool = False
    ) -> Partition:
        return self._broker.partition(name, partition, write=write)
