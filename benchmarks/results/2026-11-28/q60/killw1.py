# A measurement script kept as it was run (RESULTS §60): a leader SIGKILLed under W1 at SIZE
# straight to it, KILLS times (a fresh one-partition, three-replica stream each), and the
# segment transfers the nodes' logs show after each (a new leader whose cache lacks what the
# third replica needs sends one; ADR 0049 left a follower 4 MiB). The killed node is restarted
# (`spate dev up`) before the next kill. Usage: killw1.py DIR KILLS SIZE COUNT
import argparse
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs
import workload

from cluster import Cluster

d, kills, size, count = Path(sys.argv[1]), *(int(x) for x in sys.argv[2:5])
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=10.0, w3_only=True)


def transfers(c: Cluster) -> int:
    return sum(
        (d / n / "node.log").read_text(errors="replace").count("by segment transfer")
        for n in c.node_ids()
    )


try:
    with Cluster(3, data_dir=d) as c:
        s = sbs.Spate(c)
        total = 0
        for k in range(kills):
            name = f"kw{k}"
            leader = s.fresh(name)
            if c.node(leader).get("admin") == c.admin:
                print("SKIP", k, "led by the node whose admin API this script calls", flush=True)
                continue
            before = transfers(c)
            target = s.node(leader)
            wl = sbs._wl(name, size, count, w, f"k{k}")
            t = threading.Thread(target=workload.w1, args=(s.binary, target, wl), daemon=True)
            t.start()
            time.sleep(2.5)
            os.kill(int(c.node(leader)["pid"]), signal.SIGKILL)
            t.join(60)
            deadline = time.monotonic() + 60
            while (new := c.leaders(name, timeout_s=60)[0]) == leader:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: still led by the killed {leader}")
                time.sleep(0.5)
            time.sleep(5)
            got = transfers(c) - before
            total += got
            print("KILL", k, "leader", leader, "new", new, "transfers", got, flush=True)
            c.up()
            c.leaders(name, timeout_s=60)
            time.sleep(3)
        print("TOTAL transfers", total, "in", kills, "kills", flush=True)
finally:
    shutil.rmtree(d, ignore_errors=True)
