"""spate.core.filtering (ADR 0016; 004 "Filtering"): the filter value of a stored message, the
per-chunk Bloom filter and its section, and a link's value filter."""

from __future__ import annotations

import random

import pytest
from proton import Message, symbol
from spate.core import filtering
from spate.core.errors import InvalidArgument
from spate.core.filtering import ChunkFilter, ValueFilter

VALUE = symbol("x-stream-filter-value")


def stored(**kwargs: object) -> bytes:
    return bytes(Message(**kwargs).encode())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("message", "value"),
    [
        (stored(body="x", annotations={VALUE: "emea"}), "emea"),
        (stored(body="x", annotations={VALUE: symbol("apac")}), "apac"),
        (stored(body="x", durable=True, annotations={symbol("a"): 1, VALUE: "é" * 40}), "é" * 40),
        (stored(body="x"), None),
        (stored(body="x", annotations={VALUE: 7}), None),  # not a string: no value
        # the key's bytes elsewhere (an application property, the body) are not the annotation
        (stored(body="x-stream-filter-value", properties={"x-stream-filter-value": "p"}), None),
        (stored(body="x", annotations={symbol("other"): "x-stream-filter-value"}), None),
    ],
)
def test_the_filter_value_is_the_message_annotation_only(message: bytes, value: str | None) -> None:
    assert filtering.filter_value(message) == value
    assert filtering.filter_value(memoryview(message)) == value


def test_a_chunk_section_round_trips_and_holds_every_value_it_was_built_from() -> None:
    values = [f"v{k}" for k in range(12)] + [None]
    section = filtering.build(values, 32)
    assert section is not None and len(section) == filtering.SECTION_HEAD_BYTES + 32
    decoded, length = filtering.decode(b"xx" + section + b"rest", 2, 2 + len(section))
    assert length == len(section) and decoded.unfiltered
    assert all(decoded.may_hold(f"v{k}") for k in range(12))  # never a false negative
    assert filtering.build([None, None], 16) is None  # nothing to filter on: no section


def test_the_false_positive_rate_is_near_the_documented_one() -> None:
    """The module's table: 16 bytes, 20 distinct values per chunk -> about 4.7 %."""
    rng = random.Random(7)
    misses = trials = 0
    for _ in range(300):
        values = [f"in-{rng.random()}" for _ in range(20)]
        section = filtering.build(values, 16)
        assert section is not None
        chunk = filtering.decode(section, 0, len(section))[0]
        for _ in range(50):
            trials += 1
            misses += chunk.may_hold(f"out-{rng.random()}")
    measured = misses / trials
    documented = filtering.false_positive_rate(16, 20)
    assert 0.04 < documented < 0.05
    assert measured < 3 * documented + 0.005, (measured, documented)


@pytest.mark.parametrize(
    "section",
    [b"", b"\x10\x01", b"\x10\x00\x00" + bytes(16), b"\x10\x09\x00" + bytes(16), b"\x08\x01\x00"],
)
def test_malformed_sections_are_refused(section: bytes) -> None:
    with pytest.raises(filtering.FilterSectionError):
        filtering.decode(section, 0, len(section))


def test_a_value_filter_on_chunks_and_messages() -> None:
    section = filtering.build(["emea", None], 16)
    assert section is not None
    chunk = filtering.decode(section, 0, len(section))[0]
    wants = ValueFilter(frozenset({"emea"}))
    assert wants.chunk_may_match(chunk)
    assert not ValueFilter(frozenset({"zz-not-there-1"})).chunk_may_match(
        ChunkFilter(bytes(16), 3, unfiltered=False)
    )
    assert not wants.chunk_may_match(None)  # a chunk without a section: only unfiltered ones
    assert ValueFilter(frozenset({"x"}), match_unfiltered=True).chunk_may_match(None)
    assert wants.matches(stored(body=1, annotations={VALUE: "emea"}))
    assert not wants.matches(stored(body=1))
    assert ValueFilter(frozenset({"x"}), True).matches(stored(body=1))


def test_stream_sizes_outside_the_range_are_refused() -> None:
    for size in (15, 256):
        with pytest.raises(InvalidArgument, match="filter size must be between 16 and 255"):
            filtering.validate_size(size)
