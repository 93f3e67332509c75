"""benchmarks/commit_floor.py (RESULTS §52) runs its four processes in every mode and answers
every request, so the floor RESULTS quotes stays reproducible. Figures are printed, never
asserted; the assertions are on counts and on the summary's shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "commit_floor.py"
OPS = 200


def test_every_mode_answers_every_request_in_order(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--ops", str(OPS), "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
        env={**os.environ, "FLOOR_DIR": str(tmp_path)},
    )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ops"] == OPS and summary["runs"] == 1
    medians = summary["medians"]
    assert set(medians) == {"inline", "thread", "nosync"}
    for mode, figures in medians.items():
        # The client checks each answer's sequence; every request after the warm-up is timed.
        assert figures["answered"] == OPS, (mode, figures)
        assert 0 < figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"] <= figures["max_ms"]
        # CPU is read from /proc in 10 ms ticks: 200 requests without fsync may round to 0.
        assert figures["nodes_cpu_us_per_op"] >= 0, (mode, figures)
    assert not list(tmp_path.iterdir()), "the runs' files are removed"
