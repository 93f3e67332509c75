"""Consumer group definitions as the listener's broker answers them (ADR 0015), against every
broker of the gateway suite (memory, node, proxy); and the reserved `$` consumer names refused
over AMQP with python-qpid-proton.

Contract: `Broker.consumer_group(stream, group)` is the group's definition in the metadata
service (None: not defined); `Broker.groups_required` is the listener's
`--require-defined-groups`. A `spate:consumer-name` starting with `$` is refused with
amqp:invalid-field (those names hold the groups' offsets and epochs).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from proton import symbol
from spate.core.groups import Strategy, define
from spate.core.ids import StreamName
from spate.core.streams import StreamConfig
from support.amqp_clients import LinkProperties, LoopThread, RunningGateway, blocking, unique
from support.memory_broker import MemoryBroker
from support.node_broker import NodeBroker
from support.proxy_broker import ProxyBroker

Brokers = MemoryBroker | NodeBroker | ProxyBroker


def test_consumer_group_answers_definitions(
    broker: Brokers, loop_thread: LoopThread, make_stream: Callable[..., str]
) -> None:
    stream = StreamName(make_stream(partitions=2))
    other = StreamName(make_stream())

    async def scenario() -> None:
        assert await broker.consumer_group(stream, "billing") is None
        assert broker.groups_required is False
        broker.define_group(define(stream, "billing", strategy="range"))
        if isinstance(broker, ProxyBroker):  # a gateway knows it after its next routes read
            assert await broker.consumer_group(stream, "billing") is None
            broker.refresh()
        found = await broker.consumer_group(stream, "billing")
        assert found is not None
        assert (found.stream, found.name, found.strategy) == (stream, "billing", Strategy.RANGE)
        assert found.version > 0
        assert await broker.consumer_group(other, "billing") is None  # per stream
        broker.groups_required = True
        assert broker.groups_required is True

    loop_thread.call(scenario())


def test_a_proxy_requiring_definitions_reads_the_routes_for_an_unknown_group(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    """A group defined since the gateway's last refresh is found on the attach that needs it
    (the routes are read at once); without the requirement no read is made for it."""
    proxy = ProxyBroker(tmp_path / "node")
    reads = []

    async def scenario() -> None:
        stream = StreamName(unique("g"))
        await proxy.create_stream(StreamConfig(stream))
        assert proxy.remote is not None

        async def refresh() -> None:
            reads.append(1)
            proxy.refresh()

        proxy.remote.refresh = refresh
        proxy.define_group(define(stream, "late"))
        assert await proxy.consumer_group(stream, "late") is None  # not required: no read
        assert reads == []
        proxy.groups_required = True
        found = await proxy.consumer_group(stream, "late")
        assert found is not None and found.name == "late"
        assert reads == [1]
        assert await proxy.consumer_group(stream, "never") is None
        assert reads == [1, 1]
        await proxy.close()

    loop_thread.call(scenario())


@pytest.mark.parametrize("name", ["$group/billing", "$epoch/billing", "$anything"])
def test_a_reserved_consumer_name_is_refused_as_invalid_field(
    gateway: RunningGateway, make_stream: Callable[..., str], name: str
) -> None:
    stream = make_stream()
    properties = LinkProperties({symbol("spate:consumer-name"): name})
    with blocking(gateway) as conn:
        with pytest.raises(Exception, match="invalid-field") as refused:
            conn.create_receiver(stream, name=unique("rx"), options=[properties])
        assert "are reserved for consumer groups" in str(refused.value)
        # a name with '$' elsewhere is an ordinary consumer name
        fine = LinkProperties({symbol("spate:consumer-name"): "app$1"})
        conn.create_receiver(stream, name=unique("rx"), options=[fine]).close()
