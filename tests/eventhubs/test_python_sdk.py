"""azure-eventhub (PyPI, 5.15.1, its pure-Python AMQP stack) against a real Spate node with the
Event Hubs dialect (ADR 0021): the only change to the application is its connection string."""

from __future__ import annotations

import datetime
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.exceptions import AuthenticationError, EventHubError
from proton import Message, symbol
from proton.utils import BlockingConnection, LinkDetached
from spate.gateway.eventhubs import key_partition
from support.amqp_clients import offset_filter, partition_option, receive, unique
from support.eventhubs import FileCheckpointStore, Hubs, collect, run_js, run_sample, send

SAMPLES = Path(__file__).resolve().parents[2] / ".venv" / "azure-eventhub-samples"
"""The SDK's own samples, from its PyPI sdist (tools/bootstrap.sh puts them there)."""

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("eventhubs")]


def test_the_sdks_send_sample_runs_unchanged_and_its_events_arrive(hubs: Hubs) -> None:
    sample = SAMPLES / "send.py"
    assert sample.exists(), f"{sample} is missing: run tools/bootstrap.sh (make install)"
    hub = hubs.create(unique("send-sample"), partitions=2)
    env = dict(os.environ, EVENT_HUB_CONN_STR=hubs.conn_str(), EVENT_HUB_NAME=hub)
    out = run_sample(sample, env)
    assert "Send messages in" in out
    client = EventHubConsumerClient.from_connection_string(
        hubs.conn_str(), consumer_group="$Default", eventhub_name=hub
    )
    with client:
        stored = [client.get_partition_properties(p) for p in client.get_partition_ids()]
    total = sum(p["last_enqueued_sequence_number"] + 1 for p in stored)
    assert total >= 17  # 1 + the size-limited batch (1+) + 1 + 1 + 1 + 10 + 3
    events = collect(hubs.conn_str(), hub, total, starting_position="-1")
    assert len(events) == total
    bodies = [e.body_as_str() for _, e in events]
    assert bodies.count("Single message") == 1
    assert sorted(b for b in bodies if b.startswith("Event Data")) == sorted(
        f"Event Data {i}" for i in range(10)
    )
    keyed = [(p, e) for p, e in events if e.body_as_str().startswith("Message will be sent to a")]
    assert keyed[0][0] == str(key_partition("pkey", 2))  # Event Hubs' hash of the key
    assert keyed[0][1].partition_key == b"pkey"  # the SDK hands it out as bytes
    by_id = [p for p, e in events if e.body_as_str().endswith("target-id partition")]
    assert by_id == ["0"]
    props = next(e for _, e in events if e.body_as_str() == "Message with properties")
    assert props.properties == {b"prop_key": b"prop_value"}
    for _, event in events:  # sequence numbers are offsets; offsets their decimal
        assert event.offset == str(event.sequence_number)
        assert event.enqueued_time is not None


def test_receive_from_start_offset_sequence_number_and_enqueued_time(hubs: Hubs) -> None:
    hub = hubs.create(unique("positions"), partitions=1)
    conn = hubs.conn_str()
    send(conn, hub, [f"a{i}" for i in range(5)])
    time.sleep(0.05)
    middle = datetime.datetime.now(datetime.UTC)
    time.sleep(0.05)
    send(conn, hub, [f"b{i}" for i in range(5)])

    def bodies(count: int, **kwargs: Any) -> list[str]:
        return [e.body_as_str() for _, e in collect(conn, hub, count, partition_id="0", **kwargs)]

    assert bodies(10, starting_position="-1") == [f"a{i}" for i in range(5)] + [
        f"b{i}" for i in range(5)
    ]
    assert bodies(6, starting_position="3") == ["a4", *[f"b{i}" for i in range(5)]]
    assert bodies(7, starting_position=3, starting_position_inclusive=True)[0] == "a3"
    assert bodies(6, starting_position=3)[0] == "a4"
    assert bodies(5, starting_position=middle) == [f"b{i}" for i in range(5)]


def test_hub_and_partition_properties(hubs: Hubs) -> None:
    hub = hubs.create(unique("props"), partitions=3)
    conn = hubs.conn_str()
    send(conn, hub, ["x", "y"], partition_id="1")
    client = EventHubConsumerClient.from_connection_string(
        conn, consumer_group="$Default", eventhub_name=hub
    )
    with client:
        assert client.get_partition_ids() == ["0", "1", "2"]
        properties = client.get_eventhub_properties()
        assert properties["eventhub_name"] == hub
        one = client.get_partition_properties("1")
        empty = client.get_partition_properties("2")
    assert one["beginning_sequence_number"] == 0
    assert one["last_enqueued_sequence_number"] == 1
    assert one["last_enqueued_offset"] == "1"
    assert one["is_empty"] is False
    assert empty["is_empty"] is True


def test_an_equal_owner_level_takes_the_partition_from_the_older_receiver(hubs: Hubs) -> None:
    """Event Hubs' rule: a receiver with an owner level >= the current one's takes over (a
    greater one too: tests/core/test_ownership.py, tests/gateway's consumer-group tests)."""
    hub = hubs.create(unique("epochs"), partitions=1)
    conn = hubs.conn_str()
    send(conn, hub, ["e0", "e1"])
    errors: list[BaseException] = []
    first = EventHubConsumerClient.from_connection_string(
        conn, consumer_group="$Default", eventhub_name=hub
    )
    seen = threading.Event()
    worker = threading.Thread(
        target=first.receive,
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
    assert seen.wait(20), "the first receiver got nothing"
    got = collect(conn, hub, 2, partition_id="0", owner_level=1, starting_position="-1")
    assert [e.body_as_str() for _, e in got] == ["e0", "e1"]
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        time.sleep(0.1)
    first.close()
    worker.join(10)
    assert errors, "the older receiver was not told"
    # the condition Event Hubs uses, on Spate's consumer group for the Event Hubs one
    assert "amqp:link:stolen" in str(errors[0])
    assert "consumer group 'eventhubs:$Default'" in str(errors[0])


def test_a_token_signed_with_another_key_is_refused(hubs: Hubs) -> None:
    hub = hubs.create(unique("auth"), partitions=1)
    producer = EventHubProducerClient.from_connection_string(
        hubs.conn_str(key="not-the-key-not-the-key"), eventhub_name=hub, retry_total=0
    )
    with pytest.raises((AuthenticationError, EventHubError)) as refused, producer:
        producer.get_partition_ids()
    assert "InvalidSignature" in str(refused.value) or "401" in str(refused.value)


def test_events_from_the_sdk_read_by_proton_and_back(hubs: Hubs) -> None:
    hub = hubs.create(unique("interop"), partitions=2)
    conn = hubs.conn_str()
    send(conn, hub, ["from-sdk-0", "from-sdk-1"], partition_id="1")
    url = f"amqp://{hubs.host}:{hubs.port}"
    proton_conn = BlockingConnection(url, timeout=10)
    try:
        receiver = proton_conn.create_receiver(
            hub,
            name=unique("rx"),
            options=[offset_filter("first"), partition_option("1")],
        )
        got = receive(receiver, 2)
        assert [m.body for m in got] == [b"from-sdk-0", b"from-sdk-1"]
        offsets = [got[i].instructions[symbol("event-streams-offset")] for i in range(2)]
        assert offsets == [f"{i:020d}" for i in range(2)]
        sender = proton_conn.create_sender(hub, name=unique("tx"), options=partition_option("0"))
        sender.send(Message(body="from-proton", annotations={symbol("x-opt-partition-key"): "k"}))
    finally:
        proton_conn.close()
    events = collect(conn, hub, 1, partition_id="0", starting_position="-1")
    event = events[0][1]
    assert event.body_as_str() == "from-proton"
    assert event.sequence_number == 0
    assert event.offset == "0"
    assert event.partition_key == b"k"
    assert event.enqueued_time is not None


def test_the_event_processor_resumes_from_its_checkpoints(hubs: Hubs, tmp_path: Path) -> None:
    """The SDK's EventProcessor pattern (`receive` with a checkpoint store, checkpoint per
    event): a second processor with the same store starts after the checkpoints."""
    hub = hubs.create(unique("processor"), partitions=2)
    conn = hubs.conn_str()
    store = FileCheckpointStore(tmp_path / "checkpoints.json")
    send(conn, hub, [f"first-{i}" for i in range(3)], partition_id="0")
    send(conn, hub, [f"first-{i}" for i in range(3, 6)], partition_id="1")

    def process(count: int, **kwargs: Any) -> list[str]:
        got: list[str] = []
        client = EventHubConsumerClient.from_connection_string(
            conn, consumer_group="$Default", eventhub_name=hub, checkpoint_store=store
        )
        done = threading.Event()

        def on_event(context: Any, event: EventData) -> None:
            got.append(event.body_as_str())
            context.update_checkpoint(event)
            if len(got) >= count:
                done.set()

        worker = threading.Thread(
            target=client.receive, kwargs={"on_event": on_event, **kwargs}, daemon=True
        )
        worker.start()
        done.wait(30)
        time.sleep(0.3)  # anything beyond `count` would arrive now
        client.close()
        worker.join(10)
        return got

    assert sorted(process(6, starting_position="-1")) == [f"first-{i}" for i in range(6)]
    checkpoints = store._load()["checkpoints"].values()
    assert sorted((c["partition_id"], c["sequence_number"]) for c in checkpoints) == [
        ("0", 2),
        ("1", 2),
    ]
    send(conn, hub, ["second-0"], partition_id="0")
    send(conn, hub, ["second-1"], partition_id="1")
    assert sorted(process(2, starting_position="-1")) == ["second-0", "second-1"]


def test_python_sdk_over_tls(tls_hubs: Hubs) -> None:
    hub = tls_hubs.create(unique("tls"), partitions=1)
    kwargs = tls_hubs.client_kwargs()
    send(tls_hubs.conn_str(), hub, ["secure-0", "secure-1"], client_kwargs=kwargs)
    got = collect(
        tls_hubs.conn_str(),
        hub,
        2,
        client_kwargs=kwargs,
        partition_id="0",
        starting_position="-1",
    )
    assert [e.body_as_str() for _, e in got] == ["secure-0", "secure-1"]


def test_spate_client_reads_sdk_events_and_the_sdk_reads_spate_client_events(hubs: Hubs) -> None:
    from spate.client import Consumer, Producer

    hub = hubs.create(unique("spate-client"), partitions=2)
    conn = hubs.conn_str()
    url = f"amqp://{hubs.host}:{hubs.port}"
    send(conn, hub, ["eh-0", "eh-1"], partition_key="tenant-9")
    partition = key_partition("tenant-9", 2)
    assert partition == 0  # Event Hubs' hash; MurmurHash3 would put it on 1
    with Consumer(url, hub, partition=partition, start="first") as consumer:
        events = [consumer.receive(timeout=10) for _ in range(2)]
    assert [(e.offset, e.message.body) for e in events] == [(0, b"eh-0"), (1, b"eh-1")]
    assert events[0].message.annotations["x-opt-partition-key"] == "tenant-9"
    assert events[0].timestamp_ms > 0
    other = 1 - partition
    with Producer(url, hub, partition=other) as producer:
        producer.send_batch([b"spate-0", b"spate-1", b"spate-2"])
    got = collect(conn, hub, 3, partition_id=str(other), starting_position="-1")
    assert [e.body_as_str() for _, e in got] == ["spate-0", "spate-1", "spate-2"]
    assert [e.sequence_number for _, e in got] == [0, 1, 2]
    assert [e.offset for _, e in got] == ["0", "1", "2"]


def test_management_reads_of_what_does_not_exist_are_refused_clearly(hubs: Hubs) -> None:
    hub = hubs.create(unique("missing"), partitions=2)
    client = EventHubConsumerClient.from_connection_string(
        hubs.conn_str(), consumer_group="$Default", eventhub_name=hub, retry_total=0
    )
    with client, pytest.raises(EventHubError) as no_partition:
        client.get_partition_properties("7")
    assert "has no partition '7'" in str(no_partition.value)
    client = EventHubConsumerClient.from_connection_string(
        hubs.conn_str(), consumer_group="$Default", eventhub_name="no-such-hub", retry_total=0
    )
    with client, pytest.raises(EventHubError) as no_hub:
        client.get_partition_ids()
    assert "no-such-hub" in str(no_hub.value)


@pytest.mark.filterwarnings("ignore:uAMQP legacy support:DeprecationWarning")
def test_the_uamqp_transport_reads_properties_and_receives_with_an_owner_level(
    tls_hubs: Hubs,
) -> None:
    """azure-eventhub's older transport (`uamqp_transport=True`, the uamqp C stack): SASL
    MSSBCBS, the $cbs put-token, `$management` reads and an owner-level receiver with a
    selector. It speaks TLS only (it ignores UseDevelopmentEmulator's port: custom endpoint).
    Sending with it fails inside azure-eventhub 5.15.1 before any frame is sent
    (docs/event-hubs.md), so the events are sent with the default transport."""
    hub = tls_hubs.create(unique("uamqp"), partitions=2)
    kwargs = {**tls_hubs.client_kwargs(), "uamqp_transport": True}
    send(tls_hubs.conn_str(), hub, ["u0", "u1", "u2"], tls_hubs.client_kwargs(), partition_id="1")
    client = EventHubConsumerClient.from_connection_string(
        tls_hubs.conn_str(), consumer_group="$Default", eventhub_name=hub, **kwargs
    )
    with client:
        assert client.get_partition_ids() == ["0", "1"]
        assert client.get_partition_properties("1")["last_enqueued_sequence_number"] == 2
    got = collect(
        tls_hubs.conn_str(),
        hub,
        2,
        client_kwargs=kwargs,
        partition_id="1",
        owner_level=1,
        starting_position="0",  # exclusive: after offset 0
    )
    assert [(e.body_as_str(), e.sequence_number, e.offset) for _, e in got] == [
        ("u1", 1, "1"),
        ("u2", 2, "2"),
    ]


def test_receivers_without_an_owner_level_give_way_to_one_with_it(hubs: Hubs) -> None:
    """Event Hubs' mixed rules: receivers without owner level read side by side; a receiver
    with one (here the JS SDK's) disconnects them (`amqp:link:stolen`, the SDKs' "receiver
    disconnected"); while it holds the partition, one without is refused."""
    from spate.gateway.eventhubs import GROUP_PREFIX

    hub = hubs.create(unique("mixed"), partitions=1)
    conn = hubs.conn_str()
    send(conn, hub, ["m0", "m1"])
    readers = []
    for _ in range(2):
        client = EventHubConsumerClient.from_connection_string(
            conn, consumer_group="$Default", eventhub_name=hub
        )
        seen, errors = threading.Event(), list[BaseException]()
        worker = threading.Thread(
            target=client.receive,
            kwargs={
                "on_event": lambda ctx, ev, seen=seen: seen.set(),
                "on_error": lambda ctx, err, errors=errors: errors.append(err),
                "partition_id": "0",
                "starting_position": "-1",
            },
            daemon=True,
        )
        worker.start()
        readers.append((client, worker, seen, errors))
    holder = None
    try:
        for _, _, seen, _ in readers:  # both read at once
            assert seen.wait(20), "a receiver without owner level got nothing"
        [newer] = run_js(
            conn,
            hub,
            [
                {
                    "op": "receive",
                    "count": 2,
                    "partition_id": "0",
                    "from": "earliest",
                    # 1: the JS SDK sends no owner level for 0 (`if (options.ownerLevel)`)
                    "owner_level": 1,
                }
            ],
        )
        # (the JS SDK hands a data section out as a Node Buffer)
        assert [bytes(e["body"]["data"]) for e in newer["events"]] == [b"m0", b"m1"]
        deadline = time.monotonic() + 20
        while not all(errors for *_, errors in readers) and time.monotonic() < deadline:
            time.sleep(0.1)
        for *_, errors in readers:
            assert errors and "amqp:link:stolen" in str(errors[0]), errors
        # an owner-level receiver holds the partition: one without is refused meanwhile
        holder = EventHubConsumerClient.from_connection_string(
            conn, consumer_group="$Default", eventhub_name=hub
        )
        held = threading.Event()
        threading.Thread(
            target=holder.receive,
            kwargs={
                "on_event": lambda ctx, ev: held.set(),
                "partition_id": "0",
                "owner_level": 1,
                "starting_position": "-1",
            },
            daemon=True,
        ).start()
        assert held.wait(20)
        plain = BlockingConnection(f"amqp://{hubs.host}:{hubs.port}", timeout=10)
        try:
            with pytest.raises(LinkDetached) as refused:
                plain.create_receiver(
                    f"{hub}/ConsumerGroups/$Default/Partitions/0", name=unique("rx")
                )
        finally:
            plain.close()
        assert "amqp:resource-locked" in str(refused.value)
        assert f"{GROUP_PREFIX}$Default" in str(refused.value)
    finally:
        for client, worker, _, _ in readers:
            client.close()
            worker.join(10)
        if holder is not None:
            holder.close()
