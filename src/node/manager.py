"""The partitions this node serves, kept in step with the stream definitions it is given.

`PartitionManager.apply_streams` receives the full set of stream definitions (from the metadata
service, wired by spate.server) and opens, keeps or closes-and-deletes partition logs to match.
`LocalBroker` is the spate.core.backend.Broker the AMQP listener consumes.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from spate.core.backend import PartitionInfo
from spate.core.errors import NotFound
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.node.log import LogConfig
from spate.node.partition import PartitionShell

log = logging.getLogger(__name__)

PartitionKey = tuple[StreamName, PartitionId]


def partition_directory(root: Path, stream: StreamName, partition: PartitionId) -> Path:
    return root / "streams" / stream / f"{partition:05d}"


class PartitionManager:
    """Owns one PartitionShell per (stream, partition) defined for this node."""

    def __init__(
        self, data_dir: Path, node_id: NodeId, clock_ms: Callable[[], int] | None = None
    ) -> None:
        self._root = data_dir
        self._node_id = node_id
        self._clock_ms = clock_ms
        self._configs: dict[StreamName, StreamConfig] = {}
        self._shells: dict[PartitionKey, PartitionShell] = {}
        self._lock = asyncio.Lock()

    @property
    def configs(self) -> dict[StreamName, StreamConfig]:
        return self._configs

    def shell(self, stream: StreamName, partition: PartitionId) -> PartitionShell | None:
        return self._shells.get((stream, partition))

    async def apply_streams(self, streams: Iterable[StreamConfig]) -> None:
        """Open partitions of new streams, close and delete those of deleted streams."""
        async with self._lock:
            wanted = {s.name: s for s in streams}
            for name in [n for n in self._configs if n not in wanted]:
                await self._drop_stream(name)
            for name, config in wanted.items():
                if name not in self._configs:
                    await self._open_stream(config)
                self._configs[name] = config

    async def _open_stream(self, config: StreamConfig) -> None:
        log_config = LogConfig(segment_bytes=config.segment_bytes, retention=config.retention)
        for index in range(config.partitions):
            pid = PartitionId(index)
            directory = partition_directory(self._root, config.name, pid)
            kwargs = {} if self._clock_ms is None else {"clock_ms": self._clock_ms}
            shell = PartitionShell(
                config.name, pid, directory, log_config, leader=self._node_id, **kwargs
            )
            await shell.start()
            self._shells[(config.name, pid)] = shell
        log.info("serving stream %s (%d partitions)", config.name, config.partitions)

    async def _drop_stream(self, name: StreamName) -> None:
        config = self._configs.pop(name)
        for index in range(config.partitions):
            shell = self._shells.pop((name, PartitionId(index)), None)
            if shell is not None:
                await shell.close()
        directory = self._root / "streams" / name
        if directory.exists():
            shutil.rmtree(directory)
        log.info("deleted stream %s and its data", name)

    async def open_existing(self) -> None:
        """Nothing to do: partitions are opened when definitions arrive from metadata."""

    async def close(self) -> None:
        async with self._lock:
            for shell in self._shells.values():
                await shell.close()
            self._shells.clear()

    def stats(self, stream: StreamName) -> list[PartitionInfo]:
        """Runtime facts of every partition of `stream` served here (for describe / $info)."""
        config = self._configs.get(stream)
        if config is None:
            raise NotFound(f"stream {stream!r} does not exist")
        infos = []
        for index in range(config.partitions):
            shell = self._shells.get((stream, PartitionId(index)))
            if shell is not None:
                infos.append(shell.info())
        return infos


class LocalBroker:
    """spate.core.backend.Broker over the partitions this node serves."""

    def __init__(self, manager: PartitionManager) -> None:
        self._manager = manager

    def stream(self, name: StreamName) -> StreamConfig:
        config = self._manager.configs.get(name)
        if config is None:
            raise NotFound(
                f"stream {name!r} does not exist; create it with `spate stream create {name}`"
            )
        return config

    def partition(self, name: StreamName, partition: PartitionId, *, write: bool) -> PartitionShell:
        config = self.stream(name)
        if not 0 <= partition < config.partitions:
            raise NotFound(
                f"stream {name!r} has partitions 0..{config.partitions - 1}; "
                f"there is no partition {partition}"
            )
        shell = self._manager.shell(name, partition)
        if shell is None:
            raise NotFound(f"partition {partition} of stream {name!r} is not open on this node yet")
        return shell
