# ruff: noqa: SIM115  (a measurement script kept as it was run, RESULTS §57)
import collections
import glob
import json
import os
import statistics
import sys

base = sys.argv[1]
modes = sys.argv[2].split(",")
tab = collections.defaultdict(lambda: collections.defaultdict(list))
for mode in modes:
    for d in sorted(glob.glob(os.path.join(base, mode + "[0-9]*"))):
        if not os.path.isdir(d):
            continue
        f = os.path.join(d, "results.jsonl")
        if not os.path.exists(f):
            continue
        for line in open(f):
            r = json.loads(line)
            sysname = r.get("system")
            wl = r.get("workload")
            if wl == "w3":
                tab[mode][(sysname, "w3 p50")].append(r["e2e_p50_ms"])
                tab[mode][(sysname, "w3 p99")].append(r["e2e_p99_ms"])
            elif wl in ("w1",) or r.get("workload", "").startswith("w1"):
                v = r.get("msgs_per_s") or r.get("confirmed_per_s")
                if v:
                    tab[mode][(sysname, wl + " k/s")].append(round(v / 1000, 1))
keys = sorted({k for m in tab for k in tab[m]})
print("| figure | " + " | ".join(modes) + " |")
for k in keys:
    cells = []
    for m in modes:
        v = tab[m].get(k, [])
        cells.append(f"{statistics.median(v):.2f} ({', '.join(str(x) for x in v)})" if v else "-")
    print(f"| {k[0]} {k[1]} | " + " | ".join(cells) + " |")
