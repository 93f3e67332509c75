# A measurement script kept as it was run (RESULTS §58): W1 through the gateway at 16 KiB,
# N runs on one cluster kept in DIR (logs kept), as side_by_side.py's W1 (20,000 messages).
import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs

from cluster import Cluster

d, n = Path(sys.argv[1]), int(sys.argv[2])
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=10.0, w3_only=True)
with Cluster(3, data_dir=d) as c:
    s = sbs.Spate(c)
    for i in range(n):
        r = sbs.spate_w1_w2(s, "spate-gateway", 16384, 20000, w=w, label=f"g{i}")
        rows = [(x.get("msgs_per_s"), x.get("confirm_p50_ms"), x.get("confirm_max_ms")) for x in r]
        print("RUN", i, rows, flush=True)
