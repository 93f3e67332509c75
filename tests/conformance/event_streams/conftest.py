"""Fixtures of the Event Streams conformance suite (000, the OASIS Event Stream Extensions).

Every test talks to a real listener (`spate.gateway.server.GatewayServer`) on 127.0.0.1, port 0,
through real AMQP clients over a socket. `broker` says which Broker is behind it: the in-memory
fake (support.memory_broker) by default; tests marked `routing` (clauses about partitions: which
one a link or a message goes to, what a delivery or `$info` says of them) also run over a
proxy-mode gateway (support.proxy_broker) in front of the node's real broker (replicated
partition logs on disk), where links, routing and reads go over the gateway wire. The node's
own listener over that broker is the gateway suite's third broker (tests/gateway/conftest.py);
here it would add half again to the run time for little the proxy run does not reach.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from spate.core.ids import StreamName
from spate.core.streams import StreamConfig
from spate.gateway.server import GatewayServer, ListenerConfig
from support.amqp_clients import LoopThread, RunningGateway, unique
from support.memory_broker import MemoryBroker
from support.node_broker import NodeBroker
from support.proxy_broker import ProxyBroker

AnyBroker = MemoryBroker | NodeBroker | ProxyBroker
ROUTING_BROKERS = ["memory", "proxy"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "routing: an Event Streams clause about partition routing (every broker)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "broker" in metafunc.fixturenames:
        routing = metafunc.definition.get_closest_marker("routing") is not None
        metafunc.parametrize("broker", ROUTING_BROKERS if routing else ["memory"], indirect=True)


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


@pytest.fixture
def broker(
    request: pytest.FixtureRequest, loop_thread: LoopThread, tmp_path: Path
) -> Iterator[AnyBroker]:
    if request.param == "memory":
        yield MemoryBroker("n1")
        return
    node = (NodeBroker if request.param == "node" else ProxyBroker)(tmp_path / "node", "n1")
    yield node
    loop_thread.call(node.close())


@pytest.fixture
def make_stream(loop_thread: LoopThread, broker: AnyBroker) -> Callable[..., str]:
    """Create a fresh stream (on the gateway's loop); returns its name."""

    def make(partitions: int = 1) -> str:
        name = unique("es")
        config = StreamConfig(name=StreamName(name), partitions=partitions)
        if isinstance(broker, NodeBroker | ProxyBroker):
            loop_thread.call(broker.create_stream(config))
        else:
            loop_thread.run(lambda: broker.create_stream(config))
        return name

    return make


@pytest.fixture
def gateway(loop_thread: LoopThread, broker: AnyBroker) -> Iterator[RunningGateway]:
    server = GatewayServer(broker, ListenerConfig(node_id="n1"))
    port = loop_thread.call(server.start())
    yield RunningGateway(port=port)
    loop_thread.call(server.close())
