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


def test_delivery_runs_read_what_read_spate_annotations_reads() -> None:
    """The bulk reader learns a link's layout from one delivery, then reads runs of it; it stops
    at the first delivery in another layout (another source, timestamp size, a header, a
    sub-entry's extra annotations), which the caller learns and reads the usual way."""
    plain = bytes(Message(body=b"x" * 40).encode())
    durable = bytes(Message(body=b"x" * 40, durable=True).encode())
    raws = []
    for source, record, count in (
        (None, plain, 5),
        ("3", plain, 4),
        ("3", durable, 2),
        ("12", plain, 3),
    ):
        prefix, suffix = sections.delivery_annotation_parts(1_700_000_000_000 + len(raws), source)
        raws += sections.splice_run([record] * count, 10 + len(raws), prefix, suffix)
    runs = sections.DeliveryRuns()
    got: list[tuple[int, int, str | None]] = []
    i = 0
    while i < len(raws):
        offsets: list[int] = []
        stamps: list[int] = []
        j = runs.read_run(raws, i, offsets, stamps)
        got += [(o, s, runs.source) for o, s in zip(offsets, stamps, strict=True)]
        if j < len(raws):
            fast = runs.learn(raws[j])
            assert fast is not None
            got.append(fast)
            j += 1
        i = j
    assert got == [sections.read_spate_annotations(raw) for raw in raws]
    assert runs.read_run([b"", b"\x00\x53\x75\xa0\x01x"], 0, [], []) == 0
