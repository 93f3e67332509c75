"""Summarize the per-message stamps `e2etrace.py` wrote (RESULTS §50): per W3 run (runs split
by a second of silence), per process role (L leader, F<n> follower, G gateway) and step, the
p50 / p90 / p99 of ms since the producer sent the message.

    python e2e_trace_summary.py DIR
"""

from __future__ import annotations

import collections
import glob
import os
import sys

ORDER = [
    "p_append", "r_propose", "r_send", "r_rx", "r_write0", "r_write1", "r_synced",
    "r_apply_rx", "r_apply_b", "p_done", "c_send",
]  # fmt: skip


def main(directory: str) -> None:
    rows = []
    for path in glob.glob(os.path.join(directory, "e2e-*.tsv")):
        who = "n" + path.split("node-id_n")[1][0] if "node-id" in path else "gw"
        with open(path) as f:
            for line in f:
                point, _seq, ms, now = line.split("\t")
                rows.append((int(now), who, point, float(ms)))
    rows.sort()
    runs: list[list[tuple[int, str, str, float]]] = [[]]
    for row in rows:
        if runs[-1] and row[0] - runs[-1][-1][0] > 1.0e9:
            runs.append([])
        runs[-1].append(row)
    for i, run in enumerate(runs):
        if len(run) < 1000:
            continue
        proposers = collections.Counter(w for _, w, p, _ in run if p == "r_propose")
        senders = collections.Counter(w for _, w, p, _ in run if p == "c_send")
        leader, consumer = proposers.most_common(1)[0][0], senders.most_common(1)[0][0]
        print(f"run {i}: {len(run)} rows leader {leader} consumer at {consumer}")
        steps: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        for _, who, point, ms in run:
            role = "L" if who == leader else ("G" if who == "gw" else "F" + who[1])
            steps[(role, point)].append(ms)
        for key in sorted(steps, key=lambda k: (ORDER.index(k[1]), k[0])):
            v = sorted(steps[key])
            n = len(v)
            print(
                f"  {key[0]:3s} {key[1]:10s} n={n:5d} p50 {v[n // 2]:7.2f} "
                f"p90 {v[int(n * 0.9)]:7.2f} p99 {v[int(n * 0.99)]:7.2f}"
            )


if __name__ == "__main__":
    main(sys.argv[1])
