"""Scenarios for placement, leader reports and node liveness in the metadata state machine.

Pure: commands (with the submitter's now_ms) in, results and views out. The algorithm and its
guarantees are in docs/adr/0006-placement-and-leadership.md.
"""

from __future__ import annotations

import random
from collections import Counter

from spate.cluster.metadata import limits
from spate.cluster.metadata.placement import place
from spate.cluster.metadata.state import (
    Applied,
    CreateStream,
    DeleteStream,
    Heartbeat,
    LeaderReport,
    MetadataState,
    PartitionLeader,
    RegisterNode,
    Rejected,
    ReportLeader,
    ReportLeaders,
    RequestId,
    assignments,
    node_statuses,
    partition_placements,
)
from spate.core.errors import ErrorCode
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig

T0 = 1_700_000_000_000
_counter = iter(range(1_000_000))


def rid() -> RequestId:
    return RequestId(f"r{next(_counter)}")


def register(node: str, now_ms: int = T0) -> RegisterNode:
    return RegisterNode(
        rid(), NodeId(node), f"{node}:5672", f"{node}:7600", f"{node}:7700", f"{node}:7800", now_ms
    )


def cluster(*nodes: str, now_ms: int = T0) -> MetadataState:
    state = MetadataState()
    for node in nodes:
        assert isinstance(state.apply(register(node, now_ms)), Applied)
    return state


def create(
    name: str, partitions: int = 1, replicas: int = 1, now_ms: int = T0, default: bool = False
) -> CreateStream:
    config = StreamConfig(StreamName(name), partitions=partitions, replicas=replicas)
    return CreateStream(rid(), config, now_ms, default_replicas=default)


def report(stream: str, partition: int, node: str, epoch: int) -> ReportLeader:
    return ReportLeader(
        rid(), StreamName(stream), PartitionId(partition), NodeId(node), LeaderEpoch(epoch)
    )


def replica_sets(state: MetadataState, stream: str) -> list[tuple[str, ...]]:
    return [p.replicas for p in state.view.streams[StreamName(stream)].partitions]


# Placement ---------------------------------------------------------------------------------------


def test_one_stream_is_spread_round_robin_with_preferred_leaders_rotating() -> None:
    state = cluster("n3", "n1", "n2")  # registration order does not matter: sorted by id
    assert isinstance(state.apply(create("orders", partitions=6, replicas=3)), Applied)
    assert replica_sets(state, "orders") == [
        ("n1", "n2", "n3"),
        ("n2", "n3", "n1"),
        ("n3", "n1", "n2"),
        ("n1", "n2", "n3"),
        ("n2", "n3", "n1"),
        ("n3", "n1", "n2"),
    ]
    state.apply(create("audit", partitions=4, replicas=2))
    # The ring continues where "orders" stopped (6 partitions placed: start at 6 mod 3 = 0).
    assert replica_sets(state, "audit") == [
        ("n1", "n2"),
        ("n2", "n3"),
        ("n3", "n1"),
        ("n1", "n2"),
    ]


def test_placement_is_balanced_for_any_shape() -> None:
    """Every node is preferred leader of floor or ceil(P/k) partitions and holds between
    R*floor(P/k) and R*ceil(P/k) replicas; replica sets never repeat a node."""
    rng = random.Random(7)
    for _ in range(300):
        k = rng.randint(1, 9)
        nodes = [NodeId(f"n{i}") for i in range(k)]
        replicas = rng.randint(1, k)
        partitions = rng.randint(1, 40)
        sets = place(partitions, replicas, nodes, start=rng.randint(0, 1000))
        assert len(sets) == partitions
        assert all(len(set(s)) == replicas for s in sets)
        leaders = Counter(s[0] for s in sets)
        hosted = Counter(n for s in sets for n in s)
        for node in nodes:
            assert partitions // k <= leaders[node] <= -(-partitions // k)
            assert replicas * (partitions // k) <= hosted[node] <= replicas * -(-partitions // k)
            if partitions % k == 0:
                assert hosted[node] == partitions * replicas // k


def test_many_single_partition_streams_spread_their_leaders() -> None:
    state = cluster("n1", "n2", "n3")
    for i in range(9):
        assert isinstance(state.apply(create(f"s{i}", replicas=2)), Applied)
    statuses = node_statuses(state.view, T0)
    assert [s.partitions_hosted for s in statuses] == [6, 6, 6]
    leaders = Counter(
        state.view.streams[StreamName(f"s{i}")].partitions[0].replicas[0] for i in range(9)
    )
    assert leaders == {"n1": 3, "n2": 3, "n3": 3}


def test_placement_is_deterministic_across_replicas() -> None:
    commands = [
        *(register(n) for n in ("c", "a", "d", "b")),
        create("x", partitions=5, replicas=3),
        DeleteStream(RequestId("del"), StreamName("x")),
        create("y", partitions=7, replicas=2),
        register("e"),
        create("z", partitions=3, replicas=3),
    ]
    replicas = [MetadataState() for _ in range(3)]
    results = [[state.apply(c) for c in commands] for state in replicas]
    assert results[0] == results[1] == results[2]
    assert replicas[0].snapshot() == replicas[1].snapshot() == replicas[2].snapshot()
    # "y" starts the ring at 0 ("x" was deleted), "z" at 7 mod 5 = 2 (node "c").
    assert replica_sets(replicas[0], "z") == [("c", "d", "e"), ("d", "e", "a"), ("e", "a", "b")]


def test_too_few_registered_nodes_is_refused_with_advice() -> None:
    state = cluster("n1", "n2")
    result = state.apply(create("orders", replicas=3))
    assert result == Rejected(
        ErrorCode.INVALID_ARGUMENT,
        "stream needs 3 replicas but the cluster has 2 registered nodes: start more nodes or "
        "use --replicas 2",
    )
    assert not state.view.streams and state.view.version == 2
    one = cluster("n1")
    result = one.apply(create("orders", replicas=2))
    assert isinstance(result, Rejected)
    assert result.message == (
        "stream needs 2 replicas but the cluster has 1 registered node: start more nodes or "
        "use --replicas 1"
    )


def test_a_cluster_where_no_node_registered_refuses_streams() -> None:
    """Nodes register when they start; before any has, there is nowhere to place a stream."""
    state = MetadataState()
    refused = state.apply(create("orders", partitions=2, default=True))
    assert isinstance(refused, Rejected) and "no registered nodes" in refused.message
    state.apply(register("n1"))
    refused = state.apply(create("wide", replicas=2))
    assert isinstance(refused, Rejected) and "1 registered node" in refused.message


def test_dead_nodes_are_not_candidates() -> None:
    state = cluster("n1", "n2", "n3")
    later = T0 + limits.node_alive_ms + 5_000
    state.apply(Heartbeat(rid(), NodeId("n1"), later))
    state.apply(Heartbeat(rid(), NodeId("n2"), later))
    result = state.apply(create("orders", replicas=3, now_ms=later))
    assert isinstance(result, Rejected) and result.code is ErrorCode.INVALID_ARGUMENT
    assert result.message == (
        "stream needs 3 replicas but only 2 of the 3 registered nodes are alive "
        "(n3 silent for 15 s): restart it or use --replicas 2"
    )
    assert isinstance(
        state.apply(create("orders", partitions=4, replicas=2, now_ms=later)), Applied
    )
    assert all("n3" not in s for s in replica_sets(state, "orders"))


def test_default_replicas_is_min_of_three_and_registered_nodes() -> None:
    for nodes, expected in ((("n1",), 1), (("n1", "n2"), 2), (("a", "b", "c", "d", "e"), 3)):
        state = cluster(*nodes)
        assert isinstance(state.apply(create("s", partitions=2, default=True)), Applied)
        record = state.view.streams[StreamName("s")]
        assert record.config.replicas == expected
        assert all(len(p.replicas) == expected for p in record.partitions)


def test_assignments_list_what_each_node_hosts() -> None:
    state = cluster("n1", "n2", "n3")
    state.apply(create("orders", partitions=3, replicas=2))
    state.apply(create("audit", partitions=1, replicas=1))  # start 3 mod 3: on n1
    found = {
        node: [(c.name, int(p), r) for c, p, r in assignments(state.view, NodeId(node))]
        for node in ("n1", "n2", "n3", "n9")
    }
    assert found == {
        "n1": [("audit", 0, ("n1",)), ("orders", 0, ("n1", "n2")), ("orders", 2, ("n3", "n1"))],
        "n2": [("orders", 0, ("n1", "n2")), ("orders", 1, ("n2", "n3"))],
        "n3": [("orders", 1, ("n2", "n3")), ("orders", 2, ("n3", "n1"))],
        "n9": [],
    }


# Leader reports ----------------------------------------------------------------------------------


def test_highest_epoch_wins_and_stale_reports_are_ignored() -> None:
    state = cluster("n1", "n2", "n3")
    state.apply(create("orders", partitions=2, replicas=3))
    version = state.view.version
    assert state.apply(report("orders", 1, "n2", 4)) == Applied(version + 1)
    assert state.apply(report("orders", 1, "n3", 6)) == Applied(version + 2)
    # A late report from the previous leader (epoch 4 < 6): ignored, nothing changes.
    before = state.view
    assert state.apply(report("orders", 1, "n2", 5)) == Applied(version + 2)
    assert state.apply(report("orders", 1, "n3", 6)) == Applied(version + 2)  # repeat
    assert state.view is before
    placements = partition_placements(state.view, StreamName("orders"))
    assert [p.leader for p in placements] == [None, PartitionLeader(NodeId("n3"), LeaderEpoch(6))]
    statuses = {s.record.node: s.partitions_led for s in node_statuses(state.view, T0)}
    assert statuses == {"n1": 0, "n2": 0, "n3": 1}


def test_report_order_does_not_matter() -> None:
    reports = [report("s", 0, n, e) for n, e in (("n1", 1), ("n2", 3), ("n3", 2), ("n1", 1))]
    finals = set()
    for _ in range(10):
        state = cluster("n1", "n2", "n3")
        state.apply(create("s", replicas=3))
        for command in random.Random(len(finals)).sample(reports, len(reports)):
            state.apply(command)
        finals.add(state.view.streams[StreamName("s")].partitions[0].leader)
    assert finals == {PartitionLeader(NodeId("n2"), LeaderEpoch(3))}


def test_invalid_leader_reports_are_rejected() -> None:
    state = cluster("n1", "n2", "n3")
    state.apply(create("orders", partitions=2, replicas=2))  # p0 [n1 n2], p1 [n2 n3]
    state.apply(report("orders", 0, "n1", 3))
    cases = {
        ErrorCode.NOT_FOUND: [report("ghost", 0, "n1", 1)],
        ErrorCode.INVALID_ARGUMENT: [
            report("orders", 2, "n1", 1),  # no partition 2
            report("orders", 0, "n3", 9),  # n3 is not a replica of p0
            report("orders", 0, "n1", -1),
            report("orders", 0, "n2", 3),  # epoch 3 is n1's
        ],
    }
    version = state.view.version
    for code, commands in cases.items():
        for command in commands:
            result = state.apply(command)
            assert isinstance(result, Rejected) and result.code is code, command
    assert state.view.version == version
    conflict = state.apply(report("orders", 0, "n2", 3))
    assert isinstance(conflict, Rejected) and "epoch 3 is led by n1" in conflict.message


def test_a_batch_of_leader_reports_records_the_valid_new_ones_in_one_version() -> None:
    """ReportLeaders (issue 16): each report judged as ReportLeader would; invalid, stale and
    repeated ones skipped; the highest epoch of a partition wins within the batch; the version
    moves once; the outcome equals the reports applied one by one."""
    state, alone = cluster("n1", "n2", "n3"), cluster("n1", "n2", "n3")
    for s in (state, alone):
        s.apply(create("orders", partitions=3, replicas=2))  # [n1 n2] [n2 n3] [n3 n1]
        s.apply(report("orders", 2, "n3", 4))
    singles = [
        report("orders", 0, "n1", 1),
        report("ghost", 0, "n1", 1),  # no such stream
        report("orders", 1, "n1", 1),  # n1 is not a replica of p1
        report("orders", 2, "n1", 3),  # stale: epoch 4 is recorded
        report("orders", 2, "n1", 4),  # conflicting: epoch 4 is n3's
        report("orders", 1, "n2", 2),
        report("orders", 1, "n3", 5),  # a later epoch of p1 in the same batch wins
        report("orders", 1, "n2", 3),  # ... over an earlier-listed lower one
    ]
    version = state.view.version
    batch = ReportLeaders(
        rid(), tuple(LeaderReport(r.stream, r.partition, r.leader, r.epoch) for r in singles)
    )
    assert state.apply(batch) == Applied(version + 1)
    for command in singles:
        alone.apply(command)
    leaders = [p.leader for p in state.view.streams[StreamName("orders")].partitions]
    assert leaders == [p.leader for p in alone.view.streams[StreamName("orders")].partitions]
    assert leaders == [
        PartitionLeader(NodeId("n1"), LeaderEpoch(1)),
        PartitionLeader(NodeId("n3"), LeaderEpoch(5)),
        PartitionLeader(NodeId("n3"), LeaderEpoch(4)),
    ]
    # Nothing new: applied, and the version stays (no listener runs).
    assert state.apply(batch) == Applied(version + 1)
    assert state.view.version == version + 1
    assert state.apply(ReportLeaders(rid(), ())) == Applied(version + 1)


def test_deleting_a_stream_forgets_its_leaders() -> None:
    state = cluster("n1")
    state.apply(create("orders"))
    state.apply(report("orders", 0, "n1", 7))
    state.apply(DeleteStream(rid(), StreamName("orders")))
    state.apply(create("orders"))
    assert state.view.streams[StreamName("orders")].partitions[0].leader is None


# Registry liveness -------------------------------------------------------------------------------


def test_heartbeats_refresh_liveness_without_changing_the_version() -> None:
    state = cluster("n1", "n2")
    version = state.view.version
    later = T0 + limits.node_alive_ms
    assert state.apply(Heartbeat(rid(), NodeId("n1"), later)) == Applied(version)
    assert state.apply(Heartbeat(rid(), NodeId("n1"), T0 + 1)) == Applied(version)  # older: kept
    assert state.view.nodes[NodeId("n1")].heartbeat_ms == later
    assert state.view.version == version
    statuses = node_statuses(state.view, later + 1)
    assert [(s.record.node, s.alive, s.heartbeat_age_ms) for s in statuses] == [
        ("n1", True, 1),
        ("n2", False, limits.node_alive_ms + 1),
    ]
    # The boundary: alive while younger than node_alive_ms.
    assert state.view.nodes[NodeId("n2")].alive(T0 + limits.node_alive_ms - 1)
    assert not state.view.nodes[NodeId("n2")].alive(T0 + limits.node_alive_ms)
    # A clock behind the heartbeat reads as age 0, alive.
    assert node_statuses(state.view, T0 - 50)[1].heartbeat_age_ms == 0


def test_heartbeats_are_not_remembered_and_unknown_nodes_are_not_found() -> None:
    state = cluster("n1")
    for i in range(100):
        state.apply(Heartbeat(rid(), NodeId("n1"), T0 + i))
    assert len(state.snapshot().requests) == 1  # only the registration
    result = state.apply(Heartbeat(rid(), NodeId("n9"), T0))
    assert isinstance(result, Rejected) and result.code is ErrorCode.NOT_FOUND
