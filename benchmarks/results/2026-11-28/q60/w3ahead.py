# A measurement script kept as it was run (RESULTS §60): W3 (side_by_side.py's, 5,000 msg/s of
# 100 B for 20 s) with the consumer on a follower, RUNS times on one cluster; after each, every
# node's spate_replication_commits_ahead_of_write_total and appends received since the last.
# Usage: w3ahead.py DIR RUNS
import argparse
import re
import shutil
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs

from cluster import Cluster

NAMES = (
    "spate_replication_commits_ahead_of_write_total",
    "spate_replication_appends_received_total",
)


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for name in NAMES:
        m = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


d, runs = Path(sys.argv[1]), int(sys.argv[2])
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=20.0, w3_only=True)
try:
    with Cluster(3, data_dir=d) as c:
        s = sbs.Spate(c)
        nodes = {str(x["node_id"]): str(x["metrics"]) for x in c.endpoints["nodes"]}
        last = {n: counters(u) for n, u in nodes.items()}
        for i in range(runs):
            r = sbs.spate_w3(s, "follower", w, f"a{i}")
            now = {n: counters(u) for n, u in nodes.items()}
            delta = {
                n: [int(now[n][k] - last[n][k]) for k in NAMES] for n in nodes
            }  # [ahead, appends]
            last = now
            print("W3", i, "p50", r.get("latency_p50_ms"), "p99", r.get("latency_p99_ms"),
                  "ahead/appends per node", delta, flush=True)  # fmt: skip
finally:
    shutil.rmtree(d, ignore_errors=True)
