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


# Where an annotation key can be (RESULTS §37: a 16 KiB body much like the key cost 110 µs per
# substring search on W1's hot path; the keys live in the message-annotations section only).

_BIG_BODY = b"\x00\x53\x75\xb0" + (16384).to_bytes(4, "big") + b"x" * 16384


def _ma(annotations: dict[object, object]) -> bytes:
    """The message-annotations section alone (proton adds an empty header and a null body)."""
    raw = bytes(Message(annotations=annotations, body=None).encode())
    return raw.removeprefix(b"\x00SpE")[: -len(b"\x00Sw@")]


def _sections(*parts: bytes) -> bytes:
    return b"".join(parts)


def test_a_large_message_without_annotations_is_not_searched_at_all() -> None:
    assert filtering.key_search_end(_BIG_BODY) == 0
    assert not filtering.has_annotation_key(_BIG_BODY, b"x")  # the body is all "x"
    assert filtering.section([_BIG_BODY] * 3, 16) is None


def test_a_key_in_a_large_message_s_annotations_is_found_and_one_in_its_body_is_not() -> None:
    key = filtering.FILTER_VALUE_ANNOTATION.encode()
    annotated = _ma({symbol(filtering.FILTER_VALUE_ANNOTATION): "eu"}) + _BIG_BODY
    assert annotated[2] == 0x72
    end = filtering.key_search_end(annotated)
    assert key in annotated[:end] and end < 100
    assert filtering.has_annotation_key(annotated, key)
    in_body = _BIG_BODY[: -len(key)] + key
    assert key in in_body and not filtering.has_annotation_key(in_body, key)
    section = filtering.section([_BIG_BODY, annotated, in_body], 16)
    assert section is not None
    chunk_filter, _ = filtering.decode(section, 0, len(section))
    assert chunk_filter.may_match(["eu"], match_unfiltered=False) and chunk_filter.unfiltered


def test_the_header_and_delivery_annotations_before_the_annotations_are_walked() -> None:
    header = bytes(Message(durable=True, body=None).encode())[: -len(b"\x00Sw@")]
    assert header[2] == 0x70
    delivery = bytes.fromhex("0053 71 c1 0d 02 a3 09") + b"x-opt-foo" + b"\x41"
    ma = _ma({symbol("event-streams-group-key"): "k"})
    raw = _sections(header, delivery, ma, _BIG_BODY)
    assert filtering.has_annotation_key(raw, b"event-streams-group-key")
    assert filtering.key_search_end(raw) == len(header) + len(delivery) + len(ma)
    assert filtering.key_search_end(_sections(header, _BIG_BODY)) == len(header)


def test_small_or_unreadable_messages_are_searched_whole() -> None:
    small = b"\x00\x53\x75\xa0\x05hello"
    assert filtering.key_search_end(small) == len(small)
    assert filtering.has_annotation_key(small + b"key", b"key")  # small: the old answer
    symbolic = b"\x00\xa3\x05x:foo" + _BIG_BODY  # a symbolic descriptor: cannot tell
    assert filtering.key_search_end(symbolic) == len(symbolic)
    truncated = b"\x00\x53\x72\xd1\xff\xff\xff\xff" + b"x" * 2000  # a map longer than the bytes
    assert filtering.key_search_end(truncated) == len(truncated)


@pytest.mark.parametrize("seed", range(40))
def test_the_bounded_search_answers_as_the_whole_search_for_annotation_keys(seed: int) -> None:
    rng = random.Random(seed)
    key = b"event-streams-group-key"
    annotations: dict[object, object] = {
        symbol(f"x-opt-{i}"): "v" * rng.randrange(0, 300) for i in range(rng.randrange(0, 4))
    }
    if rng.random() < 0.5:
        annotations[symbol(key.decode())] = "k"
    body = bytes(rng.choice(b"xk-e") for _ in range(rng.randrange(900, 3000)))
    raw = bytes(Message(annotations=annotations or None, body=body).encode())
    in_annotations = any(str(k).encode() == key for k in annotations)
    assert filtering.has_annotation_key(raw, key) == (
        in_annotations or (len(raw) <= filtering.SMALL_MESSAGE_BYTES and key in raw)
    )


def _reference_section(records: list[bytes], size_bytes: int) -> bytes | None:
    """What `section` must answer: the Bloom filter of every record's filter value."""
    return filtering.build([filtering.filter_value(r) for r in records], size_bytes)


def _random_record(rng: random.Random) -> bytes:
    """A stored message in one of the layouts `_no_filter_values` tells apart (and some it
    must leave to the search): no sections, header first, annotations first or after a
    header, delivery annotations, long descriptors, garbage, bodies holding the key's bytes."""
    key = filtering.FILTER_VALUE_ANNOTATION
    body = rng.choice([b"x" * rng.randrange(0, 3000), key.encode() * 3, b"\x00\x53\x72\xa3"])
    annotations: dict[object, object] = {}
    if rng.random() < 0.3:
        annotations[symbol(key)] = rng.choice(["eu", "us", symbol("apac"), 7])
    if rng.random() < 0.3:
        annotations[symbol("x-opt-other")] = key
    kind = rng.randrange(8)
    if kind == 0:
        return body  # not an AMQP message at all (the storage benchmark's records)
    if kind == 1:
        return b"\x00\x80" + bytes(7) + b"\x72" + bytes(rng.randrange(0, 40))  # long descriptor
    if kind == 2:
        delivery = bytes.fromhex("0053 71 c1 0d 02 a3 09") + b"x-opt-foo" + b"\x41"
        return delivery + _ma(annotations or {symbol("a"): 1}) + body
    # proton writes a header always: list0 when empty, list8 when durable
    message = Message(durable=rng.random() < 0.5, annotations=annotations or None, body=body)
    return bytes(message.encode())  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(60))
def test_a_chunk_without_filter_values_is_told_by_its_first_bytes_as_the_search_tells_it(
    seed: int,
) -> None:
    """RESULTS §41: `section` decides "no filter value" from the records' first bytes; for any
    mix of layouts it answers what reading every record's value answers."""
    rng = random.Random(seed)
    layout = rng.randrange(3)
    records = [_random_record(rng) for _ in range(rng.randrange(1, 40))]
    if layout == 0:  # one layout per chunk, the usual case
        records = [records[0]] * len(records)
    assert filtering.section(records, 16) == _reference_section(records, 16)


def test_headers_then_annotations_are_read_for_their_value_not_skipped() -> None:
    header = bytes(Message(durable=True, body=None).encode())[: -len(b"\x00Sw@")]
    annotated = _sections(header, _ma({symbol(filtering.FILTER_VALUE_ANNOTATION): "eu"}), _BIG_BODY)
    plain = _sections(header, _BIG_BODY)
    assert filtering.section([plain] * 5, 16) is None
    assert filtering.section([b"x" * 1024] * 5, 16) is None  # not AMQP: no value
    section = filtering.section([plain, annotated, plain], 16)
    assert section is not None
    assert filtering.decode(section, 0, len(section))[0].may_match(["eu"], match_unfiltered=False)
