"""The disk's floor under a replicated commit: how long this machine's fdatasync of a small
append takes, alone and when three writers (three nodes on one disk, as every local cluster
here) sync at once — a commit waits for two of three (issue 8's commit p99 < 2 ms target;
../shared/BRIEF.md §4).

    .venv/bin/python benchmarks/fsync_floor.py [--rounds 3000] [--bytes 100] [--dir DIR]

Each writer is its own process with its own file (O_APPEND, preallocated like a segment is
not: a plain append, then fdatasync). Reported, ms p50 / p90 / p99 / max:
- `alone`: one writer, one append + fdatasync after another;
- `three`: three writers released together each round (a barrier); per round, the time until
  the second of the three has synced (a majority) and until the third has.
Prints one JSON object. Nothing Spate runs here: this is what any fsync-before-ack broker on
this disk waits for, before its own CPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _writer(path: str, size: int, rounds: int, barrier: Any, out: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    data = b"x" * size
    ends = []
    for _ in range(rounds):
        if barrier is not None:
            barrier.wait()
        start = time.monotonic_ns()
        os.write(fd, data)
        os.fdatasync(fd)
        ends.append((start, time.monotonic_ns()))
    os.close(fd)
    out.put(ends)


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    n = len(ordered) - 1
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(0.90 * n)], 3),
        "p99_ms": round(ordered[int(0.99 * n)], 3),
        "max_ms": round(ordered[-1], 3),
    }


def measure(directory: Path, rounds: int, size: int) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    alone = ctx.Process(target=_writer, args=(str(directory / "alone"), size, rounds, None, out))
    alone.start()
    single = [(end - start) / 1e6 for start, end in out.get()]
    alone.join()
    barrier = ctx.Barrier(3)
    writers = [
        ctx.Process(target=_writer, args=(str(directory / f"w{i}"), size, rounds, barrier, out))
        for i in range(3)
    ]
    for writer in writers:
        writer.start()
    runs = [out.get() for _ in writers]
    for writer in writers:
        writer.join()
    second, third = [], []
    for i in range(rounds):
        start = min(run[i][0] for run in runs)
        ends = sorted(run[i][1] for run in runs)
        second.append((ends[1] - start) / 1e6)
        third.append((ends[2] - start) / 1e6)
    return {
        "bytes": size,
        "rounds": rounds,
        "alone": _percentiles(single),
        "three_second_synced": _percentiles(second),
        "three_all_synced": _percentiles(third),
        "loadavg": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--bytes", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None, help="default: a temp dir in $TMPDIR")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(json.dumps(measure(Path(tmp), args.rounds, args.bytes)))


if __name__ == "__main__":
    main()
