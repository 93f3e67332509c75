"""A small host process for the CLI tests: one metadata voter plus the admin server.

Usage: admin_host.py DATA_DIR
Prints one JSON line {"admin": "127.0.0.1:PORT", "metadata": "127.0.0.1:PORT"} once serving,
then serves until SIGTERM or SIGINT. The stats provider reports partition 0 of every stream as
holding ten messages and no other partition, so both describe paths (with and without stats)
are exercised.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

from spate.cluster.admin.providers import ProcessFacts
from spate.cluster.admin.server import AdminServer
from spate.cluster.metadata.service import MetadataService
from spate.core.backend import PartitionInfo
from spate.core.ids import NodeId, Offset, PartitionId, StreamName


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def main(data_dir: Path) -> None:
    raft = f"127.0.0.1:{free_port()}"
    metadata = MetadataService(
        node_id="n1", data_dir=data_dir / "metadata", self_address=raft, password="cli-test"
    )
    admin_address = ""

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
                leader=NodeId("n1"),
            )
        ]

    def status() -> list[ProcessFacts]:
        streams = metadata.streams()
        return [
            ProcessFacts(
                node_id="n1",
                role="node",
                pid=os.getpid(),
                endpoints={"admin": admin_address, "metadata": raft},
                partitions=sum(c.partitions for c in streams),
                streams=len(streams),
            )
        ]

    await metadata.start()
    await metadata.wait_ready()
    server = AdminServer(metadata, stats=stats, status=status, host="127.0.0.1", port=0)
    port = await server.start()
    admin_address = f"127.0.0.1:{port}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"admin": admin_address, "metadata": raft}), flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
        await metadata.stop()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
