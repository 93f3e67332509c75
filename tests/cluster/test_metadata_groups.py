"""Consumer group definitions in the metadata state machine (ADR 0015; state table in
src/cluster/metadata/state.py): defined on an existing stream, once; deleted on their own or
with their stream."""

from __future__ import annotations

from dataclasses import replace

import pytest
from spate.cluster.metadata.state import (
    Applied,
    CreateConsumerGroup,
    CreateStream,
    CreateSuperStream,
    DeleteConsumerGroup,
    DeleteStream,
    DeleteSuperStream,
    MetadataState,
    RegisterNode,
    Rejected,
    RequestId,
)
from spate.core import limits
from spate.core.errors import ErrorCode, InvalidArgument
from spate.core.groups import GroupDefinition, Strategy, define, group_of
from spate.core.ids import NodeId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import define as define_super

NOW_MS = 1_700_000_000_000


def state_with(*streams: str) -> MetadataState:
    state = MetadataState()
    command = RegisterNode(RequestId("reg"), NodeId("n1"), "h:1", "h:2", "h:3", "h:4", NOW_MS)
    assert isinstance(state.apply(command), Applied)
    for name in streams:
        create = CreateStream(RequestId(f"s-{name}"), StreamConfig(StreamName(name), 2), NOW_MS)
        assert isinstance(state.apply(create), Applied)
    return state


def create(request: str, stream: str, name: str, **settings: object) -> CreateConsumerGroup:
    return CreateConsumerGroup(RequestId(request), define(stream, name, **settings))  # type: ignore[arg-type]


def rejected(result: object, code: ErrorCode, text: str) -> None:
    assert isinstance(result, Rejected), result
    assert result.code is code, result
    assert text in result.message, result.message


def test_create_stores_the_definition_with_the_version_that_created_it() -> None:
    state = state_with("orders")
    before = state.view.version
    result = state.apply(create("g1", "orders", "billing", strategy="range"))
    assert result == Applied(before + 1)
    stored = state.view.groups[(StreamName("orders"), "billing")]
    assert stored == GroupDefinition(
        StreamName("orders"), "billing", Strategy.RANGE, 30_000, 3_000, before + 1
    )
    # the same request id again: the first result, nothing applied twice
    assert state.apply(create("g1", "orders", "billing", strategy="range")) == result
    assert state.view.version == before + 1


def test_create_refusals() -> None:
    state = state_with("orders")
    rejected(state.apply(create("a", "nope", "billing")), ErrorCode.NOT_FOUND, "'nope'")
    assert state.apply(create("b", "orders", "billing")) == Applied(state.view.version)
    rejected(
        state.apply(create("c", "orders", "billing", strategy="sticky")),
        ErrorCode.ALREADY_EXISTS,
        "already defined",
    )
    # a command built past define() (another submitter) is checked again
    bad = replace(define("orders", "x"), name="$group/x")
    rejected(
        state.apply(CreateConsumerGroup(RequestId("d"), bad)),
        ErrorCode.INVALID_ARGUMENT,
        "reserved",
    )
    slow = replace(define("orders", "x"), session_timeout_ms=10)
    rejected(
        state.apply(CreateConsumerGroup(RequestId("e"), slow)),
        ErrorCode.INVALID_ARGUMENT,
        "session-timeout-ms",
    )
    # the same group name on another stream is another group
    state.apply(CreateStream(RequestId("s2"), StreamConfig(StreamName("clicks")), NOW_MS))
    assert isinstance(state.apply(create("f", "clicks", "billing")), Applied)
    assert len(state.view.groups) == 2


def test_a_super_stream_name_is_refused_as_failed_precondition() -> None:
    state = state_with()
    topology = define_super("invoices", partitions=2)
    command = CreateSuperStream(
        RequestId("ss"), topology, StreamConfig(StreamName("invoices")), NOW_MS
    )
    assert isinstance(state.apply(command), Applied)
    rejected(
        state.apply(create("g", "invoices", "billing")),
        ErrorCode.FAILED_PRECONDITION,
        "partition streams",
    )
    assert isinstance(state.apply(create("g2", "invoices-1", "billing")), Applied)
    # deleting the super stream deletes its partition streams' groups
    assert isinstance(state.apply(DeleteSuperStream(RequestId("d"), topology.name)), Applied)
    assert dict(state.view.groups) == {}


def test_delete_forgets_the_definition_and_unknown_is_not_found() -> None:
    state = state_with("orders")
    state.apply(create("g", "orders", "billing"))
    version = state.view.version
    delete = DeleteConsumerGroup(RequestId("d"), StreamName("orders"), "billing")
    assert state.apply(delete) == Applied(version + 1)
    assert dict(state.view.groups) == {}
    again = DeleteConsumerGroup(RequestId("d2"), StreamName("orders"), "billing")
    rejected(state.apply(again), ErrorCode.NOT_FOUND, "'billing' is not defined")
    # defined again: a new version identifies the new definition
    state.apply(create("g3", "orders", "billing"))
    assert state.view.groups[(StreamName("orders"), "billing")].version == version + 2


def test_deleting_a_stream_deletes_its_groups_only() -> None:
    state = state_with("orders", "clicks")
    for request, stream in (("a", "orders"), ("b", "clicks")):
        state.apply(create(request, stream, "billing"))
    state.apply(create("c", "orders", "audit"))
    assert isinstance(state.apply(DeleteStream(RequestId("del"), StreamName("orders"))), Applied)
    assert list(state.view.groups) == [(StreamName("clicks"), "billing")]
    # a stream recreated under the name has no groups
    state.apply(CreateStream(RequestId("again"), StreamConfig(StreamName("orders")), NOW_MS))
    assert list(state.view.groups) == [(StreamName("clicks"), "billing")]


def test_snapshot_restores_the_groups() -> None:
    state = state_with("orders")
    state.apply(create("g", "orders", "billing", rebalance_delay_ms=0))
    copy = MetadataState(state.snapshot())
    assert copy.view == state.view


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("", "non-empty"),
        ("$group", "reserved"),
        ("x" * (limits.group_name_bytes_max + 1), "limit is 256"),
        ("é" * 129, "258 bytes"),
        ("\ud800", "UTF-8"),
    ],
)
def test_group_name_rules(name: str, text: str) -> None:
    with pytest.raises(InvalidArgument, match=text):
        define("orders", name)


def test_define_defaults_and_limits() -> None:
    group = define("orders", "é" * 128)  # 256 bytes: the limit
    assert (group.strategy, group.session_timeout_ms, group.rebalance_delay_ms) == (
        Strategy.ROUND_ROBIN,
        30_000,
        3_000,
    )
    with pytest.raises(InvalidArgument, match="round-robin, range, sticky"):
        define("orders", "g", strategy="fair")
    with pytest.raises(InvalidArgument, match="rebalance-delay-ms"):
        define("orders", "g", rebalance_delay_ms=-1)
    with pytest.raises(InvalidArgument, match="invalid stream name"):
        define("bad name", "g")
    assert group_of("$group/g") == "g"
    assert group_of("$epoch/g") is None
    assert group_of("g") is None
