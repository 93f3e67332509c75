# A measurement script kept as it was run (RESULTS §60): the cost of the Raft log cache's rules
# for a follower that falls behind. N one-partition, three-replica streams on one cluster in
# DIR; the third node stopped (SIGSTOP); each stream then takes one burst (COUNT x SIZE) through
# its leader; the live nodes' RSS and log cache printed; the node continued (SIGCONT) and the
# time until its replicas' last indexes equal the leaders', with the segment transfers its
# log shows. The build under test is whatever `spate` imports (PYTHONPATH for an old one).
# Usage: cachedown.py DIR N SIZE COUNT
import argparse
import os
import re
import shutil
import signal
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
import side_by_side as sbs
import workload

from cluster import Cluster


def rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


def metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def gauge(text: str, name: str) -> float | None:
    m = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    return None if m is None else float(m.group(1))


def last_indexes(text: str) -> dict[str, float]:
    out = {}
    for m in re.finditer(r"^spate_partition_last_index\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        stream = re.search(r'stream="([^"]*)"', m.group(1))
        if stream:
            out[stream.group(1)] = float(m.group(2))
    return out


d, n, size, count = Path(sys.argv[1]), *(int(x) for x in sys.argv[2:5])
shutil.rmtree(d, ignore_errors=True)
w = argparse.Namespace(duration=10.0, w3_only=True)
try:
    with Cluster(3, data_dir=d) as c:
        s = sbs.Spate(c)
        nodes = {str(x["node_id"]): x for x in c.endpoints["nodes"]}
        down = c.node_ids()[2]
        live = [x for x in nodes if x != down]
        streams = [f"cd{i}" for i in range(n)]
        for name in streams:
            s.fresh(name)
        os.kill(int(nodes[down]["pid"]), signal.SIGSTOP)
        print("STOPPED", down, flush=True)
        time.sleep(6)
        started = time.monotonic()
        for i, name in enumerate(streams):
            leader = c.leaders(name, timeout_s=120)[0]
            wl = sbs._wl(name, size, count, w, f"d{i}")
            r = workload.w1(s.binary, s.node(leader), wl)
            print("BURST", name, leader, r.get("msgs_per_s"), r.get("confirm_p50_ms"), flush=True)
        print(f"BURSTS done in {time.monotonic() - started:.1f} s", flush=True)
        for what in ("AFTER", "AFTER 3s"):
            texts = {x: metrics(str(nodes[x]["metrics"])) for x in live}
            print(
                what,
                "rss MiB", [rss_mib(int(nodes[x]["pid"])) for x in live],
                "log cache B", [gauge(texts[x], "spate_replication_log_cache_bytes") for x in live],
                "trims", [gauge(texts[x], "spate_replication_log_cache_trims_total") for x in live],
                flush=True,
            )  # fmt: skip
            time.sleep(3)
        targets: dict[str, float] = {}
        for x in live:
            for stream, index in last_indexes(metrics(str(nodes[x]["metrics"]))).items():
                targets[stream] = max(targets.get(stream, 0), index)
        os.kill(int(nodes[down]["pid"]), signal.SIGCONT)
        resumed = time.monotonic()
        behind = set(streams)
        while behind and time.monotonic() - resumed < 300:
            got = last_indexes(metrics(str(nodes[down]["metrics"])))
            behind = {x for x in behind if got.get(x, 0) < targets[x]}
            time.sleep(0.2)
        log = (d / down / "node.log").read_text(errors="replace")
        print(
            f"CAUGHT UP {n - len(behind)}/{n} in {time.monotonic() - resumed:.1f} s;",
            "segment transfers", log.count("by segment transfer"),
            "rss MiB", {x: rss_mib(int(v["pid"])) for x, v in nodes.items()},
            flush=True,
        )  # fmt: skip
finally:
    shutil.rmtree(d, ignore_errors=True)
