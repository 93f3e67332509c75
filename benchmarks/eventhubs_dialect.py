#!/usr/bin/env python3
"""The Event Hubs dialect's own costs per message (ADR 0021), in process, against the splice
every consumer delivery pays anyway: the frame padding (`eventhubs.FramePadder`, on every
connection of a dialect listener) and the Event Hubs message annotations
(`eventhubs.annotate`, on Event Hubs consumer links). Prints one JSON line.

  .venv/bin/python benchmarks/eventhubs_dialect.py
"""

from __future__ import annotations

import json
import os
import struct
import sys
import timeit

from proton import Message
from spate.gateway import sections
from spate.gateway.eventhubs import FramePadder, annotate

COUNT = 20_000
REPEAT = 5


def _transfer(payload: bytes) -> bytes:
    """A consumer transfer as proton writes it: handle, delivery-id, 8-byte tag, format 0,
    settled false (the six trailing fields left out)."""
    fields = b"\x43\x52\x05\xa0\x08" + b"\x00" * 8 + b"\x43\x42"
    body = b"\x00\x53\x14\xc0" + bytes((len(fields) + 1, 5)) + fields + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 1) + body


def main() -> int:
    message = Message(body=b"x" * 100).encode()
    prefix, suffix = sections.delivery_annotation_parts(1_700_000_000_000, "0")
    delivered = sections.splice_run([message], 0, prefix, suffix)[0]
    stream = b"AMQP\x00\x01\x00\x00" + _transfer(delivered) * COUNT

    def pad() -> None:
        padder = FramePadder()
        for at in range(0, len(stream), 16384):  # proton's output, a write at a time
            padder.feed(stream[at : at + 16384])

    def per_message(fn: object, number: int) -> float:
        best = min(timeit.repeat(fn, number=number, repeat=REPEAT))  # type: ignore[arg-type]
        return round(best / COUNT * 1e6, 2)

    out = {
        "workload": "eventhubs_dialect",
        "messages": COUNT,
        "frame_bytes": len(_transfer(delivered)),
        "splice_us_per_msg": per_message(
            lambda: sections.splice_run([message] * 100, 0, prefix, suffix), COUNT // 100
        ),
        "padding_us_per_frame": per_message(pad, 1),
        "annotations_us_per_msg": per_message(
            lambda: annotate(message, 123_456, 1_700_000_000_000), COUNT
        ),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
