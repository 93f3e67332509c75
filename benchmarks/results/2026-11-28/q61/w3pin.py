# A measurement script kept as it was run (RESULTS §61): W3 with the consumer on a follower
# (w3place.py's), the node processes pinned (every thread) so that the reader's follower has a
# core of its own: the leader and the other follower on CPU 0, the reader's follower on CPU 1
# (the clients unpinned). Does ADR 0050's slower confirm in follower runs come from the reader's
# follower competing with the leader for the same cores? RUNS runs on one cluster.
# Usage: w3pin.py DIR RUNS [DURATION]
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs
import workload

from cluster import Cluster


def pin(pid: int, cpu: int) -> None:
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), {cpu})


d, runs = Path(sys.argv[1]), int(sys.argv[2])
duration = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=duration, w3_only=True)
env = {k: v for k, v in os.environ.items() if k.startswith("SPATE_") and k != "SPATE_DEV_PORTS"}
try:
    with Cluster(3, data_dir=d) as c:
        s = sbs.Spate(c)
        pids = {str(n["node_id"]): int(n["pid"]) for n in c.endpoints["nodes"]}
        for i in range(runs):
            base = s.next_name("pin-w3-")
            leader = s.fresh(f"{base}-e2e")
            reader = s.follower(leader)
            for node, pid in pids.items():
                pin(pid, 1 if node == reader else 0)
            r = workload.w3(s.binary, s.node(reader), sbs._wl(base, sbs.W3_SIZE, 0, w, f"pin{i}"))
            p = r.get("producer") or {}
            print(json.dumps({
                "run": i, "consumer_on": "follower", "pinned": True,
                "e2e_p50_ms": r.get("e2e_p50_ms"), "e2e_p99_ms": r.get("e2e_p99_ms"),
                "confirm_p50_ms": p.get("confirm_p50_ms"),
                "confirm_p99_ms": p.get("confirm_p99_ms"),
                "received": r.get("received"), "loadavg": r.get("loadavg"), "env": env,
                "error": r.get("error"),
            }), flush=True)  # fmt: skip
finally:
    shutil.rmtree(d, ignore_errors=True)
