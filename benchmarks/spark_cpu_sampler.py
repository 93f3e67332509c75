"""Per-process CPU of a running benchmarks/spark.py, by role, robust to processes that die.

    python benchmarks/spark_cpu_sampler.py PID LOG OUT     # PID: the benchmark's driver

Every 0.25 s: each process of PID's tree (children of every thread) with its own utime +
stime (never cutime: Spark's Python daemons are stopped while their idle workers live on, and
those workers are then reaped outside the tree, so summing cutime loses their CPU and can
even make a run's figure negative), keyed by (pid, start time). Lines appended to LOG (the
benchmark's stdout) are stamped with the time they appeared. `spark_cpu_sampler.py --report
OUT` then gives, for each run line of the log (a JSON object with `wall_s`), the CPU each role
spent in [its end - wall_s, its end], per million rows: `java` (the JVM), `driver` (this
benchmark's own Python), `worker` (pyspark.worker: the tasks, i.e. `read` and the Arrow
hand-off), `source` (python_streaming_source_runner: initialOffset, latestOffset, partitions,
commit), `sink` (python_streaming_sink_runner), and each other pyspark.sql.worker module by
name (lookup_data_sources, create_data_source, plan_data_source_read, ...: planning).
A process's CPU after its last sample (at most 0.25 s of it) is lost.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark import tree  # the process tree walk spark.py sums CPU over

TICK = 100.0


def role(pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    text = b" ".join(args).decode(errors="replace")
    if "java" in args[0].decode(errors="replace"):
        return "java"
    if "python_streaming_source_runner" in text:
        return "source"
    if "python_streaming_sink_runner" in text:
        return "sink"
    for arg in reversed(text.split()):
        if arg.startswith("pyspark.sql.worker."):
            return arg.removeprefix("pyspark.sql.worker.")  # a planner (and its daemon)
    if "pyspark.worker" in text:
        return "worker"
    return "other"


def sample(root: int, roles: dict[tuple[int, int], str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in tree(root):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        key = (p, int(fields[19]))
        if key not in roles:
            roles[key] = role(p, root)
        out[f"{p}:{fields[19]}:{roles[key]}"] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def run(root: int, log: Path, out: Path) -> None:
    roles: dict[tuple[int, int], str] = {}
    seen = 0
    with out.open("a") as sink:
        while Path(f"/proc/{root}").exists():
            now = time.time()
            record: dict[str, Any] = {"t": now, "cpu": sample(root, roles)}
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            if len(lines) > seen:
                record["lines"] = lines[seen:]
                seen = len(lines)
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            time.sleep(0.25)


def report(out: Path) -> None:
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    for i, s in enumerate(samples):
        for line in s.get("lines", []):
            if not line.startswith("{") or '"wall_s"' not in line:
                continue
            result = json.loads(line)
            end = s["t"]
            start = end - result["wall_s"]
            if start < samples[0]["t"]:
                continue  # the run began before sampling did
            before = max((x for x in samples[:i] if x["t"] <= start), key=lambda x: x["t"],
                         default=samples[0])  # fmt: skip
            last: dict[str, float] = {}
            for x in samples:
                if before["t"] <= x["t"] <= end:
                    last.update(x["cpu"])
            per_role: dict[str, float] = {}
            for key, cpu in last.items():
                delta = cpu - before["cpu"].get(key, 0.0)
                name = key.rsplit(":", 1)[1]
                per_role[name] = per_role.get(name, 0.0) + delta
            scale = 1e6 / result["rows"]
            print(json.dumps({"pipeline": result["pipeline"], "size": result["size"],
                              "total": round(sum(per_role.values()) * scale, 1),
                              **{k: round(v * scale, 1) for k, v in sorted(per_role.items())},
                              "load_1min": result.get("load_1min")}))  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(Path(sys.argv[2]))
    else:
        run(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
