"""`sections.read_spate_annotations`: a client reads the offset, timestamp and source partition
of a Spate delivery at the fixed places the listener writes them (000 §5.1), and says None for
any other layout, so the caller falls back to the full scanner."""

from __future__ import annotations

import pytest
from proton import Message
from spate.gateway import sections


@pytest.mark.parametrize("durable", [True, False])
@pytest.mark.parametrize("source", [None, "2", "17"])
def test_what_splice_run_writes_reads_back(durable: bool, source: str | None) -> None:
    record = bytes(Message(body=b"x" * 40, durable=durable).encode())
    prefix, suffix = sections.delivery_annotation_parts(1_700_000_000_123, source)
    for offset, out in enumerate(sections.splice_run([record] * 3, 98, prefix, suffix), 98):
        assert sections.read_spate_annotations(out) == (offset, 1_700_000_000_123, source)
        # the same answer the full scanner gives
        da = sections.scan_incoming(out).delivery_annotations
        assert da is not None
        decoded = sections.delivery_annotations_map(da)
        assert int(decoded["event-streams-offset"]) == offset


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x53\x75\xa0\x01x",  # no annotations at all
        bytes(Message(body="x", instructions={"other": 1}).encode()),  # someone else's DA
        b"\x00\x53\x70\xc0\x02\x01\x41" + b"\x00\x53\x71\xd1" + b"\x00" * 7,  # truncated
    ],
)
def test_other_layouts_are_not_guessed(raw: bytes) -> None:
    assert sections.read_spate_annotations(raw) is None
