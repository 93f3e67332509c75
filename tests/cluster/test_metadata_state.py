"""Scenarios for the metadata state machine (pure: commands in, results and views out)."""

from __future__ import annotations

from spate.cluster.metadata import limits
from spate.cluster.metadata.state import (
    Applied,
    Barrier,
    CreateStream,
    DeleteStream,
    Heartbeat,
    MetadataState,
    RegisterNode,
    Rejected,
    RequestId,
    stream_changes,
)
from spate.core.errors import AlreadyExists, ErrorCode, InvalidArgument, NotFound
from spate.core.ids import NodeId, StreamName
from spate.core.streams import Retention, StreamConfig

NOW_MS = 1_700_000_000_000


def create(request: str, name: str, **fields: object) -> CreateStream:
    return CreateStream(RequestId(request), StreamConfig(StreamName(name), **fields), NOW_MS)  # type: ignore[arg-type]


def register(
    request: str, node: str, amqp: str = "h:5672", admin: str = "h:7600", now_ms: int = NOW_MS
) -> RegisterNode:
    return RegisterNode(RequestId(request), NodeId(node), amqp, admin, "h:7700", "h:7800", now_ms)


def with_nodes(*nodes: str) -> MetadataState:
    """A state with these nodes registered (and alive at NOW_MS); version = len(nodes)."""
    state = MetadataState()
    for node in nodes:
        assert isinstance(state.apply(register(f"reg-{node}", node)), Applied)
    return state


def delete(request: str, name: str) -> DeleteStream:
    return DeleteStream(RequestId(request), StreamName(name))


def test_create_then_describe_then_delete() -> None:
    state = with_nodes("n1")
    config = StreamConfig(
        StreamName("orders"), partitions=3, retention=Retention(max_age_ms=6 * 3_600_000)
    )
    assert state.apply(CreateStream(RequestId("r1"), config, NOW_MS)) == Applied(2)
    assert state.view.streams[StreamName("orders")].config == config
    assert state.view.streams[StreamName("orders")].created_version == 2
    assert state.apply(delete("r2", "orders")) == Applied(3)
    assert StreamName("orders") not in state.view.streams
    assert state.view.version == 3


def test_duplicate_create_is_rejected_as_already_exists_and_changes_nothing() -> None:
    state = with_nodes("n1")
    state.apply(create("r1", "orders", partitions=2))
    before = state.view
    result = state.apply(create("r2", "orders", partitions=5))
    assert isinstance(result, Rejected) and result.code is ErrorCode.ALREADY_EXISTS
    assert isinstance(result.error(), AlreadyExists)
    assert "orders" in result.message
    assert state.view is before
    assert state.view.streams[StreamName("orders")].config.partitions == 2


def test_delete_unknown_is_not_found() -> None:
    state = MetadataState()
    result = state.apply(delete("r1", "ghost"))
    assert isinstance(result, Rejected) and isinstance(result.error(), NotFound)
    assert state.view.version == 0


def test_invalid_definitions_are_rejected_with_the_validation_message() -> None:
    state = with_nodes("n1")
    cases = [
        create("a", "bad name!"),
        create("b", "ok", partitions=0),
        create("c", "ok", replicas=9),
        create("d", "ok", segment_bytes=10),
        CreateStream(
            RequestId("e"),
            StreamConfig(StreamName("ok"), retention=Retention(max_bytes=-1)),
            NOW_MS,
        ),
    ]
    for command in cases:
        result = state.apply(command)
        assert isinstance(result, Rejected), command
        assert isinstance(result.error(), InvalidArgument)
    assert state.view.version == 1 and not state.view.streams


def test_retried_request_returns_its_first_result_and_applies_once() -> None:
    state = with_nodes("n1")
    command = create("same", "orders")
    assert state.apply(command) == Applied(2)
    state.apply(delete("d1", "orders"))
    # The retry arrives after the stream was deleted: it must not recreate it.
    assert state.apply(command) == Applied(2)
    assert StreamName("orders") not in state.view.streams
    rejected = state.apply(delete("d2", "ghost"))
    assert state.apply(delete("d2", "ghost")) == rejected


def test_request_memory_is_bounded_oldest_first() -> None:
    state = with_nodes("n1")
    state.apply(create("first", "s0"))
    for i in range(limits.request_ids_remembered_max):
        state.apply(Barrier(RequestId(f"b{i}")))
    snapshot = state.snapshot()
    assert len(snapshot.requests) == limits.request_ids_remembered_max
    assert RequestId("first") not in dict(snapshot.requests)
    state.apply(delete("d", "s0"))
    # Forgotten: the retry is applied again (documented limit of deduplication).
    assert isinstance(state.apply(create("first", "s0")), Applied)


def test_register_node_and_refresh() -> None:
    state = MetadataState()
    assert state.apply(register("n1a", "n1", "127.0.0.1:5672", now_ms=5)) == Applied(1)
    assert state.apply(register("n1b", "n1", "127.0.0.1:5673", now_ms=9)) == Applied(2)
    record = state.view.nodes[NodeId("n1")]
    assert (record.amqp, record.heartbeat_ms) == ("127.0.0.1:5673", 9)
    assert (record.replication, record.metadata) == ("h:7700", "h:7800")
    # Same endpoints again (a restart on the same ports): only a heartbeat, no version change.
    assert state.apply(register("n1c", "n1", "127.0.0.1:5673", now_ms=12)) == Applied(2)
    assert state.view.nodes[NodeId("n1")].heartbeat_ms == 12
    for bad in (
        register("x", "n 2"),
        register("y", "n2", admin="nowhere"),
        RegisterNode(RequestId("z"), NodeId("n2"), "h:1", "h:2", "h:0", "h:4", 1),
        RegisterNode(RequestId("w"), NodeId("n2"), "h:1", "h:2", "h:3", "h", 1),
    ):
        result = state.apply(bad)
        assert isinstance(result, Rejected) and result.code is ErrorCode.INVALID_ARGUMENT, bad


def test_a_late_registration_moves_endpoints_but_never_the_heartbeat_back() -> None:
    """A registration retried after a leader change may be applied after newer heartbeats:
    its endpoints win (the node registered them), its older clock does not (the node would
    look dead). Found by the metadata simulator (src/sim/metadata.py)."""
    state = MetadataState()
    state.apply(register("a", "n1", "h:5672", now_ms=5))
    state.apply(Heartbeat(RequestId("hb"), NodeId("n1"), 50))
    assert state.apply(register("late", "n1", "h:6000", now_ms=7)) == Applied(2)
    record = state.view.nodes[NodeId("n1")]
    assert (record.amqp, record.heartbeat_ms) == ("h:6000", 50)


def test_barrier_changes_nothing() -> None:
    state = with_nodes("n1")
    state.apply(create("r1", "orders"))
    view = state.view
    assert state.apply(Barrier(RequestId("b"))) == Applied(2)
    assert state.view is view


def test_snapshot_restores_the_same_state_and_dedup_memory() -> None:
    state = with_nodes("n1", "n2")
    state.apply(create("r1", "a", partitions=4, replicas=2))
    state.apply(create("r2", "b"))
    state.apply(delete("r3", "a"))
    state.apply(register("n", "n3", now_ms=3))
    copy = MetadataState(state.snapshot())
    assert copy.view == state.view
    assert copy.snapshot() == state.snapshot()
    assert copy.apply(create("r1", "a")) == Applied(3)  # remembered: not applied again


def test_same_commands_same_results_on_every_replica() -> None:
    commands = [
        create("1", "a"),
        create("2", "a"),
        delete("3", "b"),
        create("4", "b", partitions=2),
        delete("5", "a"),
        create("1", "a"),
        create("6", "a"),
    ]
    replicas = [with_nodes("n1", "n2", "n3") for _ in range(3)]
    results = [[r.apply(c) for c in commands] for r in replicas]
    assert results[0] == results[1] == results[2]
    assert replicas[0].snapshot() == replicas[1].snapshot() == replicas[2].snapshot()


def test_stream_changes_sees_deletion_and_recreation() -> None:
    state = with_nodes("n1")
    state.apply(create("1", "a"))
    state.apply(create("2", "b"))
    v1 = state.view
    state.apply(delete("3", "a"))
    v2 = state.view
    changes = stream_changes(v1, v2)
    assert changes.deleted == (StreamName("a"),) and changes.created == ()
    state.apply(create("4", "b2"))
    state.apply(delete("5", "b"))
    state.apply(create("6", "b", partitions=7))
    changes = stream_changes(v2, state.view)
    assert changes.deleted == (StreamName("b"),)
    assert sorted(c.name for c in changes.created) == ["b", "b2"]
