"""`python -m spate.sim`: run the deterministic cluster simulator over many seeds, or replay one.

    python -m spate.sim --seeds 200 [--start 0] [--nodes 3] [--steps 3000]
    python -m spate.sim --seed 17 [--nodes 3] [--steps 3000] [--trace]

Exits 1 when any seed fails, after printing the invariant, the seed and the command that
replays it exactly.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from spate.sim.cluster import NO_BUGS, Bugs, SimCluster, SimOptions, SimResult

_BUGS = {
    "ack-before-persist": Bugs(ack_before_persist=True),
    "early-append-response": Bugs(early_append_response=True),
    "forget-vote": Bugs(forget_vote=True),
}


def _replay_command(seed: int, args: argparse.Namespace) -> str:
    parts = ["python -m spate.sim", f"--seed {seed}", f"--steps {args.steps}"]
    if args.nodes is not None:
        parts.append(f"--nodes {args.nodes}")
    if args.bug is not None:
        parts.append(f"--bug {args.bug}")
    return " ".join(parts)


def _run(seed: int, args: argparse.Namespace, *, trace: bool) -> SimResult:
    options = SimOptions.draw(seed, nodes=args.nodes, steps=args.steps)
    options = replace(options, bugs=_BUGS[args.bug] if args.bug else NO_BUGS)
    cluster = SimCluster(seed, options, keep_trace=trace)
    result = cluster.run()
    if trace:
        for line in cluster.trace_lines:
            print(line)
    return result


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
        "--nodes",
        type=int,
        choices=(3, 4, 5),
        default=None,
        help="cluster size (default: drawn from the seed, 3-5)",
    )
    parser.add_argument("--steps", type=int, default=3000, help="events in the fault phase")
    parser.add_argument("--trace", action="store_true", help="print the event trace (--seed)")
    parser.add_argument(
        "--bug",
        choices=sorted(_BUGS),
        default=None,
        help="inject a deliberate shell bug (to see the checker fail)",
    )
    args = parser.parse_args(argv)
    if args.steps <= 0 or (args.seeds is not None and args.seeds <= 0):
        parser.error("--seeds and --steps must be positive")

    seeds = (
        [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    )
    started = time.monotonic()
    failures: list[SimResult] = []
    totals = {"acknowledged": 0, "elections": 0, "crashes": 0, "snapshots": 0, "time_ms": 0}
    for seed in seeds:
        result = _run(seed, args, trace=args.trace and args.seed is not None)
        for key in totals:
            totals[key] += getattr(result, key)
        if args.seed is not None:
            print(f"seed {seed}: {result.options}")
            print(f"trace digest {result.trace_digest}, {result.steps} events")
        if not result.ok:
            failures.append(result)
            print(f"FAIL seed {seed}: {result.failure}")
            print(f"  replay: {_replay_command(seed, args)}")
    wall_s = time.monotonic() - started
    print(
        f"{len(seeds)} seeds, {len(seeds) - len(failures)} passed, {len(failures)} failed; "
        f"{totals['acknowledged']} acknowledged appends, {totals['elections']} elections, "
        f"{totals['crashes']} crashes, {totals['snapshots']} snapshot transfers, "
        f"{totals['time_ms'] / 1000:.1f} s simulated in {wall_s:.1f} s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
