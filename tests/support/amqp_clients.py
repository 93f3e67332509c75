"""Real AMQP 1.0 clients for gateway tests: proton (BlockingConnection and a Container handler
that sends and receives raw bytes) and rhea (tests/js/client.js in a node subprocess).

Also: a gateway running on its own uvloop thread (`LoopThread`, `RunningGateway`) and a
self-signed certificate maker for TLS tests.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvloop
from proton import Described, Message, SSLDomain, Timeout, symbol, ulong
from proton.handlers import MessagingHandler
from proton.reactor import Container, Filter, LinkOption
from proton.utils import BlockingConnection

REPO = Path(__file__).resolve().parents[2]
JS_DIR = REPO / "tests" / "js"
T = TypeVar("T")
_names = itertools.count()


def unique(prefix: str) -> str:
    """A fresh stream or link name (streams are never shared between tests)."""
    return f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:6]}"


class LoopThread:
    """A uvloop event loop on a daemon thread; `call` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="gateway-loop", daemon=True
        )
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def run(self, fn: Callable[[], T], timeout_s: float = 10.0) -> T:
        async def wrapper() -> T:
            return fn()

        return self.call(wrapper(), timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class RunningGateway:
    port: int
    host: str = "127.0.0.1"
    tls_ca: Path | None = None

    @property
    def url(self) -> str:
        return f"{'amqps' if self.tls_ca else 'amqp'}://{self.host}:{self.port}"


# proton helpers -----------------------------------------------------------------------------


class LinkProperties(LinkOption):
    def __init__(self, properties: dict[Any, Any]) -> None:
        self.properties = properties

    def apply(self, link: Any) -> None:
        link.properties = self.properties


DA_FILTER = ulong(0x200)


def offset_filter(value: Any, *, descriptor: Any = DA_FILTER, key: str = "offset") -> Filter:
    return Filter({symbol(key): Described(descriptor, value)})


def partition_option(partition: str) -> LinkProperties:
    return LinkProperties({symbol("event-streams-partition"): symbol(partition)})


CONSUMER_NAME = symbol("spate:consumer-name")
SINGLE_ACTIVE = symbol("spate:single-active-consumer")
ACTIVE = symbol("spate:active")
"""Link properties of named and single-active consumers (docs/amqp.md)."""


def sac_member(name: str, value: Any = True) -> LinkProperties:
    """A receiver's properties joining `name`'s single-active-consumer group."""
    return LinkProperties({CONSUMER_NAME: name, SINGLE_ACTIVE: value})


@contextmanager
def blocking(
    gateway: RunningGateway,
    *,
    user: str | None = None,
    password: str | None = None,
    timeout_s: float = 10.0,
) -> Iterator[BlockingConnection]:
    kwargs: dict[str, Any] = {"timeout": timeout_s}
    if user is not None:
        kwargs |= {"user": user, "password": password, "allowed_mechs": "PLAIN"}
    if gateway.tls_ca is not None:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(str(gateway.tls_ca))
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        kwargs["ssl_domain"] = domain
        url = f"amqps://localhost:{gateway.port}"
    else:
        url = gateway.url
    connection = BlockingConnection(url, **kwargs)
    try:
        yield connection
    finally:
        connection.close()


def receive(receiver: Any, count: int, timeout_s: float = 10.0) -> list[Message]:
    out = []
    for _ in range(count):
        out.append(receiver.receive(timeout=timeout_s))
        receiver.accept()
    return out


def fill(gateway: RunningGateway, stream: str, count: int, start: int = 0) -> None:
    """Publish the bodies m<start> .. m<start + count - 1>, each confirmed."""
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for i in range(start, start + count):
            sender.send(Message(body=f"m{i}"))


def stream_bodies(gateway: RunningGateway, stream: str, count: int) -> list[Any]:
    """The stream's first `count` bodies, and a check that there is nothing after them."""
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=500, options=[offset_filter("first")]
        )
        got = [m.body for m in receive(receiver, count)]
        try:
            extra = receiver.receive(timeout=0.3)
        except Timeout:
            return got
        raise AssertionError(f"{stream} holds more than {count} messages: {extra.body!r}")


def da(message: Message, key: str) -> Any:
    return (message.instructions or {}).get(symbol(key))


def publish(
    gateway: RunningGateway,
    address: str,
    bodies: list[Any],
    properties: dict[Any, Any] | None = None,
) -> None:
    with blocking(gateway) as conn:
        options = LinkProperties(properties) if properties else None
        sender = conn.create_sender(address, name=unique("tx"), options=options)
        for body in bodies:
            sender.send(Message(body=body))


# raw bytes through proton's Container (no Message decode on the client either) --------------


class RawExchange(MessagingHandler):  # type: ignore[misc]
    """Send `outgoing` raw encoded messages to `address`, then read `expect` raw deliveries
    from it starting at `first` (the 0x200 simple form)."""

    def __init__(self, url: str, address: str, outgoing: list[bytes], expect: int) -> None:
        super().__init__(auto_accept=False, prefetch=0)
        self.url, self.address, self.outgoing, self.expect = url, address, outgoing, expect
        self.outcomes: list[Any] = []
        self.received: list[bytes] = []
        self.error: Any = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, self.address, name=unique("raw"))
        self.sent = 0

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < len(self.outgoing):
            event.sender.delivery(str(self.sent).encode())
            event.sender.send(self.outgoing[self.sent])
            event.sender.advance()
            self.sent += 1

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        if delivery.link.is_sender:
            if delivery.remote_state:
                self.outcomes.append((delivery.remote_state, delivery.remote.condition))
                delivery.settle()
                if len(self.outcomes) == len(self.outgoing):
                    self._consume(event)
            return
        link = delivery.link
        while link.current is not None and link.current.readable and not link.current.partial:
            current = link.current
            self.received.append(bytes(link.recv(current.pending)))
            link.advance()
            current.update(current.ACCEPTED)
            current.settle()
        if len(self.received) == self.expect:
            event.connection.close()

    def _consume(self, event: Any) -> None:
        if not self.expect:
            event.connection.close()
            return
        receiver = event.container.create_receiver(
            self.conn,
            self.address,
            name=unique("rawrx"),
            options=[Filter({symbol("start"): Described(ulong(0x200), "first")})],
        )
        receiver.flow(self.expect)

    def on_link_error(self, event: Any) -> None:
        self.error = event.link.remote_condition
        event.connection.close()

    def run(self) -> RawExchange:
        Container(self).run()
        return self


# rhea ---------------------------------------------------------------------------------------


def run_rhea(
    gateway: RunningGateway, steps: list[dict[str, Any]], *, timeout_s: float = 30.0, **extra: Any
) -> dict[str, Any]:
    """Run tests/js/client.js with these steps; returns its JSON report."""
    args: dict[str, Any] = {
        "port": gateway.port,
        "steps": steps,
        "timeout_ms": int(timeout_s * 1000) - 2000,
    } | extra
    if gateway.tls_ca is not None:
        args["tls"] = {"ca": gateway.tls_ca.read_text()}
    proc = subprocess.Popen(
        ["node", str(JS_DIR / "client.js")],
        cwd=JS_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(json.dumps(args).encode(), timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    report: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return report


# TLS ----------------------------------------------------------------------------------------


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for `localhost` / 127.0.0.1; returns (cert, key) paths."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


# docs/amqp.md's examples ---------------------------------------------------------------------

AMQP_DOC = Path(__file__).resolve().parents[2] / "docs" / "amqp.md"


def run_doc_examples(tag: str, host: str, port: int) -> list[str]:
    """docs/amqp.md's "```python TAG" and "```js TAG" blocks, as written, pointed at
    HOST:PORT; each must exit 0. Returns their outputs, in order."""
    pattern = re.compile(rf"```(python|js) {re.escape(tag)}\n(.*?)```", re.DOTALL)
    found = pattern.findall(AMQP_DOC.read_text())
    assert [language for language, _ in found] == ["python", "js"], found
    return [
        run_example(
            language,
            text.replace("127.0.0.1:5672", f"{host}:{port}").replace("port: 5672", f"port: {port}"),
        )
        for language, text in found
    ]


def run_example(language: str, code: str, env: dict[str, str] | None = None) -> str:
    """Run a documented python or js example as written; it must exit 0. Its output."""
    command = [sys.executable, "-c", code] if language == "python" else ["node", "-e", code]
    done = subprocess.run(
        command,
        cwd=JS_DIR if language == "js" else None,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{language} example failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
