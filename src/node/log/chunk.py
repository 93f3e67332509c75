"""Chunk codec: the unit of append, fsync, replication and read.

A chunk is a batch of records (the producers' encoded AMQP messages, stored byte for byte) with
one header. Segment files are chunks laid end to end, nothing else. All integers are big-endian
and unsigned unless marked signed.

Chunk header, 56 bytes (version 2; version 1 had no raft_index and was 48 bytes):

```
 offset size field           meaning
 ------ ---- --------------- ------------------------------------------------------------------
      0    4 magic           b"SPCK"; anything else means "not a chunk" (torn tail, garbage)
      4    4 crc32c          CRC32C (Castagnoli) of bytes [8, 56 + payload_length) of the chunk:
                             the rest of this header and the whole payload
      8    1 version         2
      9    1 chunk_type      0 = user records; 1 = CHUNK_TYPE_SUB_ENTRY, a sub-entry chunk
                             (below; ADR 0017); 2 = CHUNK_TYPE_MEMBERSHIP, a Raft membership
                             entry (below; ADR 0022); other values reserved
     10    2 flags           bit 0: FLAG_PRODUCER, the payload starts with a producer section
                             (spate.node.log.producers); bit 1: FLAG_TRACKING, a tracking
                             chunk (spate.node.log.tracking); bit 2: FLAG_FILTER, a filter
                             section follows (spate.core.filtering, ADR 0016); other bits 0
     12    4 record_count    number of records in the payload; 0 only for a barrier chunk or
                             a tracking chunk
     16    8 first_offset    offset of the first record; record i has offset first_offset + i
                             (a barrier's or tracking chunk's first_offset is the end offset of
                             the chunk before)
     24    8 timestamp_ms    signed; the chunk's append time, shared by every record in it
     32    8 epoch           Raft term of the leader that wrote the chunk (0 without replication)
     40    8 raft_index      Raft log index of the chunk (one chunk is one Raft entry; 0 without
                             replication)
     48    4 payload_length  bytes of payload that follow the header (0 for a barrier)
     52    4 reserved        0
```

Payload: with FLAG_PRODUCER, first the producer section of a named producer's chunk (ADR 0011)

```
      0    2 name_length     n (1..256)
      2    n name            the producer name, UTF-8
    2+n    8 last_id         publishing id of the chunk's last record
```

then, with FLAG_FILTER, the filter section (a Bloom filter of the records' filter values,
spate.core.filtering: `u8 size | u8 hashes | u8 unfiltered | size bytes`), then
`record_count` records, each

```
      0    4 record_length   n
      4    n record          the producer's encoded AMQP message, never decoded here
```

and nothing else: the section and the record lengths add up to exactly `payload_length`.

A sub-entry chunk (chunk_type 1, ADR 0017) holds one producer batch stored as the producer sent
it: after the producer section (with FLAG_PRODUCER), the payload is one sub-entry,
spate.core.subentry's layout (11-byte header: codec, count, lengths; then the data, possibly
compressed), with no record-length prefix, and `record_count` is the sub-entry's message count:
message i has offset first_offset + i as in any chunk, so indexes, retention and replication
need nothing new. The log never decompresses it; readers get a `SubEntryRecords`. Its filter
section (FLAG_FILTER, between the producer section and the sub-entry) is built from the values
the gateway read from the inner messages; a sub-entry chunk without one is read by every
filtered read (a plain chunk without one holds only unfiltered messages).

A barrier chunk (record_count 0, payload_length 0) is the empty entry a new Raft leader appends
at the start of its term: it carries the term (epoch) and Raft index into storage and holds no
record; readers skip it.

A tracking chunk (FLAG_TRACKING, record_count 0) holds no record either; its payload is a
tracking section, the stored offsets of consumer names (ADR 0012):

```
      0    2 count           entries (1..1024)
    per entry:
      0    2 name_length     n (1..256)
      2    n name            the consumer name, UTF-8
    2+n    8 offset          signed: the last offset the consumer is done with (-1: none)
```

Readers skip it like a barrier.

A membership chunk (CHUNK_TYPE_MEMBERSHIP, flags 0, record_count 0) is a Raft membership entry
(ADR 0022): its payload is `spate.node.replication.messages.Membership.encode()` (magic
"SPCF", the voters and learners), the partition's replica set from its Raft index on. Each
replica encodes it itself around the core's payload, like a barrier. Readers skip it.

Why these choices (docs/adr/0001-log-format.md has the full comparison with Osiris chunks and
Kafka record batches): the CRC sits right after the magic so that it covers every other header
field (a flipped bit in first_offset or payload_length is caught, not obeyed); big-endian like
Osiris and Kafka; fixed-width record lengths because slicing them in Python costs one
`unpack_from` per record, where varints would cost a loop per byte.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
from spate.core import filtering, subentry
from spate.core.errors import MessageSizeExceeded
from spate.core.ids import Offset
from spate.node.log import producers, tracking

MAGIC = b"SPCK"
VERSION = 2
CHUNK_TYPE_RECORDS = 0
CHUNK_TYPE_SUB_ENTRY = 1
CHUNK_TYPE_MEMBERSHIP = 2
FLAG_PRODUCER = 1
FLAG_TRACKING = 2
FLAG_FILTER = 4
HEADER_BYTES = 56
RECORD_PREFIX_BYTES = 4
CRC_START = 8
"""The CRC covers the chunk from this byte to its end."""


def record_lengths(records: Sequence[bytes], message_bytes_max: int) -> list[int]:
    """The records' lengths, MessageSizeExceeded when one is over `message_bytes_max`. Per-record
    work in C (map, max), none in Python: a chunk of a whole socket read holds hundreds of
    records (issue 16; on 1 MiB of 1 KiB records interpreted loops cost three times the chunk
    encoding)."""
    lengths = list(map(len, records))
    longest = max(lengths)
    if longest > message_bytes_max:
        raise MessageSizeExceeded(
            f"a message of {longest} bytes is over the limit of {message_bytes_max} bytes"
        )
    return lengths


def chunk_ranges(lengths: Sequence[int], records_max: int, bytes_max: int) -> list[tuple[int, int]]:
    """Cut records of these lengths into chunks of at most `records_max` records and
    `bytes_max` payload bytes (length prefixes included; a larger record goes alone):
    [(start, end), ...]. One sum in C when they all fit in one, the common case."""
    prefix = RECORD_PREFIX_BYTES
    count = len(lengths)
    if count <= records_max and sum(lengths) + prefix * count <= bytes_max:
        return [(0, count)]
    bounds = []
    start = 0
    while start < count:
        end = start
        payload = 0
        while end < count and end - start < records_max:
            size = lengths[end] + prefix
            if end > start and payload + size > bytes_max:
                break
            payload += size
            end += 1
        bounds.append((start, end))
        start = end
    return bounds


_HEADER = struct.Struct(">4sIBBHIQqQQII")
_AFTER_CRC = struct.Struct(">BBHIQqQQII")
_RECORD_LENGTH = struct.Struct(">I")
assert _HEADER.size == HEADER_BYTES
assert _AFTER_CRC.size == HEADER_BYTES - CRC_START


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    first_offset: Offset
    record_count: int
    timestamp_ms: int
    epoch: int
    payload_length: int
    crc: int
    raft_index: int = 0
    flags: int = 0
    chunk_type: int = CHUNK_TYPE_RECORDS

    @property
    def end_offset(self) -> Offset:
        """The offset after this chunk's last record."""
        return Offset(self.first_offset + self.record_count)

    @property
    def chunk_bytes(self) -> int:
        return HEADER_BYTES + self.payload_length


class ChunkError(Exception):
    """Bytes that are not a valid chunk. Recovery treats it as the end of the log; reads turn it
    into a StorageFailure. Never raised for a bug: those are assertions."""


def payload_bytes(records: Sequence[bytes | memoryview]) -> int:
    """Payload length the records take in a chunk."""
    return sum(len(r) for r in records) + RECORD_PREFIX_BYTES * len(records)


def encode_chunk(
    records: Sequence[bytes | memoryview],
    first_offset: Offset,
    timestamp_ms: int,
    epoch: int,
    raft_index: int = 0,
    *,
    producer: bytes | None = None,
    filter_section: bytes | None = None,
) -> bytes:
    """The chunk's bytes, header then payload, with its CRC; `producer` is the encoded
    producer section of a named producer's chunk (spate.node.log.producers.encode_section),
    `filter_section` the Bloom filter of its records' filter values (spate.core.filtering)."""
    return encode_chunk_with_header(
        records,
        first_offset,
        timestamp_ms,
        epoch,
        raft_index,
        producer=producer,
        filter_section=filter_section,
    )[0]


def encode_barrier(first_offset: Offset, timestamp_ms: int, epoch: int, raft_index: int) -> bytes:
    """A barrier chunk: no records, just the Raft term and index of a new leader's first entry."""
    assert first_offset >= 0 and epoch >= 0 and raft_index > 0
    after_crc = _AFTER_CRC.pack(
        VERSION, CHUNK_TYPE_RECORDS, 0, 0, first_offset, timestamp_ms, epoch, raft_index, 0, 0
    )
    return b"".join((MAGIC, _RECORD_LENGTH.pack(crc32c.crc32c(after_crc)), after_crc))


def encode_tracking(
    entries: Sequence[tuple[bytes, int]],
    first_offset: Offset,
    timestamp_ms: int,
    epoch: int,
    raft_index: int = 0,
) -> bytes:
    """A tracking chunk: the stored offset of each (consumer name, offset), no records."""
    assert first_offset >= 0 and epoch >= 0 and raft_index >= 0
    payload = tracking.encode_section(entries)
    head = (CHUNK_TYPE_RECORDS, FLAG_TRACKING, 0, first_offset, timestamp_ms, epoch, raft_index)
    return _sealed(head, payload)[0]


def _sealed(head: tuple[int, int, int, int, int, int, int], payload: bytes) -> tuple[bytes, int]:
    """A chunk of (chunk_type, flags, record_count, first_offset, timestamp_ms, epoch,
    raft_index) over `payload`, with its CRC; and the CRC."""
    after_crc = _AFTER_CRC.pack(VERSION, *head, len(payload), 0)
    crc = crc32c.crc32c(after_crc + payload)
    return b"".join((MAGIC, _RECORD_LENGTH.pack(crc), after_crc, payload)), crc


def tracking_section(
    buffer: bytes | bytearray | memoryview, position: int, header: ChunkHeader
) -> list[tuple[bytes, int]]:
    """(consumer name, offset) entries of the FLAG_TRACKING chunk at `position`."""
    assert header.flags & FLAG_TRACKING
    start = position + HEADER_BYTES
    try:
        return tracking.decode_section(buffer, start, start + header.payload_length)
    except tracking.TrackingError as error:
        raise ChunkError(f"tracking chunk at offset {header.first_offset}: {error}") from error


def encode_membership(
    first_offset: Offset, timestamp_ms: int, epoch: int, raft_index: int, membership: bytes
) -> bytes:
    """A membership chunk: no records; the payload is the core's membership entry."""
    assert first_offset >= 0 and epoch >= 0 and raft_index > 0 and membership
    head = (CHUNK_TYPE_MEMBERSHIP, 0, 0, first_offset, timestamp_ms, epoch, raft_index)
    return _sealed(head, membership)[0]


def is_membership(header: ChunkHeader) -> bool:
    return header.chunk_type == CHUNK_TYPE_MEMBERSHIP


def is_barrier(header: ChunkHeader) -> bool:
    """A new leader's empty entry (stored as a barrier chunk; the Raft core holds no payload)."""
    return header.payload_length == 0


def encode_chunk_with_header(
    records: Sequence[bytes | memoryview],
    first_offset: Offset,
    timestamp_ms: int,
    epoch: int,
    raft_index: int = 0,
    *,
    producer: bytes | None = None,
    filter_section: bytes | None = None,
) -> tuple[bytes, ChunkHeader]:
    """The chunk's bytes and its header (saves the append path a decode)."""
    buffer, header = encode_chunk_buffer(
        records,
        first_offset,
        timestamp_ms,
        epoch,
        raft_index,
        producer=producer,
        filter_section=filter_section,
    )
    return bytes(buffer), header


PREFIX_CACHE_LENGTH_MAX = 16 * 1024
"""Record lengths (bytes) below this have their 4-byte prefix cached (at most ~1 MiB of cache)."""


class _Prefixes(dict[int, bytes]):
    """Record length -> its encoded prefix: a C-level dict lookup per record instead of a
    `struct.pack` call (the encode's main cost for small records)."""

    def __missing__(self, length: int) -> bytes:
        prefix = _RECORD_LENGTH.pack(length)
        if length < PREFIX_CACHE_LENGTH_MAX:
            self[length] = prefix
        return prefix


_PREFIXES = _Prefixes()
_HEADER_SPACE = bytes(HEADER_BYTES)
_HEAD = struct.Struct(">4sI")


def encode_chunk_buffer(
    records: Sequence[bytes | memoryview],
    first_offset: Offset,
    timestamp_ms: int,
    epoch: int,
    raft_index: int = 0,
    *,
    producer: bytes | None = None,
    filter_section: bytes | None = None,
) -> tuple[bytearray, ChunkHeader]:
    """The chunk in one new buffer, built with a single copy of the records: header space,
    length prefixes and records joined at once, then the header packed in place and the CRC
    taken over the buffer (1 MiB of 1 KiB records: 76 us, against 390 us for joining the
    payload and then header + payload)."""
    assert records, "a chunk holds at least one record"
    assert first_offset >= 0 and epoch >= 0 and raft_index >= 0
    # Interleave prefixes and records with slice assignments: no Python-level loop per record.
    parts: list[bytes | memoryview] = [b""] * (2 * len(records) + 1)
    parts[0] = b"".join((_HEADER_SPACE, producer or b"", filter_section or b""))
    flags = (0 if producer is None else FLAG_PRODUCER) | (
        0 if filter_section is None else FLAG_FILTER
    )
    parts[1::2] = map(_PREFIXES.__getitem__, map(len, records))
    parts[2::2] = records
    buffer = bytearray().join(parts)
    payload_length = len(buffer) - HEADER_BYTES
    _AFTER_CRC.pack_into(
        buffer,
        CRC_START,
        VERSION,
        CHUNK_TYPE_RECORDS,
        flags,
        len(records),
        first_offset,
        timestamp_ms,
        epoch,
        raft_index,
        payload_length,
        0,
    )
    with memoryview(buffer) as view:
        crc = crc32c.crc32c(view[CRC_START:])
    _HEAD.pack_into(buffer, 0, MAGIC, crc)
    return buffer, ChunkHeader(
        first_offset,
        len(records),
        timestamp_ms,
        epoch,
        payload_length,
        crc,
        raft_index,
        flags,
    )


def encode_sub_entry_chunk(
    blob: bytes | memoryview,
    first_offset: Offset,
    timestamp_ms: int,
    epoch: int,
    raft_index: int = 0,
    *,
    producer: bytes | None = None,
    filter_section: bytes | None = None,
) -> tuple[bytes, ChunkHeader]:
    """A sub-entry chunk holding `blob` (checked with subentry.parse_header: its header only)
    byte for byte; `producer` and `filter_section` as in encode_chunk."""
    assert first_offset >= 0 and epoch >= 0 and raft_index >= 0
    count = subentry.parse_header(blob).count
    flags = (0 if producer is None else FLAG_PRODUCER) | (
        0 if filter_section is None else FLAG_FILTER
    )
    payload = b"".join((producer or b"", filter_section or b"", blob))
    head = (CHUNK_TYPE_SUB_ENTRY, flags, count, first_offset, timestamp_ms, epoch, raft_index)
    data, crc = _sealed(head, payload)
    header = ChunkHeader(
        first_offset,
        count,
        timestamp_ms,
        epoch,
        len(payload),
        crc,
        raft_index,
        flags,
        CHUNK_TYPE_SUB_ENTRY,
    )
    return data, header


def decode_header(buffer: bytes | memoryview, position: int = 0) -> ChunkHeader:
    """Parse and sanity-check the header at `position` (not the CRC: that needs the payload)."""
    if len(buffer) - position < HEADER_BYTES:
        raise ChunkError(f"short header: {len(buffer) - position} of {HEADER_BYTES} bytes")
    (
        magic,
        crc,
        version,
        chunk_type,
        flags,
        count,
        first_offset,
        timestamp_ms,
        epoch,
        raft_index,
        payload_length,
        reserved,
    ) = _HEADER.unpack_from(buffer, position)
    if magic != MAGIC:
        raise ChunkError(f"bad magic {bytes(magic)!r}")
    if (
        version != VERSION
        or chunk_type not in (CHUNK_TYPE_RECORDS, CHUNK_TYPE_SUB_ENTRY, CHUNK_TYPE_MEMBERSHIP)
        or flags & ~(FLAG_PRODUCER | FLAG_TRACKING | FLAG_FILTER)
        or reserved != 0
    ):
        raise ChunkError(f"unknown chunk version {version} type {chunk_type} flags {flags}")
    if chunk_type == CHUNK_TYPE_SUB_ENTRY:
        if flags & FLAG_TRACKING or count == 0 or payload_length < subentry.HEADER_BYTES:
            raise ChunkError(f"impossible sub-entry chunk: {count} records, flags {flags}")
    elif chunk_type == CHUNK_TYPE_MEMBERSHIP:
        if flags or count or payload_length == 0:
            raise ChunkError(f"impossible membership chunk: {count} records, flags {flags}")
    elif flags & FLAG_TRACKING:
        if flags != FLAG_TRACKING or count or payload_length == 0:
            raise ChunkError(f"impossible tracking chunk: {count} records, flags {flags}")
    elif (
        payload_length < count * RECORD_PREFIX_BYTES
        or (count == 0) != (payload_length == 0)
        or (flags and count == 0)
    ):
        raise ChunkError(f"impossible chunk: {count} records in {payload_length} bytes")
    return ChunkHeader(
        Offset(first_offset),
        count,
        timestamp_ms,
        epoch,
        payload_length,
        crc,
        raft_index,
        flags,
        chunk_type,
    )


def check_crc(buffer: bytes | memoryview, position: int, header: ChunkHeader) -> None:
    """Raise ChunkError unless the chunk at `position` (whole, in `buffer`) matches its CRC."""
    end = position + header.chunk_bytes
    if len(buffer) < end:
        raise ChunkError(f"short chunk: {len(buffer) - position} of {header.chunk_bytes} bytes")
    view = memoryview(buffer)[position + CRC_START : end]
    if crc32c.crc32c(view) != header.crc:
        raise ChunkError(f"CRC mismatch in chunk at offset {header.first_offset}")


def slice_records(
    buffer: bytes | memoryview, position: int, header: ChunkHeader
) -> list[memoryview] | subentry.SubEntryRecords:
    """The records of the chunk at `position` as views into `buffer` (no copy, no decoding);
    a sub-entry chunk's as a `SubEntryRecords` over its sub-entry (header checked, nothing
    decompressed)."""
    if header.chunk_type == CHUNK_TYPE_MEMBERSHIP:
        return []  # a Raft membership entry, no records
    view = memoryview(buffer)
    cursor = position + HEADER_BYTES
    end = cursor + header.payload_length
    if header.flags:
        if header.flags & FLAG_TRACKING:
            return []  # offsets, no records
        cursor = records_start(view, position, header)
    if header.chunk_type == CHUNK_TYPE_SUB_ENTRY:
        blob = view[cursor:end]
        try:
            count = subentry.parse_header(blob).count
        except subentry.SubEntryError as error:
            raise ChunkError(f"sub-entry chunk at offset {header.first_offset}: {error}") from error
        if count != header.record_count:
            raise ChunkError(
                f"sub-entry chunk at offset {header.first_offset} holds {count} messages, "
                f"its header says {header.record_count}"
            )
        return subentry.SubEntryRecords(blob, count)
    # The consumers' read path (RESULTS §26): no bounds test per record. The cursor only
    # grows, so a length that overruns the payload leaves it past `end` (tested once after
    # the loop), and a length prefix read past the buffer's end raises struct.error; the
    # views are only handed out when the lengths add up to the payload exactly.
    unpack = _RECORD_LENGTH.unpack_from
    records: list[memoryview] = []
    append = records.append
    try:
        for _ in range(header.record_count):
            (length,) = unpack(view, cursor)
            start = cursor + RECORD_PREFIX_BYTES
            cursor = start + length
            append(view[start:cursor])
    except struct.error:
        cursor = end + 1
    if cursor > end:
        raise ChunkError(f"chunk at offset {header.first_offset}: record lengths overrun")
    if cursor != end:
        raise ChunkError(f"chunk at offset {header.first_offset}: {end - cursor} stray bytes")
    return records


def decode_chunk(
    buffer: bytes | memoryview, position: int = 0
) -> tuple[ChunkHeader, list[memoryview] | subentry.SubEntryRecords]:
    """Header and records of the whole, CRC-checked chunk at `position`."""
    header = decode_header(buffer, position)
    check_crc(buffer, position, header)
    return header, slice_records(buffer, position, header)


def records_start(buffer: bytes | memoryview, position: int, header: ChunkHeader) -> int:
    """Where the records of the chunk at `position` begin: after its sections."""
    cursor = position + HEADER_BYTES
    if header.flags & FLAG_PRODUCER:
        cursor += producer_section(buffer, position, header)[2]
    if header.flags & FLAG_FILTER:
        cursor += _filter_at(buffer, cursor, position, header)[1]
    return cursor


def chunk_filter(
    buffer: bytes | memoryview, position: int, header: ChunkHeader
) -> filtering.ChunkFilter | None:
    """The filter section of the chunk at `position` (None: it has none)."""
    if not header.flags & FLAG_FILTER:
        return None
    cursor = position + HEADER_BYTES
    if header.flags & FLAG_PRODUCER:
        cursor += producer_section(buffer, position, header)[2]
    return _filter_at(buffer, cursor, position, header)[0]


def _filter_at(
    buffer: bytes | memoryview, cursor: int, position: int, header: ChunkHeader
) -> tuple[filtering.ChunkFilter, int]:
    try:
        return filtering.decode(buffer, cursor, position + HEADER_BYTES + header.payload_length)
    except filtering.FilterSectionError as error:
        raise ChunkError(f"chunk at offset {header.first_offset}: {error}") from error


def producer_section(
    buffer: bytes | bytearray | memoryview, position: int, header: ChunkHeader
) -> tuple[bytes, int, int]:
    """(name, last publishing id, section bytes) of a FLAG_PRODUCER chunk at `position`."""
    assert header.flags & FLAG_PRODUCER
    start = position + HEADER_BYTES
    try:
        return producers.decode_section(buffer, start, start + header.payload_length)
    except producers.ProducerStateError as error:
        raise ChunkError(f"chunk at offset {header.first_offset}: {error}") from error
