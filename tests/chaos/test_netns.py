"""chaos.netns: hosts in their own network namespaces on a bridge, cut, isolated, made lossy and
healed with nftables, observed by real TCP connections between processes in the namespaces.
Runs as root (CI and these machines do); tools/bootstrap.sh installs nftables."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator

import pytest

from chaos.netem import Impairment
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


# Packet-level impairment without tc netem: chaos.netem on an NFQUEUE.

RTT = """
import socket, sys, time
with socket.create_connection((sys.argv[1], 7000), timeout=10) as s:
    times = []
    for _ in range(10):
        start = time.perf_counter()
        s.sendall(b"x")
        s.recv(1)
        times.append((time.perf_counter() - start) * 1000)
print(min(times))
"""
UDP_SINK = """
import socket, sys
sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sink.bind((sys.argv[1], 7001))
sink.settimeout(3)
print("ready", flush=True)
got = []
try:
    while True:
        got.append(int(sink.recv(64)))
except TimeoutError:
    pass
print(" ".join(map(str, got)))
"""
UDP_SOURCE = """
import socket, sys, time
out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for n in range(int(sys.argv[2])):
    out.sendto(str(n).encode(), (sys.argv[1], 7001))
    time.sleep(0.002)
"""


def udp_through(net: Network, impairment: Impairment, count: int = 300) -> list[int]:
    """`count` numbered datagrams from a to b with a's egress impaired: what b received."""
    a, b = net.add_host("a"), net.add_host("b")
    sink = b.popen([sys.executable, "-c", UDP_SINK, b.address], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
    net.netem(a, impairment, seed=7)
    a.run([sys.executable, "-c", UDP_SOURCE, b.address, str(count)])
    out, _ = sink.communicate(timeout=60)
    net.heal()
    return [int(n) for n in out.split()]


def test_netem_delays_what_a_host_sends_until_healed(net: Network) -> None:
    """A round trip to a host whose egress is delayed 80 ms takes at least 80 ms (the bound
    cannot fail on a slow machine: nothing makes a packet faster); healing removes the rule
    and stops the process."""
    a, b = net.add_host("a"), net.add_host("b")
    server = echo_on(a)
    try:
        net.netem(a, Impairment(delay_ms=80, jitter_ms=10))
        assert float(b.run([sys.executable, "-c", RTT, a.address])) >= 70
        impairer = a.impairer
        assert impairer is not None
        with pytest.raises(NetworkError, match="already impaired"):
            net.netem(a, Impairment(delay_ms=1))
        net.heal(a)
        assert a.impairer is None and impairer.poll() is not None
        assert "NFQUEUE" not in a.run(["iptables", "-t", "mangle", "-S", "OUTPUT"])
        assert probe(b, a) == "ok"
    finally:
        server.kill()
        server.wait()


def test_netem_loses_duplicates_and_reorders_packets(net: Network) -> None:
    got = udp_through(net, Impairment(delay_ms=30, loss=20, duplicate=20, reorder=40))
    sent = set(range(300))
    assert set(got) <= sent
    assert 150 < len(set(got)) < 290, "about a fifth lost"
    assert len(got) > len(set(got)), "some received twice"
    assert got != sorted(got), "some overtaken"


def test_without_impairment_every_datagram_arrives_once_in_order(net: Network) -> None:
    """The control for the test above: the same path with nothing but the queue in it."""
    assert udp_through(net, Impairment()) == list(range(300))


def test_impairment_decisions_are_checked_and_replayable() -> None:
    for bad in (
        {"loss": 101},
        {"delay_ms": 10, "jitter_ms": 20},
        {"reorder": 10},
        {"duplicate": -1},
    ):
        with pytest.raises(ValueError, match=r"percentage|jitter|reorder"):
            Impairment(**bad)
    impairment = Impairment(delay_ms=50, jitter_ms=10, loss=10, duplicate=5, reorder=25)
    draws = random.Random(3)
    again = [impairment.decide(draws) for _ in range(500)]
    assert again[0] == impairment.decide(random.Random(3)), "a seed replays the decisions"
    dropped = sum(1 for d in again if d[0])
    assert 25 < dropped < 75
    assert all(delay == 0 or 40 <= delay <= 60 for _, delay, _ in again)
    assert any(delay == 0 and not lost for lost, delay, _ in again), "some sent at once"
