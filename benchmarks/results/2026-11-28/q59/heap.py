# A measurement script kept as it was run (RESULTS §59): N W1 runs through the gateway at SIZE
# on one cluster, then the gateway's malloc in use and kept (glibc's malloc_stats, called with
# gdb, printed to the gateway's log), its RSS at once and after WAIT seconds of quiet (the idle
# trim, ADR 0048), and, unless --no-trim-call, after a malloc_trim(0) called with gdb.
# Usage: heap.py DIR N SIZE WAIT [--no-trim-call]
import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs

from cluster import Cluster


def rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


def gdb(pid: int, call: str) -> None:
    subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", call], capture_output=True, check=False)


d, n, size, wait = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=10.0, w3_only=True)
with Cluster(3, data_dir=d) as c:
    s = sbs.Spate(c)
    gpid = int(s.gateway["pid"])
    for i in range(n):
        r = sbs.spate_w1_w2(s, "spate-gateway", size, 20000, w=w, label=f"g{i}")
        print(
            "RUN", i, r[0].get("msgs_per_s"), r[0].get("confirm_p50_ms"), rss_mib(gpid), flush=True
        )
    print("RSS at once", rss_mib(gpid), flush=True)
    gdb(gpid, "call (void)malloc_stats()")
    time.sleep(1)
    log = (d / "g1" / "node.log").read_text()
    total = log[log.rindex("Total (incl. mmap)") :]
    system, in_use = re.findall(r"= +(\d+)", total)[:2]
    print("MALLOC system MiB", int(system) >> 20, "in use MiB", int(in_use) >> 20, flush=True)
    time.sleep(wait)
    print(f"RSS after {wait:.0f} s quiet", rss_mib(gpid), flush=True)
    log = (d / "g1" / "node.log").read_text()
    print("LOG", [x for x in log.splitlines() if "free heap given back" in x][-1:], flush=True)
    if "--no-trim-call" not in sys.argv:
        gdb(gpid, "call (int)malloc_trim(0)")
        print("RSS after malloc_trim(0)", rss_mib(gpid), flush=True)
shutil.rmtree(d, ignore_errors=True)
