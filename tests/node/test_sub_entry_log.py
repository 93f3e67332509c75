"""Sub-entry chunks in the partition log (ADR 0017): stored byte for byte, one offset per message
inside, read lazily, and everything per message (offsets, indexes, counts, count retention,
recovery, truncation, producer state) as if the messages had been appended singly; a sub-entry
chunk's Bloom filter (ADR 0016) lets a filtered read pass over it as over any chunk."""

from __future__ import annotations

import pytest
from proton import Message, symbol
from spate.core import filtering, limits, subentry, wire
from spate.core.backend import OffsetSpec, PublishingIds
from spate.core.errors import InvalidArgument
from spate.core.ids import Offset, PartitionId, StreamName
from spate.core.streams import Retention
from spate.node.log import LogConfig, PartitionLog
from spate.node.log import chunk as chunk_codec
from support.log_disks import DiskUnderTest

CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=200)


def record(offset: int) -> bytes:
    return f"{offset:08d}".encode() * 5  # 40 bytes, tells its own offset


def read_all(log: PartitionLog, start: int = 0) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = Offset(start)
    while views := log.read(offset, 10_000):
        got = [
            (o, bytes(r))
            for v in views
            for o, r in enumerate(v.records, v.first_offset)
            if o >= offset
        ]
        out.extend(got)
        offset = Offset(got[-1][0] + 1)
    return out


def batch(start: int, count: int = 10, codec: str = "zstd") -> subentry.SubEntry:
    return subentry.encode([record(start + i) for i in range(count)], codec)


@pytest.mark.parametrize("codec", list(subentry.CODECS))
def test_a_sub_entry_chunk_round_trips_byte_for_byte(codec: str) -> None:
    blob = batch(5, codec=codec)
    data, header = chunk_codec.encode_sub_entry_chunk(blob, Offset(5), 1000, 2, 9)
    decoded, records = chunk_codec.decode_chunk(data)
    assert decoded == header
    assert (header.first_offset, header.record_count, header.end_offset) == (5, 10, 15)
    assert header.chunk_type == chunk_codec.CHUNK_TYPE_SUB_ENTRY
    assert isinstance(records, subentry.SubEntryRecords)
    assert bytes(records.blob) == blob  # stored as it came
    assert records._messages is None  # nothing decompressed yet
    assert list(records) == [record(5 + i) for i in range(10)]
    assert records[3:5] == [record(8), record(9)]
    damaged = bytearray(data)
    damaged[-3] ^= 1
    with pytest.raises(chunk_codec.ChunkError, match="CRC"):
        chunk_codec.decode_chunk(bytes(damaged))


def test_offsets_counts_reads_and_recovery_are_per_message(disk: DiskUnderTest) -> None:
    log = PartitionLog.open(disk.storage, CONFIG)
    log.append([record(0), record(1)], 1000)
    assert log.append([batch(2)], 1001) == 2
    log.append([record(12)], 1002)
    assert log.append([batch(13, 4, "gzip")], 1003) == 13
    log.sync()
    assert log.end_offset == 17
    expected = [(i, record(i)) for i in range(17)]
    assert read_all(log) == expected
    assert read_all(log, 7) == expected[7:]  # from inside a sub-entry
    assert log.info().messages == 17
    assert log.resolve(OffsetSpec.last()) == 13  # the last chunk's first offset
    log.close()
    reopened = PartitionLog.open(disk.restart(), CONFIG)
    assert reopened.end_offset == 17
    assert read_all(reopened) == expected


def test_retention_by_message_count_counts_the_messages_inside(disk: DiskUnderTest) -> None:
    config = LogConfig(segment_bytes=400, retention=Retention(max_messages=25))
    log = PartitionLog.open(disk.storage, config)
    for k in range(6):  # one sub-entry chunk of 10 messages (507 bytes) per segment
        log.append([batch(10 * k, codec="none")], 1000 + k)
    log.sync()
    assert len(log.segments) == 6
    assert log.apply_retention(now_ms=0) == 4  # 60 messages: down to 20 (<= 25)
    assert log.start_offset == 40 and log.info().messages == 20
    assert read_all(log)[0] == (40, record(40))


def test_truncating_inside_a_sub_entry_keeps_its_head_as_plain_records(
    disk: DiskUnderTest,
) -> None:
    log = PartitionLog.open(disk.storage, CONFIG)
    log.append([batch(0)], 1000)
    log.sync()
    log.truncate_from(Offset(4))
    assert log.end_offset == 4
    assert read_all(log) == [(i, record(i)) for i in range(4)]


def test_a_named_producer_s_sub_entry_records_its_id_and_last_offset(
    disk: DiskUnderTest,
) -> None:
    log = PartitionLog.open(disk.storage, CONFIG)
    log.append([record(0)], 1000)
    log.append([batch(1)], 1001, producer=(b"app", [7]))
    state = log.producers.get(b"app")
    assert state is not None and (state.last_id, state.last_offset) == (7, 10)


def test_what_is_not_a_sub_entry_is_refused_before_anything_is_written(
    disk: DiskUnderTest,
) -> None:
    log = PartitionLog.open(disk.storage, CONFIG)
    bad = bytearray(batch(0))
    bad[1:3] = (11).to_bytes(2, "big")  # the count says 11
    with pytest.raises(InvalidArgument, match="not a sub-entry"):
        log.append([subentry.SubEntry(bytes(bad[:-1]))], 1000)
    assert log.end_offset == 0


def test_the_append_wire_carries_the_sub_entry_flag() -> None:
    key = (StreamName("s"), PartitionId(0))
    blob = batch(0)
    for producer in (None, PublishingIds(b"p", (3,))):
        frame = wire.encode_append(1, key, 0, [blob], producer)
        body = memoryview(frame)[5:]  # length u32 | kind u8
        _, _, _, records, got = wire.decode_append(body)
        assert len(records) == 1 and isinstance(records[0], subentry.SubEntry)
        assert records[0] == blob and got == producer
    plain = wire.encode_append(2, key, 0, [bytes(blob)])  # the same bytes, unflagged
    _, _, _, records, _ = wire.decode_append(memoryview(plain)[5:])
    assert not isinstance(records[0], subentry.SubEntry)


def test_the_append_wire_carries_a_sub_entry_s_filter_values() -> None:
    key = (StreamName("s"), PartitionId(0))
    for values in (None, (), (None,), (None, "eu", "ünïcode"), ("x" * 65535,)):
        blob = subentry.SubEntry.with_values(batch(0), values)
        for producer in (None, PublishingIds(b"p", (3,))):
            frame = wire.encode_append(1, key, 0, [blob], producer)
            _, _, _, records, got = wire.decode_append(memoryview(frame)[5:])
            assert isinstance(records[0], subentry.SubEntry) and records[0] == blob
            assert records[0].filter_values == values and got == producer
    frame = bytearray(wire.encode_append(1, key, 0, [subentry.SubEntry.with_values(batch(0), ())]))
    with pytest.raises(wire.CodecError):  # the values cut off
        wire.decode_append(memoryview(frame)[5:-1])
    plain = bytearray(wire.encode_append(2, key, 0, [b"r"]))
    plain[5 + 4 + 1 + 2 + 16 : 5 + 4 + 1 + 2 + 16 + 4] = (1 | wire.SUB_ENTRY_VALUES_FLAG).to_bytes(
        4, "big"
    )
    with pytest.raises(wire.CodecError, match="without a sub-entry"):
        wire.decode_append(memoryview(plain)[5:])


def tagged(start: int, values: list[str | None], codec: str = "zstd") -> subentry.SubEntry:
    """A sub-entry whose message i has filter value values[i] (None: none), with those values
    beside it as the gateway sends them."""
    messages = [
        Message(
            body=f"m{start + i}",
            annotations=None if v is None else {symbol("x-stream-filter-value"): v},
        ).encode()
        for i, v in enumerate(values)
    ]
    blob = subentry.encode(messages, codec)
    distinct = {filtering.filter_value(m) for m in messages}
    return subentry.SubEntry.with_values(bytes(blob), tuple(distinct))


def test_a_filtered_read_passes_over_sub_entry_chunks_whose_bloom_filter_rules_them_out(
    disk: DiskUnderTest,
) -> None:
    log = PartitionLog.open(disk.storage, LogConfig(segment_bytes=100_000))
    log.append([tagged(0, ["eu", "eu", "us"])], 1000)  # 0-2
    log.append([tagged(3, ["apac", None])], 1001)  # 3-4
    log.append([tagged(5, [None, None])], 1002)  # 5-6: the empty section
    unknown = subentry.SubEntry(bytes(tagged(7, ["eu"])))  # 7: values unknown, no section
    log.append([unknown], 1003)
    log.append([record(8)], 1004)  # 8: a plain chunk, unfiltered
    log.sync()

    def chunks(where: filtering.ValueFilter) -> list[tuple[int, int]]:
        views = log.read(Offset(0), 1_000_000, where=where.chunk_may_match)
        return [(v.first_offset, len(v.records)) for v in views]

    # 5-6 and 8 are ruled out (every message unfiltered); 7 is read: nothing is known of it
    assert chunks(filtering.ValueFilter(frozenset({"eu"}))) == [(0, 3), (7, 1), (9, 0)]
    assert chunks(filtering.ValueFilter(frozenset({"apac"}))) == [(3, 2), (7, 1), (9, 0)]
    assert chunks(filtering.ValueFilter(frozenset({"apac"}), match_unfiltered=True)) == [
        (3, 2),
        (5, 2),
        (7, 1),
        (8, 1),
    ]
    log.close()
    reopened = PartitionLog.open(disk.restart(), LogConfig(segment_bytes=100_000))
    assert [
        (v.first_offset, v.filter)
        for v in reopened.read(Offset(0), 1_000_000)
        if v.first_offset in (5, 7)
    ] == [(5, filtering.ChunkFilter(b"", 0, True)), (7, None)]
    assert [bytes(r) for v in reopened.read(Offset(0), 1_000_000) for r in v.records][:3] == [
        Message(body="m0", annotations={symbol("x-stream-filter-value"): "eu"}).encode(),
        Message(body="m1", annotations={symbol("x-stream-filter-value"): "eu"}).encode(),
        Message(body="m2", annotations={symbol("x-stream-filter-value"): "us"}).encode(),
    ]


def test_unpack_never_allocates_more_than_the_header_declares() -> None:
    """A decompression bomb: 8 MiB of zeros that say they are 100 bytes."""
    import cramjam

    data = bytes(cramjam.zstd.compress(b"\0" * limits.sub_entry_uncompressed_bytes_max))
    head = subentry.HEADER.pack(0x80 | 4 << 4, 1, 100, len(data))
    with pytest.raises(subentry.SubEntryError, match="does not decompress to the 100 bytes"):
        subentry.unpack(head + data)
    with pytest.raises(subentry.OverLimit):
        subentry.parse_header(
            subentry.HEADER.pack(0x80 | 4 << 4, 1, limits.sub_entry_uncompressed_bytes_max + 1, 0)
        )
