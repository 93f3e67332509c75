"""`python -m spate.sim`: run the deterministic simulators over many seeds, or replay one.

    python -m spate.sim --seeds 200 [--start 0] [--model shell] [--nodes 3] [--steps N]
    python -m spate.sim --seed 17 [--model shell] [--trace]
    python -m spate.sim --seeds 30 --bug skip-fsync          # watch the checker fail

Models (`--model`, default `shell`; `all` runs each in turn):
  shell  the production replication shell: ReplicationDriver, Replica, RaftStore, PartitionLog
         and the catch-up on simulated disks and network (shell.py)
  core   the Raft core alone under the reference shell and a model store (cluster.py)
  metadata  the metadata service's state machine and codec on a simulated replicated log
         (metadata.py; a plug-in: later state machines register beside it)
  groups the consumer-group coordinator (spate.core.coordinator) and the partitions'
         ownership layer (spate.core.ownership) with crashing hosts, members and leaders
         (groups.py)
  pysyncobj  pysyncobj itself: three real metadata voters (the adapter's class, our dump
         codec, compaction every 8 entries) wired in memory under random schedules of
         deliveries, pauses, resets and elections; reads, agreement and acknowledged writes
         checked (metadata_raft.py)

Exits 1 when any seed fails, after printing the invariant, the seed and the command that
replays it exactly. The summary line gives seeds per second.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from spate.sim.cluster import NO_BUGS, Bugs, SimCluster, SimOptions
from spate.sim.groups import NO_BUGS as NO_GROUP_BUGS
from spate.sim.groups import GroupBugs, run_group_seed
from spate.sim.metadata import MetadataBugs, run_state_machine_seed
from spate.sim.metadata_raft import BUGS as PYSYNCOBJ_BUGS
from spate.sim.metadata_raft import run_pysyncobj_seed
from spate.sim.shell import NO_BUGS as NO_SHELL_BUGS
from spate.sim.shell import ShellBugs, ShellCluster, ShellOptions


@dataclass(frozen=True, slots=True)
class _Outcome:
    ok: bool
    failure: str | None
    digest: str
    steps: int
    summary: dict[str, int]
    options: object
    trace: list[str]


def _run_core(seed: int, args: argparse.Namespace, bug: str | None, trace: bool) -> _Outcome:
    options = SimOptions.draw(seed, nodes=args.nodes, steps=args.steps or 3000)
    options = replace(options, bugs=_CORE_BUGS[bug] if bug else NO_BUGS)
    cluster = SimCluster(seed, options, keep_trace=trace)
    result = cluster.run()
    summary = {
        "acknowledged": result.acknowledged,
        "elections": result.elections,
        "crashes": result.crashes,
        "snapshot transfers": result.snapshots,
        "membership changes": result.membership_changes,
        "leader transfers": result.transfers,
        "followers' early commits": result.early_commits,
        "simulated ms": result.time_ms,
    }
    return _Outcome(
        result.ok,
        result.failure,
        result.trace_digest,
        result.steps,
        summary,
        options,
        cluster.trace_lines,
    )


def _run_shell(seed: int, args: argparse.Namespace, bug: str | None, trace: bool) -> _Outcome:
    options = ShellOptions.draw(
        seed, nodes=args.nodes, groups=args.groups, steps=args.steps or 2000
    )
    options = replace(options, bugs=_SHELL_BUGS[bug] if bug else NO_SHELL_BUGS)
    cluster = ShellCluster(seed, options, keep_trace=trace)
    result = cluster.run()
    summary = {
        "acknowledged": result.acknowledged,
        "elections": result.elections,
        "crashes": result.crashes,
        "wiped replicas": result.wipes,
        "segment transfers": result.snapshots,
        "segments deleted by retention": result.retention_deletes,
        "offset stores acknowledged": result.offsets_acknowledged,
        "offset queries answered": result.offset_queries,
        "membership changes": result.membership_changes,
        "replicas closed and reopened": result.reopens,
        "simulated ms": result.time_ms,
    }
    return _Outcome(
        result.ok,
        result.failure,
        result.trace_digest,
        result.steps,
        summary,
        options,
        cluster.trace_lines,
    )


def _run_metadata(seed: int, args: argparse.Namespace, bug: str | None, trace: bool) -> _Outcome:
    result, cluster = run_state_machine_seed(
        seed,
        nodes=args.nodes,
        steps=args.steps or 2000,
        bugs=_METADATA_BUGS[bug] if bug else None,
        keep_trace=trace,
    )
    summary = {
        "acknowledged commands": result.acknowledged,
        "elections": result.elections,
        "crashes": result.crashes,
        "simulated ms": result.time_ms,
    }
    return _Outcome(
        result.ok,
        result.failure,
        result.trace_digest,
        result.steps,
        summary,
        cluster.options,
        cluster.trace_lines,
    )


def _run_groups(seed: int, args: argparse.Namespace, bug: str | None, trace: bool) -> _Outcome:
    result, sim = run_group_seed(
        seed,
        steps=args.steps or 1500,
        bugs=_GROUP_BUGS[bug] if bug else NO_GROUP_BUGS,
        keep_trace=trace,
    )
    summary = {
        "rebalances": result.rebalances,
        "coordinator crashes": result.coordinator_crashes,
        "member crashes": result.member_crashes,
        "commits accepted": result.commits,
        "simulated ms": result.time_ms,
    }
    return _Outcome(
        result.ok,
        result.failure,
        result.trace_digest,
        result.steps,
        summary,
        result.options,
        sim.trace_lines,
    )


def _run_pysyncobj(seed: int, args: argparse.Namespace, bug: str | None, trace: bool) -> _Outcome:
    result = run_pysyncobj_seed(seed, steps=args.steps or 3000, bug=bug)
    summary = {
        "acknowledged writes": result.acknowledged,
        "barriers": result.barriers,
        "forced elections": result.elections,
        "pauses": result.pauses,
    }
    return _Outcome(
        result.ok,
        result.failure,
        result.digest,
        result.steps,
        summary,
        f"3 voters, {args.steps or 3000} steps",
        result.trace if trace else [],
    )


_PYSYNCOBJ_BUGS = {name: True for name in PYSYNCOBJ_BUGS}
_GROUP_BUGS = {
    "announce-before-store": GroupBugs(announce_before_store=True),
    "forget-generation": GroupBugs(forget_generation=True),
    "assign-before-revoke": GroupBugs(assign_before_revoke=True),
    "stale-claims": GroupBugs(stale_claims=True),
    "forget-epochs": GroupBugs(forget_epochs=True),
    "commit-from-deposed": GroupBugs(commit_from_deposed=True),
    "promote-before-store": GroupBugs(promote_before_store=True),
    "commit-past-delivered": GroupBugs(commit_past_delivered=True),
    "forget-waiting-claims": GroupBugs(forget_waiting_claims=True),
}
_METADATA_BUGS = {
    "forget-requests": MetadataBugs(forget_requests=True),
    "stale-epochs": MetadataBugs(stale_epochs=True),
    "local-clock": MetadataBugs(local_clock=True),
    "orphan-partitions": MetadataBugs(orphan_partitions=True),
}
_CORE_BUGS = {
    "ack-before-persist": Bugs(ack_before_persist=True),
    "early-append-response": Bugs(early_append_response=True),
    "forget-vote": Bugs(forget_vote=True),
    "learners-count": Bugs(learners_count=True),
    "membership-on-commit": Bugs(membership_on_commit=True),
    "commit-with-unsynced": Bugs(commit_with_unsynced=True),
}
_SHELL_BUGS = {
    "ack-before-fsync": ShellBugs(ack_before_fsync=True),
    "early-sends-all": ShellBugs(early_sends_all=True),
    "skip-fsync": ShellBugs(skip_fsync=True),
    "catchup-uncommitted": ShellBugs(catchup_uncommitted=True),
    "retention-without-floor": ShellBugs(retention_without_floor=True),
    "dedup-forgets-proposals": ShellBugs(dedup_forgets_proposals=True),
    "catchup-forgets-offsets": ShellBugs(catchup_forgets_offsets=True),
    "offset-query-uncommitted": ShellBugs(offset_query_uncommitted=True),
    "read-unconfirmed": ShellBugs(read_unconfirmed=True),
    "store-committed-end": ShellBugs(store_committed_end=True),
    "filter-misses-last": ShellBugs(filter_misses_last=True),
    "sub-entry-first-value": ShellBugs(sub_entry_first_value=True),
    "batch-removed-replica": ShellBugs(batch_removed_replica=True),
    "cache-budget-ignored": ShellBugs(cache_budget_ignored=True),
}

Runner = Callable[[int, argparse.Namespace, str | None, bool], _Outcome]
MODELS: dict[str, tuple[Runner, dict[str, Any]]] = {
    "shell": (_run_shell, _SHELL_BUGS),
    "core": (_run_core, _CORE_BUGS),
    "metadata": (_run_metadata, _METADATA_BUGS),
    "groups": (_run_groups, _GROUP_BUGS),
    "pysyncobj": (_run_pysyncobj, _PYSYNCOBJ_BUGS),
}


def _replay_command(model: str, seed: int, args: argparse.Namespace) -> str:
    parts = ["python -m spate.sim", f"--model {model}", f"--seed {seed}"]
    hash_seed = os.environ.get("PYTHONHASHSEED")
    if model == "pysyncobj" and hash_seed not in (None, HASH_SEED):
        parts.insert(0, f"PYTHONHASHSEED={hash_seed}")
    for flag in ("steps", "nodes", "groups", "bug"):
        value = getattr(args, flag)
        if value is not None:
            parts.append(f"--{flag} {value}")
    return " ".join(parts)


def _run_model(model: str, seeds: list[int], args: argparse.Namespace) -> int:
    runner, bugs = MODELS[model]
    bug = args.bug if args.bug in bugs else None
    if args.bug is not None and bug is None:
        print(f"model {model}: no planted bug {args.bug!r}; skipped")
        return 0
    started = time.monotonic()
    failures = 0
    totals: dict[str, int] = {}
    for seed in seeds:
        outcome = runner(seed, args, bug, args.trace and args.seed is not None)
        for key, value in outcome.summary.items():
            totals[key] = totals.get(key, 0) + value
        if args.seed is not None:
            for line in outcome.trace:
                print(line)
            print(f"seed {seed}: {outcome.options}")
            print(f"trace digest {outcome.digest}, {outcome.steps} events")
        if not outcome.ok:
            failures += 1
            print(f"FAIL {model} seed {seed}: {outcome.failure}")
            print(f"  replay: {_replay_command(model, seed, args)}")
    wall_s = time.monotonic() - started
    facts = ", ".join(f"{value} {key}" for key, value in totals.items())
    print(
        f"{model}: {len(seeds)} seeds, {len(seeds) - failures} passed, {failures} failed; "
        f"{facts}; {wall_s:.1f} s, {len(seeds) / wall_s:.1f} seeds/s"
    )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spate.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seeds", type=int, help="how many seeds to run")
    which.add_argument("--seed", type=int, help="replay one seed")
    parser.add_argument("--start", type=int, default=0, help="first seed (with --seeds)")
    parser.add_argument(
        "--model", choices=[*MODELS, "all"], default="shell", help="what to simulate"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        choices=(3, 4, 5),
        default=None,
        help="cluster size (default: drawn from the seed)",
    )
    parser.add_argument(
        "--groups",
        type=int,
        choices=(1, 2, 3),
        default=None,
        help="partitions (shell model; default: drawn from the seed)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="events in the fault phase (default: core and pysyncobj 3000, groups 1500, "
        "others 2000)",
    )
    parser.add_argument("--trace", action="store_true", help="print the event trace (--seed)")
    every_bug = sorted({name for _, bugs in MODELS.values() for name in bugs})
    parser.add_argument(
        "--bug",
        choices=every_bug,
        default=None,
        help="plant a deliberate bug (to see the checker fail)",
    )
    args = parser.parse_args(argv)
    if (args.steps is not None and args.steps <= 0) or (args.seeds is not None and args.seeds <= 0):
        parser.error("--seeds and --steps must be positive")
    logging.disable(logging.CRITICAL)  # the shell logs failures it is made to meet
    seeds = (
        [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    )
    models = list(MODELS) if args.model == "all" else [args.model]
    failures = sum(_run_model(model, seeds, args) for model in models)
    return 1 if failures else 0


HASH_SEED = "0"
"""PYTHONHASHSEED this CLI runs under when none is set: the `pysyncobj` model's runs depend on
it (pysyncobj iterates sets of nodes), so a printed replay command is exact only under a fixed
one. The other models do not depend on it (tests/sim checks their digests across hash seeds)."""


def _pin_hash_seed() -> None:
    """Re-run this command under PYTHONHASHSEED=HASH_SEED when none is set."""
    if os.environ.get("PYTHONHASHSEED") is None:
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        os.execve(sys.executable, [sys.executable, "-m", "spate.sim", *sys.argv[1:]], env)


if __name__ == "__main__":
    _pin_hash_seed()
    sys.exit(main())
