"""SAS tokens on `$cbs` (ADR 0021) at a listener that lets nobody in anonymously: the SDK with
the right key works; an expired token, a token for another hub and a link without any token
are refused with the conditions Event Hubs uses; a connection without SASL gets as far as
`$cbs`; and the batch format's refusals (rhea). Real
listeners on 127.0.0.1 over the in-memory broker (the dialect is the listener's; the broker
behind it does not matter)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote_plus, urlencode

import pytest
from azure.eventhub import EventHubProducerClient
from azure.eventhub.exceptions import AuthenticationError, EventHubError
from proton.utils import BlockingConnection, LinkDetached
from spate.core.ids import StreamName
from spate.core.streams import StreamConfig
from spate.gateway.auth import hash_password
from spate.gateway.server import GatewayServer, ListenerConfig
from support.amqp_clients import LoopThread, offset_filter, receive, unique
from support.eventhubs import JS_DIR, KEY_NAME, collect, run_js, send
from support.memory_broker import MemoryBroker

KEY = "a-shared-access-key-for-tests-0123456789"


@pytest.fixture(scope="module")
def listener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, MemoryBroker]]:
    users = tmp_path_factory.mktemp("tokens") / "users.json"
    users.write_text(
        json.dumps({"users": {"app": hash_password("pw")}, "sas_keys": {KEY_NAME: KEY}})
    )
    thread = LoopThread()
    broker = MemoryBroker("n1")
    server = GatewayServer(
        broker,
        ListenerConfig(
            node_id="n1", users_file=users, allow_anonymous=False, dialects=("eventhubs",)
        ),
    )
    port = thread.call(server.start())
    try:
        yield port, broker
    finally:
        thread.call(server.close())
        thread.stop()


@pytest.fixture(scope="module")
def anonymous_listener() -> Iterator[tuple[int, MemoryBroker]]:
    """A dialect listener that lets clients in anonymously (no SAS keys: tokens not needed)."""
    thread = LoopThread()
    broker = MemoryBroker("n1")
    server = GatewayServer(broker, ListenerConfig(node_id="n1", dialects=("eventhubs",)))
    port = thread.call(server.start())
    try:
        yield port, broker
    finally:
        thread.call(server.close())
        thread.stop()


def _hub(broker: MemoryBroker) -> str:
    name = unique("hub")
    broker.create_stream(StreamConfig(StreamName(name), partitions=1))
    return name


def _conn(port: int, key: str = KEY) -> str:
    return (
        f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessKeyName={KEY_NAME};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true"
    )


def _sas(resource: str, expires: int) -> str:
    signed = f"{quote_plus(resource)}\n{expires}".encode()
    sig = base64.b64encode(hmac.new(KEY.encode(), signed, hashlib.sha256).digest())
    return "SharedAccessSignature " + urlencode(
        {"sr": resource, "sig": sig, "se": str(expires), "skn": KEY_NAME}
    )


def test_the_right_key_sends_and_receives(listener: tuple[int, MemoryBroker]) -> None:
    port, broker = listener
    hub = _hub(broker)
    send(_conn(port), hub, ["signed"])
    got = collect(_conn(port), hub, 1, partition_id="0", starting_position="-1")
    assert got[0][1].body_as_str() == "signed"


def _refusal(conn_str: str, hub: str) -> str:
    producer = EventHubProducerClient.from_connection_string(
        conn_str, eventhub_name=hub, retry_total=0
    )
    with pytest.raises((AuthenticationError, EventHubError)) as refused, producer:
        producer.send_batch(producer.create_batch())
    return str(refused.value)


def test_a_wrong_key_an_expired_token_and_a_token_for_another_hub_are_refused(
    listener: tuple[int, MemoryBroker],
) -> None:
    port, broker = listener
    hub, other = _hub(broker), _hub(broker)
    assert "InvalidSignature" in _refusal(_conn(port, key="wrong-key-wrong-key-wrong"), hub)
    expired = _sas(f"sb://127.0.0.1/{hub}", int(time.time()) - 3600)
    by_token = f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessSignature={expired};"
    by_token += "UseDevelopmentEmulator=true"
    assert "ExpiredToken" in _refusal(by_token, hub)
    elsewhere = _sas(f"sb://127.0.0.1/{other}", int(time.time()) + 3600)
    by_token = f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessSignature={elsewhere};"
    by_token += "UseDevelopmentEmulator=true"
    assert "amqp:unauthorized-access" in _refusal(by_token, hub)


def test_a_plain_amqp_client_without_a_token_is_refused(
    listener: tuple[int, MemoryBroker], tmp_path: Path
) -> None:
    port, broker = listener
    hub = _hub(broker)
    conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10, allowed_mechs="ANONYMOUS")
    try:
        with pytest.raises(LinkDetached) as refused:
            conn.create_sender(f"amqps://127.0.0.1/{hub}", name=unique("tx"))
        assert "amqp:unauthorized-access" in str(refused.value)
    finally:
        conn.close()
    # PLAIN users are who they say: no token needed for Spate's own clients
    conn = BlockingConnection(
        f"amqp://127.0.0.1:{port}", timeout=10, user="app", password="pw", allowed_mechs="PLAIN"
    )
    try:
        conn.create_sender(hub, name=unique("tx"))
    finally:
        conn.close()


def _raw_batch(port: int, address: str, *, batch: bool) -> dict[str, str]:
    proc = subprocess.run(
        ["node", str(JS_DIR / "raw_batch.js")],
        input=json.dumps({"port": port, "address": address, "batch": batch}),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    result: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_batches_go_to_event_hubs_links_only_and_must_hold_messages(
    anonymous_listener: tuple[int, MemoryBroker],
) -> None:
    port, broker = anonymous_listener
    hub = _hub(broker)
    assert _raw_batch(port, f"amqps://127.0.0.1/{hub}", batch=True) == {"outcome": "accepted"}
    conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10)
    try:
        receiver = conn.create_receiver(hub, name=unique("rx"), options=[offset_filter("first")])
        assert [m.body for m in receive(receiver, 2)] == ["inner", "inner"]
    finally:
        conn.close()
    assert _raw_batch(port, f"amqps://127.0.0.1/{hub}", batch=False) == {
        "outcome": "rejected",
        "condition": "amqp:decode-error",
    }
    # on Spate's own address (this connection put no $cbs token) a batch ends the link
    assert _raw_batch(port, hub, batch=True) == {"link_error": "amqp:not-implemented"}


def test_the_js_sdk_is_refused_with_a_wrong_key(listener: tuple[int, MemoryBroker]) -> None:
    """@azure/event-hubs sees the Python SDK's refusal: the $cbs put-token answered 401 with
    the reason, surfaced as its authorization error (no retries asked); the right key sends.
    With a `SharedAccessSignature=` connection string the SDK opens the connection without
    SASL: the listener lets it in as far as `$cbs`, and its valid token lets it send and
    receive; an expired one is refused."""
    port, broker = listener
    hub = _hub(broker)
    refuse = {"op": "send", "bodies": ["x"], "expect_error": True, "max_retries": 0}
    (wrong,) = run_js(_conn(port, key="wrong-key-wrong-key-wrong"), hub, [refuse])
    assert "InvalidSignature" in wrong["error"], wrong
    (ok,) = run_js(_conn(port), hub, [{"op": "send", "bodies": ["signed"]}])
    assert ok == {"sent": 1}

    def by_token(expires: int) -> str:
        token = _sas(f"sb://127.0.0.1/{hub}", expires)
        return (
            f"Endpoint=sb://127.0.0.1:{port}/;SharedAccessSignature={token};"
            "UseDevelopmentEmulator=true"
        )

    sent, got = run_js(
        by_token(int(time.time()) + 3600),
        hub,
        [
            {"op": "send", "bodies": ["by-token"], "partition_id": "0"},
            {"op": "receive", "count": 2, "partition_id": "0", "from": "earliest"},
        ],
    )
    assert sent == {"sent": 1}
    assert [e["body"] for e in got["events"]] == ["signed", "by-token"]
    (expired,) = run_js(by_token(int(time.time()) - 3600), hub, [refuse])
    assert "ExpiredToken" in expired["error"], expired


def test_a_connection_without_sasl_gets_no_further_than_cbs_without_a_token(
    listener: tuple[int, MemoryBroker],
) -> None:
    """A dialect listener that lets nobody in anonymously takes a connection without SASL
    (what @azure/event-hubs opens for a `SharedAccessSignature=` connection string) only as
    far as `$cbs`: a hub, a partition, Spate's own stream address are refused until a token
    covering them is put."""
    port, broker = listener
    hub = _hub(broker)
    conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10, sasl_enabled=False)
    try:
        for address in (f"amqps://127.0.0.1/{hub}", f"{hub}/Partitions/0", hub):
            with pytest.raises(LinkDetached) as refused:
                conn.create_sender(address, name=unique("tx"))
            assert "amqp:unauthorized-access" in str(refused.value), address
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver(f"{hub}/ConsumerGroups/$Default/Partitions/0", name=unique("rx"))
        assert "amqp:unauthorized-access" in str(refused.value)
        conn.create_sender("$cbs", name=unique("cbs"))  # the way in stays open
    finally:
        conn.close()
