"""Chunk and index codecs: round trips and corruption detection."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spate.core.ids import Offset
from spate.node.log import chunk
from spate.node.log.chunk import ChunkError
from spate.node.log.index import (
    SparseIndex,
    decode_offset_index,
    decode_time_index,
    encode_offset_index,
    encode_time_index,
)

records_strategy = st.lists(st.binary(max_size=300), min_size=1, max_size=40)


@given(
    records=records_strategy,
    first=st.integers(0, 2**64 - 1 - 40),
    timestamp_ms=st.integers(-(2**63), 2**63 - 1),
    epoch=st.integers(0, 2**64 - 1),
)
def test_chunk_round_trip(records: list[bytes], first: int, timestamp_ms: int, epoch: int) -> None:
    """Records come back byte for byte (002: the bare message is immutable), with the header."""
    data = chunk.encode_chunk(records, Offset(first), timestamp_ms, epoch)
    assert len(data) == chunk.HEADER_BYTES + chunk.payload_bytes(records)
    header, views = chunk.decode_chunk(data)
    assert [bytes(v) for v in views] == records
    assert (header.first_offset, header.record_count, header.timestamp_ms, header.epoch) == (
        first,
        len(records),
        timestamp_ms,
        epoch,
    )
    assert header.end_offset == first + len(records)
    assert header.chunk_bytes == len(data)


def test_layout_matches_the_documented_bytes() -> None:
    """The byte layout in chunk.py's docstring, checked field by field."""
    data = chunk.encode_chunk([b"ab", b"c"], Offset(5), 1234, 9, 77)
    assert data[0:4] == b"SPCK"
    (crc,) = struct.unpack(">I", data[4:8])
    assert data[8] == 2 and data[9] == 0 and data[10:12] == b"\0\0"
    assert struct.unpack(">IQqQQII", data[12:56]) == (2, 5, 1234, 9, 77, 4 + 2 + 4 + 1, 0)
    assert data[56:] == b"\0\0\0\x02ab\0\0\0\x01c"
    assert crc == crc32c.crc32c(data[8:])


@settings(max_examples=200)
@given(records=records_strategy, data=st.data())
def test_any_changed_byte_is_detected(records: list[bytes], data: st.DataObject) -> None:
    encoded = bytearray(chunk.encode_chunk(records, Offset(100), 1, 0))
    position = data.draw(st.integers(0, len(encoded) - 1))
    flip = data.draw(st.integers(1, 255))
    encoded[position] ^= flip
    with pytest.raises(ChunkError):
        chunk.decode_chunk(bytes(encoded))


@given(records=records_strategy, data=st.data())
def test_any_truncation_is_detected(records: list[bytes], data: st.DataObject) -> None:
    encoded = chunk.encode_chunk(records, Offset(0), 1, 0)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ChunkError):
        chunk.decode_chunk(encoded[:cut])


def test_records_are_views_not_copies() -> None:
    encoded = chunk.encode_chunk([b"x" * 1000, b"y" * 10], Offset(0), 1, 0)
    _, views = chunk.decode_chunk(encoded)
    assert all(isinstance(v, memoryview) and v.obj is encoded for v in views)


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), max_size=50))
def test_index_round_trip(pairs: list[tuple[int, int]]) -> None:
    offsets = SparseIndex()
    times = SparseIndex()
    key = value = -1
    for dk, dv in pairs:
        key, value = key + dk + 1, value + dv + 1
        offsets.add(key, value)
        times.add(key - 5, value)
    decoded = decode_offset_index(encode_offset_index(offsets))
    assert decoded is not None and offsets.same_as(decoded)
    decoded_times = decode_time_index(encode_time_index(times))
    assert decoded_times is not None and times.same_as(decoded_times)


def test_torn_or_unordered_index_is_refused() -> None:
    index = SparseIndex()
    index.add(0, 0)
    index.add(10, 500)
    data = encode_offset_index(index)
    assert decode_offset_index(data[:-3]) is None
    assert decode_offset_index(data[8:] + data[:8]) is None


def test_floor_and_below() -> None:
    index = SparseIndex()
    for key in (0, 10, 20):
        index.add(key, key * 100)
    assert index.floor(15) == (10, 1000)
    assert index.floor(20) == (20, 2000)
    assert index.below(20) == (10, 1000)
    assert index.below(0) is None
    index.cut(10)
    assert list(index.keys) == [0]


def test_barrier_chunk_has_no_records_and_carries_term_and_index() -> None:
    """A new Raft leader's empty entry is stored as a chunk with record_count 0."""
    data = chunk.encode_barrier(Offset(42), 1000, 7, 13)
    assert len(data) == chunk.HEADER_BYTES
    header, views = chunk.decode_chunk(data)
    assert views == []
    assert (header.first_offset, header.end_offset, header.epoch, header.raft_index) == (
        42,
        42,
        7,
        13,
    )
    broken = bytearray(data)
    broken[12:16] = struct.pack(">I", 1)  # a record count without payload is not a chunk
    with pytest.raises(ChunkError):
        chunk.decode_chunk(bytes(broken))


def test_the_single_buffer_encoding_is_the_chunk_and_caches_no_long_lengths() -> None:
    """The append path's one-copy buffer holds exactly the chunk bytes (header packed in place,
    CRC over it), for record lengths below and above the prefix cache's bound."""
    long = chunk.PREFIX_CACHE_LENGTH_MAX
    records = [b"", b"a", b"b" * 1024, b"c" * long, b"d" * (long + 1), b"e" * 100]
    buffer, header = chunk.encode_chunk_buffer(records, Offset(7), 99, 3, 12)
    assert isinstance(buffer, bytearray)
    payload = b"".join(struct.pack(">I", len(r)) + r for r in records)
    after_crc = struct.pack(">BBHIQqQQII", 2, 0, 0, len(records), 7, 99, 3, 12, len(payload), 0)
    crc = crc32c.crc32c(after_crc + payload)
    assert bytes(buffer) == b"SPCK" + struct.pack(">I", crc) + after_crc + payload
    assert bytes(buffer) == chunk.encode_chunk(records, Offset(7), 99, 3, 12)
    decoded, views = chunk.decode_chunk(bytes(buffer))
    assert decoded == header
    assert [bytes(v) for v in views] == records
    assert long not in chunk._PREFIXES and (long - 1) not in chunk._PREFIXES


def test_record_lengths_that_do_not_add_up_are_refused() -> None:
    """slice_records tests the lengths once, after the loop (RESULTS §26): a length past the
    payload, a prefix past the buffer and a payload with bytes left over are all ChunkErrors,
    also when the buffer goes on after the chunk (a read block holds the next chunks)."""
    records = [b"a" * 10, b"b" * 20, b"c" * 5]
    buffer, header = chunk.encode_chunk_buffer(records, Offset(0), 1, 1)
    assert [bytes(r) for r in chunk.slice_records(bytes(buffer), 0, header)] == records
    second = chunk.HEADER_BYTES + chunk.RECORD_PREFIX_BYTES + 10
    for tampered_length, tail in ((21, b""), (21, b"\x00" * 64), (19, b"\x00" * 64), (10**6, b"")):
        bad = bytearray(buffer)
        struct.pack_into(">I", bad, second, tampered_length)
        with pytest.raises(ChunkError, match=r"overrun|stray"):
            chunk.slice_records(bytes(bad) + tail, 0, header)
    short = bytes(buffer)[: len(buffer) - 6]  # the last prefix is cut
    with pytest.raises(ChunkError, match=r"overrun|stray"):
        chunk.slice_records(short, 0, header)
