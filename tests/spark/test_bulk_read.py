"""Bulk reads (ADR 0029) on the real three-node cluster: a reading task's Arrow batches are the
same with `bulkRead=true` (frames cut with numpy) as with `false` (messages one by one), read
from the nodes, through the proxy gateway and through a redirect; for plain, keyed and rich
messages, sub-entries plain and zstd, ranges starting and ending inside sub-entries. No
SparkSession: `source._read` is what a Spark task runs."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pyarrow as pa
import pytest
from spate.client import Producer
from spate.client.aio import AsyncConsumer
from spate.client.engine import LinkSpec
from spate.client.messages import MessageParts
from spate.core import bulk
from spate.spark import broker, source
from spate.spark.options import read_options
from spate.spark.planning import Range
from support.cluster import Cluster
from support.spark import gateway_url, new_stream

pytestmark = pytest.mark.spark

FULL = tuple(source.SCHEMA.names)


def read_range(endpoints: str, r: Range, in_bulk: bool) -> tuple[pa.Table, bool]:
    options = read_options(
        {"endpoints": endpoints, "stream": r.stream, "bulkRead": str(in_bulk).lower()},
        streaming=False,
    )
    columns = broker.Columns(FULL, tuple(f.nullable for f in source.SCHEMA.fields))
    reader = broker.RangeReader(
        options.connection, r, columns, credit=options.credit, fail_on_data_loss=True
    )
    schema = source._arrow_schema(columns)
    if in_bulk:
        from spate.spark.columns import record_batch

        batches = list(
            reader.frame_batches(lambda f: record_batch(f, schema, r.stream, r.partition))
        )
    else:
        batches = list(source._read(options, columns, source.SpatePartition(r)))
    return pa.Table.from_batches(batches, schema=schema), reader.bulk


class Redirected(AsyncConsumer):
    """A consumer asking the gateway to redirect its link to the partition's leader."""

    def _spec(self) -> LinkSpec:
        spec = super()._spec()
        return dataclasses.replace(
            spec, properties={**spec.properties, "spate:gateway-mode": "redirect"}
        )


def test_bulk_reads_give_the_rows_read_one_by_one(spark_cluster: Cluster) -> None:
    s = new_stream(spark_cluster, 2)
    producer = Producer(gateway_url(spark_cluster), s, partition=0)
    try:
        producer.send_batch([b"plain-%d" % i for i in range(300)] + [b"", b"L" * 70_000])
        producer.send_batch([MessageParts(b"keyed-%d" % i, f"k{i % 7}") for i in range(200)])
        producer.send_batch([MessageParts(b"rich", "k", {"subject": "s"}, {"r": "emea"})] * 5)
        producer.send_batch([b"sub-%d" % i for i in range(3000)], sub_entry_size=500)
        producer.send_batch(
            [MessageParts(b"zstd-%d" % i, "z") for i in range(3000)],
            sub_entry_size=1000,
            compression="zstd",
        )
    finally:
        producer.close()
    total = 302 + 200 + 5 + 3000 + 3000
    nodes = ",".join(n["amqp"] for n in spark_cluster.state["nodes"])
    gateway = spark_cluster.state["gateways"][0]["amqp"]
    want, _ = read_range(nodes, Range(s, 0, 0, total), in_bulk=False)
    assert want.num_rows == total and want.column("offset").to_pylist() == list(range(total))
    for endpoints in (nodes, gateway):
        got, granted = read_range(endpoints, Range(s, 0, 0, total), in_bulk=True)
        assert granted, endpoints
        assert got.equals(want), endpoints
    # a range starting inside a plain sub-entry and ending inside a compressed one
    inner = Range(s, 0, 507 + 250, total - 1500)
    got, _ = read_range(gateway, inner, in_bulk=True)
    assert got.equals(want.slice(inner.start, inner.count))
    one_by_one, _ = read_range(gateway, inner, in_bulk=False)
    assert one_by_one.equals(got)

    # through a redirect to the leader: the link keeps its properties
    async def redirected() -> tuple[list[int], bool]:
        offsets: list[int] = []

        def frames(got: list[bulk.Frame]) -> None:
            for frame in got:
                offsets.extend(frame.offset_list())

        consumer = await Redirected.connect(
            f"amqp://{gateway}", s, partition=0, start="first", bulk_handler=frames
        )
        deadline = time.monotonic() + 60
        while len(offsets) < total and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await consumer.close()
        return offsets, consumer.bulk

    offsets, granted = asyncio.run(redirected())
    assert granted and offsets == list(range(total))


ROW_BYTES = 16 * 1024


def test_large_rows_make_batches_of_bounded_bytes(spark_cluster: Cluster) -> None:
    """A read of 16 KiB rows yields Arrow batches of at most maxBytesPerBatch (default 16 MiB)
    of messages — before, a task's batches were cut by rows alone, 8,192 rows (128 MiB) — and
    the batches, in order, hold every row once; bulk or message by message; a row larger than
    the limit travels alone."""
    s = new_stream(spark_cluster, 1)
    total = 1_100  # 17.6 MiB: more than one default batch
    bodies = [b"%06d" % i + bytes([i % 256]) * (ROW_BYTES - 6) for i in range(total)]
    with Producer(gateway_url(spark_cluster), s, partition=0) as producer:
        producer.send_batch(bodies)
    gateway = spark_cluster.state["gateways"][0]["amqp"]
    columns = broker.Columns(("value", "offset"), (True, False))
    cases = [  # (bulkRead, maxBytesPerBatch, rows read)
        ("true", None, total),
        ("false", None, total),
        ("true", 256 * 1024, total),
        ("false", 256 * 1024, 300),
        ("true", 8 * 1024, 40),
        ("false", 8 * 1024, 40),
    ]
    for in_bulk, bytes_max, n in cases:
        given = {"endpoints": gateway, "stream": s, "bulkRead": in_bulk}
        if bytes_max is not None:
            given["maxBytesPerBatch"] = str(bytes_max)
        options = read_options(given, streaming=False)
        limit = bytes_max or 16 * 1024 * 1024
        batches = list(source._read(options, columns, source.SpatePartition(Range(s, 0, 0, n))))
        label = (in_bulk, bytes_max)
        for batch in batches:
            value_bytes = sum(len(v) for v in batch.column(0).to_pylist())
            assert batch.num_rows == 1 or value_bytes <= limit, (label, batch.num_rows)
        rows = [r for b in batches for r in b.to_pylist()]
        assert [r["offset"] for r in rows] == list(range(n)), label
        assert [r["value"] for r in rows] == bodies[:n], label
        most = max(b.num_rows for b in batches)
        if limit < ROW_BYTES:
            assert most == 1, label
        else:  # a message is its body and a few dozen bytes of sections
            assert limit // (ROW_BYTES + 128) <= most <= limit // ROW_BYTES, (label, most)
