"""The Raft log cache (ADR 0049): which applied entries a replica keeps in memory.

A leader keeps only what some peer has not acknowledged (up to `log_cache_bytes`), a replica
that does not lead keeps the last `follower_log_cache_bytes` and none while quiet, and a node's
driver lowers the largest caches once a second when they hold more than its budget together.
Before, every group kept 16 MiB of applied entries for good: a node's RSS grew run after run
(RESULTS §59), and 1,000 partitions that each once took a burst would have held 16 GB.
"""

from __future__ import annotations

import logging
import random

import pytest
from replication.drivers import IDS, Nodes, outcomes
from replication.harness import Group
from spate.core.ids import NodeId
from spate.node.replication import limits
from spate.node.replication.driver import SWEEP_TICKS, water_level
from spate.node.replication.messages import Proposed
from spate.node.replication.progress import ProgressState
from spate.node.replication.raft import RaftConfig, Role

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
RECORD = b"r" * 100


def _config(**changes: int | bool) -> RaftConfig:
    base: dict[str, int | bool] = {"election_timeout_ticks": 10, "heartbeat_interval_ticks": 1}
    return RaftConfig(**{**base, **changes})  # type: ignore[arg-type]


def _propose(group: Group, count: int, payload: bytes = RECORD) -> None:
    for _ in range(count):
        assert isinstance(group["n1"].propose(payload), Proposed)
    group.stabilize()


def test_a_leader_drops_what_every_peer_acknowledged() -> None:
    group = Group(3, config=_config())
    group.elect("n1")
    _propose(group, 20)
    leader = group["n1"]
    assert leader.log.applied == leader.log.last_index == 21  # the barrier and 20 records
    assert leader.cache_bytes == 0 and leader.log.snapshot.index == 21


def test_a_leader_keeps_what_a_cut_off_peer_lacks_and_feeds_it_by_append() -> None:
    group = Group(3, config=_config())
    group.elect("n1")
    _propose(group, 2)
    group.cut.add(N3)
    _propose(group, 10)
    leader = group["n1"]
    assert leader.cache_bytes == 10 * len(RECORD)  # n3 acknowledged up to the second record
    assert leader.log.snapshot.index == 3
    group.cut.clear()
    group.tick_all(2)
    group.stabilize()
    assert N3 not in group.snapshot_requests  # fed from memory, no segment transfer
    assert leader.progress(N3).match == leader.log.last_index
    assert leader.cache_bytes == 0  # and then dropped: every peer has them


def test_a_leader_keeps_at_most_its_limit_for_a_peer_far_behind() -> None:
    group = Group(3, config=_config(log_cache_bytes=550))
    group.elect("n1")
    group.cut.add(N3)
    _propose(group, 10)
    leader = group["n1"]
    assert leader.cache_bytes == 500  # five of the ten records n3 lacks
    group.cut.clear()
    group.tick_all(2)
    group.stabilize()
    assert group.snapshot_requests[N3].snapshot.index == leader.log.snapshot.index == 6
    assert leader.progress(N3).state is ProgressState.SNAPSHOT


def test_a_follower_keeps_its_own_limit() -> None:
    group = Group(3, config=_config(follower_log_cache_bytes=250))
    group.elect("n1")
    _propose(group, 10)
    for node in ("n2", "n3"):
        follower = group[node]
        assert follower.log.applied == 11
        assert follower.cache_bytes == 200  # the last two records: a third would pass 250


@pytest.mark.parametrize("role", ["leader", "follower"])
def test_a_quiet_group_keeps_no_cache(role: str) -> None:
    group = Group(3, config=_config(quiesce=True))
    group.elect("n1")
    group.cut.add(N3)
    _propose(group, 10)
    node = "n1" if role == "leader" else "n2"
    assert group[node].cache_bytes > 0
    group.cut.clear()
    for _ in range(6):  # n3 catches up, then two idle heartbeat rounds and the quiet one
        group.tick_all(1)
        group.stabilize()
    assert all(group[n].quiesced for n in ("n1", "n2", "n3"))
    assert group[node].role is (Role.LEADER if role == "leader" else Role.FOLLOWER)
    assert group[node].cache_bytes == 0
    assert group[node].log.snapshot.index == group[node].log.last_index == 11


def test_the_shells_cap_lowers_every_role() -> None:
    group = Group(3, config=_config())
    group.elect("n1")
    group.cut.add(N3)
    _propose(group, 10)
    for node in ("n1", "n2"):
        raft = group[node]
        raft.cache_cap = 300
        raft.compact_cache()
        assert raft.cache_bytes == 300
        raft.cache_cap = 0
        raft.compact_cache()
        assert raft.cache_bytes == 0


@pytest.mark.parametrize(
    ("sizes", "budget", "level"),
    [
        ([], 0, None),
        ([10, 20], 30, None),
        ([10, 20], 29, 19),
        ([5, 100, 100], 105, 50),
        ([5, 100, 100], 5, 1),
        ([7, 7, 7], 0, 0),
    ],
)
def test_water_level_examples(sizes: list[int], budget: int, level: int | None) -> None:
    assert water_level(sizes, budget) == level


def test_water_level_is_the_largest_cap_that_fits() -> None:
    rng = random.Random(49)
    for _ in range(2000):
        sizes = [rng.randint(1, 1000) for _ in range(rng.randint(1, 12))]
        budget = rng.randint(0, sum(sizes) * 2)
        level = water_level(sizes, budget)
        if sum(sizes) <= budget:
            assert level is None
            continue
        assert level is not None and 0 <= level < max(sizes)
        assert sum(min(s, level) for s in sizes) <= budget < sum(min(s, level + 1) for s in sizes)


def _sweep(nodes: Nodes) -> None:
    for _ in range(SWEEP_TICKS):
        for driver in nodes.drivers.values():
            driver.tick()
        nodes.settle()


def test_a_nodes_budget_lowers_its_caches_and_a_lagging_peer_catches_up_by_transfer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three production drivers: n3 cut off while 40 records commit, the leader's node has a
    budget of 1,000 bytes. Its sweep lowers the leader's cache to fit; n3 back, it gets what
    the leader dropped by segment transfer (the cost of the budget), then Appends again."""
    nodes = Nodes()
    leader, a, b = nodes.elect()
    lagging = b
    raft = nodes.replicas[leader].raft
    driver = nodes.drivers[leader]
    driver.log_cache_budget_bytes = 1000
    got, done = outcomes()
    for _ in range(40):
        nodes.replicas[leader].propose([RECORD], done)  # type: ignore[arg-type]
        nodes.run(leader)
        nodes.discard(lagging)
        nodes.deliver(to=[a])
        nodes.run(a)
        nodes.deliver(to=[leader])
        nodes.run(leader)
    assert len(got) == 40 and not [g for g in got if not isinstance(g, int)]
    assert raft.cache_bytes > 1000
    _sweep_without(nodes, lagging)
    assert driver.log_cache_level is not None and driver.log_cache_trims >= 1
    assert raft.cache_bytes <= 1000 and raft.cache_cap == driver.log_cache_level
    assert driver.log_cache_bytes > 1000  # what the sweep found, before it lowered them
    before = raft.log.snapshot.index
    caplog.set_level(logging.INFO, logger="spate.node.replication.driver")
    nodes.settle()
    for _ in range(3):
        _sweep(nodes)
    follower = nodes.replicas[lagging].raft
    assert follower.log.committed == raft.log.committed
    assert follower.log.snapshot.index >= before  # it restored the leader's snapshot point
    assert f"{lagging}: s/0 caught up to Raft index" in caplog.text  # by segment transfer
    assert raft.progress(lagging).state is ProgressState.REPLICATE
    assert raft.cache_bytes == 0 and driver.log_cache_level is None  # all caught up: caps off
    assert raft.cache_cap is None


def _sweep_without(nodes: Nodes, cut: NodeId) -> None:
    for _ in range(SWEEP_TICKS):
        for node, driver in nodes.drivers.items():
            if node != cut:
                driver.tick()
        nodes.discard(cut)
        for node in IDS:
            if node != cut:
                nodes.run(node)
        nodes.deliver(to=[n for n in IDS if n != cut])
        nodes.discard(cut)


def test_caps_stay_until_the_caches_hold_less_than_three_quarters_of_the_budget() -> None:
    nodes = Nodes()
    leader, _, _ = nodes.elect()
    driver = nodes.drivers[leader]
    raft = nodes.replicas[leader].raft
    driver.log_cache_budget_bytes = 1000
    raft.cache_cap = 600
    driver._capped = [nodes.replicas[leader]]
    driver.log_cache_level = 600
    raft.log.bytes_applied = 800  # the sweep reads this figure only
    driver._bound_caches()
    assert raft.cache_cap == 600  # 800 fits the budget thanks to the cap, which stays
    raft.log.bytes_applied = 700
    driver._bound_caches()
    assert raft.cache_cap is None and driver.log_cache_level is None


def test_the_default_limits_are_related() -> None:
    assert limits.follower_log_cache_bytes_max <= limits.log_cache_bytes_max
    assert limits.log_cache_bytes_max <= limits.node_log_cache_bytes_max
    config = RaftConfig()
    assert config.follower_log_cache_bytes == limits.follower_log_cache_bytes_max
