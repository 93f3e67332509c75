"""Format `spate_timed` for benchmarks/spark.py: the `spate` source, each reading task timed.

The connector's own streaming reader, unchanged, with its `read` wrapped: for each batch the
task yields, how long `next()` on the connector's generator took (wall), how much of that this
thread was on a CPU and how much it waited in the run queue (/proc/thread-self/schedstat), and
how long Spark kept the batch before asking for the next one (wall, the generator suspended:
Spark's Python worker sending the batch to the JVM). Inside `next()`,

    blocked = wall - on CPU - run-queue wait

is time the task sat with nothing to do: its link had no delivery to hand over, i.e. it was
waiting on the broker (credit or flow). The first `next()` includes connecting and attaching,
the last one (StopIteration) closing.

Options besides the connector's: `_stats` (a file: one JSON line per task is appended) and
`_capture` (a directory: each task writes its batches for format `spate_null`, see
benchmarks/spark_null.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import spark_null
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType
from spate.spark.options import read_options
from spate.spark.source import SpateDataSource, SpatePartition, SpateStreamReader, _columns


def _sched() -> tuple[float, float]:
    """This thread's time on a CPU and waiting in a run queue so far, seconds."""
    on, queued, _ = Path("/proc/thread-self/schedstat").read_text().split()
    return int(on) / 1e9, int(queued) / 1e9


class TimedDataSource(SpateDataSource):
    @classmethod
    def name(cls) -> str:
        return "spate_timed"

    def streamReader(self, schema: StructType) -> TimedStreamReader:
        options = {str(k): str(v) for k, v in self.options.items()}
        stats = options.pop("_stats")
        capture = options.pop("_capture", None)
        reader = TimedStreamReader(read_options(options, streaming=True), _columns(schema))
        reader.stats_path, reader.capture = stats, capture
        return reader


class TimedStreamReader(SpateStreamReader):
    stats_path: str
    capture: str | None

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpatePartition), partition
        return self._timed(super().read(partition), partition)

    def _timed(
        self, inner: Iterator[pa.RecordBatch], partition: SpatePartition
    ) -> Iterator[pa.RecordBatch]:
        r = partition.range
        batches: list[list[float]] = []
        """Per next(): rows, wall, on CPU, run-queue wait (s), then Spark's wall (s)."""
        kept: list[pa.RecordBatch] = []
        began = time.perf_counter()
        try:
            while True:
                w0, (c0, q0) = time.perf_counter(), _sched()
                try:
                    batch = next(inner)
                except StopIteration:
                    w1, (c1, q1) = time.perf_counter(), _sched()
                    batches.append([0, w1 - w0, c1 - c0, q1 - q0, 0.0])
                    break
                w1, (c1, q1) = time.perf_counter(), _sched()
                entry = [batch.num_rows, w1 - w0, c1 - c0, q1 - q0, 0.0]
                batches.append(entry)
                if self.capture is not None:
                    kept.append(batch)
                yield batch
                entry[4] = time.perf_counter() - w1
        finally:
            record: dict[str, Any] = {
                "stream": r.stream, "partition": r.partition, "start": r.start, "end": r.end,
                "pid": os.getpid(), "wall": time.perf_counter() - began,
                "credit": self.options.credit, "batches": batches,
            }  # fmt: skip
            with open(self.stats_path, "a") as out:
                out.write(json.dumps(record) + "\n")
            if self.capture is not None and kept:
                spark_null.write_partition(Path(self.capture), r.partition, kept)
