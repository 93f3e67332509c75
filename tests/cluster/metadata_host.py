"""A process hosting one metadata voter, for the kill -9 test.

Usage: metadata_host.py DATA_DIR ADDRESS PASSWORD NAME...
Creates a stream per NAME, prints `created <version>` and waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from spate.cluster.metadata.service import MetadataService
from spate.core.ids import NodeId, StreamName
from spate.core.streams import StreamConfig


async def main(data_dir: str, address: str, password: str, names: list[str]) -> None:
    service = MetadataService(
        node_id="n1", data_dir=Path(data_dir), self_address=address, password=password
    )
    await service.start()
    await service.wait_ready()
    await service.register_node(
        NodeId("n1"), amqp=address, admin=address, replication=address, metadata=address
    )
    for name in names:
        await service.create_stream(StreamConfig(StreamName(name), partitions=2))
    print(f"created {service.view().version}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
