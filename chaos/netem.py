"""Packet-level delay, jitter, loss, duplication and reordering on a host's egress, for kernels
without `tc netem` (these machines': CONFIG_NET_SCH_NETEM is not set, "Specified qdisc kind is
unknown"). The kernel still has NFQUEUE (nfnetlink_queue and the xt NFQUEUE target are built
in): an iptables rule in the host's namespace hands each packet it sends to this module's
process in that namespace, which holds it for its delay and then lets it go (verdict accept),
drops it, or lets it go and sends a copy — what netem does in the qdisc, done in user space.

    Network.netem(host, Impairment(delay_ms=100, jitter_ms=20, loss=5, duplicate=2, reorder=25))
    Network.heal(host)  # the rule removed, the process stopped by its PID

The decisions are pure and seeded (`Impairment.decide`); the shell (`serve`) speaks nfnetlink
over a raw netlink socket (no library: the protocol is four fixed structures; linux/netfilter/
nfnetlink_queue.h), keeps held packets in a heap by release time, and re-sends duplicates with
an IP_HDRINCL raw socket whose packets carry a mark the rule skips (no loop).

Reordering is netem's: with `delay_ms` > 0, `reorder` % of the packets go at once and so
overtake the ones held before them; jitter alone also reorders, as netem without rate does.
`--queue-bypass` on the rule: if this process dies, packets pass unimpaired (never a black
hole the run did not ask for).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import os
import random
import select
import signal
import socket
import struct
import time
from dataclasses import dataclass

MARK = 0x5350
"""Duplicates carry this fwmark; the rule skips marked packets."""
QUEUE_MAXLEN = 20_000
"""Packets the kernel holds for us (its default, 1024, is a few ms of a busy link)."""
HELD_MAX = 50_000
"""Packets held here at once; beyond it packets go without delay (a safety valve)."""
DELAY_MS_MAX = 60_000

# nfnetlink_queue (linux/netfilter/nfnetlink_queue.h, nfnetlink.h)
_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_QUEUE = 3
_NFQNL_MSG_PACKET, _NFQNL_MSG_VERDICT, _NFQNL_MSG_CONFIG = 0, 1, 2
_NFQA_CFG_CMD, _NFQA_CFG_PARAMS, _NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
_NFQNL_CFG_CMD_BIND = 1
_NFQNL_COPY_PACKET = 2
_NFQA_PACKET_HDR, _NFQA_VERDICT_HDR, _NFQA_PAYLOAD = 1, 2, 10
_NF_DROP, _NF_ACCEPT = 0, 1
_NLM_F_REQUEST, _NLM_F_ACK = 1, 4
_NLMSG_ERROR = 2
_NLMSG = struct.Struct("=IHHII")
_NFGEN = struct.Struct("!BBH")
_NLATTR = struct.Struct("=HH")


@dataclass(frozen=True)
class Impairment:
    """netem's knobs: `delay_ms` ± `jitter_ms` (uniform), and percentages of packets lost,
    duplicated, and (with a delay) sent at once."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            if not 0 <= getattr(self, name) <= 100:
                raise ValueError(f"{name} is a percentage, got {getattr(self, name)}")
        if not 0 <= self.jitter_ms <= self.delay_ms <= DELAY_MS_MAX:
            raise ValueError(
                f"need 0 <= jitter_ms <= delay_ms <= {DELAY_MS_MAX}, got "
                f"{self.jitter_ms} and {self.delay_ms}"
            )
        if self.reorder and not self.delay_ms:
            raise ValueError("reorder needs a delay: reordered packets are the ones not delayed")

    def decide(self, rng: random.Random) -> tuple[bool, float, bool]:
        """For one packet: (dropped, delay in ms, duplicated). One draw per knob, in a fixed
        order, so a seed replays the same decisions for the same packets."""
        lost = rng.random() * 100 < self.loss
        doubled = rng.random() * 100 < self.duplicate
        at_once = rng.random() * 100 < self.reorder
        jitter = rng.uniform(-self.jitter_ms, self.jitter_ms)
        if lost:
            return True, 0.0, False
        return False, 0.0 if at_once else max(0.0, self.delay_ms + jitter), doubled

    def argv(self) -> list[str]:
        return [
            f"--delay-ms={self.delay_ms}",
            f"--jitter-ms={self.jitter_ms}",
            f"--loss={self.loss}",
            f"--duplicate={self.duplicate}",
            f"--reorder={self.reorder}",
        ]


def _attr(kind: int, payload: bytes) -> bytes:
    data = _NLATTR.pack(_NLATTR.size + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _message(kind: int, queue: int, attributes: bytes, flags: int = _NLM_F_REQUEST) -> bytes:
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, queue) + attributes
    return (
        _NLMSG.pack(_NLMSG.size + len(body), (_NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0, 0) + body
    )


def _attributes(data: bytes, at: int, end: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    while at + _NLATTR.size <= end:
        length, kind = _NLATTR.unpack_from(data, at)
        if length < _NLATTR.size:
            break
        out[kind & 0x7FFF] = data[at + _NLATTR.size : at + length]
        at += (length + 3) & ~3
    return out


class Queue:
    """One bound NFQUEUE (run inside the host's namespace)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, 0))
        self._config(_attr(_NFQA_CFG_CMD, struct.pack("!BxH", _NFQNL_CFG_CMD_BIND, 0)))
        self._config(_attr(_NFQA_CFG_PARAMS, struct.pack("!IB", 0xFFFF, _NFQNL_COPY_PACKET)))
        self._config(_attr(_NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)))

    def _config(self, attributes: bytes) -> None:
        self.sock.send(
            _message(_NFQNL_MSG_CONFIG, self.number, attributes, _NLM_F_REQUEST | _NLM_F_ACK)
        )
        data = self.sock.recv(65536)
        _, kind, _, _, _ = _NLMSG.unpack_from(data)
        if kind == _NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, _NLMSG.size)
            if error:
                raise OSError(-error, f"nfqueue {self.number}: config: {os.strerror(-error)}")

    def packets(self) -> list[tuple[int, bytes]]:
        """The packets one recv() brings: (id, the IP packet)."""
        data = self.sock.recv(1 << 20)
        out, at = [], 0
        while at + _NLMSG.size <= len(data):
            length, kind, _, _, _ = _NLMSG.unpack_from(data, at)
            if length < _NLMSG.size:
                break
            if kind == (_NFNL_SUBSYS_QUEUE << 8) | _NFQNL_MSG_PACKET:
                attrs = _attributes(data, at + _NLMSG.size + _NFGEN.size, at + length)
                header, payload = attrs.get(_NFQA_PACKET_HDR), attrs.get(_NFQA_PAYLOAD, b"")
                if header is not None:
                    out.append((struct.unpack_from("!I", header)[0], payload))
            at += (length + 3) & ~3
        return out

    def verdict(self, packet_id: int, verdict: int) -> None:
        header = _attr(_NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id))
        self.sock.send(_message(_NFQNL_MSG_VERDICT, self.number, header))


def serve(number: int, impairment: Impairment, seed: int) -> None:
    """Apply `impairment` to every packet queued on `number` until SIGTERM."""
    queue = Queue(number)
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
    rng = random.Random(seed)
    held: list[tuple[float, int, int]] = []  # (release time, arrival, packet id)
    arrivals = 0
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while not stopping:
        now = time.monotonic()
        while held and held[0][0] <= now:
            queue.verdict(heapq.heappop(held)[2], _NF_ACCEPT)
        timeout = max(0.0, held[0][0] - now) if held else 0.5
        try:
            readable, _, _ = select.select([queue.sock], [], [], timeout)
        except InterruptedError:
            continue
        if not readable:
            continue
        for packet_id, payload in queue.packets():
            dropped, delay_ms, doubled = impairment.decide(rng)
            if dropped:
                queue.verdict(packet_id, _NF_DROP)
                continue
            if doubled and len(payload) >= 20:
                destination = socket.inet_ntoa(payload[16:20])
                with contextlib.suppress(OSError):  # a copy that cannot go is not made
                    raw.sendto(payload, (destination, 0))
            if delay_ms <= 0 or len(held) >= HELD_MAX:
                queue.verdict(packet_id, _NF_ACCEPT)
            else:
                arrivals += 1
                heapq.heappush(held, (time.monotonic() + delay_ms / 1000, arrivals, packet_id))
    for _, _, packet_id in held:  # let what is held go
        queue.verdict(packet_id, _NF_ACCEPT)


def main() -> None:
    parser = argparse.ArgumentParser(description="user-space netem on an NFQUEUE (run as root)")
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--duplicate", type=float, default=0.0)
    parser.add_argument("--reorder", type=float, default=0.0)
    args = parser.parse_args()
    impairment = Impairment(args.delay_ms, args.jitter_ms, args.loss, args.duplicate, args.reorder)
    serve(args.queue, impairment, args.seed)


if __name__ == "__main__":
    main()
