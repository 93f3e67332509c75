"""CPU per row of the Spark connector's reader alone (RangeReader -> Arrow record batches, no
Spark): a one-node `spate dev up` cluster, N messages of 100 B in one partition, read three ways
(the full schema, `value` only, `offset` only), each twice; prints CPU-us per row
(`time.process_time` of this process: the connector's whole client side) and rows/s.

    .venv/bin/python benchmarks/spark_reader_cpu.py --rows 100000 [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from spate.client import Producer
from spate.spark import broker, source
from spate.spark.options import Connection
from spate.spark.planning import Range
from support.cluster import running_cluster

FULL = ("key", "value", "stream", "partition", "offset", "timestamp", "properties",
        "application_properties")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true", help="cProfile the second run")
    args = parser.parse_args()
    with running_cluster(Path(tempfile.mkdtemp()) / "c", nodes=1) as cluster:
        cluster.cli("stream", "create", "rp", "--replicas", "1")
        url = cluster.amqp_url()
        with Producer(url, "rp") as producer:
            for _ in range(0, args.rows, 1000):
                producer.send_batch([b"x" * 100] * 1000)
        connection = Connection((url,), None, None, 30.0)
        for label, names in (("full", FULL), ("value", ("value",)), ("offset", ("offset",))):
            columns = broker.Columns(names, tuple(True for _ in names))
            schema = source._arrow_schema(columns)

            def make(
                data: dict[str, list[Any]], names: tuple[str, ...] = names, schema: Any = schema
            ) -> Any:
                arrays = [pa.array(data[n], type=schema.field(n).type) for n in names]
                return pa.RecordBatch.from_arrays(arrays, schema=schema)

            for run in range(2):
                reader = broker.RangeReader(
                    connection, Range("rp", 0, 0, args.rows), columns, credit=10_000,
                    fail_on_data_loss=True,
                )  # fmt: skip
                profile = cProfile.Profile() if args.profile and run == 1 else None
                cpu, wall, rows = time.process_time(), time.perf_counter(), 0
                if profile:
                    profile.enable()
                for batch in reader.batches(make):
                    rows += batch.num_rows
                if profile:
                    profile.disable()
                    pstats.Stats(profile).sort_stats("tottime").print_stats(14)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                print(f"{label}: {rows} rows, {cpu / rows * 1e6:.2f} CPU-us/row, "
                      f"{rows / wall:.0f} rows/s", flush=True)  # fmt: skip
    print("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
