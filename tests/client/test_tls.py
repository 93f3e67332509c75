"""spate.client over TLS (issue 10 needs it for the Spark connector): `amqps://` URLs, a
context for a private CA, SASL PLAIN inside TLS, against a real gateway process that terminates
TLS in front of a real cluster; and the mistakes a user makes, each with a clear error."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from spate.client import AuthenticationFailed, Consumer, Producer
from spate.client.aio import AsyncProducer, runtime_information
from support.amqp_clients import self_signed_cert
from support.cluster import Cluster, TlsGateway, running_cluster, tls_gateway


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, TlsGateway]]:
    base = tmp_path_factory.mktemp("tls")
    with running_cluster(base / "cluster", nodes=1) as cluster:
        cluster.cli("stream", "create", "secure-orders", "--partitions", "2")
        with tls_gateway(cluster, base / "gw") as gateway:
            yield cluster, gateway


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def test_publish_and_consume_over_tls_with_sasl_plain(secured: tuple[Cluster, TlsGateway]) -> None:
    _, gw = secured
    context = trusting(gw.ca)
    bodies = [f"tls-{i}".encode() for i in range(200)]
    with Producer(
        gw.url, "secure-orders", partition=1, user=gw.user, password=gw.password, tls=context
    ) as producer:
        assert producer.send_batch(bodies) == len(bodies)
    with Consumer(
        gw.url,
        "secure-orders",
        partition=1,
        start="first",
        user=gw.user,
        password=gw.password,
        tls=context,
    ) as consumer:
        events = [consumer.receive(timeout=20) for _ in bodies]
    assert [e.body for e in events] == bodies
    assert [e.offset for e in events] == list(range(len(bodies)))
    info = asyncio.run(
        runtime_information(
            gw.url, "secure-orders", user=gw.user, password=gw.password, tls=context
        )
    )
    assert [int(p["partition"]) for p in info["partitions"]] == [0, 1]


def test_the_system_trust_store_refuses_a_private_ca_at_once(
    secured: tuple[Cluster, TlsGateway],
) -> None:
    """Without `tls=`, amqps:// checks against the system's CAs: the test CA is not one of
    them. The failure is raised at the first attempt even with reconnecting on — no retry can
    change a certificate."""
    _, gw = secured
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        Producer(gw.url, "secure-orders", user=gw.user, password=gw.password,
                 reconnect_timeout_s=600, timeout_s=10)  # fmt: skip


def test_a_wrong_password_over_tls_is_refused(secured: tuple[Cluster, TlsGateway]) -> None:
    """SASL's refusal comes out as such (not "connection lost"), at once although reconnecting
    is on: the same credentials cannot succeed on a retry."""
    _, gw = secured
    with pytest.raises(AuthenticationFailed, match="amqp:unauthorized-access") as refused:
        Producer(gw.url, "secure-orders", user=gw.user, password="wrong", tls=trusting(gw.ca),
                 timeout_s=10, reconnect_timeout_s=600)  # fmt: skip
    assert not isinstance(refused.value, ssl.SSLError)


def test_the_host_name_is_checked(secured: tuple[Cluster, TlsGateway], tmp_path: Path) -> None:
    """The certificate names localhost and 127.0.0.1; another CA's certificate is refused even
    when that CA is trusted for something else."""
    _, gw = secured
    other_ca, _ = self_signed_cert(tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        Producer(gw.url, "secure-orders", user=gw.user, password=gw.password,
                 tls=trusting(other_ca), timeout_s=10)  # fmt: skip


def test_tls_context_without_an_amqps_url_is_a_mistake(
    secured: tuple[Cluster, TlsGateway],
) -> None:
    cluster, gw = secured
    with pytest.raises(ValueError, match=r"amqps://"):
        Producer(cluster.amqp_url(), "secure-orders", tls=trusting(gw.ca))
    with pytest.raises(ValueError, match=r"amqp:// or amqps://"):
        Producer("https://localhost:443", "secure-orders")


def test_a_certificate_failure_is_not_retried(tmp_path: Path) -> None:
    """A TLS listener that counts handshakes (the client's hello, by its server name): with
    reconnecting on for 5 s, a client that does not trust it tries once (retrying with backoff
    would try a dozen times)."""
    cert, key = self_signed_cert(tmp_path)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    hellos: list[str | None] = []
    server_context.sni_callback = lambda _sock, name, _ctx: hellos.append(name)
    accepted = 0
    ready = threading.Event()
    port_box: list[int] = []
    stop: list[asyncio.Event] = []

    async def serve() -> None:
        nonlocal accepted

        async def on_client(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            writer.close()

        server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server_context)
        port_box.append(server.sockets[0].getsockname()[1])
        stop.append(asyncio.Event())
        ready.set()
        async with server:
            await stop[0].wait()

    async def client() -> BaseException:
        try:
            await AsyncProducer.connect(
                f"amqps://localhost:{port_box[0]}", "s", reconnect_timeout_s=5, timeout_s=5
            )
        except BaseException as error:
            return error
        raise AssertionError("connected to an untrusted listener")

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(10)
    error = asyncio.run(client())
    assert isinstance(error, ssl.SSLCertVerificationError), error
    assert hellos == ["localhost"]
    assert accepted == 0
    loop.call_soon_threadsafe(stop[0].set)
    thread.join(10)
    loop.close()
