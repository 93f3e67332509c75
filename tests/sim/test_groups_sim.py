"""The consumer-group coordinator and the partitions' ownership layer under the simulator
(src/sim/groups.py): seeds hold every invariant and reach a quiet group on its target, a seed
replays exactly, and each planted bug is caught within 50 seeds."""

from __future__ import annotations

import pytest
from spate.sim.groups import GroupBugs, run_group_seed

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
    ("bugs", "invariant"),
    [
        (GroupBugs(announce_before_store=True), "generation-stored:"),
        (GroupBugs(forget_generation=True), "generation-monotonic:"),
        (GroupBugs(assign_before_revoke=True), "single-owner:"),
        (GroupBugs(stale_claims=True), "ownership-fence:"),
        (GroupBugs(forget_epochs=True), "ownership-fence:"),
        (GroupBugs(commit_from_deposed=True), "commit-fenced:"),
        (GroupBugs(promote_before_store=True), "handover-commit:"),
        (GroupBugs(commit_past_delivered=True), "commit-not-ahead:"),
    ],
)
def test_each_planted_bug_is_caught(bugs: GroupBugs, invariant: str) -> None:
    failures = [run_group_seed(seed, bugs=bugs)[0].failure or "" for seed in range(SEEDS)]
    assert any(f.startswith(invariant) for f in failures), failures
