"""TLS and mutual TLS on the admin API (ADR 0023 addendum, spate.api.tls): the admin server in
process, real grpc.aio clients over 127.0.0.1, certificates of a test CA (tests/support/certs.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from cluster.test_admin_server import async_stats, status
from cryptography import x509
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from spate.api.tls import AdminTls, aio_channel, explain
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc
from spate.cluster.admin.auth import AdminAuth
from spate.cluster.admin.operations import Peers
from spate.cluster.admin.server import AdminServer
from spate.cluster.metadata.service import MetadataService
from spate.core.errors import BrokerError, InvalidArgument
from spate.core.ids import NodeId
from spate.core.permissions import UserStore, token_hash
from spate.server.settings import NodeSettings
from support.certs import TestCA

USERS = {
    "users": {
        "alice": {"configure": "", "write": "", "read": ".*"},  # read-only
        "n1": {"configure": ".*", "write": ".*", "read": ".*"},  # the node's certificate
        "ops": {"token_sha256": token_hash("ops-token"), "configure": ".*", "read": ".*"},
    }
}


def stream_request(name: str) -> pb.CreateStreamRequest:
    return pb.CreateStreamRequest(stream=pb.StreamConfig(name=name, partitions=1, replicas=1))


async def call_fails(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


def served_common_name(address: str) -> str:
    """The CN of the certificate the server presents to a new handshake (nothing verified)."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    name = x509.load_der_x509_certificate(der).subject
    return str(name.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_tls_admin_api_plaintext_refused_with_a_clear_message_and_rotation(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """TLS without client certificates: a client with the CA lists streams, health checking
    answers over TLS; a plaintext client fails and is told the server speaks TLS (the CLI's
    message); new certificate files are served at the next handshake without a restart."""
    from spate.cli.admin import _call

    ca = TestCA(tmp_path)
    server_cert = ca.issue("n1")
    tls = AdminTls.load(ca.cert, server_cert.cert, server_cert.key)
    client = AdminTls.load(ca.cert)

    async def main() -> None:
        metadata = MetadataService(
            node_id="n1",
            data_dir=tmp_path / "md",
            self_address=f"127.0.0.1:{free_port()}",
            password="pw",
        )
        await metadata.start()
        server = AdminServer(metadata, stats=async_stats, status=status, tls=tls)
        try:
            await metadata.wait_ready()
            address = f"127.0.0.1:{await server.start()}"
            async with aio_channel(address, client) as channel:
                listed = await pb_grpc.AdminStub(channel).ListStreams(pb.ListStreamsRequest())
                assert list(listed.streams) == []
                health = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="spate.api.v1.Admin")
                )
                assert health.status == health_pb2.HealthCheckResponse.SERVING
            async with grpc.aio.insecure_channel(address) as plain:
                error = await call_fails(
                    pb_grpc.AdminStub(plain).ListStreams(pb.ListStreamsRequest(), timeout=5)
                )
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            why = await asyncio.to_thread(explain, error.details() or "", address, None)
            assert why is not None and f"the admin API at {address} speaks TLS" in why
            # the CLI: the same message, not gRPC's dump (exit code: unavailable)
            import argparse

            args = argparse.Namespace(admin=address, timeout=5.0)
            with pytest.raises(Exception, match="speaks TLS: pass --tls-ca"):
                await asyncio.to_thread(_call, args, "ListStreams", pb.ListStreamsRequest())
            # a client trusting another CA: certificate verify failed, naming the CA file
            (tmp_path / "other").mkdir()
            other = TestCA(tmp_path / "other", "other")
            stranger = AdminTls.load(other.cert, names=("--tls-ca", "--tls-cert", "--tls-key"))
            async with aio_channel(address, stranger) as channel:
                error = await call_fails(
                    pb_grpc.AdminStub(channel).ListStreams(pb.ListStreamsRequest(), timeout=5)
                )
            why = explain(error.details() or "", address, stranger)
            assert why is not None and "certificate verify failed" in why, error.details()
            assert str(other.cert) in why
            # rotation: new files, the next handshake presents them
            assert served_common_name(address) == "n1"
            rotated = ca.issue("n1-rotated")
            server_cert.cert.write_bytes(rotated.cert.read_bytes())
            server_cert.key.write_bytes(rotated.key.read_bytes())
            assert served_common_name(address) == "n1-rotated"
            async with aio_channel(address, client) as channel:
                await pb_grpc.AdminStub(channel).ListStreams(pb.ListStreamsRequest())
        finally:
            await server.stop()
            await metadata.stop()

    asyncio.run(main())


def test_mutual_tls_identity_permissions_and_node_to_node_calls(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """mTLS with tokens required: no client certificate or one of another CA is refused at the
    handshake; CN=alice (read-only) lists streams but may not create one; a CN that is no user
    is UNAUTHENTICATED naming it; a token wins over the certificate; the node's operations call
    other nodes (here itself) over mTLS as its certificate's user."""
    ca = TestCA(tmp_path)
    node_cert, alice, mallory = ca.issue("n1"), ca.issue("alice"), ca.issue("mallory")
    (tmp_path / "other").mkdir()
    other = TestCA(tmp_path / "other", "other")
    alien = other.issue("alice")
    tls = AdminTls.load(ca.cert, node_cert.cert, node_cert.key, client_auth=True)
    store = UserStore.parse(USERS, "users.json")

    def client(cert: object = None, ca_file: Path = ca.cert) -> AdminTls:
        issued = cert
        return AdminTls.load(
            ca_file,
            getattr(issued, "cert", None),
            getattr(issued, "key", None),
            names=("--tls-ca", "--tls-cert", "--tls-key"),
        )

    async def main() -> None:
        metadata = MetadataService(
            node_id="n1",
            data_dir=tmp_path / "md",
            self_address=f"127.0.0.1:{free_port()}",
            password="pw",
        )
        await metadata.start()
        server = AdminServer(
            metadata,
            stats=async_stats,
            status=status,
            auth=AdminAuth(store, require_token=True),
            tls=tls,
            peer_token="",  # no token: the node is its certificate's user
        )
        try:
            await metadata.wait_ready()
            address = f"127.0.0.1:{await server.start()}"
            await metadata.register_node(
                NodeId("n1"), amqp=address, admin=address, replication=address, metadata=None
            )
            # no client certificate: refused at the handshake
            anonymous = client()
            async with aio_channel(address, anonymous) as channel:
                error = await call_fails(
                    pb_grpc.AdminStub(channel).ListStreams(pb.ListStreamsRequest(), timeout=5)
                )
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            why = explain(error.details() or "", address, anonymous)
            assert why is not None and "requires a client certificate" in why, error.details()
            # a certificate of another CA (even with a user's CN): refused at the handshake
            alien_tls = client(alien)
            async with aio_channel(address, alien_tls) as channel:
                error = await call_fails(
                    pb_grpc.AdminStub(channel).ListStreams(pb.ListStreamsRequest(), timeout=5)
                )
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            why = explain(error.details() or "", address, alien_tls)
            assert why is not None and "did not accept the client certificate" in why
            assert str(alien.cert) in why
            # alice: reads, may not create
            async with aio_channel(address, client(alice)) as channel:
                stub = pb_grpc.AdminStub(channel)
                await stub.ListStreams(pb.ListStreamsRequest())
                error = await call_fails(stub.CreateStream(stream_request("orders")))
                assert error.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "alice" in (error.details() or "") and "configure" in (error.details() or "")
                # a token wins over the certificate
                created = stub.CreateStream(
                    stream_request("orders"), metadata=(("authorization", "Bearer ops-token"),)
                )
                await created
            # a certificate of the CA whose CN is no user
            async with aio_channel(address, client(mallory)) as channel:
                error = await call_fails(
                    pb_grpc.AdminStub(channel).ListStreams(pb.ListStreamsRequest())
                )
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "'mallory'" in (error.details() or "")
            # node to node: the operations' peers call over mTLS as user n1 (no token)
            peers = server._servicer.operations.peers
            answer = await peers.call_any("n1", "ClusterStatus", pb.ClusterStatusRequest())
            assert isinstance(answer, pb.ClusterStatusResponse) and answer.metadata.ready
            plain = Peers(metadata, token="")
            try:
                with pytest.raises(BrokerError, match="did not answer"):
                    await plain.call_any("n1", "ClusterStatus", pb.ClusterStatusRequest(), 5)
            finally:
                await plain.close()
            # the CLI, with the three flags (one real subprocess)
            env = {k: v for k, v in os.environ.items() if not k.startswith("SPATE_ADMIN")}
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "spate.cli.main",
                "stream",
                "list",
                "--admin",
                address,
                "--tls-ca",
                str(ca.cert),
                "--tls-cert",
                str(alice.cert),
                "--tls-key",
                str(alice.key),
                "--output",
                "json",
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
            out, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
            assert [s["name"] for s in json.loads(out)["streams"]] == ["orders"]
        finally:
            await server.stop()
            await metadata.stop()

    asyncio.run(main())


def test_admin_tls_settings_are_checked_naming_the_field(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    node = ca.issue("n1")
    base = {"node_id": "n1", "data_dir": tmp_path, "metadata_password": "pw"}
    with pytest.raises(InvalidArgument, match="missing: admin_tls_key, admin_tls_ca"):
        NodeSettings(**base, admin_tls_cert=node.cert).validate()  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="admin_tls_client_auth"):
        NodeSettings(**base, admin_tls_client_auth=True).validate()  # type: ignore[arg-type]
    NodeSettings(
        **base,  # type: ignore[arg-type]
        admin_tls_cert=node.cert,
        admin_tls_key=node.key,
        admin_tls_ca=ca.cert,
        admin_tls_client_auth=True,
    ).validate()
    missing = tmp_path / "nope.pem"
    with pytest.raises(InvalidArgument, match=f"admin_tls_ca: cannot read {missing}: No such"):
        AdminTls.load(missing, node.cert, node.key)
    with pytest.raises(InvalidArgument, match=f"admin_tls_cert: {node.key} holds no PEM cert"):
        AdminTls.load(ca.cert, node.key, node.key)
    stranger = ca.issue("n2")
    with pytest.raises(InvalidArgument, match="the key does not match the certificate"):
        AdminTls.load(ca.cert, node.cert, stranger.key)
    with pytest.raises(InvalidArgument, match="--tls-key is set but --tls-cert is not"):
        AdminTls.load(ca.cert, None, node.key, names=("--tls-ca", "--tls-cert", "--tls-key"))


def test_who_calls_token_then_certificate_then_the_loopback_rule() -> None:
    """AdminAuth.identify (pure): a token wins over a certificate; a verified certificate's
    common name is its user, satisfies tokens-required, and names the CN when it is no user;
    without a users file certificates change nothing (anonymous, loopback rule)."""
    from spate.core.errors import Unauthenticated

    store = UserStore.parse(USERS, "users.json")
    bearer = (("authorization", "Bearer ops-token"),)
    strict = AdminAuth(store, require_token=True)
    assert strict.identify(bearer, "ipv4:10.0.0.9:5000", "alice") == "ops"
    assert strict.identify((), "ipv4:10.0.0.9:5000", "alice") == "alice"
    with pytest.raises(Unauthenticated, match="common name 'mallory' is not a user"):
        strict.identify((), "ipv4:10.0.0.9:5000", "mallory")
    with pytest.raises(Unauthenticated, match="common name 'anonymous' is not a user"):
        AdminAuth(UserStore.parse({"users": {"anonymous": {}}}, "f")).identify(
            (), "ipv4:127.0.0.1:5000", "anonymous"
        )
    with pytest.raises(Unauthenticated, match="needs a token"):
        strict.identify((), "ipv4:127.0.0.1:5000")
    open_auth = AdminAuth(None)
    assert open_auth.identify((), "ipv4:127.0.0.1:5000", "mallory") == "anonymous"
    with pytest.raises(Unauthenticated, match="loopback only"):
        open_auth.identify((), "ipv4:10.0.0.9:5000", "mallory")


def test_gateway_admin_tls_settings_name_the_field(tmp_path: Path) -> None:
    from spate.server.gateway_process import GatewaySettings

    ca = TestCA(tmp_path)
    issued = ca.issue("g1")
    base = {"admin": ("127.0.0.1:7600",), "data_dir": tmp_path, "mode": "redirect"}
    with pytest.raises(InvalidArgument, match="needs both admin_tls_cert and admin_tls_key"):
        GatewaySettings(**base, admin_tls_cert=issued.cert).validate()  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="admin_tls_cert needs admin_tls_ca"):
        GatewaySettings(
            **base,  # type: ignore[arg-type]
            admin_tls_cert=issued.cert,
            admin_tls_key=issued.key,
        ).validate()
    GatewaySettings(**base, admin_tls_ca=ca.cert).validate()  # type: ignore[arg-type]
