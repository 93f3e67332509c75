"""RESULTS §51: commit-1 then publish-1 (offset_commits.py's loops) on one three-node dev
cluster, with every node's user and system CPU per operation read from /proc around each loop.

    .venv/bin/python benchmarks/results/2026-11-27/q51/oc_us.py OUT [--commits N] [--no-prof]

Without --no-prof, py-spy records every node (GIL samples, 250 Hz, 12 s) during each loop into
OUT/<case>-<L|F>-<node>.txt. Writes OUT/res.json and prints one line per case.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "benchmarks"))

from offset_commits import commit_loop, fill, percentiles, publish_loop  # noqa: E402

from cluster import Cluster  # noqa: E402


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(user, system) clock ticks of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return int(fields[11]), int(fields[12])


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    n = int(sys.argv[sys.argv.index("--commits") + 1]) if "--commits" in sys.argv else 6000
    profile = "--no-prof" not in sys.argv
    tick_us = 1_000_000 / os.sysconf("SC_CLK_TCK")
    res = {}
    with Cluster(3) as c:
        for case in ("commit-1", "publish-1"):
            stream = f"p-{case}"
            c.create_stream(stream, replicas=3)
            leader = c.leaders(stream)[0]
            host, port = c.amqp(leader)
            url = f"amqp://{host}:{port}"
            pids = {nid: int(c.node(nid)["pid"]) for nid in c.node_ids()}
            if case == "commit-1":
                asyncio.run(fill(url, stream, n))
            spies = []
            if profile:
                for nid, pid in pids.items():
                    tag = "L" if nid == leader else "F"
                    spy = [str(REPO / ".venv" / "bin" / "py-spy"), "record", "-p", str(pid)]
                    spy += ["-d", "12", "-r", "250", "-f", "raw", "--gil", "--nonblocking"]
                    spy += ["-o", str(out / f"{case}-{tag}-{nid}.txt")]
                    spies.append(subprocess.Popen(spy, stdout=subprocess.DEVNULL))
            before = {nid: cpu_ticks(pid) for nid, pid in pids.items()}
            started = time.perf_counter()
            if case == "commit-1":
                samples = asyncio.run(commit_loop(url, stream, f"c-{case}", n))
            else:
                samples = asyncio.run(publish_loop(url, stream, n))
            took = time.perf_counter() - started
            after = {nid: cpu_ticks(pid) for nid, pid in pids.items()}
            for spy_process in spies:
                spy_process.wait()
            cpu = {
                ("L" if nid == leader else "F") + nid: tuple(
                    round((after[nid][i] - before[nid][i]) * tick_us / n) for i in (0, 1)
                )
                for nid in pids
            }
            res[case] = {**percentiles(samples), "per_s": round(n / took), "cpu_us_per_op": cpu}
            print(case, res[case], os.getloadavg(), flush=True)
    (out / "res.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
