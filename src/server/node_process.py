"""`spate node run`: one storage node process on one asyncio (uvloop) loop.

Start order: partitions directory -> metadata voter -> partition manager (follows stream
definitions) -> AMQP listener -> gRPC admin -> endpoints file. Stop order is the reverse; SIGTERM
and SIGINT stop it cleanly, nothing acknowledged is lost by a kill -9 either (acks follow fsync).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spate.cluster.admin.providers import ProcessFacts
from spate.cluster.admin.server import AdminServer
from spate.cluster.metadata.service import MetadataService
from spate.core.backend import PartitionInfo
from spate.core.ids import NodeId, StreamName
from spate.gateway.server import GatewayServer, ListenerConfig
from spate.node.manager import LocalBroker, PartitionManager
from spate.server.settings import NodeSettings

log = logging.getLogger(__name__)

ENDPOINTS_FILE = "node.json"
"""Written into the node's data directory once every listener is bound."""


@dataclass(frozen=True)
class NodeEndpoints:
    node_id: str
    pid: int
    amqp: str
    admin: str
    metadata: str
    started_at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "pid": self.pid,
            "role": "node",
            "amqp": self.amqp,
            "admin": self.admin,
            "metadata": self.metadata,
            "started_at_ms": self.started_at_ms,
        }


class NodeProcess:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        node_id = NodeId(settings.node_id)
        self.manager = PartitionManager(settings.data_dir, node_id)
        self.metadata = MetadataService(
            node_id=settings.node_id,
            data_dir=settings.data_dir / "metadata",
            self_address=f"{settings.host}:{settings.metadata_port}",
            peer_addresses=list(settings.metadata_peers),
            password=settings.metadata_password,
        )
        self.gateway = GatewayServer(
            LocalBroker(self.manager),
            ListenerConfig(
                host=settings.host,
                port=settings.amqp_port,
                node_id=settings.node_id,
                allow_anonymous=settings.allow_anonymous,
                users_file=settings.users_file,
                tls_cert=settings.tls_cert,
                tls_key=settings.tls_key,
            ),
        )
        self.admin = AdminServer(
            self.metadata,
            stats=self._stats,
            status=self._status,
            host=settings.host,
            port=settings.admin_port,
        )
        self.endpoints: NodeEndpoints | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._streams_changed = asyncio.Event()

    def _stats(self, stream: StreamName) -> list[PartitionInfo]:
        return self.manager.stats(stream)

    def _status(self) -> list[ProcessFacts]:
        assert self.endpoints is not None
        e = self.endpoints
        return [ProcessFacts(
            node_id=e.node_id, role="node", pid=e.pid,
            endpoints={"amqp": e.amqp, "admin": e.admin, "metadata": e.metadata},
            partitions=sum(c.partitions for c in self.manager.configs.values()),
            streams=len(self.manager.configs),
        )]

    async def start(self) -> NodeEndpoints:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        await self.metadata.start()
        await self.metadata.wait_ready()  # a leader exists and this replica has caught up
        self.metadata.add_listener(lambda *_: self._streams_changed.set())
        await self.manager.apply_streams(self.metadata.streams())
        self._sync_task = asyncio.create_task(self._follow_streams(), name="follow-streams")
        amqp_port = await self.gateway.start()
        admin_port = await self.admin.start()
        host = self.settings.host
        self.endpoints = NodeEndpoints(
            node_id=self.settings.node_id,
            pid=os.getpid(),
            amqp=f"{host}:{amqp_port}",
            admin=f"{host}:{admin_port}",
            metadata=f"{host}:{self.settings.metadata_port}",
            started_at_ms=int(time.time() * 1000),
        )
        path = self.settings.data_dir / ENDPOINTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.endpoints.to_json(), indent=2))
        tmp.replace(path)
        log.info(
            "node %s ready: amqp %s admin %s",
            self.settings.node_id,
            self.endpoints.amqp,
            self.endpoints.admin,
        )
        return self.endpoints

    async def _follow_streams(self) -> None:
        """Apply stream definitions whenever the metadata service reports a change."""
        while True:
            await self._streams_changed.wait()
            self._streams_changed.clear()
            await self.manager.apply_streams(self.metadata.streams())

    async def stop(self) -> None:
        await self.admin.stop()
        await self.gateway.close()
        if self._sync_task is not None:
            self._sync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync_task
        await self.manager.close()
        await self.metadata.stop()
        (self.settings.data_dir / ENDPOINTS_FILE).unlink(missing_ok=True)


async def run_node(settings: NodeSettings) -> None:
    node = NodeProcess(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await node.start()
    try:
        await stop.wait()
    finally:
        log.info("node %s stopping", settings.node_id)
        await node.stop()


def main_run(settings: NodeSettings) -> int:
    import uvloop  # the one place the node's event loop is chosen

    logging.basicConfig(
        level=os.environ.get("SPATE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    uvloop.run(run_node(settings))
    return 0


def read_endpoints(data_dir: Path) -> dict[str, Any] | None:
    path = Path(data_dir) / ENDPOINTS_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None
