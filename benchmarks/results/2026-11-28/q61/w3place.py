# A measurement script kept as it was run (RESULTS §61): W3 (side_by_side.py's: 5,000 msg/s of
# 100 B for --duration s) on one cluster, the consumer on the partition's leader and on a
# follower alternately (the producer at the leader both times: at a follower it is redirected),
# PAIRS pairs, the order swapped every pair. The nodes inherit this process's environment
# (e.g. SPATE_SYNC_INLINE_BYTES_MAX, SPATE_SYNC_TRACE). One JSON line per run on stdout.
# Usage: w3place.py DIR PAIRS [DURATION]
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs

from cluster import Cluster

d, pairs = Path(sys.argv[1]), int(sys.argv[2])
duration = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=duration, w3_only=True)
env = {k: v for k, v in os.environ.items() if k.startswith("SPATE_") and k != "SPATE_DEV_PORTS"}
try:
    with Cluster(3, data_dir=d) as c:
        s = sbs.Spate(c)
        for i in range(pairs):
            for where in ("leader", "follower") if i % 2 == 0 else ("follower", "leader"):
                r = sbs.spate_w3(s, where, w, f"{where}{i}")
                p = r.get("producer") or {}
                row = {
                    "pair": i,
                    "consumer_on": where,
                    "e2e_p50_ms": r.get("e2e_p50_ms"),
                    "e2e_p99_ms": r.get("e2e_p99_ms"),
                    "confirm_p50_ms": p.get("confirm_p50_ms"),
                    "confirm_p99_ms": p.get("confirm_p99_ms"),
                    "received": r.get("received"),
                    "producer_endpoint": p.get("endpoint"),
                    "consumer_endpoint": r.get("endpoint"),
                    "loadavg": r.get("loadavg"),
                    "env": env,
                    "error": r.get("error"),
                }
                print(json.dumps(row), flush=True)
finally:
    shutil.rmtree(d, ignore_errors=True)
