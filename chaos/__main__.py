"""`python -m chaos`: the chaos suite's commands.

python -m chaos run [--schedule NAME] [--seed S] [--minutes M] [--out DIR]
python -m chaos schedules
python -m chaos.toxiproxy [--port 8474]      (the Toxiproxy-compatible server alone)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chaos.nemesis import SCHEDULES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="one run: cluster in network namespaces, workload, faults, checker, report",
        description="Start three nodes and two gateways in network namespaces (root), run the "
        "workload under a fault schedule, heal, read everything back, check the history and "
        "write a report to OUT/<run-id>/. Exit code 0 only for a valid history. Example: "
        "python -m chaos run --schedule ci --seed 7 --minutes 3",
    )
    run.add_argument("--schedule", choices=sorted(SCHEDULES), default="standard")
    run.add_argument("--seed", type=int, help="the fault plan's seed (default: random, printed)")
    run.add_argument("--minutes", type=float, help="length (default: the schedule's)")
    run.add_argument("--out", type=Path, default=Path("chaos/reports"))
    commands.add_parser("schedules", help="list the fault schedules")
    args = parser.parse_args(argv)
    if args.command == "schedules":
        for s in SCHEDULES.values():
            print(f"{s.name:12} {s.minutes:g} min  faults {', '.join(s.kinds)}")
        return 0
    from chaos.run import run as run_once

    outcome = run_once(args.schedule, args.seed, args.minutes, args.out)
    totals = dict(outcome.verdict.totals())
    state = "valid" if outcome.valid else "INVALID"
    print(
        f"chaos: {state}: {len(outcome.faults)} faults, anomalies {totals or 'none'}, "
        f"harness errors {len(outcome.harness_errors)}; report {outcome.run_dir / 'summary.md'}"
    )
    return 0 if outcome.valid else 1


if __name__ == "__main__":
    sys.exit(main())
