"""CPU per message per function, from py-spy's collapsed stacks (RESULTS §41).

    .venv/bin/python benchmarks/profile_table.py PROFILE.txt --cpu-us 192.5 [--top 25]

PROFILE.txt is `py-spy record --format raw` output (benchmarks/w1_cpu.py --profile writes one
per size and role): one line per distinct stack, `frame;frame;...;leaf COUNT`, root first.
`--cpu-us` is the process's CPU microseconds per message over the same run (w1_cpu.py's
`cpu_us_per_msg`), or per MiB for storage_append.py; every sample is charged that share of it.
py-spy leaves idle threads out, so the samples are the process's busy time, all its threads
together (the sampling is by wall clock per thread: a figure is a share of samples scaled to
the measured CPU, as good as the assumption that a busy sample is a CPU sample).

Prints two tables: self (the leaf frame: where the CPU is spent) and inclusive (every frame
on the stack, once per stack: what a call costs with everything below it).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(.*?) \((.*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`function (path/to/module.py:123)` -> `function (module.py)`; native frames alike."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    function, where = match.groups()
    return f"{function} ({where.rsplit('/', 1)[-1]})"


def load(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        frames = [frame_name(f) for f in match.group(1).split(";")]
        stacks.append((frames, int(match.group(2))))
    return stacks


def tables(stacks: list[tuple[list[str], int]]) -> tuple[Counter[str], Counter[str], int]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for frames, count in stacks:
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return own, inclusive, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--cpu-us", type=float, required=True, help="CPU us per message")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--unit", default="us/msg")
    a = parser.parse_args()
    own, inclusive, total = tables(load(a.profile))
    if not total:
        raise SystemExit(f"{a.profile}: no samples")
    scale = a.cpu_us / total
    print(f"{a.profile}: {total} samples, {a.cpu_us} {a.unit} in all")
    for title, counts in (("self", own), ("inclusive", inclusive)):
        print(f"\n| {title} | {a.unit} | share |\n|---|---|---|")
        for name, count in counts.most_common(a.top):
            print(f"| `{name}` | {count * scale:.2f} | {100 * count / total:.1f}% |")


if __name__ == "__main__":
    main()
