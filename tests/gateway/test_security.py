"""Connection establishment: capability, SASL ANONYMOUS / PLAIN, TLS (proton and rhea)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from proton import ConnectionException, Message, symbol
from proton.utils import BlockingConnection
from spate.gateway import codec
from spate.gateway.auth import hash_password, verify_password
from support.amqp_clients import (
    RunningGateway,
    blocking,
    offset_filter,
    receive,
    run_rhea,
    self_signed_cert,
    unique,
)

PASSWORD = "s3cret-pw"


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("users") / "users.json"
    path.write_text(json.dumps({"users": {"alice": hash_password(PASSWORD, n=2**10)}}))
    return path


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


def test_hash_and_verify() -> None:
    encoded = hash_password("pw", n=2**10)
    assert encoded.startswith("scrypt$1024$8$1$")
    assert verify_password("pw", encoded) and not verify_password("pW", encoded)
    assert hash_password("pw", n=2**10) != encoded  # per-user random salt


def test_event_streams_capability_is_offered(gateway: RunningGateway) -> None:
    """000 §3.1 / §8.1: the open frame offers AMQP_EVENT_STREAMS_V1_0."""
    with blocking(gateway) as conn:
        assert symbol("AMQP_EVENT_STREAMS_V1_0") in conn.conn.remote_offered_capabilities
    report = run_rhea(gateway, [])
    assert "AMQP_EVENT_STREAMS_V1_0" in report["offered_capabilities"]


def test_plain_good_and_bad_password(
    start_gateway: Callable[..., RunningGateway], make_stream: Callable[..., str], users_file: Path
) -> None:
    gateway = start_gateway(users_file=users_file, allow_anonymous=False)
    stream = make_stream()
    with blocking(gateway, user="alice", password=PASSWORD) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        assert sender.send(Message(body="hi")).remote_state == 36
    with (
        pytest.raises(ConnectionException) as failed,
        blocking(gateway, user="alice", password="wrong"),
    ):
        pass
    assert "unauthorized-access" in str(failed.value) or "Authentication" in str(failed.value)
    with pytest.raises(ConnectionException), blocking(gateway, user="mallory", password=PASSWORD):
        pass
    good = run_rhea(
        gateway,
        [{"op": "publish", "address": stream, "bodies": ["r"]}],
        username="alice",
        password=PASSWORD,
    )
    assert good["steps"][0]["outcomes"] == ["accepted"]
    bad = run_rhea(
        gateway,
        [{"op": "publish", "address": stream, "bodies": ["r"]}],
        username="alice",
        password="nope",
    )
    assert bad["steps"] == [] and "disconnected" in bad


def test_anonymous_refused_when_disabled(
    start_gateway: Callable[..., RunningGateway], users_file: Path
) -> None:
    gateway = start_gateway(users_file=users_file, allow_anonymous=False)
    with pytest.raises(ConnectionException):
        BlockingConnection(gateway.url, timeout=5, allowed_mechs="ANONYMOUS")
    # a plain AMQP header (no SASL) is not a way around it
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x01\x00\x00")
        assert sock.recv(64) == b"AMQP\x03\x01\x00\x00"
        assert sock.recv(64) == b""


def test_anonymous_allowed_with_plain_also_offered(
    start_gateway: Callable[..., RunningGateway], make_stream: Callable[..., str], users_file: Path
) -> None:
    gateway = start_gateway(users_file=users_file, allow_anonymous=True)
    stream = make_stream()
    with blocking(gateway) as conn:  # ANONYMOUS
        conn.create_sender(stream, name=unique("tx")).send(Message(body="anon"))
    with blocking(gateway, user="alice", password=PASSWORD) as conn:
        receiver = conn.create_receiver(stream, name=unique("rx"), options=offset_filter("first"))
        assert [m.body for m in receive(receiver, 1)] == ["anon"]


def test_tls_with_proton_and_rhea(
    start_gateway: Callable[..., RunningGateway],
    make_stream: Callable[..., str],
    users_file: Path,
    certificate: tuple[Path, Path],
) -> None:
    """TLS terminated by asyncio; SASL PLAIN runs inside it."""
    cert, key = certificate
    gateway = start_gateway(tls_cert=cert, tls_key=key, users_file=users_file)
    stream = make_stream()
    with blocking(gateway, user="alice", password=PASSWORD) as conn:
        conn.create_sender(stream, name=unique("tx")).send(Message(body="over tls"))
    report = run_rhea(
        gateway,
        [
            {
                "op": "consume",
                "address": stream,
                "count": 1,
                "filter": {"f": {"descriptor": 0x200, "type": "string", "value": "first"}},
            },
        ],
        username="alice",
        password=PASSWORD,
    )
    assert report["steps"][0]["messages"][0]["body"] == "over tls"
    # a plaintext client cannot talk to the TLS port
    with pytest.raises(ConnectionException):
        BlockingConnection(f"amqp://127.0.0.1:{gateway.port}", timeout=5)


def test_idle_timeout_closes_silent_connections(
    start_gateway: Callable[..., RunningGateway],
) -> None:
    """ListenerConfig.idle_timeout_s: a peer that sends nothing after open is closed."""
    gateway = start_gateway(idle_timeout_s=0.2)
    open_body = codec.encode(codec.Described(codec.ULong(0x10), ["silent-peer"]))
    open_frame = (8 + len(open_body)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + open_body
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(b"AMQP\x00\x01\x00\x00" + open_frame)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert b"amqp:resource-limit-exceeded" in received
