"""Helpers of the Spark stage (tests/spark): streams, publishing and reading back through the
plain client, waiting."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

from support.cluster import Cluster


def gateway_url(cluster: Cluster) -> str:
    return "amqp://" + cluster.state["gateways"][0]["amqp"]


def endpoints(cluster: Cluster) -> str:
    """The gateway first, then every node: the connector tries them in turn."""
    gateways = [g["amqp"] for g in cluster.state.get("gateways", [])]
    return ",".join([*gateways, *(n["amqp"] for n in cluster.state["nodes"])])


def new_stream(cluster: Cluster, partitions: int = 3, *extra: str) -> str:
    name = f"s{uuid.uuid4().hex[:10]}"
    cluster.cli("stream", "create", name, "--partitions", str(partitions), *extra)
    return name


def publish(
    cluster: Cluster,
    stream: str,
    bodies: Sequence[bytes],
    *,
    partition: int = 0,
    message: Any = None,
) -> None:
    """Publish with confirms to one partition through the gateway (`message(body)` may build
    a `MessageParts` instead of a plain body)."""
    from spate.client.aio import AsyncProducer

    async def run() -> None:
        producer = await AsyncProducer.connect(gateway_url(cluster), stream, partition=partition)
        futures = [producer.send_nowait(b if message is None else message(b)) for b in bodies]
        await producer.flush()
        for future in futures:
            future.result()
        await producer.close()

    asyncio.run(run())


def read_all(cluster: Cluster, stream: str, partitions: int) -> dict[int, list[bytes]]:
    """Every body in each partition, in offset order (through the plain client)."""
    from spate.client.aio import AsyncConsumer, runtime_information

    async def run() -> dict[int, list[bytes]]:
        url = gateway_url(cluster)
        info = await runtime_information(url, stream)
        out: dict[int, list[bytes]] = {}
        for entry in info["partitions"]:
            p = int(str(entry["partition"]))
            end = int(str(entry["end-offset"]))
            out[p] = []
            if end == 0:
                continue
            consumer = await AsyncConsumer.connect(url, stream, partition=p, start="first")
            while True:
                event = await consumer.receive(timeout=30)
                out[p].append(bytes(event.body))
                if event.offset + 1 >= end:
                    break
            await consumer.close()
        return out

    return asyncio.run(run())


def first_offset(cluster: Cluster, stream: str, partition: int = 0) -> int:
    """The partition's first retained offset, from `$info`."""
    from spate.client.aio import runtime_information

    info = asyncio.run(runtime_information(gateway_url(cluster), stream))
    entry = next(e for e in info["partitions"] if int(str(e["partition"])) == partition)
    return int(str(entry["earliest-offset"]))


def wait_for(predicate: Any, timeout_s: float, what: str, query: Any = None) -> None:
    """Poll `predicate`; with a streaming `query`, fail at once with its error if it dies."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}: {query.exception()}")
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.2)


CONNECT_BACK = "Python worker failed to connect back"
"""Spark gives each fresh Python process it starts for a query (planning, the driver-side
source runner) a hard-coded 10 s to connect back (PythonWorkerFactory). Such a process imports
pyspark from pyspark.zip, without bytecode: 1.9 CPU-s here (0.5 s from site-packages), which at
a load average of 12-15 on 2 cores (other test suites on the shared machine) passed 10 s."""


def start_query(factory: Any, ready: Any = None, attempts: int = 3, timeout_s: float = 180) -> Any:
    """Start a streaming query and wait until it made progress, ended, or `ready()`; a query
    that failed before its first micro-batch because a Python process did not connect back in
    time is started again (nothing was read or written: same checkpoint). Any other failure,
    and this one after progress, is the test's."""
    for attempt in range(attempts):
        query = factory()
        deadline = time.monotonic() + timeout_s
        while query.isActive and not query.recentProgress and not (ready and ready()):
            assert time.monotonic() < deadline, "the query made no progress"
            time.sleep(0.2)
        error = query.exception() if not query.isActive else None
        retry = error is not None and CONNECT_BACK in str(error) and not query.recentProgress
        if retry and attempt + 1 < attempts:
            continue
        return query
    raise AssertionError("unreachable")


def run_available_now(factory: Any, timeout_s: float = 180) -> Any:
    """`start_query`, then wait for a Trigger.AvailableNow query to end."""
    query = start_query(factory, timeout_s=timeout_s)
    try:
        query.awaitTermination(timeout_s)
    except Exception:  # it ended with an error: the caller reads query.exception()
        if query.exception() is None:
            raise
    return query
