#!/usr/bin/env python3
"""Server-side filtering (issue 11, ADR 0016) on a three-node cluster through its proxy
gateway: consume 1 of V filter values from a stream of N messages, against an unfiltered read
of the same stream, in the same run.

  python benchmarks/filtering.py [--count 1000000] [--values 100] [--batch 1000] [--runs 3]
                                 [--size-bytes 16] [--sub-entry-size 0] [--out F]

The stream (3 replicas) gets N messages of ~100 B JSON, each with `x-stream-filter-value`
"v<(k // batch) % V>" — producers that publish runs of one value (a region's feed), so that a
chunk holds one or two values; with `--batch 1` the values are interleaved and every chunk
holds all of them (the Bloom filter's worst case: it can pass over nothing). Then, `--runs`
times, alternating which goes first: a consumer through the gateway reads the stream from
`first` with `rabbitmq:stream-filter` = ["v7"], and one reads it unfiltered (pre-settled,
transfers not decoded). Per read: wall time until the last expected message, messages and
bytes (whole transfers) the client received, and bytes the gateway process read
(`/proc/PID/io` rchar: what the node sent it) and the leader node read (rchar: segment bytes
read, plus small requests). Medians and ratios at the end, with the
load average. `--sub-entry-size S` publishes the messages S at a time as zstd sub-entries
(ADR 0017; a sub-entry chunk's Bloom filter holds its inner messages' values) instead of one by
one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from loadclient import emit, loadavg, log
from proton import Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import AtMostOnce, Container, Filter
from spate.client.core import SubEntryBatch

from cluster import Cluster

VALUE = symbol("x-stream-filter-value")


class Publisher(MessagingHandler):  # type: ignore[misc]
    """Sends N pre-encoded messages with a window of unsettled ones; stops when all are
    accepted."""

    def __init__(self, url: str, stream: str, a: argparse.Namespace) -> None:
        super().__init__(auto_settle=True)
        self.url, self.stream, self.a = url, stream, a
        self.sent = self.accepted = 0

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        event.container.create_sender(self.conn, self.stream)

    def on_sendable(self, event: Any) -> None:
        self.pump(event.sender)

    def message(self, k: int) -> Message:
        value = f"v{(k // self.a.batch) % self.a.values}"
        body = json.dumps({"id": k, "region": value, "pad": "x" * 40})
        return Message(body=body, annotations={VALUE: value})

    def pump(self, sender: Any) -> None:
        a = self.a
        size = max(1, a.sub_entry_size)
        while sender.credit and self.sent < a.count and self.sent - self.accepted < 5000:
            k = self.sent
            if a.sub_entry_size:
                inner = [self.message(i).encode() for i in range(k, min(k + size, a.count))]
                envelope = Message()
                envelope.decode(SubEntryBatch(inner, "zstd").envelope())
                sender.send(envelope)
                self.sent += len(inner)
            else:
                sender.send(self.message(k))
                self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += max(1, self.a.sub_entry_size)
        if self.accepted >= self.a.count:
            event.connection.close()
        elif self.accepted % 1000 == 0:
            self.pump(event.link)  # the window has room again


class Reader(MessagingHandler):  # type: ignore[misc]
    """Receives from `first` until `expect` messages came, pre-settled and not decoded (what
    it measures is the broker, not proton's Python decoder); counts their bytes."""

    def __init__(self, url: str, stream: str, expect: int, values: list[str] | None) -> None:
        super().__init__(prefetch=5000, auto_accept=False, auto_settle=False)
        self.url, self.stream, self.expect, self.values = url, stream, expect, values
        self.got = self.bytes = 0
        self.done_at = 0.0

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        filters: dict[Any, Any] = {symbol("rabbitmq:stream-offset-spec"): "first"}
        if self.values is not None:
            filters[symbol("rabbitmq:stream-filter")] = self.values
        event.container.create_receiver(conn, self.stream, options=[Filter(filters), AtMostOnce()])

    def on_delivery(self, event: Any) -> None:
        delivery, link = event.delivery, event.link
        if delivery.partial:
            return
        self.bytes += len(link.recv(delivery.pending))
        link.advance()
        delivery.settle()
        self.got += 1
        if self.got == self.expect:
            self.done_at = time.monotonic()
            event.connection.close()


def rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError(f"no rchar for {pid}")


def read_once(
    url: str, stream: str, expect: int, values: list[str] | None, pids: dict[str, int]
) -> dict[str, Any]:
    before = {name: rchar(pid) for name, pid in pids.items()}
    reader = Reader(url, stream, expect, values)
    started = time.monotonic()
    Container(reader).run()
    after = {name: rchar(pid) for name, pid in pids.items()}
    return {
        "case": "filtered" if values else "unfiltered",
        "messages": reader.got,
        "seconds": round(reader.done_at - started, 3),
        "client_bytes": reader.bytes,
        "gateway_read_bytes": after["gateway"] - before["gateway"],
        "leader_read_bytes": after["leader"] - before["leader"],
        "loadavg": loadavg(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1_000_000)
    p.add_argument("--values", type=int, default=100)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--size-bytes", type=int, default=16)
    p.add_argument("--sub-entry-size", type=int, default=0)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    rows: list[dict[str, Any]] = []
    with Cluster(3) as c:
        stream = "filtering"
        c.create_stream(stream, 3, 1, "--filter-size-bytes", str(a.size_bytes))
        leader = c.leaders(stream)[0]
        status = c.refresh()
        gateway = status["gateways"][0]
        url = f"amqp://{gateway['amqp']}"
        pids = {"gateway": int(gateway["pid"]), "leader": int(c.node(leader)["pid"])}
        log(f"publishing {a.count} messages, {a.values} values in runs of {a.batch}")
        started = time.monotonic()
        Container(Publisher(url, stream, a)).run()
        log(f"published in {time.monotonic() - started:.1f} s")
        wanted = sum(1 for k in range(a.count) if (k // a.batch) % a.values == 7)
        for run in range(a.runs):
            order = [["v7"], None] if run % 2 == 0 else [None, ["v7"]]
            for values in order:
                expect = wanted if values else a.count
                row = read_once(url, stream, expect, values, pids) | {"run": run}
                row |= {"count": a.count, "values": a.values, "batch": a.batch}
                row |= {"sub_entry_size": a.sub_entry_size}
                emit(row, a.out)
                rows.append(row)
    summary: dict[str, Any] = {"summary": True, "loadavg": loadavg()}
    for key in ("seconds", "client_bytes", "gateway_read_bytes", "leader_read_bytes"):
        f = statistics.median(r[key] for r in rows if r["case"] == "filtered")
        u = statistics.median(r[key] for r in rows if r["case"] == "unfiltered")
        summary[key] = {"filtered": f, "unfiltered": u, "ratio": round(f / u, 4) if u else None}
    emit(summary, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
