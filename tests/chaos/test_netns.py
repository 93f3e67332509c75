"""chaos.netns: hosts in their own network namespaces on a bridge, cut, isolated, made lossy and
healed with nftables, observed by real TCP connections between processes in the namespaces.
Runs as root (CI and these machines do); tools/bootstrap.sh installs nftables."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from chaos.netns import Host, Network, NetworkError, run

ECHO = """
import socket, sys
server = socket.create_server((sys.argv[1], 7000))
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)
"""
PROBE = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])) as s:
        s.settimeout(float(sys.argv[2]))
        s.sendall(b"hi")
        print("ok" if s.recv(2) == b"hi" else "bad")
except OSError as error:
    print(type(error).__name__)
"""


@pytest.fixture
def net() -> Iterator[Network]:
    with Network() as network:
        yield network


def echo_on(host: Host) -> subprocess.Popen[str]:
    server = host.popen(
        [sys.executable, "-c", ECHO, host.address], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    return server


def probe(client: Host, server: Host, timeout_s: float = 1.0) -> str:
    return client.run([sys.executable, "-c", PROBE, server.address, str(timeout_s)]).strip()


def test_hosts_reach_each_other_until_cut_and_again_once_healed(net: Network) -> None:
    a, b, c = net.add_host("a"), net.add_host("b"), net.add_host("c")
    server = echo_on(a)
    try:
        assert probe(b, a) == "ok" and probe(c, a) == "ok"
        net.cut(a, b)
        assert probe(b, a) in ("TimeoutError", "timeout")
        assert probe(c, a) == "ok"  # only that pair
        net.heal()
        assert probe(b, a) == "ok"
        net.isolate(a)
        assert probe(b, a) != "ok" and probe(c, a) != "ok"
        net.heal(a)
        assert probe(c, a) == "ok"
        net.loss(a, 100)
        assert probe(b, a) != "ok"
        net.heal()
        assert probe(b, a) == "ok"
    finally:
        server.kill()
        server.wait()


def test_a_one_way_cut_stops_one_direction_only(net: Network) -> None:
    """b no longer receives from a: a's SYN-ACK never reaches b, so b cannot connect to a;
    a's packets to b are dropped too, but b's own packets still reach a (a sees b's SYNs)."""
    a, b = net.add_host("a"), net.add_host("b")
    net.cut(a, b, both=False)
    rules = b.run(["nft", "list", "chain", "inet", "spate_chaos", "input"])
    assert f"ip saddr {a.address} drop" in rules
    assert a.address not in a.run(["nft", "list", "chain", "inet", "spate_chaos", "input"])
    assert f"ip saddr {b.address}" not in rules
    net.loss(b, 30)  # each packet drawn alone
    assert "numgen random mod 100 < 30 drop" in b.run(
        ["nft", "list", "chain", "inet", "spate_chaos", "input"]
    )


def test_networks_are_removed_on_close_and_names_are_checked() -> None:
    with Network() as network:
        network.add_host("x")
        with pytest.raises(NetworkError, match="taken"):
            network.add_host("x")
        with pytest.raises(NetworkError, match="percentage"):
            network.loss(network.hosts["x"], 101)
        prefix = network.prefix
    assert prefix not in run(["ip", "netns", "list"])
    assert f"{prefix}br" not in run(["ip", "-o", "link", "show"])


def test_two_networks_at_once_get_different_subnets() -> None:
    with Network() as first, Network() as second:
        assert first.subnet != second.subnet and first.bridge != second.bridge
