"""benchmarks/page_cost.py (RESULTS §55) prints what a page of memory costs on this machine, so
CPU figures of different sessions can be read side by side. Figures are printed, never
asserted; the assertions are on the output's shape and on what it leaves behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "page_cost.py"


def test_prints_every_cost_and_leaves_no_file() -> None:
    before = set(SCRIPT.parent.iterdir())
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=True
    )
    costs = json.loads(done.stdout.strip().splitlines()[-1])["us_per_page"]
    assert set(costs) == {"fresh", "again", "after_4s", "page_cache", "page_cache_again"}
    for name in ("fresh", "again", "after_4s"):  # wall clock: populating 65,536 pages
        assert costs[name] > 0, costs
    for name in ("page_cache", "page_cache_again"):  # system time, read in ticks: may be 0
        assert costs[name] >= 0, costs
    assert set(SCRIPT.parent.iterdir()) == before, "its temporary directory is removed"
