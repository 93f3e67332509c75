# A measurement script kept as it was run (RESULTS §61): one stream of PARTS partitions (3
# replicas) on a three-node cluster with its gateway, then COUNT messages of SIZE bytes through
# the gateway (amqp_load publish --group-keys --window WINDOW: each message hashed to a
# partition). During the burst: CPU of each node and of the gateway (utime + stime), and per
# node the counters below (driver batches, fsyncs, Appends sent, leader changes seen by its
# replicas), as deltas over the burst.
# Usage: burstdiag.py DIR PARTS COUNT SIZE WINDOW
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
from loadclient import build_client

from cluster import Cluster

COUNTERS = (
    "spate_replication_batches_total",
    "spate_replication_fsyncs_total",
    "spate_replication_appends_sent_total",
    "spate_partition_leader_changes_total",
)


def ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    out = {}
    for name in COUNTERS:
        out[name] = sum(
            float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", text, re.M)
        )
    return out


d, parts, count, size, window = Path(sys.argv[1]), *(int(x) for x in sys.argv[2:6])
shutil.rmtree(d, ignore_errors=True)
binary = build_client()
try:
    with Cluster(3, data_dir=d) as c:
        nodes = c.endpoints["nodes"]
        gw = c.endpoints["gateways"][0]
        host, port = gw["amqp"].rsplit(":", 1)
        c.create_stream("burst", 3, parts)
        c.leaders("burst", timeout_s=900)
        time.sleep(10)
        pids = [int(n["pid"]) for n in nodes] + [int(gw["pid"])]
        before_cpu = [ticks(p) for p in pids]
        before = [counters(str(n["metrics"])) for n in nodes]
        t0 = time.monotonic()
        args = [str(binary), "publish", "--host", host, "--port", port, "--address", "burst",
                "--count", str(count), "--size", str(size), "--window", str(window),
                "--group-keys", "--timeout", "900"]  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, timeout=1000, check=False)
        dt = time.monotonic() - t0
        after_cpu = [ticks(p) for p in pids]
        after = [counters(str(n["metrics"])) for n in nodes]
        hz = os.sysconf("SC_CLK_TCK")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            json.dumps(
                {
                    "parts": parts, "count": count, "size": size, "window": window,
                    "seconds": round(dt, 1),
                    "burst": {k: r.get(k) for k in ("confirmed", "msgs_per_s", "confirm_p50_ms",
                                                    "confirm_p99_ms", "error")},
                    "cpu_pct_of_a_core": {
                        "nodes": [round(100 * (a - b) / hz / dt, 1)
                                  for a, b in zip(after_cpu[:3], before_cpu[:3], strict=True)],
                        "gateway": round(100 * (after_cpu[3] - before_cpu[3]) / hz / dt, 1),
                    },
                    "per_node": [{k.replace("spate_", ""): int(a[k] - b[k]) for k in COUNTERS}
                                 for a, b in zip(after, before, strict=True)],
                    "load": Path("/proc/loadavg").read_text().split()[:3],
                }
            ),
            flush=True,
        )  # fmt: skip
finally:
    shutil.rmtree(d, ignore_errors=True)
