"""commit-1 and publish-1 against a 3-node dev cluster, py-spy on every node while they run.
usage: oc_prof.py OUTDIR [--commits N] [--no-prof]"""
import asyncio, json, os, subprocess, sys, time
sys.path.insert(0, "/work/main/benchmarks")
from cluster import Cluster
from offset_commits import commit_loop, publish_loop, fill, percentiles
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
n = int(sys.argv[sys.argv.index("--commits") + 1]) if "--commits" in sys.argv else 6000
prof = "--no-prof" not in sys.argv
with Cluster(3) as c:
    res = {}
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
        if prof:
            for nid, pid in pids.items():
                tag = "L" if nid == leader else "F"
                spies.append(subprocess.Popen(["/work/main/.venv/bin/py-spy", "record", "-p", str(pid), "-d", "12", "-r", "250", "-f", "raw", "--gil", "--nonblocking", "-o", f"{out}/{case}-{tag}-{nid}.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cpu0 = {nid: tuple(map(int, open(f"/proc/{pid}/stat").read().split(")")[1].split()[11:13])) for nid, pid in pids.items()}
        t0 = time.perf_counter()
        if case == "commit-1":
            s = asyncio.run(commit_loop(url, stream, f"c-{case}", n))
        else:
            s = asyncio.run(publish_loop(url, stream, n))
        dt = time.perf_counter() - t0
        cpu1 = {nid: tuple(map(int, open(f"/proc/{pid}/stat").read().split(")")[1].split()[11:13])) for nid, pid in pids.items()}
        for p in spies: p.wait()
        cpu = {("L" if nid == leader else "F") + nid: (round((cpu1[nid][0] - cpu0[nid][0]) * 10 / n * 1000), round((cpu1[nid][1] - cpu0[nid][1]) * 10 / n * 1000)) for nid in pids}
        res[case] = {**percentiles(s), "per_s": round(n / dt), "cpu_us_per_op": cpu}
        print(case, res[case], os.getloadavg(), flush=True)
    json.dump(res, open(f"{out}/res.json", "w"))
