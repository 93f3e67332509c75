"""Server-side filtering on a real three-node cluster (issue 11, ADR 0016): every filter form on
a partitioned stream through the proxy gateway, with python-qpid-proton and rhea, and the Bloom
filters surviving a leader kill (they are part of the replicated chunk bytes)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Described, Message, Timeout, symbol, ulong
from proton.reactor import Filter
from proton.utils import BlockingConnection
from support.amqp_clients import LinkProperties
from support.cluster import Cluster

JS = Path(__file__).resolve().parents[1] / "js"
PARTITION = symbol("event-streams-partition")
VALUE = symbol("x-stream-filter-value")
FIRST = {symbol("rabbitmq:stream-offset-spec"): "first"}
REGIONS = ("emea", "apac", None)


def publish(url: str, stream: str, partition: int, count: int) -> None:
    """Message k of the partition: body "p<partition>-<k>", value REGIONS[k % 3], n = k."""
    deadline = time.monotonic() + 60
    while True:
        conn = BlockingConnection(url, timeout=30)
        try:
            sender = conn.create_sender(
                stream, options=LinkProperties({PARTITION: symbol(str(partition))})
            )
            for k in range(count):
                region = REGIONS[k % 3]
                sender.send(
                    Message(
                        body=f"p{partition}-{k}",
                        properties={"n": k},
                        annotations={} if region is None else {VALUE: region},
                    )
                )
            return
        except Exception as refused:  # a gateway whose routes lag: retryable, later
            if "resource-locked" not in str(refused) or time.monotonic() > deadline:
                raise
            time.sleep(0.3)
        finally:
            conn.close()


def consume(
    url: str, stream: str, filters: dict[Any, Any], partition: int | None = None
) -> set[str]:
    conn = BlockingConnection(url, timeout=30)
    try:
        options: list[Any] = [Filter(FIRST | filters)]
        if partition is not None:
            options.append(LinkProperties({PARTITION: symbol(str(partition))}))
        receiver = conn.create_receiver(stream, credit=500, options=options)
        got: list[str] = []
        while True:
            try:
                got.append(receiver.receive(timeout=2).body)
            except Timeout:
                break
            receiver.accept()
        assert len(got) == len(set(got)), got  # nothing twice
        return set(got)
    finally:
        conn.close()


def expected(partitions: range, count: int, keep: Any) -> set[str]:
    return {f"p{p}-{k}" for p in partitions for k in range(count) if keep(k)}


@pytest.mark.long
def test_every_filter_form_on_a_partitioned_stream_and_after_a_leader_kill(
    cluster3: Cluster,
) -> None:
    cluster3.cli("stream", "create", "regions", "--partitions", "3", "--replicas", "3")
    for p in range(3):
        cluster3.leader_of("regions", p)
    gateway = f"amqp://{cluster3.state['gateways'][0]['amqp']}"
    for p in range(3):
        publish(gateway, "regions", p, 30)
    parts = range(3)
    apac = {symbol("rabbitmq:stream-filter"): ["apac"]}
    assert consume(gateway, "regions", apac) == expected(parts, 30, lambda k: k % 3 == 1)
    with_unfiltered = apac | {symbol("rabbitmq:stream-match-unfiltered"): True}
    assert consume(gateway, "regions", with_unfiltered) == expected(parts, 30, lambda k: k % 3)
    sql = {symbol("sql"): Described(ulong(0x201), "n >= 25 AND m.x-stream-filter-value IS NULL")}
    assert consume(gateway, "regions", sql) == {f"p{p}-{k}" for p in parts for k in (26, 29)}

    # rhea, partition-agnostic, a value filter and an SQL filter
    args = {
        "port": int(gateway.rsplit(":", 1)[1]),
        "timeout_ms": 40_000,
        "steps": [
            {
                "op": "consume",
                "address": "regions",
                "count": 30,
                "filter": {
                    "rabbitmq:stream-offset-spec": {"type": "string", "value": "first"},
                    "rabbitmq:stream-filter": {"type": "list", "value": ["emea"]},
                },
            },
            {
                "op": "consume",
                "address": "regions",
                "count": 3,
                "filter": {
                    "rabbitmq:stream-offset-spec": {"type": "string", "value": "first"},
                    "sql": {"descriptor": 0x201, "type": "string", "value": "a.n = 7"},
                },
            },
        ],
    }
    done = subprocess.run(
        ["node", str(JS / "client.js")],
        cwd=JS,
        input=json.dumps(args),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.get("error") is None, report
    emea = {m["body"] for m in report["steps"][0]["messages"]}
    assert emea == expected(parts, 30, lambda k: k % 3 == 0)
    assert {m["body"] for m in report["steps"][1]["messages"]} == {f"p{p}-7" for p in parts}

    # the Bloom filters are in the replicated chunks: a new leader filters the same way
    cluster3.kill9(cluster3.index_of(cluster3.leader_of("regions", 0)))
    deadline = time.monotonic() + 60
    want = expected(range(1), 30, lambda k: k % 3 == 1)
    while True:
        try:  # refused (retryable) until the partition has a leader the gateway knows
            last: object = consume(gateway, "regions", apac, partition=0)
        except Exception as refused:
            last = refused
        if last == want:
            break
        assert time.monotonic() < deadline, f"partition 0 not served filtered: {last!r}"
        time.sleep(0.5)
