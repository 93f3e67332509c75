# A measurement script kept as it was run (RESULTS §60): N W1 runs at SIZE straight to a node
# (side_by_side.py's W1, a new stream each) on one three-node cluster in DIR; after each run the
# nodes' RSS and, where the build exports it, spate_replication_log_cache_bytes; then the same
# after WAIT s idle. The build under test is whatever `spate` imports (PYTHONPATH for an old one).
# With TRIM (any 6th argument), the nodes are then made to call malloc_trim(0) through gdb and
# their RSS printed again: what an idle trim in the nodes would give back.
# Usage: cachemem.py DIR N SIZE COUNT WAIT [TRIM]
import argparse
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs

from cluster import Cluster


def rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


def cache_mib(url: str) -> float | None:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    m = re.search(r"^spate_replication_log_cache_bytes\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return None if m is None else round(float(m.group(1)) / 2**20, 1)


d, n, size, count, wait = Path(sys.argv[1]), *(int(x) for x in sys.argv[2:6])
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=10.0, w3_only=True)
try:
    with Cluster(3, data_dir=d) as c:
        s = sbs.Spate(c)
        nodes = c.endpoints["nodes"]

        def report(what: str) -> None:
            rss = [rss_mib(int(node["pid"])) for node in nodes]
            caches = [cache_mib(str(node["metrics"])) for node in nodes]
            print(what, "nodes rss MiB", rss, "log cache MiB", caches, flush=True)

        report("START")
        for i in range(n):
            r = sbs.spate_w1_w2(s, "spate-direct", size, count, w=w, label=f"c{i}")
            rows = [(x.get("msgs_per_s"), x.get("confirm_p50_ms")) for x in r]
            report(f"RUN {i} {rows}")
        time.sleep(wait)
        report(f"IDLE {wait}s")
        if len(sys.argv) > 6:
            for node in nodes:
                call = ["gdb", "-p", str(node["pid"]), "-batch", "-ex", "call (int)malloc_trim(0)"]
                subprocess.run(call, capture_output=True, timeout=120, check=False)
            report("TRIMMED")
finally:
    shutil.rmtree(d, ignore_errors=True)
