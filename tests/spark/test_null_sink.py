"""The null sink of benchmarks/spark_null.py (format `spate_null`), which splits a write's cost
(benchmarks/RESULTS.md §35): counting only, or doing all the connector's writer does before the
client — rows encoded, routed and cut into sub-entries exactly as a real write cuts them — and
sending nothing. Directly, then through Spark's batch and streaming writer paths."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from spate.core.superstreams import hash_partition
from spate.spark import limits
from support.spark import run_available_now

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import spark_null

pytestmark = pytest.mark.spark

KEYS = [None if i % 5 == 0 else f"k{i % 7}" for i in range(2_500)]


def rows_batches() -> list[pa.RecordBatch]:
    values = pa.array([b"v%d" % i for i in range(len(KEYS))], pa.binary())
    batch = pa.RecordBatch.from_arrays([values, pa.array(KEYS, pa.string())], ["value", "key"])
    return [batch.slice(0, 1_200), batch.slice(1_200)]  # Spark's batches play no part


def test_null_sink_cuts_what_the_writer_cuts_and_sends_nothing() -> None:
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    schema = StructType([StructField("value", BinaryType()), StructField("key", StringType())])
    sink = spark_null.NullSink.of({"encode": "true", "partitions": "3"}, schema)
    done = sink.write(iter(rows_batches()), 0)
    assert done.rows == len(KEYS)
    # one sub-entry per (grid cell of rows_per_sub_entry rows, destination partition): keyed
    # rows by the key's hash, the others spread from the task's Spark partition (0)
    cells = {
        (i // limits.rows_per_sub_entry, hash_partition(k, 3) if k is not None else i % 3)
        for i, k in enumerate(KEYS)
    }
    assert done.chunks == len(cells)
    counted = spark_null.NullSink.of({"encode": "false"}, schema).write(iter(rows_batches()), 0)
    assert (counted.rows, counted.chunks) == (len(KEYS), 0)


def test_null_sink_through_spark_batch_and_streaming(spark: Any, tmp_path: Path) -> None:
    spark.dataSource.register(spark_null.NullDataSource)
    df = spark.createDataFrame(
        [(b"v%d" % i, k) for i, k in enumerate(KEYS)], "value BINARY, key STRING"
    ).repartition(2)
    files = tmp_path / "in"
    df.write.parquet(str(files))
    report = tmp_path / "report.jsonl"
    for encode in ("false", "true"):
        (
            spark.read.parquet(str(files))
            .write.format("spate_null")
            .option("encode", encode)
            .option("report", str(report))
            .mode("append")
            .save()
        )
    query = run_available_now(
        lambda: (
            spark.readStream.schema(df.schema)
            .parquet(str(files))
            .writeStream.format("spate_null")
            .option("encode", "true")
            .option("report", str(report))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
    )
    assert query.exception() is None
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert [line["rows"] for line in lines] == [len(KEYS)] * 3
    assert lines[0]["chunks"] == 0 and lines[1]["chunks"] > 0 and lines[2]["chunks"] > 0
