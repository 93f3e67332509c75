"""CPU per row of the Spark connector alone, both directions, no Spark: what a reading task
does (`source._read`: a planned range -> Arrow record batches) and what a writing task does
(`source._write`: Arrow record batches -> a stream, exactly-once), on a one-node
`spate dev up` cluster. CPU-us per row is `time.process_time` of this process (the
connector's whole client side; the broker runs in other processes).

    .venv/bin/python benchmarks/spark_connector_cpu.py --rows 100000 [--runs 2] [--profile read]

Reads: N messages of 100 B in one partition, read with the full schema, `value` only and
`offset` only, message by message (`bulkRead=false`) and in bulk deliveries (`true`, ADR
0029). Writes: N rows of 100 B in Arrow batches of 10,000 (Spark's
`maxRecordsPerBatch`), `value` only and `value` + `key`, to a stream of 2 partitions, each run
under a new write id (producer names). To compare two versions of the connector, run the script
from each with `PYTHONPATH=<the other tree's package root>` (see benchmarks/RESULTS.md §18d).
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import os
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import spate
from spate.client import Producer
from spate.spark import broker, source
from spate.spark.options import read_options, write_options
from spate.spark.planning import Range
from support.cluster import running_cluster

FULL = ("key", "value", "stream", "partition", "offset", "timestamp", "properties",
        "application_properties")  # fmt: skip
ARROW_BATCH_ROWS = 10_000


def measure(label: str, rows_expected: int, run: int, profile_this: bool, work: object) -> None:
    profile = cProfile.Profile() if profile_this else None
    cpu, wall = time.process_time(), time.perf_counter()
    if profile:
        profile.enable()
    rows = work()  # type: ignore[operator]
    if profile:
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert rows == rows_expected, (label, rows, rows_expected)
    print(f"{label} run {run}: {rows} rows, {cpu / rows * 1e6:.2f} CPU-us/row, "
          f"{rows / wall:.0f} rows/s", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--read-modes", nargs="+", default=["false", "true"],
                        help="option bulkRead values to read with (ADR 0029; "
                             "'unset': not given, for trees without it)")  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help="reads only")
    parser.add_argument("--profile", choices=("read", "write"), help="cProfile the last run")
    args = parser.parse_args()
    print("spate from", Path(spate.__file__).parent, flush=True)
    with running_cluster(Path(tempfile.mkdtemp()) / "c", nodes=1) as cluster:
        cluster.cli("stream", "create", "rp", "--replicas", "1")
        cluster.cli("stream", "create", "wp", "--replicas", "1", "--partitions", "2")
        url = cluster.amqp_url()
        with Producer(url, "rp") as producer:
            for _ in range(0, args.rows, 1000):
                producer.send_batch([b"x" * 100] * 1000)
        reads = [
            (mode, read_options({"endpoints": url, "stream": "rp"}
                                | ({} if mode == "unset" else {"bulkRead": mode}),
                                streaming=False))
            for mode in args.read_modes
        ]  # fmt: skip
        for (mode, read), (task, names) in itertools.product(
            reads,
            (("read full", FULL), ("read value", ("value",)), ("read offset", ("offset",))),
        ):
            label = f"{task} (bulkRead={mode})"
            columns = broker.Columns(names, tuple(True for _ in names))
            for run in range(args.runs):
                part = source.SpatePartition(Range("rp", 0, 0, args.rows))

                def read_all(
                    columns: broker.Columns = columns, part: object = part, read: object = read
                ) -> int:
                    return sum(b.num_rows for b in source._read(read, columns, part))  # type: ignore[arg-type]

                last = run == args.runs - 1
                measure(label, args.rows, run, last and args.profile == "read", read_all)

        if args.no_write:
            print("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))
            return
        write = write_options({"endpoints": url, "stream": "wp"})
        values = pa.array([b"y" * 100] * ARROW_BATCH_ROWS, pa.binary())
        keys = pa.array([f"k{i % 97}" for i in range(ARROW_BATCH_ROWS)], pa.string())
        for label, columns_w in (("write value", ("value",)),
                                 ("write value+key", ("value", "key"))):  # fmt: skip
            arrays = [values] if columns_w == ("value",) else [values, keys]
            batch = pa.RecordBatch.from_arrays(arrays, names=list(columns_w))
            for run in range(args.runs):
                plan = source.WritePlan(2, columns_w, uuid.uuid4().hex[:16])

                def write_all(plan: source.WritePlan = plan, batch: pa.RecordBatch = batch) -> int:
                    batches = (batch for _ in range(args.rows // ARROW_BATCH_ROWS))
                    done = source._write(write, plan, batches, name=f"bench:{plan.write_id}:0",
                                         id_base=0)  # fmt: skip
                    return done.rows

                last = run == args.runs - 1
                measure(label, args.rows, run, last and args.profile == "write", write_all)
    print("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
