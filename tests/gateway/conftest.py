"""Gateway test fixtures. Every gateway test talks to a real listener on 127.0.0.1 through real
AMQP clients; only `broker` knows which Broker is behind it (today the in-memory one; the
node-backed broker can be added as a parameter of `broker` + `make_stream`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spate.core.ids import StreamName
from spate.core.streams import StreamConfig
from spate.gateway.server import GatewayServer, ListenerConfig
from support.amqp_clients import LoopThread, RunningGateway, unique
from support.memory_broker import MemoryBroker


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


@pytest.fixture
def broker(loop_thread: LoopThread) -> MemoryBroker:
    return MemoryBroker("n1")


@pytest.fixture
def make_stream(loop_thread: LoopThread, broker: MemoryBroker) -> Callable[..., str]:
    """Create a fresh stream (on the gateway's loop); returns its name."""

    def make(partitions: int = 1, prefix: str = "s") -> str:
        name = unique(prefix)
        loop_thread.run(
            lambda: broker.create_stream(StreamConfig(name=StreamName(name), partitions=partitions))
        )
        return name

    return make


@pytest.fixture
def start_gateway(loop_thread: LoopThread, broker: MemoryBroker) -> Iterator[Callable[..., Any]]:
    servers: list[GatewayServer] = []

    def start(**config: Any) -> RunningGateway:
        tls_ca: Path | None = config.get("tls_cert")
        server = GatewayServer(broker, ListenerConfig(node_id="n1", **config))
        port = loop_thread.call(server.start())
        servers.append(server)
        return RunningGateway(port=port, tls_ca=tls_ca)

    yield start
    for server in servers:
        loop_thread.call(server.close())


@pytest.fixture
def gateway(start_gateway: Callable[..., RunningGateway]) -> RunningGateway:
    return start_gateway()
