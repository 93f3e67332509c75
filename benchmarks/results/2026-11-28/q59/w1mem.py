# A measurement script kept as it was run (RESULTS §59): N W1 runs (side_by_side.py's W1) on one
# three-node cluster in DIR, printing msg/s, confirm p50 and max, and the gateway's and nodes'
# RSS after each run. Usage: w1mem.py DIR N SYSTEM SIZE [COUNT]
import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs

from cluster import Cluster


def rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


d, n = Path(sys.argv[1]), int(sys.argv[2])
system, size = sys.argv[3], int(sys.argv[4])
count = int(sys.argv[5]) if len(sys.argv) > 5 else 20000
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=10.0, w3_only=True)
with Cluster(3, data_dir=d) as c:
    s = sbs.Spate(c)
    gpid = int(s.gateway["pid"])
    for i in range(n):
        r = sbs.spate_w1_w2(s, system, size, count, w=w, label=f"g{i}")
        rows = [(x.get("msgs_per_s"), x.get("confirm_p50_ms"), x.get("confirm_max_ms")) for x in r]
        nodes = [rss_mib(int(node["pid"])) for node in c.endpoints["nodes"]]
        print("RUN", i, rows, "gw rss MiB", rss_mib(gpid), "nodes", nodes, flush=True)
shutil.rmtree(d, ignore_errors=True)
