"""Issue 11's proof of sub-entry batching and compression (ADR 0017; 004 "Sub-Entry Batching
and Compression") on a real three-process cluster (`spate dev up --nodes 3`: three nodes and a
proxy gateway): compressed sub-entries of every codec, published by spate.client and rhea,
across a SIGKILL of the partition leader and the catch-up of a wiped replica, read one message
at a time with their own offsets by python-qpid-proton and rhea.

004: "A sub-entry batch will go directly to disc after it reached the broker"; "the messages in
a sub-entry are compressed altogether". The issue: offsets, `$info` counts and retention stay
per message; a plain AMQP consumer gets the messages as if they had been sent singly.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from proton import Message, Timeout, symbol
from proton.reactor import Filter
from proton.utils import BlockingConnection
from spate.client import AttachRefused, Producer, PublishRefused
from spate.core import subentry
from support.amqp_clients import RunningGateway, offset_filter, run_rhea
from support.cluster import Cluster

CODECS = list(subentry.CODECS)
SUB_ENTRY_SIZE = 10
WAIT_S = 60.0
FILTER_VALUE = "x-stream-filter-value"


def bodies_of(batch: int) -> list[bytes]:
    """100-byte JSON messages, as in the benchmark."""
    return [
        json.dumps({"batch": batch, "i": i, "sensor": "s-17", "pad": "x" * 40}).encode()[:100]
        for i in range(SUB_ENTRY_SIZE * 2)
    ]


def publish(urls: list[str], stream: str, batch: int) -> list[bytes]:
    """One batch of two sub-entries (codec by batch number), confirmed; retried on other nodes
    while a leader change refuses it (at-least-once: a batch may be stored twice, never lost)."""
    codec = CODECS[batch % len(CODECS)]
    bodies = bodies_of(batch)
    deadline = time.monotonic() + WAIT_S
    attempt = 0
    while True:
        url = urls[attempt % len(urls)]
        attempt += 1
        try:
            with Producer(url, stream, timeout_s=5) as producer:
                producer.send_batch(bodies, sub_entry_size=SUB_ENTRY_SIZE, compression=codec)
                return bodies
        except (PublishRefused, AttachRefused, OSError, Exception) as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"batch {batch} never accepted: {error}") from error
            time.sleep(0.2)


def read(url: str, stream: str, count: int) -> list[tuple[int, bytes]]:
    connection = BlockingConnection(url, timeout=20)
    try:
        receiver = connection.create_receiver(stream, credit=500, options=offset_filter("first"))
        out = []
        for _ in range(count):
            message = receiver.receive(timeout=20)
            receiver.accept()
            offset = int(message.instructions["event-streams-offset"])
            out.append((offset, bytes(message.body)))
        return out
    finally:
        connection.close()


def check(seen: list[tuple[int, bytes]], acked: list[bytes]) -> None:
    """Consecutive offsets from 0; every acknowledged message there, in publishing order
    (a resent batch may appear twice: each sub-entry is stored whole or not at all)."""
    assert [o for o, _ in seen] == list(range(len(seen)))
    first: dict[bytes, int] = {}
    for offset, body in seen:
        first.setdefault(body, offset)
    positions = [first[b] for b in acked]
    assert positions == sorted(positions)
    # a sub-entry is never cut: each stored batch of SUB_ENTRY_SIZE is contiguous
    bodies = [b for _, b in seen]
    for start in range(0, len(bodies), SUB_ENTRY_SIZE):
        chunk = [json.loads(b)["i"] for b in bodies[start : start + SUB_ENTRY_SIZE]]
        assert chunk == list(range(chunk[0], chunk[0] + SUB_ENTRY_SIZE)), chunk


REGIONS = ("emea", "apac", "amer")


def regional(batch: int) -> list[Message]:
    """A batch whose messages all carry one filter value (x-stream-filter-value), so that each
    of its sub-entries' Bloom filters holds that value alone."""
    value = REGIONS[batch % len(REGIONS)]
    return [
        Message(body=f"{value}-{batch}-{i}", annotations={symbol(FILTER_VALUE): value})
        for i in range(SUB_ENTRY_SIZE)
    ]


def publish_regional(urls: list[str], batch: int) -> None:
    codec = CODECS[batch % len(CODECS)]
    with Producer(urls, "regions", timeout_s=5, reconnect_timeout_s=WAIT_S) as producer:
        producer.send_batch(regional(batch), sub_entry_size=SUB_ENTRY_SIZE, compression=codec)


def read_filtered(url: str, value: str) -> list[str]:
    """Every message of `regions` a `rabbitmq:stream-filter` link is sent (until 1 s of quiet)."""
    connection = BlockingConnection(url, timeout=20)
    try:
        receiver = connection.create_receiver(
            "regions",
            credit=500,
            options=Filter(
                {
                    symbol("rabbitmq:stream-offset-spec"): "first",
                    symbol("rabbitmq:stream-filter"): value,
                }
            ),
        )
        out = []
        while True:
            try:
                out.append(str(receiver.receive(timeout=1).body))
            except Timeout:
                return out
            receiver.accept()
    finally:
        connection.close()


@pytest.mark.long
def test_compressed_sub_entries_survive_a_leader_kill_and_a_wiped_replica_s_catch_up(
    cluster3: Cluster,
) -> None:
    cluster3.cli("stream", "create", "metrics", "--replicas", "3")
    cluster3.cli("stream", "create", "regions", "--replicas", "3")
    acked: list[bytes] = []
    for batch in range(10):  # two sub-entries per batch, every codec twice
        acked += publish(cluster3.urls(), "metrics", batch)
    for batch in range(6):  # sub-entries with filter values, through the same faults
        publish_regional(cluster3.urls(), batch)
    leader = cluster3.leader_of("metrics")
    cluster3.kill9(cluster3.index_of(leader))
    survivors = [u for i, u in enumerate(cluster3.urls()) if i != cluster3.index_of(leader)]
    for batch in range(10, 20):  # across the election
        acked += publish(survivors, "metrics", batch)
    for batch in range(6, 12):
        publish_regional(survivors, batch)
    cluster3.up(3)
    cluster3.refresh()
    # wipe a replica that is not the leader now, and let it catch up from the others
    leader = cluster3.leader_of("metrics")
    victim = next(i for i, n in enumerate(cluster3.state["nodes"]) if n["node_id"] != leader)
    cluster3.kill9(victim)
    shutil.rmtree(Path(cluster3.state["nodes"][victim]["data_dir"]))
    cluster3.up(3)
    cluster3.refresh()
    others = [u for i, u in enumerate(cluster3.urls()) if i != victim]
    for batch in range(20, 25):
        acked += publish(others, "metrics", batch)
    total = len(read(cluster3.urls()[cluster3.index_of(leader)], "metrics", len(acked)))
    node = cluster3.state["nodes"][victim]
    deadline = time.monotonic() + WAIT_S
    while True:  # the wiped node's own view of its replica: $info-style counts per message
        info = cluster3.cli_json("stream", "describe", "metrics", "--admin", node["admin"])
        if info["partitions"][0]["messages"] >= len(acked):
            break
        assert time.monotonic() < deadline, f"the wiped replica did not catch up: {info}"
        time.sleep(0.2)
    messages = info["partitions"][0]["messages"]
    assert messages % SUB_ENTRY_SIZE == 0 and messages >= total
    seen = read(f"amqp://{node['amqp']}", "metrics", messages)  # from the wiped replica
    check(seen, acked)
    # the wiped replica's copies of the sub-entry chunks kept their Bloom filters: a filtered
    # link there is sent exactly the messages of its value, each once (the producers' batches
    # are deduplicated only by their reconnects resending; count each body's first sighting)
    while True:
        info = cluster3.cli_json("stream", "describe", "regions", "--admin", node["admin"])
        if info["partitions"][0]["messages"] >= 12 * SUB_ENTRY_SIZE:
            break
        assert time.monotonic() < deadline, f"the wiped replica did not catch up: {info}"
        time.sleep(0.2)
    for value in ("apac", "amer"):
        got = read_filtered(f"amqp://{node['amqp']}", value)
        wanted = [
            str(m.body) for b in range(12) for m in regional(b) if b % 3 == REGIONS.index(value)
        ]
        assert list(dict.fromkeys(got)) == wanted

    # rhea through the gateway: publishes a sub-entry of every codec, and reads everything
    gateway = RunningGateway(port=int(cluster3.state["gateways"][0]["amqp"].rsplit(":", 1)[1]))
    extra = [
        bytes(subentry.encode([Message(body=f"rhea-{c}-{i}").encode() for i in range(3)], c)).hex()
        for c in CODECS
    ]
    first = {"f": {"descriptor": 0x200, "type": "string", "value": "first"}}
    report = run_rhea(
        gateway,
        [
            {"op": "publish", "address": "metrics", "sub_entries": extra},
            {"op": "consume", "address": "metrics", "count": messages + 15, "filter": first},
        ],
        timeout_s=90,
    )
    published, consumed = report["steps"]
    assert published["outcomes"] == ["accepted"] * len(CODECS), published
    got = consumed["messages"]
    assert [int(m["offset"]) for m in got] == list(range(messages + 15))
    assert [m["body"] for m in got[messages:]] == [
        f"rhea-{c}-{i}" for c in CODECS for i in range(3)
    ]
