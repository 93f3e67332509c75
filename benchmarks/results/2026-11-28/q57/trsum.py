# ruff: noqa: SIM115, E501  (a measurement script kept as it was run, RESULTS §57)
import collections
import glob
import os
import sys

ORDER = [
    "p_append",
    "g_send",
    "g_flush_wait",
    "w_append",
    "r_propose",
    "r_send",
    "r_rx",
    "r_write0",
    "r_write1",
    "r_synced",
    "r_apply_rx",
    "r_apply_b",
    "w_appended",
    "w_push",
    "w_flush_wait",
    "g_appended",
    "g_records",
    "p_done",
    "c_send",
]
rows = []
for path in glob.glob(os.path.join(sys.argv[1], "e2e-*.tsv")):
    who = "n" + path.split("node-id_n")[1][0] if "node-id" in path else "gw"
    for line in open(path):
        point, _s, ms, now = line.split("\t")
        rows.append((int(now), who, point, float(ms)))
rows.sort()
runs = [[]]
for r in rows:
    if runs[-1] and r[0] - runs[-1][-1][0] > 1e9:
        runs.append([])
    runs[-1].append(r)
for i, run in enumerate(runs):
    if len(run) < 1000:
        continue
    prop = collections.Counter(w for _, w, p, _ in run if p == "r_propose").most_common(1)[0][0]
    cons = collections.Counter(w for _, w, p, _ in run if p == "c_send").most_common(1)
    print(f"run {i}: rows {len(run)} leader {prop} consumer {cons}")
    steps = collections.defaultdict(list)
    for _, w, p, ms in run:
        role = "L" if w == prop else ("G" if w == "gw" else "F" + w[1])
        steps[(role, p)].append(ms)
    for k in sorted(steps, key=lambda k: (ORDER.index(k[1]) if k[1] in ORDER else 99, k[0])):
        v = sorted(steps[k])
        n = len(v)
        print(
            f"  {k[0]:3s} {k[1]:13s} n={n:6d} p50 {v[n // 2]:7.3f} p90 {v[int(n * 0.9)]:7.3f} p99 {v[int(n * 0.99)]:7.3f}"
        )
