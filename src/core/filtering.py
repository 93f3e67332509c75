"""Stream filtering by filter value (ADR 0016, 004 "Filtering"), pure: no I/O.

A producer gives a message a *filter value* with the message annotation
`x-stream-filter-value` (a string; RabbitMQ's name, so its users' code ports as is). Each chunk
of records that has any carries a Bloom filter of its values (the chunk's filter section,
spate.node.log.chunk FLAG_FILTER); a consumer that asks for some values is sent only the chunks
whose filter may hold one of them (or that hold messages without a value, when it also wants
those), and then only the messages whose value is one of them.

The Bloom filter: `size_bytes` (m = 8 * size_bytes bits; per stream, `--filter-size-bytes`,
16-255, default 16 like RabbitMQ's `stream-filter-size-bytes`) and k hash functions chosen per
chunk from its n distinct values (k = round(m / n * ln 2), 1-8), bit positions
(h1 + i * h2) mod m with h1, h2 the two halves of the value's 64-bit BLAKE2b digest (Kirsch and
Mitzenmacher's double hashing). False-positive rate for a value not in the chunk:
(1 - e^(-k n / m))^k; with 16 bytes: n = 5: < 0.01 %, 10: 0.2 %, 20: 4.7 %, 50: 29 %,
100: 54 % (then the chunk is sent and its messages are dropped one by one, so only bandwidth
between node and gateway is lost, never a match). With 64 bytes and 100 values: 8.6 %; with
255 bytes: 0.01 %.

Section layout (after the producer section, before the records)::

    0  1 size_bytes      m / 8 (0: no value in the chunk, no bits follow)
    1  1 hashes          k (1-8; 0 when size_bytes is 0)
    2  1 unfiltered      1 when some record of the chunk has no filter value
    3  m bits            bit b is byte b // 8, bit b % 8 (LSB first)
"""

from __future__ import annotations

import hashlib
import math
import operator
import struct
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from spate.core.errors import InvalidArgument

FILTER_VALUE_ANNOTATION = "x-stream-filter-value"
SIZE_BYTES_DEFAULT = 16
SIZE_BYTES_MIN = 16
SIZE_BYTES_MAX = 255
HASHES_MAX = 8
VALUE_BYTES_MAX = 255
"""Longest filter value (UTF-8) that is indexed; a longer one counts as no value."""
VALUES_PER_LINK_MAX = 64
"""Most filter values one consumer link may ask for."""
SECTION_HEAD_BYTES = 3

_KEY = FILTER_VALUE_ANNOTATION.encode()
_SYM8_KEY = b"\xa3" + bytes([len(_KEY)]) + _KEY
_SYM32_KEY = b"\xb3" + struct.pack(">I", len(_KEY)) + _KEY
_U32 = struct.Struct(">I")
_HALVES = struct.Struct("<II")


class FilterSectionError(ValueError):
    """A chunk's filter section is malformed."""


def validate_size(size_bytes: int) -> None:
    if not SIZE_BYTES_MIN <= size_bytes <= SIZE_BYTES_MAX:
        raise InvalidArgument(
            f"filter size must be between {SIZE_BYTES_MIN} and {SIZE_BYTES_MAX} bytes, "
            f"got {size_bytes}"
        )


def filter_value(record: bytes | memoryview) -> str | None:
    """The `x-stream-filter-value` message annotation of a stored message, or None.

    Cheap when absent (the common case on streams nobody filters): one substring search of the
    record for the encoded key. When present, the key must be a symbol key of the
    message-annotations section (the scan walks the sections before it to be sure) and the
    value a string or symbol; anything else counts as no value."""
    raw = bytes(record)
    at = raw.find(_SYM8_KEY)
    skip = len(_SYM8_KEY)
    if at < 0:
        at = raw.find(_SYM32_KEY)
        skip = len(_SYM32_KEY)
        if at < 0:
            return None
    span = _annotations_span(raw)
    if span is None or not span[0] <= at < span[1]:
        return None
    return _string_at(raw, at + skip, span[1])


def _annotations_span(raw: bytes) -> tuple[int, int] | None:
    """[start, end) of the message-annotations section's map value, or None."""
    i = 0
    for _ in range(2):  # header?, then message annotations (stored bytes have no DA)
        if len(raw) < i + 4 or raw[i] != 0x00:
            return None
        if raw[i + 1] == 0x53:
            descriptor, value = raw[i + 2], i + 3
        elif raw[i + 1] == 0x80 and len(raw) >= i + 10:
            descriptor, value = int.from_bytes(raw[i + 2 : i + 10], "big"), i + 10
        else:
            return None  # a symbolic descriptor: not worth the walk
        end = _compound_end(raw, value)
        if end is None:
            return None
        if descriptor == 0x72:
            return value, end
        if descriptor not in (0x70, 0x71):
            return None
        i = end
    return None


def _compound_end(raw: bytes, i: int) -> int | None:
    code = raw[i]
    if code in (0x40, 0x45):  # null, list0
        return i + 1
    if code in (0xC0, 0xC1) and len(raw) > i + 1:
        return i + 2 + raw[i + 1]
    if code in (0xD0, 0xD1) and len(raw) >= i + 5:
        size: int = _U32.unpack_from(raw, i + 1)[0]
        return i + 5 + size
    return None


def _string_at(raw: bytes, i: int, end: int) -> str | None:
    if i >= end:
        return None
    code = raw[i]
    if code in (0xA1, 0xA3) and i + 1 < end:
        start, length = i + 2, int(raw[i + 1])
    elif code in (0xB1, 0xB3) and i + 5 <= end:
        start = i + 5
        length = int(_U32.unpack_from(raw, i + 1)[0])
    else:
        return None
    if start + length > end or length > VALUE_BYTES_MAX:
        return None
    try:
        return raw[start : start + length].decode()
    except UnicodeDecodeError:
        return None


def _positions(value: str, bits: int, hashes: int) -> Iterable[int]:
    digest = hashlib.blake2b(value.encode(), digest_size=8).digest()
    h1, h2 = _HALVES.unpack(digest)
    h2 |= 1  # odd: the k positions differ for any m
    return ((h1 + i * h2) % bits for i in range(hashes))


@dataclass(frozen=True, slots=True)
class ChunkFilter:
    """A chunk's filter section: its Bloom filter and whether it holds unfiltered messages."""

    bits: bytes
    hashes: int
    unfiltered: bool

    def may_hold(self, value: str) -> bool:
        if not self.bits:
            return False
        bits = self.bits
        positions = _positions(value, len(bits) * 8, self.hashes)
        return all(bits[b >> 3] >> (b & 7) & 1 for b in positions)

    def may_match(self, values: Collection[str], match_unfiltered: bool) -> bool:
        """Whether the chunk may hold a message the consumer wants."""
        if match_unfiltered and self.unfiltered:
            return True
        return any(self.may_hold(v) for v in values)


SMALL_MESSAGE_BYTES = 1024
"""Up to this size one substring search of a whole message is cheaper than walking its
sections to bound the search (`key_search_end`)."""


def key_search_end(raw: bytes) -> int:
    """Where a message-annotation key of `raw` (a message as sent, or as stored) can end at
    the latest: the end of its message-annotations section, or the start of its first section
    after where that section would be (no annotations: nothing to search); the whole message
    when it is small (SMALL_MESSAGE_BYTES) or when the walk cannot tell (a symbolic or long
    descriptor, a malformation: the callers' own parsing judges those). A key found only in a
    body was never an annotation, so searching `raw[:key_search_end(raw)]` answers as searching
    `raw` does, without reading a large body (a substring search of 16 KiB costs 9 us on
    random bytes and 110 us on bytes much like the key; RESULTS §37)."""
    n = len(raw)
    if n <= SMALL_MESSAGE_BYTES:
        return n
    i = 0
    for _ in range(3):  # header?, delivery annotations?, message annotations?
        if n < i + 4 or raw[i] != 0x00 or raw[i + 1] != 0x53:
            return n
        code = raw[i + 2]
        if code not in (0x70, 0x71, 0x72):
            return i  # a later section: there are no message annotations
        end = _compound_end(raw, i + 3)
        if end is None or end > n:
            return n
        if code == 0x72:
            return end
        i = end
    return n


def has_annotation_key(raw: bytes, key: bytes) -> bool:
    """Whether `key` occurs in `raw` where a message annotation can be (`key_search_end`):
    the cheap test before a message is parsed for that annotation."""
    if len(raw) <= SMALL_MESSAGE_BYTES:
        return key in raw
    return raw.find(key, 0, key_search_end(raw)) >= 0


_HEAD = operator.itemgetter(slice(0, 5))
_CANNOT_HOLD, _UNKNOWN = 0, -1


def _second_section_at(head: bytes) -> int:
    """What the first five bytes of a stored message say about a filter value: where its
    second section starts when the first is a header in a short form (the message
    annotations may follow it), `_CANNOT_HOLD` when no filter value can be in it
    (`filter_value` answers None: not an AMQP section, or a first section after the
    annotations), `_UNKNOWN` when it may (annotations first, a delivery-annotations or
    long-descriptor section, a long header)."""
    if len(head) < 5 or head[0] != 0x00 or head[1] not in (0x53, 0x80):
        return _CANNOT_HOLD
    if head[1] == 0x80 or head[2] in (0x71, 0x72):
        return _UNKNOWN
    if head[2] != 0x70:
        return _CANNOT_HOLD
    if head[3] in (0x40, 0x45):
        return 4
    if head[3] in (0xC0, 0xC1):
        return 5 + head[4]
    return _UNKNOWN


def _no_filter_values(records: Sequence[bytes]) -> bool:
    """True when no record can hold a filter value, judged from the first bytes of each
    record and, after a header, the first bytes of its second section, with C-level passes
    (`map` of an itemgetter, a set of what they return: ~0.1 us per record whatever its size;
    RESULTS §41). False means "maybe": the caller searches. Exact where it says True:
    `filter_value` finds a value only in message annotations that come first, or second
    after a header or delivery annotations (`_annotations_span`)."""
    seconds: set[int] = set()
    for head in set(map(_HEAD, records)):
        at = _second_section_at(head)
        if at == _UNKNOWN:
            return False
        if at != _CANNOT_HOLD:
            seconds.add(at)
    if not seconds:
        return True
    if len(seconds) > 1:
        return False  # headers of several lengths: rare, searched
    (at,) = seconds
    for second in set(map(operator.itemgetter(slice(at, at + 3)), records)):
        if len(second) == 3 and second[0] == 0x00 and (second[1] == 0x80 or second[2] == 0x72):
            return False  # message annotations (or a long descriptor) after the header
    return True


FIRST_BYTES_RECORD_BYTES_MIN = 512
"""Records of this mean size and above are told by their first bytes (`_no_filter_values`,
~0.1 us a record); below it one join and one search of the chunk is cheaper (RESULTS §41:
10,000 records of 100 B, 0.8 ms against 1.8 ms)."""


def section(records: Sequence[bytes], size_bytes: int) -> bytes | None:
    """The filter section of a chunk of these stored messages (None: no record has a filter
    value). The common case, a chunk without any, is told by the first bytes of its records
    when they are large (`_no_filter_values`; 1 MiB of 1 KiB records: 0.1 ms, where one
    substring search of the joined records took 0.3 ms; RESULTS §41), else, and when the
    first bytes cannot tell, by one copy and one substring search of its bytes for small
    records, or one search of each record's annotations for large ones
    (`has_annotation_key`); only a chunk holding the key somewhere is scanned message by
    message (~4 us each)."""
    total = sum(map(len, records))
    if total >= FIRST_BYTES_RECORD_BYTES_MIN * len(records) and _no_filter_values(records):
        return None
    if total <= SMALL_MESSAGE_BYTES * len(records):
        if _KEY not in b"".join(records):
            return None
    elif not any(has_annotation_key(record, _KEY) for record in records):
        return None
    return build([filter_value(r) for r in records], size_bytes)


def build(values: Sequence[str | None], size_bytes: int) -> bytes | None:
    """The filter section of a chunk whose records have these filter values (None: none), or
    None when no record has one (the chunk gets no section: every message is unfiltered)."""
    distinct = {v for v in values if v is not None}
    if not distinct:
        return None
    unfiltered = any(v is None for v in values)
    bits = size_bytes * 8
    hashes = max(1, min(HASHES_MAX, round(bits / len(distinct) * math.log(2))))
    array = bytearray(size_bytes)
    for value in distinct:
        for b in _positions(value, bits, hashes):
            array[b >> 3] |= 1 << (b & 7)
    return bytes((size_bytes, hashes, int(unfiltered))) + bytes(array)


def sub_entry_section(values: Sequence[str | None], size_bytes: int) -> bytes:
    """The filter section of a sub-entry chunk whose messages have these filter values (ADR
    0017): always one, so that a filtered read can pass over it; with no value at all it is
    the empty section (3 bytes: no Bloom bits, every message unfiltered). A sub-entry chunk
    without a section (its values unknown) is read by every filtered read."""
    return build(values, size_bytes) or bytes((0, 0, 1))


def decode(buffer: bytes | memoryview, start: int, end: int) -> tuple[ChunkFilter, int]:
    """The section at `start` (bounded by `end`) and its length in bytes."""
    if end - start < SECTION_HEAD_BYTES:
        raise FilterSectionError("filter section shorter than its head")
    size, hashes, unfiltered = buffer[start], buffer[start + 1], buffer[start + 2]
    length = SECTION_HEAD_BYTES + size
    if (
        start + length > end
        or unfiltered > 1
        or (size == 0) != (hashes == 0)
        or hashes > HASHES_MAX
        or (size and size < SIZE_BYTES_MIN)
    ):
        raise FilterSectionError(f"impossible filter section ({size} bytes, {hashes} hashes)")
    bits = bytes(buffer[start + SECTION_HEAD_BYTES : start + length])
    return ChunkFilter(bits, hashes, bool(unfiltered)), length


def false_positive_rate(size_bytes: int, values: int) -> float:
    """The documented rate for a chunk with `values` distinct values (see the module)."""
    bits = size_bytes * 8
    hashes = max(1, min(HASHES_MAX, round(bits / values * math.log(2))))
    return float((1 - math.exp(-hashes * values / bits)) ** hashes)


@dataclass(frozen=True, slots=True)
class ValueFilter:
    """What a consumer link asked for with `rabbitmq:stream-filter` (and
    `rabbitmq:stream-match-unfiltered`)."""

    values: frozenset[str]
    match_unfiltered: bool = False

    def chunk_may_match(self, section: ChunkFilter | None) -> bool:
        """A chunk without a section holds only unfiltered messages."""
        if section is None:
            return self.match_unfiltered
        return section.may_match(self.values, self.match_unfiltered)

    def matches(self, record: bytes | memoryview) -> bool:
        value = filter_value(record)
        if value is None:
            return self.match_unfiltered
        return value in self.values
