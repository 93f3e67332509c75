"""CPU per message per function, from py-spy's collapsed stacks (RESULTS §41).

    .venv/bin/python benchmarks/profile_table.py PROFILE.txt --cpu-us 192.5 [--top 25]

PROFILE.txt is `py-spy record --format raw` output (benchmarks/w1_cpu.py --profile writes one
per size and role): one line per distinct stack, `frame;frame;...;leaf COUNT`, root first.
`--cpu-us` is the process's CPU microseconds per message over the same run (w1_cpu.py's
`cpu_us_per_msg`), or per MiB for storage_append.py; every sample is charged that share of it.
py-spy leaves idle threads out, so the samples are the process's busy time, all its threads
together (the sampling is by wall clock per thread: a figure is a share of samples scaled to
the measured CPU, as good as the assumption that a busy sample is a CPU sample). With
`--native` py-spy counts threads blocked in C as busy: a sample whose stack holds a wait
(`WAITS`: a lock, a queue, epoll, poll, fdatasync) is left out and counted apart.

Prints two tables: self (the leaf frame: where the CPU is spent) and inclusive (every frame
on the stack, once per stack: what a call costs with everything below it); with `--summary`,
one table of the W1 path's parts instead (`SUMMARY`, RESULTS §41), several profiles side by
side:

    .venv/bin/python benchmarks/profile_table.py --summary \
        before.txt=281 after.txt=250   # PROFILE=CPU-us-per-message, one column each
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")
WAITS = (
    "PyThread_acquire_lock_timed",
    "_queue_SimpleQueue_get",
    "epoll_wait",
    "epoll_pwait",
    "poll (libc",
    "select (",
    "fdatasync (",
    "sem_wait",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
)
"""Frames of a thread waiting, not running (in py-spy's native frame names)."""

SUMMARY: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    # (row, frames (any of them, by name; `~x` a frame ending with x), leaf only)
    (
        "AMQP input, a read's slices (`AmqpConnection._continue`)",
        ("AmqpConnection._continue",),
        False,
    ),
    (
        "- proton reads a slice (`Transport.push`, `.capacity`)",
        ("Transport.push", "Transport.capacity"),
        False,
    ),
    ("- deliveries read (`ProducerPart.drain`)", ("ProducerPart.drain",), False),
    ("- the pump (`AmqpConnection.pump`)", ("AmqpConnection.pump",), False),
    ("-- of which the append (`ProducerPart.flush`)", ("ProducerPart.flush",), False),
    ("chunk encode and CRC (`encode_chunk_buffer`)", ("encode_chunk_buffer",), False),
    ("filter section (`filtering.section`)", ("section",), False),
    ("replication batch (`ReplicationHost._drive`)", ("ReplicationHost._drive",), False),
    ("- the log write (`RaftStore.persist`)", ("RaftStore.persist",), False),
    (
        "replication input (`Transport._accept`; `FrameReceiver.buffer_updated`, ADR 0039)",
        ("Transport._accept", "FrameReceiver.buffer_updated"),
        False,
    ),
    (
        "- frame read (`read_frame`) and decode (`decode_raft`)",
        ("read_frame", "decode_raft"),
        False,
    ),
    (
        "- the frame splitter, self (`FrameSplitter`, ADR 0039)",
        ("FrameSplitter.wrote", "FrameSplitter._split", "FrameSplitter.buffer"),
        True,
    ),
    ("Raft frame encode (`encode_raft`)", ("encode_raft",), False),
    (
        "socket writes to peers (`Transport.flush`, `_write_some`)",
        ("Transport.flush", "_write_some"),
        False,
    ),
    ("write(2), self: files and sockets", ("write",), True),
    ("read(2), self", ("read",), True),
    ("unnamed libc under GIL hand-offs (futex)", ("~4193",), True),
    ("unnamed libc under copies (memmove)", ("~bb75",), True),
    ("metadata Raft thread (pysyncobj `_autoTickThread`)", ("SyncObj._autoTickThread",), False),
)
"""Rows of `--summary`: the parts of W1's path on a node (and two background costs that are
per second, not per message, so they show per message more at lower rates)."""
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


def tables(stacks: list[tuple[list[str], int]]) -> tuple[Counter[str], Counter[str], int, int]:
    """(self, inclusive, busy samples, waiting samples)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = waiting = 0
    for frames, count in stacks:
        if any(wait in frame for frame in frames for wait in WAITS):
            waiting += count
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return own, inclusive, total, waiting


def _matches(name: str, wanted: str) -> bool:
    function = name.split(" (", maxsplit=1)[0]
    if wanted.startswith("~"):
        return function.endswith(wanted[1:])
    return function == wanted


def summary(columns: list[tuple[Path, float]]) -> None:
    loaded = [(load(path), cpu) for path, cpu in columns]
    head = " | ".join(f"{path.name} ({cpu:g})" for path, cpu in columns)
    print(f"| part | {head} |\n|---|{'---|' * len(columns)}")
    for row, wanted, leaf_only in SUMMARY:
        cells = []
        for stacks, cpu in loaded:
            busy = hit = 0
            for frames, count in stacks:
                if any(wait in frame for frame in frames for wait in WAITS):
                    continue
                busy += count
                names = frames[-1:] if leaf_only else frames
                if any(_matches(n, w) for n in names for w in wanted):
                    hit += count
            cells.append(f"{cpu * hit / busy:.1f}" if busy else "-")
        print(f"| {row} | {' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, nargs="?")
    parser.add_argument("--cpu-us", type=float, help="CPU us per message")
    parser.add_argument("--summary", nargs="+", metavar="PROFILE=CPU", help="summary table")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--unit", default="us/msg")
    a = parser.parse_args()
    if a.summary:
        summary([(Path(c.split("=")[0]), float(c.split("=")[1])) for c in a.summary])
        return
    if a.profile is None or a.cpu_us is None:
        parser.error("PROFILE and --cpu-us, or --summary")
    own, inclusive, total, waiting = tables(load(a.profile))
    if not total:
        raise SystemExit(f"{a.profile}: no samples")
    scale = a.cpu_us / total
    print(f"{a.profile}: {total} busy samples ({waiting} waiting left out), {a.cpu_us} {a.unit}")
    for title, counts in (("self", own), ("inclusive", inclusive)):
        print(f"\n| {title} | {a.unit} | share |\n|---|---|---|")
        for name, count in counts.most_common(a.top):
            print(f"| `{name}` | {count * scale:.2f} | {100 * count / total:.1f}% |")


if __name__ == "__main__":
    main()
