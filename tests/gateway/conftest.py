"""Gateway test fixtures. Every gateway test talks to a real listener on 127.0.0.1 through real
AMQP clients; only `broker` knows which Broker is behind it. Every test runs twice: against the
in-memory broker, against the node's real broker (partition logs on disk with fsync), and
against a gateway's proxy-mode broker in front of that node over the real gateway wire
(support.proxy_broker), so the fake and the proxy pass the same suite as the node. Tests
marked `memory_broker_only` use failure-injection hooks that only the in-memory broker has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spate.core.ids import StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream, define
from spate.gateway import fastsend
from spate.gateway.server import GatewayServer, ListenerConfig
from support.amqp_clients import LoopThread, RunningGateway, unique
from support.memory_broker import MemoryBroker
from support.node_broker import NodeBroker
from support.proxy_broker import ProxyBroker
from support.pump import Client, PumpRig


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


INGRESS_BOTH = frozenset(
    {"test_dedup", "test_sub_entries", "test_publish_consume", "test_super_streams",
     "test_refusals", "test_flow_and_failures", "test_inbound"}
)  # fmt: skip
"""Producer-path modules run again with the Python loop instead of the C one (ADR 0038),
against the in-memory broker: the two take the same messages the same way."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "broker" in metafunc.fixturenames:
        kinds = ["memory"]
        if metafunc.definition.get_closest_marker("memory_broker_only") is None:
            kinds += ["node", "proxy"]
        if metafunc.module.__name__.rpartition(".")[2] in INGRESS_BOTH:
            pairs = [(kind, "c") for kind in kinds] + [("memory", "python")]
            metafunc.parametrize(
                ("broker", "ingress"), pairs, indirect=True, ids=[f"{b}-{i}" for b, i in pairs]
            )
        else:
            metafunc.parametrize("broker", kinds, indirect=True)


@pytest.fixture(autouse=True)
def ingress(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """ "c": the gateway takes producers' messages with `_fastsend.recv_run` when built (the
    default); "python": with the Python loop it falls back to (`fastsend.native` None, which
    also makes the consumers' sends Python)."""
    kind: str = getattr(request, "param", "c")
    if kind == "python":
        monkeypatch.setattr(fastsend, "native", None)
    return kind


@pytest.fixture
def broker(
    request: pytest.FixtureRequest, loop_thread: LoopThread, tmp_path: Path
) -> Iterator[MemoryBroker | NodeBroker | ProxyBroker]:
    if request.param == "memory":
        yield MemoryBroker("n1")
        return
    node = (NodeBroker if request.param == "node" else ProxyBroker)(tmp_path / "node", "n1")
    yield node
    loop_thread.call(node.close())


@pytest.fixture
def make_stream(
    loop_thread: LoopThread, broker: MemoryBroker | NodeBroker | ProxyBroker
) -> Callable[..., str]:
    """Create a fresh stream (on the gateway's loop); returns its name."""

    def make(partitions: int = 1, prefix: str = "s") -> str:
        name = unique(prefix)
        config = StreamConfig(name=StreamName(name), partitions=partitions)
        if isinstance(broker, NodeBroker | ProxyBroker):
            loop_thread.call(broker.create_stream(config))
        else:
            loop_thread.run(lambda: broker.create_stream(config))
        return name

    return make


@pytest.fixture
def make_super(
    loop_thread: LoopThread, broker: MemoryBroker | NodeBroker | ProxyBroker
) -> Callable[..., SuperStream]:
    """Create a fresh super stream (ADR 0014; `partitions=N` or `binding_keys=(...)`) and its
    partition streams; returns its topology."""

    def make(**kwargs: Any) -> SuperStream:
        topology = define(unique("ss"), **kwargs)
        if isinstance(broker, NodeBroker | ProxyBroker):
            loop_thread.call(broker.create_super_stream(topology))
        else:
            loop_thread.run(lambda: broker.create_super_stream(topology))
        return topology

    return make


@pytest.fixture
def start_gateway(
    loop_thread: LoopThread, broker: MemoryBroker | NodeBroker | ProxyBroker
) -> Iterator[Callable[..., Any]]:
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


# -- the pump rig (tests/support/pump.py): the listener and a client engine in memory, no sockets


@pytest.fixture
def memory() -> MemoryBroker:
    """Streams `orders` (1 partition) and `clicks` (3); appends wait for `rig.release()`."""
    memory = MemoryBroker("n1", commit_delay_s=None)
    for name, partitions in (("orders", 1), ("clicks", 3)):
        memory.create_stream(StreamConfig(StreamName(name), partitions=partitions))
    return memory


@pytest.fixture
def rig(memory: MemoryBroker) -> Iterator[PumpRig]:
    rig = PumpRig(memory)
    yield rig
    rig.close()


@pytest.fixture
def client(rig: PumpRig) -> Client:
    return rig.connect()
