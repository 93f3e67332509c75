"""The consumer-group coordinator and the partitions' ownership layer under the simulator
(src/sim/groups.py): seeds hold every invariant and reach a quiet group on its target, a seed
replays exactly, and each planted bug is caught within 50 seeds (100 for the rarest)."""

from __future__ import annotations

import re

import pytest
from spate.sim.groups import GroupBugs, run_group_seed
from support.seeds import until_caught

SEEDS = 50


def test_many_seeds_hold_every_invariant_and_settle() -> None:
    runs = [run_group_seed(seed)[0] for seed in range(SEEDS)]
    assert [(r.seed, r.failure) for r in runs if not r.ok] == []
    # The faults happened and the group kept working through them.
    assert sum(r.coordinator_crashes for r in runs) > SEEDS
    assert sum(r.member_crashes for r in runs) > SEEDS
    assert sum(r.rebalances for r in runs) > 4 * SEEDS
    assert sum(r.commits for r in runs) > 50 * SEEDS
    assert {r.options.strategy for r in runs} == {"round-robin", "range", "sticky"}


def test_same_seed_same_trace() -> None:
    first, _ = run_group_seed(5)
    assert run_group_seed(5)[0].trace_digest == first.trace_digest
    assert run_group_seed(6)[0].trace_digest != first.trace_digest


@pytest.mark.parametrize(
    ("bugs", "invariant", "seeds"),
    [
        (GroupBugs(announce_before_store=True), "generation-stored:", SEEDS),
        (GroupBugs(forget_generation=True), "generation-monotonic:", SEEDS),
        (GroupBugs(assign_before_revoke=True), "single-owner:", SEEDS),
        (GroupBugs(stale_claims=True), "ownership-fence:", SEEDS),
        (GroupBugs(forget_epochs=True), "ownership-fence:", SEEDS),
        (GroupBugs(commit_from_deposed=True), "commit-fenced:", SEEDS),
        (GroupBugs(promote_before_store=True), "handover-commit:", SEEDS),
        (GroupBugs(commit_past_delivered=True), "commit-not-ahead:", SEEDS),
        # rarer: a claim must be displaced, or lose its leader, while it waits (~1 seed in 20)
        (GroupBugs(forget_waiting_claims=True), "liveness: .* links of the group", 2 * SEEDS),
    ],
)
def test_each_planted_bug_is_caught(bugs: GroupBugs, invariant: str, seeds: int) -> None:
    sweep = (run_group_seed(seed, bugs=bugs)[0].failure or "" for seed in range(seeds))
    failures = until_caught(sweep, lambda f: re.match(invariant, f) is not None)
    assert any(re.match(invariant, f) for f in failures), failures
