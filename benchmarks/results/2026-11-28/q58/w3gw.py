# A measurement script kept as it was run (RESULTS §58).
"""W3 through the gateway only, N runs on one fresh cluster (a fresh stream each, as
side_by_side.py's W3), one JSON line per run: what a stream's first second costs."""

import argparse
import json
import sys
import time

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs

from cluster import Cluster

label, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
w = argparse.Namespace(duration=10.0)
with Cluster(3) as c:
    s = sbs.Spate(c)
    for i in range(runs):
        r = sbs.spate_w3(s, "gateway", w, f"{label}/{i}")
        p = r.get("producer") or {}
        row = {
            "label": label,
            "run": i,
            "e2e_p50_ms": r.get("e2e_p50_ms"),
            "e2e_p99_ms": r.get("e2e_p99_ms"),
            "e2e_max_ms": r.get("e2e_max_ms"),
            "confirm_p50_ms": p.get("confirm_p50_ms"),
            "confirm_p99_ms": p.get("confirm_p99_ms"),
            "confirm_max_ms": p.get("confirm_max_ms"),
            "received": r.get("received"),
            "loadavg": r.get("loadavg"),
            "ts": time.strftime("%H:%M:%S"),
        }
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
