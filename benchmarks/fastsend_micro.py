#!/usr/bin/env python3
"""Thread CPU per delivery of a consumer run's sends (ADR 0030, RESULTS §31): the C extension
against the Python sends, and proton's framing of what they queued, on two proton engines in
memory (no sockets, no broker).

A run of RECORDS records of SIZE bytes (views into one chunk-like buffer, a list8 header as
the C load client sends), pre-settled; per repetition a fresh engine pair with enough credit.
`send` is `Sender.send_run`; `framing` is `Transport.pending` + peek + pop of everything it
queued. Minimum over --reps of each, alternating C and Python.

  python benchmarks/fastsend_micro.py [--size 100] [--records 1000] [--reps 9]
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

from proton import Connection, Endpoint, Link, Transport
from spate.gateway import fastsend, sections


def engines(credit: int) -> tuple[Transport, Transport, Link]:
    """(sending transport, receiving transport, sender link) with `credit` granted."""
    a, b = Connection(), Connection()
    ta, tb = Transport(Transport.SERVER), Transport()
    ta.bind(a)
    tb.bind(b)
    b.open()
    session = b.session()
    session.open()
    receiver = session.receiver("r")
    receiver.snd_settle_mode = Link.SND_SETTLED
    receiver.open()
    receiver.flow(credit)
    move(ta, tb)
    a.open()
    ssn = a.session_head(Endpoint.LOCAL_UNINIT)
    assert ssn is not None
    ssn.open()
    link = a.link_head(Endpoint.LOCAL_UNINIT)
    assert link is not None
    link.snd_settle_mode = Link.SND_SETTLED
    link.open()
    move(ta, tb)
    assert link.credit == credit
    return ta, tb, link


def move(ta: Transport, tb: Transport) -> None:
    for _ in range(10):
        moved = 0
        for src, dst in ((ta, tb), (tb, ta)):
            n = src.pending()
            if n > 0:
                dst.push(bytes(src.peek(n) or b""))
                src.pop(n)
                moved += n
        if not moved:
            return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    if fastsend.native is None:
        print("the C extension is not built: python tools/build_native.py", file=sys.stderr)
        return 1
    head = b"\x00\x53\x70\xc0\x04\x02\x41\x50\x05"  # header: durable, priority 5
    body = b"x" * max(0, a.size - len(head) - 5)
    record = head + b"\x00\x53\x75\xa0" + bytes([len(body) & 0xFF]) + body
    if len(body) > 255:
        record = head + b"\x00\x53\x75\xb0" + struct.pack(">I", len(body)) + body
    chunk = memoryview(b"".join(struct.pack(">I", len(record)) + record for _ in range(a.records)))
    step = len(record) + 4
    records = [chunk[i * step + 4 : (i + 1) * step] for i in range(a.records)]
    prefix, suffix = sections.delivery_annotation_parts(1_700_000_000_123, None)
    best = {(kind, part): float("inf") for kind in ("C", "Python") for part in ("send", "framing")}
    for _ in range(a.reps):
        for kind in ("C", "Python"):
            ta, _tb, link = engines(a.records + 10)
            sender = fastsend.Sender(use_native=kind == "C")
            t0 = time.thread_time()
            sender.send_run(
                link._impl, fastsend.address(link._impl), records, 1000, 1,
                parts=(prefix, suffix), presettled=True,
            )  # fmt: skip
            t1 = time.thread_time()
            n = ta.pending()
            ta.peek(n)
            ta.pop(n)
            t2 = time.thread_time()
            best[kind, "send"] = min(best[kind, "send"], t1 - t0)
            best[kind, "framing"] = min(best[kind, "framing"], t2 - t1)
    for kind in ("C", "Python"):
        send_us = best[kind, "send"] * 1e6 / a.records
        framing_us = best[kind, "framing"] * 1e6 / a.records
        print(f"{kind:6} {a.size} B: send {send_us:.3f} µs/delivery, framing {framing_us:.3f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
