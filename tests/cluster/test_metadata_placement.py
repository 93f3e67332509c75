"""Scenarios for placement, leader reports and node liveness in the metadata state machine.

Pure: commands (with the submitter's now_ms) in, results and views out. The algorithm and its
guarantees are in docs/adr/0006-placement-and-leadership.md.
"""

from __future__ import annotations

import random
from collections import Counter

from spate.cluster.metadata import limits
from spate.cluster.metadata.placement import best_target, better_hosts_than, place
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


# Hosts and shards (ADR 0032) ---------------------------------------------------------------------


def hosts(**domains: str) -> dict[NodeId, str | None]:
    return {NodeId(n.replace("_", "-")): d for n, d in domains.items()}


def test_one_node_per_host_places_exactly_as_before_hosts_existed() -> None:
    """A metadata log written before failure domains replays to the same placement."""
    rng = random.Random(32)
    for _ in range(200):
        k = rng.randint(1, 7)
        nodes = [NodeId(f"n{i}") for i in rng.sample(range(1, 20), k)]
        r, p, start = rng.randint(1, k), rng.randint(1, 12), rng.randint(0, 50)
        ring = sorted(nodes)
        before = tuple(tuple(ring[(start + i + j) % k] for j in range(r)) for i in range(p))
        assert place(p, r, nodes, start) == before
        assert place(p, r, nodes, start, {n: None for n in nodes}) == before
        assert place(p, r, nodes, start, {n: str(n) for n in nodes}) == before


def test_replicas_land_on_distinct_hosts_whenever_there_are_enough() -> None:
    rng = random.Random(16)
    for _ in range(300):
        host_count = rng.randint(1, 4)
        domains: dict[NodeId, str | None] = {}
        for h in range(host_count):
            for s in range(rng.randint(1, 3)):
                domains[NodeId(f"h{h}" if s == 0 else f"h{h}-s{s}")] = f"host{h}"
        nodes = list(domains)
        r = rng.randint(1, len(nodes))
        sets = place(rng.randint(1, 12), r, nodes, rng.randint(0, 40), domains)
        for replica_set in sets:
            assert len(set(replica_set)) == r
            assert len({domains[n] for n in replica_set}) == min(r, host_count), replica_set


def test_the_shards_of_a_host_share_its_leaders_and_replicas() -> None:
    # two hosts of two shards each, R=2: every set spans both hosts, each shard leads 2 of 8
    domains = hosts(a="A", a_s1="A", b="B", b_s1="B")
    sets = place(8, 2, list(domains), 0, domains)
    assert all({domains[n] for n in s} == {"A", "B"} for s in sets)
    assert Counter(s[0] for s in sets) == dict.fromkeys(domains, 2)
    assert Counter(n for s in sets for n in s) == dict.fromkeys(domains, 4)
    # one host of two shards, replicas 1 (the 1-vs-2-shards benchmark): alternate
    one = hosts(n1="n1", n1_s1="n1")
    assert place(4, 1, list(one), 0, one) == (("n1",), ("n1-s1",), ("n1",), ("n1-s1",))


def test_a_host_with_two_shards_and_two_hosts_with_one_under_three_replicas() -> None:
    """The documented case (ADR 0032): every partition spans the three hosts; B and C hold a
    replica of each, A's two shards split A's share and each leads one partition in four."""
    domains = hosts(a="A", a_s1="A", b="B", c="C")
    sets = place(4, 3, list(domains), 0, domains)
    assert sets == (
        ("a", "b", "c"),
        ("b", "c", "a-s1"),
        ("c", "a-s1", "b"),
        ("a-s1", "b", "c"),
    )
    assert all(len({domains[n] for n in s}) == 3 for s in sets)
    # one host with two shards cannot give R=2 two hosts: both shards hold the partition
    one = hosts(n1="n1", n1_s1="n1")
    assert place(2, 2, list(one), 0, one) == (("n1", "n1-s1"), ("n1-s1", "n1"))


def test_streams_are_placed_by_the_failure_domains_nodes_register() -> None:
    state = MetadataState()
    for node, domain in (("a", "A"), ("a-s1", "A"), ("b", "B"), ("b-s1", "B")):
        command = register(node)
        command = RegisterNode(
            command.request_id,
            command.node,
            command.amqp,
            command.admin,
            command.replication,
            None,
            T0,
            failure_domain=domain,
        )
        assert isinstance(state.apply(command), Applied)
    assert isinstance(state.apply(create("orders", partitions=4, replicas=2)), Applied)
    sets = replica_sets(state, "orders")
    assert sets == [("a", "b"), ("b", "a-s1"), ("a-s1", "b-s1"), ("b-s1", "a")]
    bad = RegisterNode(rid(), NodeId("c"), "c:1", "c:2", "c:3", None, T0, failure_domain="a b")
    rejected = state.apply(bad)
    assert isinstance(rejected, Rejected) and "failure domain" in rejected.message


def test_a_drained_replica_moves_to_a_host_the_partition_is_not_on() -> None:
    domains = hosts(a="A", a_s1="A", b="B", c="C")
    # the partition is on a and b; a is drained: a-s1 holds fewest but shares no host with b,
    # c neither; the emptier wins. Were the partition on a-s1 and b, draining b picks c.
    hosted = {NodeId("a-s1"): 0, NodeId("c"): 5}
    assert best_target([NodeId("a-s1"), NodeId("c")], [NodeId("b")], hosted, domains) == "a-s1"
    assert best_target([NodeId("a"), NodeId("c")], [NodeId("a-s1")], hosted, domains) == "c"


def test_an_explicit_move_onto_a_host_the_partition_is_on_is_refused_if_another_host_is_free() -> (
    None
):
    domains = hosts(a="A", a_s1="A", b="B", c="C")
    live = [n for n in domains if n != "b"]  # the candidates: live nodes but the source
    # orders/0 on a and b; moving b's replica to a-s1 would put both on host A while C is free
    assert better_hosts_than(NodeId("a-s1"), [NodeId("a")], live, domains) == ["c"]
    assert better_hosts_than(NodeId("c"), [NodeId("a")], live, domains) == []
    # a one-host cluster of two shards has no better host: the move is allowed
    one = hosts(n1="n1", n1_s1="n1")
    assert better_hosts_than(NodeId("n1-s1"), [NodeId("n1")], list(one), one) == []
    # nodes without failure domains (every cluster before shards): never refused
    assert better_hosts_than(NodeId("n3"), [NodeId("n1")], ["n1", "n2", "n3"], {}) == []
