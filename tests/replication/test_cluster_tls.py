"""Mutual TLS on the replication port (ADR 0023, spate.server.tls): a peer with a certificate of
the cluster CA and the secret gets its frames through; a peer without a certificate, or with one
of another CA, is refused in the TLS handshake although it knows the secret."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from spate.core.errors import InvalidArgument
from spate.core.ids import NodeId, PartitionId, StreamName, Term
from spate.node.replication import codec
from spate.node.replication.messages import Heartbeat
from spate.node.replication.transport import Transport
from spate.server.tls import check_all_or_none, cluster_contexts
from support.amqp_clients import self_signed_cert

A, B = NodeId("n1"), NodeId("n2")
SECRET = "the-cluster-secret"


def _credentials(tmp_path: Path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    directory = tmp_path / name
    directory.mkdir()
    cert, key = self_signed_cert(directory)  # its own CA: a cluster of one certificate
    return cluster_contexts(cert, key, cert)


async def _delivered(client_ssl: ssl.SSLContext | None, server_ssl: ssl.SSLContext) -> bool:
    """B dials A (which requires a client certificate) and sends one Raft frame."""
    received: list[bytes] = []
    addresses: dict[NodeId, tuple[str, int]] = {}
    a = Transport(
        A,
        secret=SECRET,
        host="127.0.0.1",
        port=0,
        peers=addresses.get,
        on_frame=lambda peer, kind, body: received.append(bytes(body)),
        ssl_server=server_ssl,
    )
    b = Transport(
        B,
        secret=SECRET,
        host="127.0.0.1",
        port=0,
        peers=addresses.get,
        on_frame=lambda *args: None,
        ssl_client=client_ssl,
    )
    addresses[A] = ("127.0.0.1", await a.start())
    try:
        b.dial(A)
        frame = codec.encode_raft(
            (StreamName("orders"), PartitionId(0)), Heartbeat(Term(1), B, A, 0)
        )
        for _ in range(200):
            if b.connected(A):
                b.send(A, frame)
            if received:
                return True
            await asyncio.sleep(0.01)
        return False
    finally:
        await b.stop()
        await a.stop()


def test_a_peer_with_the_cluster_certificate_gets_through(tmp_path: Path) -> None:
    server, client = _credentials(tmp_path, "cluster")
    assert asyncio.run(_delivered(client, server))


def test_a_peer_without_a_certificate_is_refused(tmp_path: Path) -> None:
    server, _ = _credentials(tmp_path, "cluster")
    anonymous = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    anonymous.check_hostname, anonymous.verify_mode = False, ssl.CERT_NONE
    assert not asyncio.run(_delivered(anonymous, server))


def test_a_peer_of_another_ca_is_refused(tmp_path: Path) -> None:
    server, _ = _credentials(tmp_path, "cluster")
    _, stranger = _credentials(tmp_path, "stranger")
    stranger.verify_mode = ssl.CERT_NONE  # it does not even check us: refused all the same
    assert not asyncio.run(_delivered(stranger, server))


def test_a_peer_without_tls_is_refused(tmp_path: Path) -> None:
    server, _ = _credentials(tmp_path, "cluster")
    assert not asyncio.run(_delivered(None, server))


def test_settings_need_all_three_files(tmp_path: Path) -> None:
    assert not check_all_or_none(None, None, None)
    with pytest.raises(InvalidArgument, match="all three"):
        check_all_or_none(tmp_path / "c.pem", None, tmp_path / "ca.pem")
    with pytest.raises(InvalidArgument, match="cannot load"):
        cluster_contexts(tmp_path / "missing.pem", tmp_path / "k.pem", tmp_path / "ca.pem")
