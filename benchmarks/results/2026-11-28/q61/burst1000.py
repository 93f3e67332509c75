# A measurement script kept as it was run (RESULTS §61): one stream of PARTS partitions (3
# replicas) on a three-node cluster with its gateway; idle cost per node (CPU over 30 s, RSS,
# fds, Raft log cache), then a burst through the gateway (amqp_load publish --group-keys: each
# message hashed to a partition, COUNT messages of SIZE bytes, ~COUNT/PARTS per partition), then
# the same figures right after and after WAIT s idle; then HOT partitions (1%) under a light
# load (amqp_load publish at RATE msg/s to each, one process per hot partition) while measured.
# Usage: burst1000.py DIR PARTS COUNT SIZE WAIT [HOT RATE]
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

CPU_WINDOW_S = 30.0


def proc_stat(pid: int) -> tuple[int, int, int]:
    """(utime+stime ticks, RSS MiB, open fds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    with open(f"/proc/{pid}/status") as status:
        rss = next(int(x.split()[1]) for x in status if x.startswith("VmRSS")) // 1024
    return ticks, rss, len(os.listdir(f"/proc/{pid}/fd"))


def gauge(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url, timeout=20) as response:
        text = response.read().decode()
    m = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", text, re.M)
    return None if m is None else float(m.group(1))


def measure(what: str, nodes: list[dict]) -> None:
    pids = [int(n["pid"]) for n in nodes]
    before = [proc_stat(p) for p in pids]
    t0 = time.monotonic()
    time.sleep(CPU_WINDOW_S)
    after = [proc_stat(p) for p in pids]
    dt = time.monotonic() - t0
    hz = os.sysconf("SC_CLK_TCK")
    cpu = [round(100 * (a[0] - b[0]) / hz / dt, 1) for a, b in zip(after, before, strict=True)]
    cache = []
    for n in nodes:
        v = gauge(str(n["metrics"]), "spate_replication_log_cache_bytes")
        cache.append(None if v is None else round(v / 2**20, 1))
    print(
        json.dumps(
            {
                "what": what,
                "cpu_pct_of_a_core": cpu,
                "rss_mib": [a[1] for a in after],
                "fds": [a[2] for a in after],
                "log_cache_mib": cache,
                "load": Path("/proc/loadavg").read_text().split()[:3],
            }
        ),
        flush=True,
    )


d, parts, count, size, wait = Path(sys.argv[1]), *(int(x) for x in sys.argv[2:6])
hot, rate = (int(sys.argv[6]), int(sys.argv[7])) if len(sys.argv) > 7 else (0, 0)
shutil.rmtree(d, ignore_errors=True)
binary = build_client()
try:
    with Cluster(3, data_dir=d) as c:
        nodes = c.endpoints["nodes"]
        gw = c.endpoints["gateways"][0]["amqp"]
        host, port = gw.rsplit(":", 1)
        t = time.monotonic()
        c.create_stream("burst", 3, parts)
        c.leaders("burst", timeout_s=900)
        print(json.dumps({"leaders_after_s": round(time.monotonic() - t, 1)}), flush=True)
        time.sleep(20)
        measure("idle before the burst", nodes)
        args = [
            str(binary),
            "publish",
            "--host",
            host,
            "--port",
            port,
            "--address",
            "burst",
            "--count",
            str(count),
            "--size",
            str(size),
            "--group-keys",
            "--timeout",
            "900",
        ]
        done = subprocess.run(args, capture_output=True, text=True, timeout=1000, check=False)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps({"burst": {k: r.get(k) for k in ("confirmed", "msgs_per_s",
              "confirm_p50_ms", "confirm_p99_ms", "error")}}), flush=True)  # fmt: skip
        measure("right after the burst", nodes)
        time.sleep(wait)
        measure(f"idle {wait} s after", nodes)
        if hot:
            procs = []
            for p in range(hot):
                a = [str(binary), "publish", "--host", host, "--port", port, "--address",
                     "burst", "--partition", str(p * (parts // hot)), "--rate", str(rate),
                     "--duration", "100", "--size", "100", "--timeout", "200"]  # fmt: skip
                procs.append(subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
            time.sleep(15)
            measure(f"{hot} partitions at {rate} msg/s each", nodes)
            for proc in procs:
                out, _ = proc.communicate(timeout=300)
                last = json.loads(out.decode().strip().splitlines()[-1])
                if last.get("error") or last.get("confirmed") != last.get("count"):
                    print(json.dumps({"hot_error": last}), flush=True)
finally:
    shutil.rmtree(d, ignore_errors=True)
