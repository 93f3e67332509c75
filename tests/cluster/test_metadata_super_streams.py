"""Super streams in the metadata state machine (ADR 0014): one transition creates or deletes
the topology with its partition streams; names clash with streams as FAILED_PRECONDITION."""

from __future__ import annotations

from dataclasses import replace

import pytest
from spate.cluster.metadata.state import (
    Applied,
    CreateStream,
    CreateSuperStream,
    DeleteStream,
    DeleteSuperStream,
    MetadataState,
    RegisterNode,
    Rejected,
    RequestId,
    stream_changes,
)
from spate.core.errors import ErrorCode
from spate.core.ids import NodeId, StreamName
from spate.core.streams import Retention, StreamConfig
from spate.core.superstreams import SuperStream, define

NOW_MS = 1_700_000_000_000


def with_nodes(*nodes: str) -> MetadataState:
    state = MetadataState()
    for node in nodes:
        command = RegisterNode(
            RequestId(f"reg-{node}"), NodeId(node), "h:1", "h:2", "h:3", "h:4", NOW_MS
        )
        assert isinstance(state.apply(command), Applied)
    return state


def create_super(
    request: str,
    topology: SuperStream,
    *,
    replicas: int = 1,
    default: bool = False,
    **config: object,
) -> CreateSuperStream:
    template = StreamConfig(topology.name, replicas=replicas, **config)  # type: ignore[arg-type]
    return CreateSuperStream(RequestId(request), topology, template, NOW_MS, default)


def rejected(result: object, code: ErrorCode, text: str) -> None:
    assert isinstance(result, Rejected), result
    assert result.code is code, result
    assert text in result.message, result.message


def test_create_adds_the_topology_and_its_placed_streams_in_one_version() -> None:
    state = with_nodes("n1", "n2", "n3")
    retention = Retention(max_age_ms=3_600_000)
    command = create_super("c", define("invoices", partitions=3), replicas=3, retention=retention)
    before = state.view
    assert state.apply(command) == Applied(4)
    view = state.view
    topology = view.super_streams[StreamName("invoices")]
    assert topology.version == 4
    assert topology.partitions == ("invoices-0", "invoices-1", "invoices-2")
    leaders = set()
    for name in topology.partitions:
        record = view.streams[name]
        assert record.config == StreamConfig(name, 1, 3, retention)
        assert record.created_version == 4
        assert len(record.partitions[0].replicas) == 3
        leaders.add(record.partitions[0].replicas[0])
    assert leaders == {"n1", "n2", "n3"}  # preferred leaders spread round the ring
    assert view.super_stream_of(StreamName("invoices-1")) is topology
    changes = stream_changes(before, view)
    assert sorted(c.name for c in changes.created) == list(topology.partitions)


def test_binding_keys_and_default_replicas() -> None:
    state = with_nodes("n1", "n2")
    command = create_super("c", define("invoices", binding_keys=("amer", "emea")), default=True)
    assert state.apply(command) == Applied(3)
    assert state.view.streams[StreamName("invoices-emea")].config.replicas == 2


def test_delete_removes_the_topology_and_its_streams() -> None:
    state = with_nodes("n1")
    state.apply(create_super("c", define("invoices", partitions=2)))
    state.apply(CreateStream(RequestId("o"), StreamConfig(StreamName("orders")), NOW_MS))
    before = state.view
    assert state.apply(DeleteSuperStream(RequestId("d"), StreamName("invoices"))) == Applied(4)
    assert dict(state.view.super_streams) == {}
    assert list(state.view.streams) == ["orders"]
    assert sorted(stream_changes(before, state.view).deleted) == ["invoices-0", "invoices-1"]
    again = state.apply(DeleteSuperStream(RequestId("d2"), StreamName("invoices")))
    rejected(again, ErrorCode.NOT_FOUND, "super stream 'invoices' does not exist")


def test_name_clashes_are_failed_preconditions() -> None:
    state = with_nodes("n1")
    state.apply(CreateStream(RequestId("s"), StreamConfig(StreamName("orders")), NOW_MS))
    state.apply(CreateStream(RequestId("t"), StreamConfig(StreamName("pay-1")), NOW_MS))
    version = state.view.version
    rejected(
        state.apply(create_super("a", define("orders", partitions=2))),
        ErrorCode.FAILED_PRECONDITION,
        "a stream named 'orders' exists",
    )
    rejected(
        state.apply(create_super("b", define("pay", partitions=3))),
        ErrorCode.FAILED_PRECONDITION,
        "needs the partition stream name 'pay-1', already taken by a stream",
    )
    assert state.apply(create_super("c", define("invoices", partitions=2))) == Applied(version + 1)
    rejected(
        state.apply(create_super("d", define("invoices", partitions=1))),
        ErrorCode.ALREADY_EXISTS,
        "super stream 'invoices' already exists",
    )
    rejected(
        state.apply(CreateStream(RequestId("e"), StreamConfig(StreamName("invoices")), NOW_MS)),
        ErrorCode.FAILED_PRECONDITION,
        "'invoices' is a super stream",
    )
    rejected(
        state.apply(DeleteStream(RequestId("f"), StreamName("invoices-0"))),
        ErrorCode.FAILED_PRECONDITION,
        "is a partition of super stream 'invoices'",
    )
    rejected(
        state.apply(DeleteStream(RequestId("g"), StreamName("invoices"))),
        ErrorCode.FAILED_PRECONDITION,
        "is a super stream, not a stream",
    )
    rejected(
        state.apply(create_super("h", define("invoices", partitions=1, binding_keys=None))),
        ErrorCode.ALREADY_EXISTS,
        "already exists",
    )
    assert state.view.version == version + 1


@pytest.mark.parametrize(
    ("command", "text"),
    [
        (
            create_super("a", replace(define("x", partitions=2), binding_keys=("0", "0"))),
            "binding-keys: '0' is given twice",
        ),
        (
            create_super("b", replace(define("x", partitions=2), partitions=("x-0", "y"))),
            "partition streams must be named NAME-KEY",
        ),
        (create_super("c", define("x", partitions=2), replicas=2), "registered node"),
        (create_super("d", define("x", partitions=2), partitions=2), "one partition"),
        (create_super("e", define("x", partitions=2), segment_bytes=1), "segment size"),
    ],
)
def test_invalid_commands_are_invalid_arguments(command: CreateSuperStream, text: str) -> None:
    state = with_nodes("n1")
    rejected(state.apply(command), ErrorCode.INVALID_ARGUMENT, text)
    assert state.view.version == 1


def test_snapshot_keeps_super_streams_and_replay_is_deterministic() -> None:
    commands = [
        create_super("c1", define("invoices", partitions=3)),
        create_super("c2", define("regions", binding_keys=("amer", "emea"))),
        DeleteSuperStream(RequestId("d1"), StreamName("invoices")),
    ]
    one, two = with_nodes("n1", "n2"), with_nodes("n1", "n2")
    assert [one.apply(c) for c in commands] == [two.apply(c) for c in commands]
    assert one.view == two.view
    restored = MetadataState(one.snapshot())
    assert restored.view == one.view
    assert restored.apply(commands[1]) == Applied(4)  # the request id is remembered
