"""The node's real Broker (PartitionManager + LocalBroker over real files with fsync), with the
same `create_stream` hook as the in-memory broker so the gateway suite runs against both."""

from __future__ import annotations

from pathlib import Path

from spate.core.backend import Partition
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.node.manager import LocalBroker, PartitionManager


class NodeBroker:
    def __init__(self, data_dir: Path, node: str = "n1") -> None:
        self.manager = PartitionManager(data_dir, NodeId(node))
        self._broker = LocalBroker(self.manager)
        self._configs: dict[StreamName, StreamConfig] = {}

    async def create_stream(self, config: StreamConfig) -> None:
        config.validate()
        self._configs[config.name] = config
        await self.manager.apply_streams(self._configs.values())

    async def close(self) -> None:
        await self.manager.close()

    def stream(self, name: StreamName) -> StreamConfig:
        return self._broker.stream(name)

    def partition(self, name: StreamName, partition: PartitionId, *, write: bool) -> Partition:
        return self._broker.partition(name, partition, write=write)
