"""chaos.toxiproxy against Toxiproxy's documented behaviour, driven by toxiproxy-python (the
client library the chaos suite uses): the HTTP API (README "HTTP API": proxies, toxics, reset,
populate, errors 404/409/400) and each toxic's effect on a real TCP connection through the
proxy (README "Toxics"). With TOXIPROXY_URL set the same tests drive that server instead (a
real Toxiproxy), so the two stay interchangeable.

Timing checks are lower bounds only (a toxic that delays by 300 ms makes a round trip take at
least 300 ms); no test fails because the machine is slow.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.toxiproxy import running

WAIT_S = 10.0


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    """The API's base URL: TOXIPROXY_URL (a real Toxiproxy) or chaos.toxiproxy on port 0."""
    if url := os.environ.get("TOXIPROXY_URL"):
        yield url.rstrip("/")
        return
    with running(seed=7) as server:
        yield server.url


@pytest.fixture
def toxiproxy(api: str) -> Iterator[Toxiproxy]:
    client = Toxiproxy()
    parts = urlsplit(api)
    client.update_api_consumer(parts.hostname, parts.port)
    client.destroy_all()
    yield client
    client.destroy_all()


def connect(listen: str) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def round_trip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        part = sock.recv(65536)
        if not part:
            break
        got += part
    return got


def test_proxies_are_created_listed_found_and_destroyed(
    toxiproxy: Toxiproxy, echo: str, api: str
) -> None:
    assert toxiproxy.running() and toxiproxy.version()
    proxy = toxiproxy.create(upstream=echo, name="echo")
    assert proxy.listen.startswith("127.0.0.1:") and not proxy.listen.endswith(":0")
    assert set(toxiproxy.proxies()) == {"echo"}
    assert toxiproxy.get_proxy("echo").upstream == echo
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=echo, name="echo")
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"hello") == b"hello"
    assert toxiproxy.destroy(proxy)
    assert toxiproxy.get_proxy("echo") is None
    with pytest.raises(NotFound):
        proxy.add_toxic(type="latency", attributes={"latency": 1})
    answer = requests.get(f"{api}/proxies/nothing", timeout=WAIT_S)
    assert answer.status_code == 404 and "not found" in answer.json()["error"]


def test_bad_toxics_are_refused_with_400(toxiproxy: Toxiproxy, echo: str) -> None:
    """An unknown type is a 400 (InvalidToxic) from either server; chaos.toxics also refuses
    unknown attributes and toxicity outside 0..1 (tests/chaos/test_toxics.py)."""
    proxy = toxiproxy.create(upstream=echo, name="bad")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latencyy")
    proxy.add_toxic(type="latency", attributes={"latency": 5})
    with pytest.raises(ProxyExists):  # the same name (latency_downstream) again: 409
        proxy.add_toxic(type="latency", attributes={"latency": 5})
    toxic = proxy.get_toxic("latency_downstream")
    assert toxic is not None and toxic.attributes == {"latency": 5, "jitter": 0}
    assert toxic.stream == "downstream" and toxic.toxicity == 1.0


def test_latency_delays_each_direction_it_is_on(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="slow")
    with connect(proxy.listen) as sock:
        proxy.add_toxic(type="latency", attributes={"latency": 300})
        started = time.monotonic()
        assert round_trip(sock, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.3
        proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 200})
        started = time.monotonic()
        assert round_trip(sock, b"pong") == b"pong"
        assert time.monotonic() - started >= 0.5  # both ways now
        proxy.destroy_toxic("latency_downstream")
        proxy.destroy_toxic("latency_upstream")
        assert round_trip(sock, b"fast again") == b"fast again"


def test_a_disabled_proxy_refuses_and_drops_connections_until_enabled(
    toxiproxy: Toxiproxy, echo: str
) -> None:
    proxy = toxiproxy.create(upstream=echo, name="down")
    open_one = connect(proxy.listen)
    assert round_trip(open_one, b"x") == b"x"
    with proxy.down():
        assert open_one.recv(1) == b""  # dropped
        with pytest.raises(ConnectionRefusedError):
            connect(proxy.listen)
        assert toxiproxy.get_proxy("down").enabled is False
    open_one.close()
    with connect(proxy.listen) as sock:  # the same address again
        assert round_trip(sock, b"back") == b"back"


def test_timeout_drops_data_then_closes_and_zero_holds_until_removed(
    toxiproxy: Toxiproxy, echo: str
) -> None:
    proxy = toxiproxy.create(upstream=echo, name="timeout")
    with connect(proxy.listen) as sock:
        started = time.monotonic()  # the timeout counts from when the toxic is added
        proxy.add_toxic(type="timeout", attributes={"timeout": 200})
        sock.sendall(b"lost")
        assert sock.recv(16) == b""  # nothing came back; then the proxy closed it
        assert time.monotonic() - started >= 0.2
    proxy.destroy_toxic("timeout_downstream")
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    with connect(proxy.listen) as sock:
        sock.sendall(b"dropped")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(16)  # held: neither data nor a close
        proxy.destroy_toxic("timeout_downstream")
        sock.settimeout(WAIT_S)
        assert round_trip(sock, b"after") == b"after"


def test_reset_peer_resets_the_connection(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="reset")
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
    with connect(proxy.listen) as sock, pytest.raises(ConnectionResetError):
        sock.sendall(b"x")
        while sock.recv(16):
            pass
        sock.sendall(b"y")  # a reset socket refuses the write if recv saw EOF first


def test_limit_data_closes_after_that_many_bytes(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="limit")
    proxy.add_toxic(type="limit_data", attributes={"bytes": 10})
    with connect(proxy.listen) as sock:
        sock.sendall(b"0123456789abcdef")
        got = b""
        while part := sock.recv(64):
            got += part
        assert got == b"0123456789"


def test_bandwidth_and_slicer_pass_every_byte_in_order(toxiproxy: Toxiproxy, echo: str) -> None:
    proxy = toxiproxy.create(upstream=echo, name="thin")
    data = bytes(range(256)) * 80  # 20,480 bytes
    with connect(proxy.listen) as sock:
        proxy.add_toxic(type="bandwidth", attributes={"rate": 50})  # 50 KB/s
        started = time.monotonic()
        assert round_trip(sock, data) == data
        assert time.monotonic() - started >= 0.4
        proxy.destroy_toxic("bandwidth_downstream")
        proxy.add_toxic(
            type="slicer",
            attributes={"average_size": 100, "size_variation": 50, "delay": 100},
        )
        assert round_trip(sock, data) == data


def test_toxicity_zero_never_applies_and_reset_clears_everything(
    toxiproxy: Toxiproxy, echo: str
) -> None:
    proxy = toxiproxy.create(upstream=echo, name="odds")
    proxy.add_toxic(type="timeout", attributes={"timeout": 0}, toxicity=0.0)
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"untouched") == b"untouched"
    proxy.add_toxic(name="cut", type="timeout", attributes={"timeout": 0})
    proxy.disable()
    toxiproxy.reset()
    assert toxiproxy.get_proxy("odds").enabled is True
    assert proxy.toxics() == {}
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"clean") == b"clean"


def test_populate_creates_and_replaces_proxies(toxiproxy: Toxiproxy, echo: str) -> None:
    made = toxiproxy.populate(
        [{"name": "a", "upstream": echo, "listen": "127.0.0.1:0"}, {"name": "b", "upstream": echo}]
    )
    assert sorted(p.name for p in made) == ["a", "b"]
    with connect(toxiproxy.get_proxy("b").listen) as sock:
        assert round_trip(sock, b"b") == b"b"


def test_slow_close_delays_the_close_it_passes_on(toxiproxy: Toxiproxy, echo: str) -> None:
    """slow_close (README "Toxics"): the close coming from the upstream reaches the client
    `delay` ms late; the data before it is not delayed."""
    proxy = toxiproxy.create(upstream=echo, name="slowclose")
    proxy.add_toxic(type="slow_close", attributes={"delay": 300})
    with connect(proxy.listen) as sock:
        assert round_trip(sock, b"data") == b"data"
        started = time.monotonic()
        sock.shutdown(socket.SHUT_WR)  # the echo server closes when it reads the end
        assert sock.recv(16) == b""
        assert time.monotonic() - started >= 0.3


def test_the_populate_endpoint_creates_and_replaces_proxies(
    toxiproxy: Toxiproxy, echo: str, api: str
) -> None:
    """POST /populate (README "HTTP API"): 201 {"proxies": [...]}; a proxy of the same name
    with other settings is replaced. (toxiproxy-python's `populate` creates one by one; this
    is the server's own endpoint.)"""
    body = [{"name": "pop", "listen": "127.0.0.1:0", "upstream": echo}]
    answer = requests.post(f"{api}/populate", json=body, timeout=WAIT_S)
    assert answer.status_code == 201
    made = answer.json()["proxies"]
    assert [p["name"] for p in made] == ["pop"] and not made[0]["listen"].endswith(":0")
    with connect(made[0]["listen"]) as sock:
        assert round_trip(sock, b"populated") == b"populated"
    body[0]["upstream"] = "127.0.0.1:9"  # discard: nothing answers there
    assert requests.post(f"{api}/populate", json=body, timeout=WAIT_S).status_code == 201
    assert toxiproxy.get_proxy("pop").upstream == "127.0.0.1:9"
    bad = requests.post(f"{api}/populate", json={"proxies": "none"}, timeout=WAIT_S)
    assert bad.status_code == 400
