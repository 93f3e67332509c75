"""Real network partitions for the chaos suite (issue 13), the way Jepsen makes them: each host
(a node, a gateway, a client) in its own Linux network namespace with its own address on a
bridge this module creates, and faults made with nftables inside the namespaces. Needs root
(CI and these machines run as root) and the iproute2 and nftables packages
(tools/bootstrap.sh installs them).

    with Network() as net:
        a, b = net.add_host("a"), net.add_host("b")
        server = a.popen(["python3", "-m", "http.server", "8000", "--bind", a.address])
        net.cut(a, b)            # both ways: nothing from one reaches the other
        net.cut(a, b, both=False)  # one way: b no longer receives from a
        net.loss(b, 30)          # b drops 30 % of what it receives
        net.heal()

Layout: bridge `<prefix>br` with the host side's address .1 of 10.<n>.0.0/24; host i is
namespace `<prefix><name>` with a veth `<prefix>v<i>` (bridge end) / `eth0` (namespace end) at
10.<n>.0.<10+i>, and its own loopback. `<prefix>` is "sp" + a per-network number, so networks of
concurrent runs never collide (the bridge's name is claimed first); everything is removed on
close, and `sweep(prefix)` removes what a killed run left.

`tc netem` (delay, reordering, duplication) is not available on these machines' kernels
("Specified qdisc kind is unknown"): `netem(host, Impairment(...))` does the same in user space
on an NFQUEUE (chaos.netem: delay, jitter, loss, duplication, reordering of what the host
sends); TCP-level delay and jitter per link also come from Toxiproxy-style proxies
(chaos.toxiproxy); `loss` here is nftables' `numgen random` on what a host receives.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.netem import MARK, Impairment

HOSTS_MAX = 200
COMMAND_TIMEOUT_S = 30.0
_TABLE = "spate_chaos"
_NAT = "spate_chaos_nat"
NETEM_QUEUE = 100
"""The NFQUEUE number chaos.netem binds in a host's namespace."""
_ROOT = Path(__file__).resolve().parents[1]
"""Where `python -m chaos.netem` is found."""


class NetworkError(RuntimeError):
    """A command that builds or changes the network failed; the message has its output."""


def run(argv: Sequence[str], *, namespace: str | None = None, check: bool = True) -> str:
    full = ["ip", "netns", "exec", namespace, *argv] if namespace else list(argv)
    done = subprocess.run(
        full, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(full)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


@dataclass(eq=False)
class Host:
    network: Network
    name: str
    namespace: str
    address: str
    veth: str
    _nat_ready: bool = False
    impairer: subprocess.Popen[str] | None = None
    """The chaos.netem process impairing this host's egress, while `netem` is on."""

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """A process inside this host's namespace (it sees only eth0 and lo)."""
        return subprocess.Popen(["ip", "netns", "exec", self.namespace, *argv], **kwargs)

    def run(self, argv: Sequence[str], check: bool = True) -> str:
        return run(argv, namespace=self.namespace, check=check)

    def nat(self, address: str, port: int, to: str) -> None:
        """Connections this host opens to `address:port` go to `to` (host:port) instead (a
        DNAT rule on its output: how chaos.cluster puts a proxy on a link)."""
        if not self._nat_ready:
            self.run(["nft", "add", "table", "ip", _NAT])
            rule = f"add chain ip {_NAT} output {{ type nat hook output priority -100 ; }}"
            self.run(["nft", *rule.split()])
            self._nat_ready = True
        rule = f"add rule ip {_NAT} output ip daddr {address} tcp dport {port} dnat to {to}"
        self.run(["nft", *rule.split()])


@dataclass(eq=False)
class Network:
    subnet: int = 0
    """The second octet of 10.N.0.0/24 (0: chosen from the process id)."""
    hosts: dict[str, Host] = field(default_factory=dict)
    prefix: str = ""
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if os.geteuid() != 0:
            raise NetworkError("network namespaces need root (CI and these machines run as root)")
        # Claim a subnet by creating its bridge (atomic: a taken name fails), so concurrent
        # runs (test workers) never share or sweep each other's network.
        requested = self.subnet
        start = os.getpid() % 100
        candidates = [requested] if requested else [100 + (start + k) % 100 for k in range(100)]
        for number in candidates:
            self.subnet, self.prefix = number, f"sp{number}"
            try:
                run(["ip", "link", "add", self.bridge, "type", "bridge"])
                break
            except NetworkError:
                if requested:
                    raise
        else:
            raise NetworkError("no free subnet among 10.100.0.0/24 .. 10.199.0.0/24")
        run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def gateway(self) -> str:
        """The host side's address on the bridge (the root namespace)."""
        return f"10.{self.subnet}.0.1"

    def add_host(self, name: str) -> Host:
        if name in self.hosts or len(self.hosts) >= HOSTS_MAX or not name.isalnum():
            raise NetworkError(f"host name {name!r} is taken, not alphanumeric, or one too many")
        index = next(self._counter)
        namespace, veth = f"{self.prefix}{name}", f"{self.prefix}v{index}"
        address = f"10.{self.subnet}.0.{10 + index}"
        run(["ip", "netns", "add", namespace])
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"])
        run(["ip", "link", "set", f"{veth}p", "netns", namespace])
        run(["ip", "link", "set", veth, "master", self.bridge])
        run(["ip", "link", "set", veth, "up"])
        for command in (
            f"ip link set {veth}p name eth0",
            f"ip addr add {address}/24 dev eth0",
            "ip link set eth0 up",
            "ip link set lo up",
            f"ip route add default via {self.gateway}",
            f"nft add table inet {_TABLE}",
            f"nft add chain inet {_TABLE} input {{ type filter hook input priority 0 ; }}",
        ):
            run(command.split(), namespace=namespace)
        host = Host(self, name, namespace, address, veth)
        self.hosts[name] = host
        return host

    def cut(self, a: Host, b: Host, *, both: bool = True) -> None:
        """b stops receiving from a (and, with `both`, a from b): packets are dropped on input,
        so connections between them stall until healed, as behind a failed switch port."""
        _drop_from(b, a.address)
        if both:
            _drop_from(a, b.address)

    def isolate(self, host: Host) -> None:
        """`host` cut from every other host, both ways."""
        for other in self.hosts.values():
            if other is not host:
                self.cut(host, other)

    def loss(self, host: Host, percent: int) -> None:
        """`host` drops `percent` % of the packets it receives (each packet drawn alone)."""
        if not 0 <= percent <= 100:
            raise NetworkError(f"loss is a percentage, got {percent}")
        if percent == 0:
            return
        chance = "" if percent == 100 else f"numgen random mod 100 < {percent} "
        rule = f"add rule inet {_TABLE} input iifname eth0 {chance}drop"
        host.run(["nft", *rule.split()])

    def netem(self, host: Host, impairment: Impairment, seed: int = 0) -> None:
        """What `host` sends (to every other host) is delayed, lost, duplicated and reordered
        as `impairment` says, until healed (chaos.netem; one impairment per host at a time)."""
        if host.impairer is not None:
            raise NetworkError(f"{host.name} is already impaired: heal it first")
        queue = NETEM_QUEUE  # queue numbers are per namespace: one impairment per host
        process = host.popen(
            [sys.executable, "-m", "chaos.netem", f"--queue={queue}", f"--seed={seed}",
             *impairment.argv()],
            stdout=subprocess.PIPE, text=True, cwd=str(_ROOT),
        )  # fmt: skip
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            process.kill()
            process.wait()
            raise NetworkError(f"chaos.netem did not start in {host.name} (exit {process.poll()})")
        host.impairer = process
        host.run(
            ["iptables", "-t", "mangle", "-A", "OUTPUT", "-o", "eth0", "-m", "mark", "!",
             "--mark", str(MARK), "-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
        )  # fmt: skip

    def _unimpair(self, host: Host) -> None:
        if host.impairer is None:
            return
        host.run(["iptables", "-t", "mangle", "-F", "OUTPUT"], check=False)
        host.impairer.terminate()
        try:
            host.impairer.wait(COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            host.impairer.kill()
            host.impairer.wait()
        host.impairer = None

    def heal(self, host: Host | None = None) -> None:
        """Every fault removed; or only those touching `host`: its own rules, and the other
        hosts' rules against its address."""
        if host is None:
            for each in self.hosts.values():
                each.run(["nft", "flush", "chain", "inet", _TABLE, "input"])
                self._unimpair(each)
            return
        self._unimpair(host)
        host.run(["nft", "flush", "chain", "inet", _TABLE, "input"])
        for other in self.hosts.values():
            listing = other.run(["nft", "-a", "list", "chain", "inet", _TABLE, "input"])
            for line in listing.splitlines():
                if f"ip saddr {host.address} " in line and "# handle " in line:
                    handle = line.rsplit("# handle ", 1)[1].strip()
                    other.run(["nft", "delete", "rule", "inet", _TABLE, "input", "handle", handle])

    def close(self) -> None:
        for host in self.hosts.values():
            self._unimpair(host)
        sweep(self.prefix)
        self.hosts.clear()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _drop_from(host: Host, source: str) -> None:
    rule = f"add rule inet {_TABLE} input ip saddr {source} drop"
    host.run(["nft", *rule.split()])


def sweep(prefix: str) -> None:
    """Remove the namespaces and links named with `prefix` (what an earlier run left)."""
    for line in run(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(prefix):
            run(["ip", "netns", "del", name], check=False)
    for line in run(["ip", "-o", "link", "show"]).splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            link = parts[1].strip().split("@")[0]
            if link.startswith(prefix):
                run(["ip", "link", "del", link], check=False)
