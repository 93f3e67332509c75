"""The `pysyncobj` simulator model (spate.sim.metadata_raft): random schedules over three real
metadata voters (pysyncobj with the adapter's overrides) wired in memory, checking that reads
are linearizable, voters agree on what they applied, and acknowledged writes survive (the
module's docstring has the invariants). `make sim` runs more seeds; this runs
`SPATE_METADATA_SCHEDULES` (default 40).
"""

from __future__ import annotations

import os

import pytest
from spate.sim.metadata_raft import run_pysyncobj_seed
from support.seeds import until_caught

SEEDS = int(os.environ.get("SPATE_METADATA_SCHEDULES", "40"))


@pytest.mark.parametrize("seed", range(1, SEEDS + 1))
def test_random_schedules_keep_reads_linearizable_and_acknowledged_writes(seed: int) -> None:
    result = run_pysyncobj_seed(seed)
    assert result.ok, f"seed {seed}: {result.failure}\nlast steps:\n" + "\n".join(result.trace)
    assert result.acknowledged > 10, "the schedule acknowledged almost nothing"


def test_a_seed_replays_exactly() -> None:
    """pysyncobj's clock is the schedule's: the same seed makes the same run."""
    assert run_pysyncobj_seed(3).digest == run_pysyncobj_seed(3).digest


def test_pysyncobjs_own_snapshot_handling_is_caught() -> None:
    """The planted bug: voters handling snapshots as pysyncobj alone does (ADR 0025's second
    addendum: a piece commits a deposed leader's tail; a snapshot is installed over a log that
    holds it). Before the fix, 17 of 60 seeds failed."""
    sweep = (run_pysyncobj_seed(s, bug="pysyncobj-snapshots").failure or "" for s in range(1, 31))
    failures = until_caught(sweep, bool)
    assert any(failures), failures


def test_pysyncobjs_own_reset_answers_are_caught() -> None:
    """The planted bug: a conflict's reset answered as pysyncobj alone does (no reset floor,
    raft.py `_defer`): the leader's pipelined messages' answers undo the back-off, and a
    follower whose tail conflicts never catches up: 12 of 60 seeds did not settle before."""
    sweep = (run_pysyncobj_seed(s, bug="pysyncobj-resets").failure or "" for s in range(1, 31))
    failures = until_caught(sweep, lambda f: f.startswith("unsettled"))
    assert any(f.startswith("unsettled") for f in failures), failures


def test_pysyncobjs_own_follower_append_is_caught() -> None:
    """The planted bug: followers take a leader's entries as pysyncobj alone does (ADR 0025's
    first addendum: a late append cuts an acknowledged tail; a follower commits up to the
    leader's index over entries the message does not prove)."""
    sweep = (run_pysyncobj_seed(s, bug="pysyncobj-append").failure or "" for s in range(1, 31))
    failures = until_caught(sweep, bool)
    assert any(failures), failures
