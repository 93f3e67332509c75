# A measurement script kept as it was run (RESULTS §58): W1 straight to the leader, cluster
# kept in DIR; with stall-timer.patch applied to the tree on PYTHONPATH (SLICE=bytes) the
# leader logs its slices' wall times (TRACE lines in DIR/n*/node.log).
import shutil
import sys
from pathlib import Path

sys.path.insert(0, "/work/main/benchmarks")
from loadclient import build_client, run_client

from cluster import Cluster

size, count, d = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
shutil.rmtree(d, ignore_errors=True)
binary = build_client()
with Cluster(3, data_dir=d) as c:
    c.create_stream("w1", replicas=3)
    leader = c.leaders("w1")[0]
    host, port = c.amqp(leader)
    args = ["--host", host, "--port", port, "--address", "w1", "--count", str(count)]
    args += ["--size", str(size), "--window", "10000"]
    r = run_client(binary, "publish", args, 600)
    print("rate", r.get("msgs_per_s"))
