"""A null Python data source for benchmarks/spark.py: format `spate_null`, no broker behind it.

It yields exactly the Arrow record batches a `spate` read produced — captured from one by
benchmarks/spark.py into Arrow IPC files, one per stream partition, then loaded once per Python
worker and kept in memory — through the same Spark machinery: a Python streaming source
(`DataSourceStreamReader` + `SupportsTriggerAvailableNow`), one input partition per stream
partition, one micro-batch under `Trigger.AvailableNow`, Kafka-style offsets
`{"bench-in": {"0": 100000, ...}}`. So a query over it costs what Spark's Python Data Source
path costs for those batches and nothing else: `spate - null` is the connector's whole share
(its reader, planning, offsets, a connection per task, its imports) and `null - parquet` is
Spark's.

Options:
  path    a directory written by `write_partition` and `write_index`: `index.json`
          ({"stream": s, "partitions": {"0": rows, ...}}) and `<partition>.arrow` (the
          batches, in order)
  tuples  `true`: yield the same rows as Python tuples (Spark's row path: it converts them
          to Arrow itself, `spark.sql.execution.arrow.maxRecordsPerBatch` rows at a time)

The module imports only pyspark and pyarrow, so a null query's Python workers load nothing the
connector brings. benchmarks/spark.py puts this directory on the workers' PYTHONPATH.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

_TEXT_MAP = MapType(StringType(), StringType(), valueContainsNull=True)
SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("stream", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("properties", _TEXT_MAP, True),
        StructField("application_properties", _TEXT_MAP, True),
    ]
)
"""The connector's schema (spate.spark.source.SCHEMA; benchmarks/spark.py checks they match)."""

_LOADED: dict[tuple[str, int, bool], list[Any]] = {}
"""Per Python worker: (path, partition, tuples) -> the batches (or rows), loaded once."""


def write_partition(path: Path, partition: int, batches: list[pa.RecordBatch]) -> None:
    """One stream partition's batches, in order, as a spate read yielded them."""
    path.mkdir(parents=True, exist_ok=True)
    with (
        pa.OSFile(str(path / f"{partition}.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, batches[0].schema) as writer,
    ):
        for batch in batches:
            writer.write_batch(batch)


def write_index(path: Path, stream: str, rows: dict[int, int]) -> None:
    """The stream's name and each captured partition's row count."""
    index = {"stream": stream, "partitions": {str(p): n for p, n in sorted(rows.items())}}
    (path / "index.json").write_text(json.dumps(index))


def _load(path: str, partition: int, tuples: bool) -> list[Any]:
    key = (path, partition, tuples)
    got = _LOADED.get(key)
    if got is None:
        with pa.memory_map(str(Path(path) / f"{partition}.arrow")) as source:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        # copy out of the mapping: in memory, as a read's batches are
        got = [pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in b.columns],
                                          schema=b.schema) for b in batches]  # fmt: skip
        if tuples:
            got = [row for b in got for row in zip(*(c.to_pylist() for c in b.columns),
                                                   strict=True)]  # fmt: skip
        _LOADED[key] = got
    return got


class NullPartition(InputPartition):
    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__(partition)
        self.partition, self.start, self.end = partition, start, end


class NullDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "spate_null"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> NullStreamReader:
        if schema != SCHEMA:
            raise ValueError("spate_null yields the connector's full schema only")
        return NullStreamReader(self.options["path"], self.options.get("tuples") == "true")


class NullStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, path: str, tuples: bool) -> None:
        index = json.loads((Path(path) / "index.json").read_text())
        self.path, self.tuples, self.stream = path, tuples, index["stream"]
        self.ends = {int(p): int(n) for p, n in index["partitions"].items()}

    def _json(self, offsets: dict[int, int]) -> dict[str, dict[str, int]]:
        return {self.stream: {str(p): n for p, n in sorted(offsets.items())}}

    def initialOffset(self) -> dict[str, dict[str, int]]:
        return self._json(dict.fromkeys(self.ends, 0))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def reportLatestOffset(self) -> dict[str, dict[str, int]]:
        return self._json(self.ends)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        return self._json(self.ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[NullPartition]:
        begin, stop = start[self.stream], end[self.stream]
        return [
            NullPartition(int(p), int(begin[p]), int(stop[p]))
            for p in sorted(stop, key=int)
            if int(stop[p]) > int(begin[p])
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NullPartition), partition
        if (partition.start, partition.end) != (0, self.ends[partition.partition]):
            raise ValueError("spate_null replays whole captured partitions only")
        return iter(_load(self.path, partition.partition, self.tuples))

    def commit(self, end: dict[str, Any]) -> None:
        return None
