"""The metadata group's password (ADR 0023): a voter with the wrong one cannot join.

Three voters are configured as each other's peers; the third holds a different password.
pysyncobj encrypts and authenticates every message with the password, so the two with the right
one form the group (a majority) and serve, and the third never hears a leader: it never becomes
ready, never learns a stream, and can change nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from spate.cluster.metadata.service import MetadataService
from spate.core.errors import Unavailable
from spate.core.ids import NodeId, StreamName
from spate.core.streams import StreamConfig

GOOD, BAD = "the-cluster-password", "a-guessed-password"


def test_a_voter_with_the_wrong_password_cannot_join(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    ports = [free_port() for _ in range(3)]

    def voter(i: int, password: str) -> MetadataService:
        return MetadataService(
            node_id=f"n{i}",
            data_dir=tmp_path / f"v{i}",
            self_address=f"127.0.0.1:{ports[i]}",
            peer_addresses=[f"127.0.0.1:{p}" for p in ports if p != ports[i]],
            password=password,
        )

    async def scenario() -> None:
        voters = [voter(0, GOOD), voter(1, GOOD), voter(2, BAD)]
        try:
            for v in voters:
                await v.start()
            good, intruder = voters[:2], voters[2]
            for v in good:
                await v.wait_ready()
            address = f"127.0.0.1:{ports[0]}"
            await good[0].register_node(
                NodeId("n0"), amqp=address, admin=address, replication=address, metadata=address
            )
            await good[0].create_stream(StreamConfig(StreamName("orders")))
            deadline = time.monotonic() + 15
            while not all([c.name for c in v.streams()] == ["orders"] for v in good):
                assert time.monotonic() < deadline, "the good voters never agreed"
                await asyncio.sleep(0.05)
            # Several election timeouts later the intruder still has no leader and no state.
            await asyncio.sleep(3)
            status = intruder.status()
            assert not status.ready and status.leader is None, status
            assert intruder.streams() == []
            with pytest.raises(Unavailable):
                await intruder.wait_ready(timeout_ms=1000)
            assert all(v.status().leader is not None for v in good)
            assert {v.status().leader for v in good} <= {
                f"127.0.0.1:{ports[0]}",
                f"127.0.0.1:{ports[1]}",
            }
        finally:
            for v in voters:
                await v.stop()

    asyncio.run(scenario())
