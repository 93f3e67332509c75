"""RESULTS §53: the A/B table from replication_latency.py's outputs in this directory
(rl-<A|B><n>.txt, ep-<A|B><n>/<node>.json).

    python benchmarks/results/2026-11-27/q53/sum.py [DIR]
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def main() -> None:
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    rows = {}
    for path in sorted(here.glob("rl-*.txt")):
        found = re.search(r"rl-(\w+)\.txt", path.name)
        assert found is not None
        tag = found.group(1)
        text = path.read_text()
        run = json.loads(text[text.index("{") :])
        count = run["count"]
        per_node = {}
        loops = 0.0
        for node in ("n1", "n2", "n3"):
            points = json.loads((here / f"ep-{tag}" / f"{node}.json").read_text())
            loop_us = points["loop_thread_ns"] / count / 1000
            loops += loop_us
            batches = points["entry_points"].get("driver.begin_batch", {}).get("calls", 0)
            per_node[node] = (round(batches / count, 2), round(loop_us))
        rows[tag] = (
            run["leader_commit"]["p50_ms"],
            run["leader_commit"]["p99_ms"],
            run["follower_visible"]["p50_ms"],
            run["leader_cpu_ms_per_append"],
            round(loops),
        )
        print(tag, rows[tag], "begin_batch calls and loop us per append:", per_node)
    for variant in "AB":
        runs = [row for tag, row in rows.items() if tag.startswith(variant)]
        if runs:
            medians = [statistics.median(row[i] for row in runs) for i in range(5)]
            p50, p99, follower, leader_cpu, loops_us = medians
            print(
                f"{variant} medians: commit p50 {p50:.2f} p99 {p99:.2f}, follower p50 "
                f"{follower:.2f}, leader CPU {leader_cpu:.3f} ms, loop threads {loops_us:.0f} us "
                "per append"
            )


if __name__ == "__main__":
    main()
