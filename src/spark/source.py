"""The data source Spark sees: format `spate`, on Spark's Python Data Source API (>= 4.2).

Where each object lives (research/pyspark.md §3): the `DataSource` and the readers are built
in short-lived planning workers and pickled; a streaming query's offset callbacks run in one
long-lived driver-side Python process per run; `read` and `write` run in executor workers on
the pickled copies. So every object here holds plain data (parsed options, planned ranges)
and connects only inside a call (spate.spark.broker).

Spark starts several fresh Python processes per query (lookup, create, plan, the offsets
runner); those that only plan never need the client. So this module imports spate.client
(proton, ~0.23 CPU-s per process measured, benchmarks/RESULTS.md §30) only inside the calls
that talk to the broker (`from spate.spark import broker` inside them).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from spate.spark import limits, planning
from spate.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    ReadOptions,
    WriteOptions,
    read_options,
    write_options,
)
from spate.spark.planning import Columns, Metadata, Offsets, Range

if TYPE_CHECKING:
    from spate.spark import broker

log = logging.getLogger("spate.spark")

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
"""Kafka's columns (key, value, topic -> stream, partition, offset, timestamp) plus the AMQP
message's properties and application properties; `key` is the `event-streams-group-key`."""
_ARROW_MAP = pa.map_(pa.string(), pa.string())
ARROW_TYPES: dict[str, pa.DataType] = {
    "key": pa.binary(),
    "value": pa.binary(),
    "stream": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "properties": _ARROW_MAP,
    "application_properties": _ARROW_MAP,
}
WRITE_COLUMNS = ("value", "key", "partition", "properties", "application_properties")
"""Columns a written row is made of (`value` required); the read-only columns of SCHEMA
(stream, offset, timestamp) are ignored so that a read DataFrame can be written back."""


def _columns(schema: StructType) -> Columns:
    """A user-given schema picks columns of SCHEMA (any order, same types): only their
    sections are decoded."""
    known: dict[str, DataType] = {f.name: f.dataType for f in SCHEMA.fields}
    names = []
    for f in schema.fields:
        if f.name not in known:
            raise OptionError(
                f"schema: unknown column {f.name!r}; a Spate source has {', '.join(known)}"
            )
        if f.dataType != known[f.name]:
            raise OptionError(
                f"schema: column {f.name!r} is {known[f.name].simpleString()}, "
                f"not {f.dataType.simpleString()}"
            )
        names.append(f.name)
    return Columns(tuple(names), tuple(f.nullable for f in schema.fields))


def _arrow_schema(columns: Columns) -> pa.Schema:
    return pa.schema(
        [
            pa.field(n, ARROW_TYPES[n], nullable)
            for n, nullable in zip(columns.names, columns.nullable, strict=True)
        ]
    )


class SpatePartition(InputPartition):
    """One Spark task: a planned range. Picklable (plain data)."""

    def __init__(self, r: Range) -> None:
        super().__init__(r)
        self.range = r


def _read(
    options: ReadOptions, columns: Columns, partition: SpatePartition
) -> Iterator[pa.RecordBatch]:
    from spate.spark import broker
    from spate.spark.columns import record_batch

    schema = _arrow_schema(columns)
    reader = broker.RangeReader(
        options.connection,
        partition.range,
        columns,
        credit=options.credit,
        fail_on_data_loss=options.fail_on_data_loss,
        fail_marker=options.test_fail_marker,
        batch_bytes=options.batch_bytes_max,
    )

    if options.bulk_read:
        r = partition.range
        yield from reader.frame_batches(
            lambda frames: record_batch(frames, schema, r.stream, r.partition)
        )
        return

    def make(data: dict[str, list[Any]]) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array(data[n], type=schema.field(n).type) for n in columns.names], schema=schema
        )

    yield from reader.batches(make)


def _streams(options: ReadOptions) -> tuple[str, ...]:
    if options.streams is not None:
        return options.streams
    assert options.super_stream is not None
    from spate.spark import broker

    return broker.super_stream_partitions(options.connection, options.super_stream)


def _losses(start: Offsets, meta: Metadata, options: ReadOptions) -> Offsets:
    """Start offsets retention already removed: fail (failOnDataLoss) or skip with a warning."""
    lost = planning.losses(start, meta)
    if not lost:
        return start
    if options.fail_on_data_loss:
        from spate.spark.broker import DataLoss

        raise DataLoss(
            "; ".join(loss.describe() for loss in lost)
            + ". Set failOnDataLoss=false to skip lost offsets with a warning."
        )
    moved = dict(start)
    for loss in lost:
        log.warning("skipping lost offsets (failOnDataLoss=false): %s", loss.describe())
        moved[(loss.stream, loss.partition)] = loss.first
    return moved


class SpateDataSource(DataSource):
    """`spark.read / readStream / write / writeStream .format("spate")` (docs/spark.md)."""

    @classmethod
    def name(cls) -> str:
        return "spate"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> SpateBatchReader:
        return SpateBatchReader(read_options(self.options, streaming=False), _columns(schema))

    def streamReader(self, schema: StructType) -> SpateStreamReader:
        return SpateStreamReader(read_options(self.options, streaming=True), _columns(schema))

    def writer(self, schema: StructType, overwrite: bool) -> SpateBatchWriter:
        options = write_options(self.options)
        return SpateBatchWriter(options, _write_plan(options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> SpateStreamWriter:
        options = write_options(self.options)
        return SpateStreamWriter(options, _write_plan(options, schema, overwrite))


class SpateBatchReader(DataSourceReader):
    """A bounded read of the retained log, planned once: [startingOffsets | startingTimestamp,
    endingOffsets | endingTimestamp) per partition."""

    def __init__(self, options: ReadOptions, columns: Columns) -> None:
        from spate.spark import broker

        self.options, self.columns = options, columns
        meta = broker.metadata(options.connection, _streams(options))
        if options.starting_timestamp_ms is not None:
            start = broker.offsets_at(options.connection, meta, options.starting_timestamp_ms)
        else:
            start = planning.resolve(
                options.starting, meta, name="startingOffsets", default=EARLIEST
            )
        if options.ending_timestamp_ms is not None:
            end = broker.offsets_at(options.connection, meta, options.ending_timestamp_ms)
        else:
            end = planning.resolve(options.ending, meta, name="endingOffsets", default=LATEST)
        for key, offset in end.items():
            if offset > meta[key].end:
                raise OptionError(
                    f"option endingOffsets: {key[0]}/{key[1]} ends at {meta[key].end}, not {offset}"
                )
        start = _losses(start, meta, options)
        self.ranges = planning.ranges(
            start,
            end,
            min_partitions=options.min_partitions,
            max_records_per_partition=options.max_records_per_partition,
        )

    def partitions(self) -> Sequence[SpatePartition]:
        return [SpatePartition(r) for r in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpatePartition), partition
        return _read(self.options, self.columns, partition)


class SpateStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of per-partition offset ranges; Spark checkpoints the offsets."""

    def __init__(self, options: ReadOptions, columns: Columns) -> None:
        self.options, self.columns = options, columns
        self._cache: tuple[float, Metadata] | None = None
        self._target: Offsets | None = None
        """Trigger.AvailableNow: the ends fixed when the run started."""

    def _meta(self) -> Metadata:
        now = time.monotonic()
        if self._cache is None or now - self._cache[0] > self.options.metadata_refresh_ms / 1000:
            from spate.spark import broker

            meta = broker.metadata(self.options.connection, _streams(self.options))
            self._cache = (now, meta)
        return self._cache[1]

    def initialOffset(self) -> dict[str, dict[str, int]]:
        options, meta = self.options, self._meta()
        if options.starting_timestamp_ms is not None:
            from spate.spark import broker

            start = broker.offsets_at(options.connection, meta, options.starting_timestamp_ms)
        else:
            start = planning.resolve(options.starting, meta, name="startingOffsets", default=LATEST)
        return planning.to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_messages_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {key: state.end for key, state in self._meta().items()}

    def reportLatestOffset(self) -> dict[str, dict[str, int]]:
        return planning.to_json({key: state.end for key, state in self._meta().items()})

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        meta = self._meta()
        begin = planning.with_new_partitions(planning.from_json(start), meta)
        latest = {key: state.end for key, state in meta.items()}
        if self._target is not None:
            latest = {key: min(end, self._target.get(key, end)) for key, end in latest.items()}
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return planning.to_json(planning.limit(begin, latest, rows))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[SpatePartition]:
        meta = self._meta()
        begin = planning.with_new_partitions(planning.from_json(start), meta)
        stop = planning.from_json(end)
        needed = {key: offset for key, offset in begin.items() if stop.get(key, offset) > offset}
        lost = planning.losses(needed, meta)
        if lost:
            self._cache = None  # retention moved: check against fresh figures
            meta = self._meta()
            begin = {**begin, **_losses(needed, meta, self.options)}
        ranges = planning.ranges(
            begin,
            stop,
            min_partitions=self.options.min_partitions,
            max_records_per_partition=self.options.max_records_per_partition,
        )
        return [SpatePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpatePartition), partition
        return _read(self.options, self.columns, partition)

    def commit(self, end: dict[str, Any]) -> None:
        return None  # Spark's checkpoint is the source of truth (as with Kafka)

    def stop(self) -> None:
        self._cache = None


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class WritePlan:
    partitions: int
    """The stream's partition count when the write was planned."""
    columns: tuple[str, ...]
    write_id: str
    """Fixed at planning: a batch write's tasks (and their retries) derive names from it."""


def _write_plan(options: WriteOptions, schema: StructType, overwrite: bool) -> WritePlan:
    if overwrite:
        raise OptionError("mode overwrite: a stream is append-only; use mode append")
    names = [f.name for f in schema.fields]
    if "value" not in names:
        raise OptionError("a row written to Spate needs a column value (binary or string)")
    read_only = {"stream", "offset", "timestamp"}
    unknown = [n for n in names if n not in WRITE_COLUMNS and n not in read_only]
    if unknown:
        raise OptionError(
            f"column {unknown[0]!r} cannot be written: a row is {', '.join(WRITE_COLUMNS)}"
        )
    types: dict[str, tuple[type, ...]] = {
        "value": (BinaryType, StringType),
        "key": (BinaryType, StringType),
        "partition": (IntegerType, LongType),
        "properties": (MapType,),
        "application_properties": (MapType,),
    }
    for f in schema.fields:
        if f.name in types and not isinstance(f.dataType, types[f.name]):
            raise OptionError(
                f"column {f.name!r} is {f.dataType.simpleString()}; expected "
                + " or ".join(t.__name__.removesuffix("Type").lower() for t in types[f.name])
            )
    from spate.spark import broker

    meta = broker.metadata(options.connection, (options.stream,))
    return WritePlan(
        partitions=len(meta),
        columns=tuple(n for n in names if n in WRITE_COLUMNS),
        write_id=uuid.uuid4().hex[:16],
    )


@dataclass
class Published(WriterCommitMessage):
    spark_partition: int
    producer: str
    rows: int
    skipped: int
    batch_id: int | None = None


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return bytes(value).decode("utf-8")


def _rows(batch: pa.RecordBatch, columns: tuple[str, ...]) -> list[broker.Row]:
    """Each row as (explicit partition, key, its encoded message), without a Python object per
    section: rows with only a value and a key are encoded by `encode_plain` (~1 µs)."""
    from spate.client.messages import MessageParts, encode_plain

    data = {name: batch.column(name).to_pylist() for name in columns}
    values = data["value"]
    n = len(values)
    keys = data.get("key")
    texts = [None] * n if keys is None else [_text(k) for k in keys]
    partitions = data.get("partition") or [None] * n
    props = data.get("properties")
    apps = data.get("application_properties")
    if None in values:
        raise ValueError("column value is null: every message needs a body")
    kind = batch.schema.field("value").type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        bodies = [v.encode() for v in values]
    else:
        bodies = [bytes(v) for v in values]
    if props is None and apps is None:
        return [
            (partition, key, encode_plain(body, key))
            for partition, key, body in zip(partitions, texts, bodies, strict=True)
        ]
    out: list[broker.Row] = []
    for i, body in enumerate(bodies):
        message = MessageParts(
            body,
            texts[i],
            None if props is None or props[i] is None else dict(props[i]),
            None if apps is None or apps[i] is None else dict(apps[i]),
        )
        out.append((partitions[i], texts[i], message.envelope()))
    return out


def slices(batch: pa.RecordBatch, bytes_max: int) -> Iterator[pa.RecordBatch]:
    """`batch` in consecutive slices (views, no copy) of at most `bytes_max` bytes of values
    and keys, at least one row each: a writing task's Python copies (`_rows`) of a Spark batch
    of large rows stay bounded (`limits.write_slice_bytes`)."""
    n = batch.num_rows
    if n == 0:
        return
    if batch.nbytes <= bytes_max:
        yield batch
        return
    import numpy as np  # here: Spark's planning processes import this module too
    import pyarrow.compute as pc

    sizes = np.zeros(n, dtype=np.int64)
    for name in ("value", "key"):
        if name in batch.schema.names:
            lengths = pc.binary_length(batch.column(name)).fill_null(0)
            sizes += lengths.to_numpy(zero_copy_only=False).astype(np.int64)
    ends = np.cumsum(sizes)
    at = 0
    while at < n:
        base = int(ends[at - 1]) if at else 0
        stop = max(at + 1, int(np.searchsorted(ends, base + bytes_max, side="right")))
        yield batch.slice(at, stop - at)
        at = stop


def _write(
    options: WriteOptions,
    plan: WritePlan,
    batches: Iterator[pa.RecordBatch],
    *,
    name: str,
    id_base: int,
) -> Published:
    from spate.spark import broker

    ctx = TaskContext.get()
    spark_partition = ctx.partitionId() if ctx is not None else 0
    writer = broker.PartitionWriter(
        options.connection,
        options.stream,
        plan.partitions,
        name=name,
        id_base=id_base,
        spread_from=spark_partition,
        window=options.window,
        fail_marker=options.test_fail_marker,
    )
    return send_batches(writer, plan, batches, spark_partition=spark_partition)


def send_batches(
    writer: broker.PartitionWriter,
    plan: WritePlan,
    batches: Iterator[pa.RecordBatch],
    *,
    spark_partition: int,
) -> Published:
    """A writing task's loop: Spark's Arrow batches -> rows -> `writer` (which routes, cuts
    sub-entries and sends), closed at the end. benchmarks/spark_null.py runs it with a writer
    that sends nothing, to split a write's cost."""
    try:
        for batch in batches:
            for piece in slices(batch, limits.write_slice_bytes):
                writer.send(_rows(piece, plan.columns))
    finally:
        written = writer.close()
    return Published(spark_partition, writer.name, written.rows, written.skipped)


class SpateBatchWriter(DataSourceArrowWriter):
    """`df.write.format("spate").mode("append")`: each task's producer is named
    `<producerName | spark>:<write id>:<Spark partition>` (write id fixed at planning), ids =
    row index + 1; a retried task sends the same names and ids, and the broker stores each row
    once."""

    def __init__(self, options: WriteOptions, plan: WritePlan) -> None:
        self.options, self.plan = options, plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        ctx = TaskContext.get()
        spark_partition = ctx.partitionId() if ctx is not None else 0
        prefix = self.options.producer_name or "spark"
        name = f"{prefix}:{self.plan.write_id}:{spark_partition}"
        return _write(self.options, self.plan, iterator, name=name, id_base=0)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, Published)]
        rows, skipped = sum(m.rows for m in done), sum(m.skipped for m in done)
        log.info(
            "spate: batch write %s: %d rows, %d repeats skipped", self.plan.write_id, rows, skipped
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "spate: batch write %s aborted: what its tasks stored stays (a stream is "
            "append-only); rerunning the same write is not deduplicated (a new write id)",
            self.plan.write_id,
        )


class SpateStreamWriter(DataSourceStreamArrowWriter):
    """`writeStream.format("spate")`: each task's producer is named
    `<producerName | spark>:<query id>:<Spark partition>`; its publishing ids are
    (batch id << 32) + row index + 1, so they grow from one micro-batch to the next and a
    replayed batch (a retried task, or a restart from the checkpoint) resends the same ids,
    which the broker drops."""

    def __init__(self, options: WriteOptions, plan: WritePlan) -> None:
        self.options, self.plan = options, plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        from spate.spark.broker import ID_EPOCH_SHIFT

        ctx = TaskContext.get()
        assert ctx is not None, "a streaming write runs in a Spark task"
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or -1)
        query_id = ctx.getLocalProperty("sql.streaming.queryId") or self.plan.write_id
        prefix = self.options.producer_name or "spark"
        name = f"{prefix}:{query_id}:{ctx.partitionId()}"
        if not 0 <= batch_id < 2**31:
            raise ValueError(f"micro-batch id {batch_id} is outside the id scheme (0..2^31)")
        published = _write(
            self.options,
            self.plan,
            iterator,
            name=name,
            id_base=batch_id << ID_EPOCH_SHIFT,
        )
        published.batch_id = batch_id
        return published

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "spate: micro-batch %d aborted; Spark replays it and the broker drops the rows "
            "already stored",
            batchId,
        )
