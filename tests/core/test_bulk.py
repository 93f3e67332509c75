"""Bulk frames (ADR 0029, spate.core.bulk): what the node encodes, the client reads back."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from spate.core import bulk, limits


def _runs() -> st.SearchStrategy[list[tuple[int, int, list[bytes]]]]:
    """Runs in offset order with gaps between them (a filtered link's)."""

    @st.composite
    def build(draw: st.DrawFn) -> list[tuple[int, int, list[bytes]]]:
        at = draw(st.integers(0, 2**40))
        out = []
        for _ in range(draw(st.integers(1, 5))):
            records = draw(st.lists(st.binary(max_size=300), min_size=1, max_size=20))
            out.append((at, draw(st.integers(0, 2**45)), records))
            at += len(records) + draw(st.integers(0, 3))
        return out

    return build()


@given(_runs())
def test_round_trip(runs: list[tuple[int, int, list[bytes]]]) -> None:
    frame = bulk.parse(bulk.unwrap(bulk.wrap(b"\x00\x53\x71\xc1\x01\x00", bulk.encode(runs))))
    want = [(first + i, stamp, r) for first, stamp, records in runs
            for i, r in enumerate(records)]  # fmt: skip
    assert len(frame) == len(want)
    assert frame.offset_list() == [o for o, _, _ in want]
    assert frame.timestamp_list() == [t for _, t, _ in want]
    assert frame.messages() == [r for _, _, r in want]
    # a slice of rows reads the same rows
    part = frame.rows(1, len(want)) if len(want) > 1 else frame
    assert part.messages() == [r for _, _, r in want][part.first :]
    assert part.offset_list() == [o for o, _, _ in want][part.first :]


def test_encode_rows_matches_runs() -> None:
    assert bulk.encode_rows([3, 4, 9], [7, 7, 8], [b"a", b"bc", b""]) == bulk.encode(
        [(3, 7, [b"a", b"bc"]), (9, 8, [b""])]
    )


def test_layout_is_the_documented_one() -> None:
    frame = bulk.encode([(258, 1000, [b"ab", b"c"])])
    assert frame == b"".join((
        b"\x01\x00\x00\x00", struct.pack("<I", 2),
        struct.pack("<qq", 258, 259), struct.pack("<qq", 1000, 1000),
        struct.pack("<II", 2, 3), b"abc",
    ))  # fmt: skip
    message = bulk.wrap(b"DA", frame)
    assert message.startswith(b"DA" + bulk.HEAD + len(frame).to_bytes(4, "big"))


def test_not_a_bulk_delivery() -> None:
    assert bulk.unwrap(b"\x00\x53\x75\xa0\x01x") is None


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"\x01\x00", "at least 8 bytes"),
        (b"\x02\x00\x00\x00\x01\x00\x00\x00", "unknown bulk frame version 2"),
        (b"\x01\x00\x00\x00\x00\x00\x00\x00", "1..4096 messages, not 0"),
        (b"\x01\x00\x00\x00\x02\x00\x00\x00" + bytes(16), "cut short"),
        (bulk.encode([(0, 0, [b"ab"])]) + b"!", "ends at 2, its data has 3 bytes"),
        (
            b"\x01\x00\x00\x00\x03\x00\x00\x00"
            + struct.pack("<qqqqqqIII", 0, 1, 2, 0, 0, 0, 3, 1, 3)
            + b"abc",
            "ends do not increase",
        ),
        (
            b"\x01\x00\x00\x00\x03\x00\x00\x00"
            + struct.pack("<qqqqqqIII", 0, 5, 2, 0, 0, 0, 1, 2, 3)
            + b"abc",
            "offsets do not increase",
        ),
    ],
)
def test_damage_is_named(frame: bytes, says: str) -> None:
    with pytest.raises(bulk.FrameError, match=says):
        bulk.parse(frame)


def test_limits() -> None:
    with pytest.raises(bulk.FrameError, match=r"1\.\.4096"):
        bulk.encode([(0, 0, [b""] * (limits.bulk_delivery_messages_max + 1))])
    with pytest.raises(bulk.FrameError, match="says 99 bytes"):
        bulk.unwrap(bulk.HEAD + (99).to_bytes(4, "big") + b"x")
