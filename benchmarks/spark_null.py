"""A null Python data source and sink for benchmarks/spark.py: format `spate_null`, no broker
behind it.

Reading
-------

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

Writing
-------
`df.write.format("spate_null")` and `df.writeStream.format("spate_null")`: the same Python Data
Source writer path as the connector's sink (`DataSourceArrowWriter` /
`DataSourceStreamArrowWriter`: Spark hands each task the same Arrow record batches), sending
nothing. Options:

  encode      `false` (default): the task only counts the rows of the batches it is given —
              Spark's Python Data Source writer path and nothing else. `true`: the task does
              all the connector's writer does before the client — `source.send_batches`
              (batches sliced by bytes, `_rows`: every row encoded as its message, routing by
              key / partition column / spread, sub-entries cut by `planning.Chunker`, publishing
              ids and the skip check) through a `PartitionWriter` whose producers send nothing:
              each cut sub-entry is dropped where the real writer would ship it.
  partitions  the destination's partition count for routing (`encode=true`; default 2)
  report      a file: each commit appends one JSON line {"rows": .., "tasks": ..}

So `null(encode=false) - parquet -> noop` is Spark's Python Data Source writer path,
`null(encode=true) - null(encode=false)` the connector's encoding, and
`spate - null(encode=true)` the connector's client and connections plus what the broker's
confirms cost Spark (the broker's own CPU is counted apart). `encode=true` imports spate.spark
(and its client) in the tasks, as the connector does.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
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

    def writer(self, schema: StructType, overwrite: bool) -> NullBatchWriter:
        return NullBatchWriter(NullSink.of(dict(self.options), schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> NullStreamWriter:
        return NullStreamWriter(NullSink.of(dict(self.options), schema))


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


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass
class NullCommit(WriterCommitMessage):
    rows: int
    chunks: int
    """Sub-entries the connector's writer would have sent (encode=true)."""


@dataclass(frozen=True)
class NullSink:
    """What a null writing task needs (plain data: Spark pickles it to the tasks)."""

    encode: bool
    partitions: int
    columns: tuple[str, ...]
    report: str | None
    write_id: str

    @staticmethod
    def of(options: dict[str, str], schema: StructType) -> NullSink:
        options = {k.lower(): v for k, v in options.items()}
        names = tuple(schema.names)
        if "value" not in names:
            raise ValueError("spate_null writes need a column value, as the connector's sink")
        written = ("value", "key", "partition", "properties", "application_properties")
        return NullSink(
            encode=options.get("encode", "false") == "true",
            partitions=int(options.get("partitions", "2")),
            columns=tuple(n for n in names if n in written),
            report=options.get("report"),
            write_id=uuid.uuid4().hex[:16],
        )

    def write(self, batches: Iterator[pa.RecordBatch], id_base: int) -> NullCommit:
        ctx = TaskContext.get()
        spark_partition = ctx.partitionId() if ctx is not None else 0
        if not self.encode:
            return NullCommit(sum(batch.num_rows for batch in batches), 0)
        from spate.spark import source

        writer = null_partition_writer(
            self.partitions, f"null:{self.write_id}:{spark_partition}", id_base, spark_partition
        )
        published = source.send_batches(
            writer,
            source.WritePlan(self.partitions, self.columns, self.write_id),
            batches,
            spark_partition=spark_partition,
        )
        return NullCommit(published.rows, writer.chunks)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        if self.report is None:
            return
        done = [m for m in messages if isinstance(m, NullCommit)]
        line = {"rows": sum(m.rows for m in done), "chunks": sum(m.chunks for m in done),
                "tasks": len(done)}  # fmt: skip
        with open(self.report, "a") as out:
            out.write(json.dumps(line) + "\n")


def null_partition_writer(partitions: int, name: str, id_base: int, spread_from: int) -> Any:
    """The connector's `broker.PartitionWriter` with producers that send nothing: rows are
    routed and cut into sub-entries as when writing to Spate (no name was written before: the
    last stored id is -1), and each sub-entry is counted where it would be shipped."""
    from spate.spark import broker, limits
    from spate.spark.options import Connection

    class NullPartitionWriter(broker.PartitionWriter):
        chunks = 0

        async def _producer(self, partition: int) -> Any:
            self.producers[partition] = None  # type: ignore[assignment]
            self.last_ids[partition] = -1

        async def _ship(self, chunk: Any) -> None:
            self.chunks += 1

        def flush(self) -> None:
            self.loop.run_until_complete(self._drain())

        def close(self) -> broker.Written:
            try:
                self.flush()
            finally:
                self.loop.close()
            return self.written

    nowhere = Connection(("amqp://127.0.0.1:1",), None, None, 1.0)
    return NullPartitionWriter(
        nowhere, "null", partitions, name=name, id_base=id_base, spread_from=spread_from,
        window=limits.window_default,
    )  # fmt: skip


class NullBatchWriter(DataSourceArrowWriter):
    def __init__(self, sink: NullSink) -> None:
        self.sink = sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NullCommit:
        return self.sink.write(iterator, 0)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.sink.commit(messages)


class NullStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, sink: NullSink) -> None:
        self.sink = sink

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NullCommit:
        ctx = TaskContext.get()
        batch_id = int((ctx.getLocalProperty("streaming.sql.batchId") if ctx else None) or 0)
        return self.sink.write(iterator, batch_id << 32)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.sink.commit(messages)
