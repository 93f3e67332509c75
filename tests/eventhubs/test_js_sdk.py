"""@azure/event-hubs (npm, 6.0.4) against a real Spate node with the Event Hubs dialect
(ADR 0021), over plain TCP and TLS; and events crossing between it and the Python SDK."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
from spate.gateway.eventhubs import key_partition
from support.amqp_clients import unique
from support.eventhubs import JS_DIR, Hubs, collect, run_js

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("eventhubs")]


def test_js_sends_batches_reads_properties_and_receives_from_positions(hubs: Hubs) -> None:
    hub = hubs.create(unique("js"), partitions=2)
    conn = hubs.conn_str()
    sent, props, first, by_sequence, by_offset = run_js(
        conn,
        hub,
        [
            {"op": "send", "bodies": [f"p1-{i}" for i in range(4)], "partition_id": "1"},
            {"op": "properties"},
            {"op": "receive", "count": 4, "partition_id": "1", "from": "earliest"},
            {
                "op": "receive",
                "count": 2,
                "partition_id": "1",
                "from": {"sequence_number": 2, "inclusive": True},
            },
            {"op": "receive", "count": 1, "partition_id": "1", "from": {"offset": "2"}},
        ],
    )
    assert sent == {"sent": 4}
    assert props["hub"] == {"name": hub, "partition_ids": ["0", "1"]}
    assert props["partitions"]["1"]["last_sequence_number"] == 3
    assert props["partitions"]["1"]["last_offset"] == "3"
    assert props["partitions"]["0"]["empty"] is True
    assert [e["body"] for e in first["events"]] == [f"p1-{i}" for i in range(4)]
    assert [e["sequence_number"] for e in first["events"]] == [0, 1, 2, 3]
    assert [e["offset"] for e in first["events"]] == ["0", "1", "2", "3"]
    assert first["events"][0]["properties"] == {"from": "js"}
    assert [e["body"] for e in by_sequence["events"]][:2] == ["p1-2", "p1-3"]
    assert [e["body"] for e in by_offset["events"]] == ["p1-3"]


def test_js_partition_key_and_enqueued_time_and_the_python_sdk_reads_it(hubs: Hubs) -> None:
    hub = hubs.create(unique("js-key"), partitions=2)
    conn = hubs.conn_str()
    run_js(conn, hub, [{"op": "send", "bodies": ["old"], "partition_key": "user-7"}])
    time.sleep(0.05)
    since_ms = int(time.time() * 1000)
    time.sleep(0.05)
    keys = ["user-7", "tenant-9", "ü-ключ", "$0cb", "7"]
    [_, later, mapped] = run_js(
        conn,
        hub,
        [
            {"op": "send", "bodies": ["new"], "partition_key": "user-7"},
            {"op": "receive", "count": 1, "from": {"enqueued_on_ms": since_ms}},
            {"op": "key_partitions", "keys": keys, "partition_count": 32},
        ],
    )
    # Event Hubs' hash of the key (the SDK's own port of the service's), not MurmurHash3
    assert mapped == {key: key_partition(key, 32) for key in keys}
    partition = str(key_partition("user-7", 2))
    assert partition == "0"  # MurmurHash3 would put it on 1
    assert [(e["partition"], e["body"]) for e in later["events"]] == [(partition, "new")]
    assert later["events"][0]["partition_key"] == "user-7"
    got = [e for _, e in collect(conn, hub, 2, partition_id=partition, starting_position="-1")]
    # the JS SDK puts a string body into its data section as JSON; Python hands data out as is
    assert [json.loads(e.body_as_str()) for e in got] == ["old", "new"]
    assert got[0].partition_key == b"user-7"


def test_js_over_tls(tls_hubs: Hubs) -> None:
    hub = tls_hubs.create(unique("js-tls"), partitions=1)
    assert tls_hubs.tls_ca is not None
    _, received = run_js(
        tls_hubs.conn_str(),
        hub,
        [
            {"op": "send", "bodies": ["over-tls"]},
            {"op": "receive", "count": 1, "partition_id": "0", "from": "earliest"},
        ],
        ca=tls_hubs.tls_ca,
        custom_endpoint=f"sb://localhost:{tls_hubs.port}",
    )
    assert [e["body"] for e in received["events"]] == ["over-tls"]


def test_a_js_receiver_with_an_equal_owner_level_takes_over_from_python(hubs: Hubs) -> None:
    from azure.eventhub import EventHubConsumerClient

    hub = hubs.create(unique("js-epoch"), partitions=1)
    conn = hubs.conn_str()
    run_js(conn, hub, [{"op": "send", "bodies": ["x0", "x1"], "partition_id": "0"}])
    errors: list[BaseException] = []
    seen = threading.Event()
    older = EventHubConsumerClient.from_connection_string(
        conn, consumer_group="$Default", eventhub_name=hub
    )
    worker = threading.Thread(
        target=older.receive,
        kwargs={
            "on_event": lambda ctx, ev: seen.set(),
            "on_error": lambda ctx, err: errors.append(err),
            "partition_id": "0",
            "owner_level": 1,
            "starting_position": "-1",
        },
        daemon=True,
    )
    worker.start()
    try:
        assert seen.wait(20), "the Python receiver got nothing"
        [newer] = run_js(
            conn,
            hub,
            [
                {
                    "op": "receive",
                    "count": 2,
                    "partition_id": "0",
                    "from": "earliest",
                    "owner_level": 1,  # equal: takes over too, as on Event Hubs
                }
            ],
        )
        assert [e["body"] for e in newer["events"]] == ["x0", "x1"]
        deadline = time.monotonic() + 20
        while not errors and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        older.close()
        worker.join(10)
    assert errors and "amqp:link:stolen" in str(errors[0])


def test_idempotent_publishing_maps_onto_producer_deduplication(hubs: Hubs) -> None:
    """@azure/event-hubs' idempotent publishing (EventHubBufferedProducerClient with
    `enableIdempotentRetries`): the attach is answered with a producer group id and the last
    sequence number; the events carry their sequence numbers, which are Spate publishing ids
    (ADR 0011, `eventhubs:<id>`): a sender resuming that group (rhea, as the SDKs do after a
    failure) learns where it stopped, and what it sends again is not stored twice."""
    from azure.eventhub import EventHubConsumerClient

    hub = hubs.create(unique("js-idempotent"), partitions=2)
    conn = hubs.conn_str()
    [sent] = run_js(
        conn, hub, [{"op": "send_idempotent", "bodies": ["i0", "i1", "i2"], "partition_id": "1"}]
    )
    assert sent["sent"] == 3
    assert sent["last_sequence_number"] == 2
    producer_id = int(sent["producer_group_id"])
    assert producer_id > 0
    proc = subprocess.run(
        ["node", str(JS_DIR / "raw_idempotent.js")],
        input=json.dumps(
            {
                "port": hubs.port,
                "address": f"{hub}/Partitions/1",
                "producer_id": producer_id,
                "first_sequence": 1,  # i1, i2 again, then i3
                "bodies": ["i1", "i2", "i3"],
            }
        ),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    resumed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert resumed["attach"] == {
        "producer_id": str(producer_id),
        "producer_epoch": 0,
        "last_sequence_number": 2,
    }, resumed
    assert resumed["outcomes"] == ["accepted"] * 3, resumed
    client = EventHubConsumerClient.from_connection_string(
        conn, consumer_group="$Default", eventhub_name=hub
    )
    with client:  # stored once each: offsets 0..3
        assert client.get_partition_properties("1")["last_enqueued_sequence_number"] == 3
    got = collect(conn, hub, 4, partition_id="1", starting_position="-1")
    sequence = b"com.microsoft:producer-sequence-number"
    assert [e.raw_amqp_message.annotations[sequence] for _, e in got] == [0, 1, 2, 3]
