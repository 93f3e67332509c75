"""SAS tokens on `$cbs` (ADR 0021) at a listener that lets nobody in anonymously: the SDK with
the right key works; an expired token, a token for another hub and a link without any token
are refused with the conditions Event Hubs uses. A real listener on 127.0.0.1 over the
in-memory broker (the dialect is the listener's; the broker behind it does not matter)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
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
from support.amqp_clients import LoopThread, unique
from support.eventhubs import KEY_NAME, collect, send
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
