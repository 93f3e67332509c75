"""The connector on a real three-node cluster, through Spark (local[2,4]): batch reads with
Kafka's options, a stream -> Spark -> stream pipeline that survives a Python worker killed
mid-write and a query stopped mid-batch, a partition leader killed with -9 under a running
query, and retention deleting what a stopped query still needed (failOnDataLoss both ways).

Exactly-once is checked on the output stream itself: every input row appears once, no more."""

from __future__ import annotations

import collections
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from spate.client import Producer
from spate.client.messages import MessageParts
from spate.core.superstreams import hash_partition
from support.cluster import Cluster, tls_gateway
from support.spark import (
    endpoints,
    first_offset,
    gateway_url,
    new_stream,
    publish,
    read_all,
    run_available_now,
    start_query,
    wait_for,
)

pytestmark = pytest.mark.spark


def reader(spark: Any, cluster: Cluster, stream: str) -> Any:
    return (
        spark.read.format("spate").option("endpoints", endpoints(cluster)).option("stream", stream)
    )


def test_batch_read_schema_offsets_timestamps(spark: Any, spark_cluster: Cluster) -> None:
    s = new_stream(spark_cluster, 3)
    for p in range(3):
        publish(spark_cluster, s, [f"{p}-{i}".encode() for i in range(10)], partition=p)
    time.sleep(0.05)
    cut_ms = int(time.time() * 1000)
    time.sleep(0.05)
    publish(
        spark_cluster,
        s,
        [b"rich"],
        partition=1,
        message=lambda b: MessageParts(b, "cust-1", {"subject": "hi"}, {"region": "emea"}),
    )
    df = reader(spark, spark_cluster, s).load()
    assert df.columns == [
        "key",
        "value",
        "stream",
        "partition",
        "offset",
        "timestamp",
        "properties",
        "application_properties",
    ]
    rows = df.collect()
    assert len(rows) == 31
    assert {(r.partition, r.offset) for r in rows} == {
        (p, o) for p in range(3) for o in range(10)
    } | {(1, 10)}
    (rich,) = [r for r in rows if r.value == b"rich"]
    assert (rich.key, rich.stream, rich.partition, rich.offset) == (b"cust-1", s, 1, 10)
    assert rich.properties == {"subject": "hi"} and rich.application_properties == {
        "region": "emea"
    }
    plain = next(r for r in rows if r.value == b"2-7")
    assert (plain.partition, plain.offset, plain.key, plain.properties) == (2, 7, None, None)

    # Kafka's JSON: -2 earliest, -1 latest; partitions left out: earliest / latest
    ranged = (
        reader(spark, spark_cluster, s)
        .option("startingOffsets", f'{{"{s}": {{"0": 3, "1": -2}}}}')
        .option("endingOffsets", f'{{"{s}": {{"0": 8, "1": 5}}}}')
        .load()
        .groupBy("partition")
        .count()
        .collect()
    )
    assert {r["partition"]: r["count"] for r in ranged} == {0: 5, 1: 5, 2: 10}
    since = reader(spark, spark_cluster, s).option("startingTimestamp", str(cut_ms)).load()
    assert [r.value for r in since.collect()] == [b"rich"]

    # a schema naming fewer columns: only those sections are decoded
    narrow = reader(spark, spark_cluster, s).schema("offset LONG, value BINARY").load()
    assert narrow.columns == ["offset", "value"]
    values = [r.value for r in narrow.collect()]
    assert len(values) == 31 and b"rich" in values

    with pytest.raises(Exception, match="unknown option 'startingoffset'"):
        reader(spark, spark_cluster, s).option("startingOffset", "earliest").load().collect()


def _pipeline(
    spark: Any,
    cluster: Cluster,
    source: str,
    sink: str,
    checkpoint: Path,
    *,
    per_trigger: int = 40,
    **extra: str,
) -> Any:
    """stream -> Spark (upper-cases the body, keeps the source partition as the key) -> stream;
    `extra` are the sink's options."""
    frame = (
        spark.readStream.format("spate")
        .option("endpoints", endpoints(cluster))
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(per_trigger))
        .load()
        .selectExpr("upper(cast(value as string)) as value", "cast(partition as string) as key")
        .writeStream.format("spate")
        .option("endpoints", endpoints(cluster))
        .option("stream", sink)
        .option("checkpointLocation", str(checkpoint))
    )
    for name, value in extra.items():
        frame = frame.option(name, value)
    return frame


def _expect_exactly_once(cluster: Cluster, sink: str, sent: list[bytes]) -> None:
    stored = [b for bodies in read_all(cluster, sink, 2).values() for b in bodies]
    want = collections.Counter(b.upper() for b in sent)
    got = collections.Counter(stored)
    assert got == want, {
        "missing": sorted((want - got).elements())[:10],
        "repeated": sorted((got - want).elements())[:10],
    }


def test_pipeline_survives_worker_kill_and_query_stop(
    spark: Any, spark_cluster: Cluster, tmp_path: Path
) -> None:
    source, sink = new_stream(spark_cluster, 3), new_stream(spark_cluster, 2)
    sent: list[bytes] = []

    def more(n: int) -> None:
        for p in range(3):
            bodies = [f"p{p}-{len(sent) + i}".encode() for i in range(n)]
            publish(spark_cluster, source, bodies, partition=p)
            sent.extend(bodies)

    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "marker"
    more(30)
    q = run_available_now(
        lambda: (
            _pipeline(spark, spark_cluster, source, sink, checkpoint)
            .trigger(availableNow=True)
            .start()
        )
    )
    assert q.exception() is None
    assert [p["numInputRows"] for p in q.recentProgress] == [40, 40, 10]
    _expect_exactly_once(spark_cluster, sink, sent)

    # 1. a writer's Python worker dies half-way through its rows; Spark retries the task
    more(20)
    marker.write_text("exit")
    q = run_available_now(
        lambda: (
            _pipeline(spark, spark_cluster, source, sink, checkpoint, _testFailMarker=str(marker))
            .trigger(availableNow=True)
            .start()
        )
    )
    assert q.exception() is None
    assert not marker.exists(), "the injected failure did not happen"
    _expect_exactly_once(spark_cluster, sink, sent)

    # 2. the query is stopped while a writer is half-way through a micro-batch, then restarted
    more(20)
    marker.write_text("hang")
    hung = Path(f"{marker}.hung")
    q = start_query(
        lambda: _pipeline(
            spark, spark_cluster, source, sink, checkpoint, _testFailMarker=str(marker)
        ).start(),
        ready=hung.exists,
    )
    wait_for(hung.exists, 120, "a writer half-way through a batch", q)
    stored_mid_batch = sum(len(b) for b in read_all(spark_cluster, sink, 2).values())
    q.stop()
    # 150 rows were stored before this run; the stopped micro-batch had stored part of its 60
    assert 150 < stored_mid_batch < 210, stored_mid_batch
    q = run_available_now(
        lambda: (
            _pipeline(spark, spark_cluster, source, sink, checkpoint)
            .trigger(availableNow=True)
            .start()
        )
    )
    assert q.exception() is None
    _expect_exactly_once(spark_cluster, sink, sent)


def test_leader_killed_during_query(spark: Any, spark_cluster: Cluster, tmp_path: Path) -> None:
    source, sink = new_stream(spark_cluster, 2), new_stream(spark_cluster, 2)
    sent = []
    for p in range(2):
        bodies = [f"k{p}-{i}".encode() for i in range(1500)]
        publish(spark_cluster, source, bodies, partition=p)
        sent.extend(bodies)
    leader = spark_cluster.leader_of(source, 0)
    victim = spark_cluster.index_of(leader)
    q = start_query(
        lambda: (
            _pipeline(spark, spark_cluster, source, sink, tmp_path / "checkpoint", per_trigger=1000)
            .trigger(processingTime="200 milliseconds")
            .start()
        )
    )
    try:
        wait_for(lambda: len(q.recentProgress) >= 1, 120, "a first micro-batch", q)
        spark_cluster.kill9(victim)
        killed_at = len(q.recentProgress)

        def caught_up() -> bool:
            progress = q.lastProgress
            end = progress and progress["sources"][0]["endOffset"]
            return bool(end) and json.loads(end).get(source) == {"0": 1500, "1": 1500}

        wait_for(caught_up, 150, "the query to read everything after the leader's death", q)
        assert len(q.recentProgress) > killed_at
    finally:
        q.stop()
        spark_cluster.up(3)  # restart the killed node for the tests after this one
    _expect_exactly_once(spark_cluster, sink, sent)


def test_fail_on_data_loss_both_ways(spark: Any, spark_cluster: Cluster, tmp_path: Path) -> None:
    s = new_stream(spark_cluster, 1, "--segment-bytes", "64KiB", "--max-messages", "100")
    publish(spark_cluster, s, [f"early-{i}".encode() for i in range(10)])

    def run(checkpoint: Path, out: Path, fail_on_data_loss: str | None) -> Any:
        frame = (
            spark.readStream.format("spate")
            .option("endpoints", endpoints(spark_cluster))
            .option("stream", s)
            .option("startingOffsets", "earliest")
        )
        if fail_on_data_loss is not None:
            frame = frame.option("failOnDataLoss", fail_on_data_loss)
        return run_available_now(
            lambda: (
                frame.load()
                .select("offset", "value")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
        )

    assert run(tmp_path / "ck", tmp_path / "out", None).exception() is None
    # the query is stopped at offset 10; 400 more messages of 1 KB make ~7 segments, and
    # retention (at most 100 messages) deletes whole segments from the front
    publish(spark_cluster, s, [b"x" * 1000 for _ in range(400)])
    first: dict[str, int] = {}

    def retention_ran() -> bool:
        first["offset"] = first_offset(spark_cluster, s)
        return first["offset"] > 10

    wait_for(retention_ran, 60, "retention to delete the first segments")
    shutil.copytree(tmp_path / "ck", tmp_path / "ck2")  # the same query state, twice

    failed = run(tmp_path / "ck", tmp_path / "out", None).exception()
    assert failed is not None
    assert f"partition 0 of stream '{s}': offsets [10, " in str(failed)
    assert "deleted by retention" in str(failed)

    assert run(tmp_path / "ck2", tmp_path / "out2", "false").exception() is None
    # the files each run wrote (out2's sink log starts at batch 1: read the files themselves)
    before = sorted(pq.read_table(tmp_path / "out", columns=["offset"])["offset"].to_pylist())
    after = sorted(pq.read_table(tmp_path / "out2", columns=["offset"])["offset"].to_pylist())
    assert before == list(range(10))
    assert after[0] >= first["offset"] > 10, "skipped to the first retained offset"
    assert after == list(range(after[0], 410))


def test_batch_write_exactly_once_after_worker_kill(
    spark: Any, spark_cluster: Cluster, tmp_path: Path
) -> None:
    s = new_stream(spark_cluster, 3)
    marker = tmp_path / "marker"
    marker.write_text("exit")
    (
        spark.range(0, 600, 1, 3)
        .selectExpr("cast(id as string) as value", "cast(id % 5 as string) as key")
        .write.format("spate")
        .option("endpoints", endpoints(spark_cluster))
        .option("stream", s)
        .option("_testFailMarker", str(marker))
        .mode("append")
        .save()
    )
    assert not marker.exists(), "the injected failure did not happen"
    stored = read_all(spark_cluster, s, 3)
    assert collections.Counter(
        b for bodies in stored.values() for b in bodies
    ) == collections.Counter(str(i).encode() for i in range(600))
    # one key, one partition: the broker's own routing of a group key (MurmurHash3 modulo 3)
    for partition, bodies in stored.items():
        assert {hash_partition(str(int(b) % 5), 3) for b in bodies} <= {partition}


def test_write_and_read_through_a_tls_gateway_with_credentials(
    spark: Any, spark_cluster: Cluster, tmp_path: Path
) -> None:
    """amqps:// endpoints with tlsCaFile, username and password: a batch write and a batch read
    through a gateway that terminates TLS and refuses anonymous clients; and the same read with
    a wrong password fails with SASL's refusal, not a hang."""
    s = new_stream(spark_cluster, 2)
    with tls_gateway(spark_cluster, tmp_path / "tls") as gw:

        def secured(io: Any) -> Any:
            return (
                io.format("spate")
                .option("endpoints", gw.url)
                .option("tlsCaFile", str(gw.ca))
                .option("username", gw.user)
                .option("password", gw.password)
                .option("stream", s)
            )

        rows = spark.range(0, 300, 1, 2).selectExpr("cast(id as string) as value")
        secured(rows.write).mode("append").save()
        got = secured(spark.read).load().select("value").collect()
        assert sorted(int(r.value) for r in got) == list(range(300))
        with pytest.raises(Exception, match="unauthorized-access"):
            secured(spark.read).option("password", "wrong").option(
                "timeoutMs", "5000"
            ).load().collect()
    stored = read_all(spark_cluster, s, 2)  # and the plain listeners hold the same rows
    assert sorted(int(b) for bodies in stored.values() for b in bodies) == list(range(300))


def test_batch_read_of_super_streams_by_binding_keys_and_by_count(
    spark: Any, spark_cluster: Cluster
) -> None:
    """superStream finds the partition streams from the super stream's `$info`: named by
    binding keys (`NAME-amer`, ...) or by index (`NAME-0`, ...)."""
    keyed, counted = (f"ss{uuid.uuid4().hex[:8]}" for _ in range(2))
    spark_cluster.cli("superstream", "create", keyed, "--binding-keys", "amer,emea,apac")
    spark_cluster.cli("superstream", "create", counted, "--partitions", "2")
    sent: dict[str, list[tuple[str, str]]] = {keyed: [], counted: []}
    with Producer(gateway_url(spark_cluster), keyed) as producer:
        for i, region in enumerate(["amer", "emea", "apac", "emea"] * 5):
            producer.send(MessageParts(f"k{i}".encode(), region))
            sent[keyed].append((f"{keyed}-{region}", f"k{i}"))
    with Producer(gateway_url(spark_cluster), counted) as producer:
        for i in range(20):
            producer.send(MessageParts(f"c{i}".encode(), f"key{i}"))
            sent[counted].append((f"{counted}-{hash_partition(f'key{i}', 2)}", f"c{i}"))
    for name, expected in sent.items():
        rows = (
            spark.read.format("spate")
            .option("endpoints", endpoints(spark_cluster))
            .option("superStream", name)
            .load()
            .selectExpr("stream", "cast(value as string) as value")
            .collect()
        )
        assert sorted((r.stream, r.value) for r in rows) == sorted(expected)
    with pytest.raises(Exception, match="is a stream; use option stream"):
        spark.read.format("spate").option("endpoints", endpoints(spark_cluster)).option(
            "superStream", f"{keyed}-emea"
        ).load().collect()
