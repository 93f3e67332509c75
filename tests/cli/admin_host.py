"""A small host process for the CLI and cluster tests: one metadata voter plus the admin server.

Usage: admin_host.py DATA_DIR [--node-id N] [--metadata HOST:PORT] [--peers HOST:PORT,...]
                              [--also-register N,...]

Prints one JSON line {"admin": "127.0.0.1:PORT", "metadata": "127.0.0.1:PORT", "pid": int} once
serving, then serves until SIGTERM or SIGINT. It does what a node process does with the metadata
service, minus the partitions: registers itself with all four endpoints (AMQP and replication are
reserved ports nothing listens on), heartbeats every `heartbeat_interval_ms`, and reports itself
leader at epoch 1 of every partition it is the preferred leader of. `--also-register` adds
registry-only nodes that it heartbeats too, so placement has several nodes to spread over.

The stats provider reports partition 0 of every stream as holding ten messages and no other
partition, so both describe paths (with and without stats) are exercised. The consumers
provider reports, on that partition, a plain consumer `app` (offset 4) and the stored names of
two consumer groups: `seen` (committed 3 with its owner attached, epoch 2; not defined unless a
test defines it) and `billing` (committed 6).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path

from spate.cluster.admin.providers import ProcessFacts
from spate.cluster.admin.server import AdminServer
from spate.cluster.metadata import limits
from spate.cluster.metadata.service import MetadataService
from spate.cluster.metadata.state import MetadataView
from spate.core.backend import ConsumerOffset, PartitionInfo
from spate.core.errors import NotFound, Unavailable
from spate.core.ids import LeaderEpoch, NodeId, Offset, PartitionId, StreamName
from spate.server.devcluster import _free_port

log = logging.getLogger("admin_host")


_drawn: set[int] = set()


def free_port() -> int:
    """A port for a listener named before it binds, drawn like `spate dev up` draws them: from
    $SPATE_DEV_PORTS (each pytest-xdist worker has its own slice, tests/conftest.py) and never
    twice in this process."""
    port = _free_port(_drawn)
    _drawn.add(port)
    return port


async def main(args: argparse.Namespace) -> None:
    data_dir = Path(args.data_dir)
    node = NodeId(args.node_id)
    raft = args.metadata or f"127.0.0.1:{free_port()}"
    metadata = MetadataService(
        node_id=node,
        data_dir=data_dir / "metadata",
        self_address=raft,
        peer_addresses=[p for p in args.peers.split(",") if p],
        password="cli-test",
    )
    admin_address = ""
    extra = [NodeId(n) for n in args.also_register.split(",") if n]

    def stats(stream: StreamName) -> list[PartitionInfo]:
        return [
            PartitionInfo(
                stream=stream,
                partition=PartitionId(0),
                first_offset=Offset(0),
                last_offset=Offset(9),
                end_offset=Offset(10),
                first_timestamp_ms=1_700_000_000_000,
                last_timestamp_ms=1_700_000_001_000,
                messages=10,
                bytes=1500,
                segments=1,
                leader=node,
            )
        ]

    class Consumers:
        def list(self, stream: StreamName) -> dict[PartitionId, list[ConsumerOffset]]:
            metadata.stream(stream)  # NotFound for an unknown stream
            stamp = 1_700_000_002_000
            return {
                PartitionId(0): [
                    ConsumerOffset("app", 4, stamp),
                    ConsumerOffset("$group/seen", 3, stamp, attached=1),
                    ConsumerOffset("$epoch/seen", 2, stamp),
                    ConsumerOffset("$group/billing", 6, stamp),
                ]
            }

        async def reset(
            self, stream: StreamName, partition: PartitionId, name: bytes, offset: int
        ) -> None:
            raise Unavailable("this process does not serve partitions")

    def status() -> list[ProcessFacts]:
        hosted = metadata.assignments(node)
        return [
            ProcessFacts(
                node_id=node,
                role="node",
                pid=os.getpid(),
                endpoints={"admin": admin_address, "metadata": raft},
                partitions=len(hosted),
                streams=len({a.config.name for a in hosted}),
            )
        ]

    async def register(who: NodeId) -> None:
        base = admin_address if who == node else f"{who}.invalid:7600"
        await metadata.register_node(
            who,
            amqp=f"127.0.0.1:{free_port()}" if who == node else f"{who}.invalid:5672",
            admin=base,
            replication=f"127.0.0.1:{free_port()}" if who == node else f"{who}.invalid:7700",
            metadata=raft if who == node else f"{who}.invalid:7800",
        )

    async def heartbeats() -> None:
        while True:
            await asyncio.sleep(limits.heartbeat_interval_ms / 1000)
            for who in (node, *extra):
                try:
                    await metadata.heartbeat(who)
                except NotFound:
                    await register(who)
                except Unavailable as error:
                    log.warning("heartbeat of %s failed: %s", who, error.message)

    changed = asyncio.Event()

    def on_change(view: MetadataView) -> None:
        changed.set()

    async def report_leaders() -> None:
        while True:
            for config, partition, replicas in metadata.assignments(node):
                record = metadata.stream_record(config.name)
                if replicas[:1] == (node,) and record.partitions[partition].leader is None:
                    with contextlib.suppress(NotFound, Unavailable):
                        await metadata.report_leader(config.name, partition, node, LeaderEpoch(1))
            await changed.wait()
            changed.clear()

    await metadata.start()
    await metadata.wait_ready()
    server = AdminServer(
        metadata, stats=stats, status=status, host="127.0.0.1", port=0, consumers=Consumers()
    )
    port = await server.start()
    admin_address = f"127.0.0.1:{port}"
    for who in (node, *extra):
        await register(who)
    metadata.add_listener(on_change)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"admin": admin_address, "metadata": raft, "pid": os.getpid()}), flush=True)
    try:
        async with asyncio.TaskGroup() as tasks:
            workers = [tasks.create_task(heartbeats()), tasks.create_task(report_leaders())]
            await stop.wait()
            for worker in workers:
                worker.cancel()
    finally:
        await server.stop()
        await metadata.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("--node-id", default="n1")
    parser.add_argument("--metadata", default="")
    parser.add_argument("--peers", default="")
    parser.add_argument("--also-register", default="")
    asyncio.run(main(parser.parse_args()))
