"""Sub-entries: several encoded AMQP messages in one stored slot, optionally compressed (ADR 0017).

The layout is RabbitMQ's stream-protocol sub-entry (its PROTOCOL.adoc, "SubEntry"), all
integers big-endian and unsigned:

```
 offset size field                meaning
 ------ ---- -------------------- ---------------------------------------------------------------
      0    1 kind                 bit 7: 1 (a sub-entry; an AMQP message's first byte is 0x00);
                                  bits 6-4: codec (CODECS); bits 3-0: 0 (reserved)
      1    2 record_count         messages in the sub-entry, 1..limits.sub_entry_messages_max
      3    4 uncompressed_length  bytes of `messages` below, <= sub_entry_uncompressed_bytes_max
      7    4 data_length          bytes of `data` that follow (all the rest)
     11    n data                 codec(messages)
messages = (u32 length | encoded AMQP message)*   record_count times, nothing after
```

Codecs (the numbers are RabbitMQ's `Compression` values): 0 none (data is `messages`), 1 gzip
(RFC 1952), 2 snappy (framing format), 3 lz4 (frame format), 4 zstd (frame). All four come from
one package, cramjam (Rust bindings, wheels for every platform, no system libraries); this is
the only module that imports it.

Who does what: the producer (spate.client.core.encode_sub_entry) builds it; the gateway
(spate.gateway.subentry) checks it once on publish with `unpack`, which decompresses into a
buffer of the declared size and so cannot be made to allocate more; the node checks the header
only (`parse_header`) and stores the bytes untouched in a chunk of their own; readers see the
messages through `SubEntryRecords`, which unpacks on first use.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import cramjam
from spate.core import limits

HEADER = struct.Struct(">BHII")
HEADER_BYTES = HEADER.size
KIND_BIT = 0x80
CODEC_SHIFT = 4
CODECS: dict[str, int] = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CODEC_NAMES: dict[int, str] = {number: name for name, number in CODECS.items()}
_LENGTH = struct.Struct(">I")
_MODULES = {1: cramjam.gzip, 2: cramjam.snappy, 3: cramjam.lz4, 4: cramjam.zstd}
assert HEADER_BYTES == 11


class SubEntryError(ValueError):
    """Bytes that are not a valid sub-entry; the message says what is wrong, for a person."""


class UnknownCodec(SubEntryError):
    """A codec number this broker does not know (`CODECS`)."""


class OverLimit(SubEntryError):
    """A well-formed sub-entry over sub_entry_messages_max or sub_entry_uncompressed_bytes_max."""


@dataclass(frozen=True, slots=True)
class SubEntryHeader:
    codec: int
    count: int
    uncompressed_length: int
    data_length: int

    @property
    def codec_name(self) -> str:
        return CODEC_NAMES[self.codec]


class SubEntry(bytes):
    """A sub-entry's bytes (header and data), marked as such for `Partition.append`: an append
    is either plain records or exactly one SubEntry, which becomes one sub-entry chunk.

    `filter_values` are its messages' filter values for the chunk's Bloom filter (ADR 0016):
    the distinct values, plus None when some message has none; the gateway reads them from the
    inner messages as it checks them, and they travel beside the bytes (wire APPEND), so the
    node never decompresses. None: not known, and the chunk gets no filter section (every
    filtered read then reads it)."""

    filter_values: tuple[str | None, ...] | None = None

    @classmethod
    def with_values(cls, blob: bytes, values: tuple[str | None, ...] | None) -> SubEntry:
        entry = cls(blob)
        entry.filter_values = values
        return entry


def parse_header(blob: bytes | memoryview) -> SubEntryHeader:
    """The header, checked against the limits and the blob's length (no decompression)."""
    if len(blob) < HEADER_BYTES:
        raise SubEntryError(f"a sub-entry needs an {HEADER_BYTES}-byte header; got {len(blob)}")
    kind, count, uncompressed, data_length = HEADER.unpack_from(blob, 0)
    if not kind & KIND_BIT or kind & 0x0F:
        raise SubEntryError(f"first byte 0x{kind:02x} is not a sub-entry's (bit 7 set, 3-0 clear)")
    codec = (kind >> CODEC_SHIFT) & 0x07
    if codec not in CODEC_NAMES:
        raise UnknownCodec(
            f"unknown sub-entry codec {codec}; known: "
            + ", ".join(f"{n} {name}" for n, name in CODEC_NAMES.items())
        )
    if count == 0:
        raise SubEntryError("a sub-entry holds at least one message; it says 0")
    if count > limits.sub_entry_messages_max:
        raise OverLimit(
            f"a sub-entry holds at most {limits.sub_entry_messages_max} messages "
            f"(limits.sub_entry_messages_max); it says {count}"
        )
    if data_length != len(blob) - HEADER_BYTES:
        raise SubEntryError(
            f"the header says {data_length} data bytes; {len(blob) - HEADER_BYTES} follow it"
        )
    if uncompressed > limits.sub_entry_uncompressed_bytes_max:
        raise OverLimit(
            f"{uncompressed} uncompressed bytes is over the limit of "
            f"{limits.sub_entry_uncompressed_bytes_max} (limits.sub_entry_uncompressed_bytes_max)"
        )
    if uncompressed < count * (_LENGTH.size + 1):
        raise SubEntryError(f"{uncompressed} bytes cannot hold {count} non-empty messages")
    if codec == 0 and uncompressed != data_length:
        raise SubEntryError(
            f"codec none: uncompressed length {uncompressed} must equal data length {data_length}"
        )
    return SubEntryHeader(codec, count, uncompressed, data_length)


def codec_number(name: str) -> int:
    number = CODECS.get(name)
    if number is None:
        raise UnknownCodec(f"unknown codec {name!r}; known: {', '.join(CODECS)}")
    return number


def encode(messages: Sequence[bytes | memoryview], codec: str = "none") -> SubEntry:
    """The sub-entry holding the encoded AMQP messages, compressed with `codec`."""
    number = codec_number(codec)
    if not 0 < len(messages) <= limits.sub_entry_messages_max:
        raise SubEntryError(f"a sub-entry holds 1..{limits.sub_entry_messages_max} messages")
    parts: list[bytes | memoryview] = []
    for message in messages:
        if not message:
            raise SubEntryError("an empty message cannot go in a sub-entry")
        parts.append(_LENGTH.pack(len(message)))
        parts.append(message)
    plain = b"".join(parts)
    if len(plain) > limits.sub_entry_uncompressed_bytes_max:
        raise SubEntryError(
            f"{len(plain)} bytes of messages is over the sub-entry limit of "
            f"{limits.sub_entry_uncompressed_bytes_max}"
        )
    data = plain if number == 0 else bytes(_MODULES[number].compress(plain))
    head = HEADER.pack(KIND_BIT | number << CODEC_SHIFT, len(messages), len(plain), len(data))
    return SubEntry(head + data)


def unpack(blob: bytes | memoryview) -> list[bytes]:
    """The messages of a sub-entry, checked: the header (`parse_header`), the data decompresses
    to exactly `uncompressed_length` bytes (never more is allocated), which split into exactly
    `record_count` non-empty messages of at most limits.message_bytes_max each."""
    header = parse_header(blob)
    data = memoryview(blob)[HEADER_BYTES:]
    if header.codec == 0:
        plain: bytes | bytearray | memoryview = data
    else:
        out = bytearray(header.uncompressed_length + 1)  # one spare byte to see an overrun
        try:
            got = _MODULES[header.codec].decompress_into(bytes(data), out)
        except cramjam.DecompressionError as error:
            raise SubEntryError(
                f"{header.codec_name} data does not decompress to the "
                f"{header.uncompressed_length} bytes the header says ({error})"
            ) from error
        if got != header.uncompressed_length:
            raise SubEntryError(
                f"{header.codec_name} data decompresses to {got} bytes; the header says "
                f"{header.uncompressed_length}"
            )
        plain = memoryview(out)[:got]
    return _split(plain, header.count)


def _split(plain: bytes | bytearray | memoryview, count: int) -> list[bytes]:
    messages: list[bytes] = []
    at, end = 0, len(plain)
    unpack_length = _LENGTH.unpack_from
    size_max = limits.message_bytes_max
    for i in range(count):
        if at + _LENGTH.size > end:
            raise SubEntryError(f"the messages end after {i} of {count}")
        (length,) = unpack_length(plain, at)
        at += _LENGTH.size
        if not 0 < length <= size_max or at + length > end:
            raise SubEntryError(
                f"message {i} says {length} bytes: empty, over {size_max} or past the end"
            )
        messages.append(bytes(plain[at : at + length]))
        at += length
    if at != end:
        raise SubEntryError(f"{end - at} bytes after the {count} messages")
    return messages


class SubEntryRecords(Sequence[bytes]):
    """A stored sub-entry seen as its messages (a `ChunkView.records`): the length comes from
    the header, the messages from `unpack` on first use (a consumer that wants the sub-entry as
    is reads `blob` and never pays for it). A stored sub-entry was checked on publish, so a
    failure here is damage: `SubEntryError` propagates to the reader."""

    __slots__ = ("_messages", "blob", "size")

    def __init__(self, blob: bytes | memoryview, count: int) -> None:
        self.blob = blob
        self.size = count
        self._messages: list[bytes] | None = None

    def messages(self) -> list[bytes]:
        if self._messages is None:
            self._messages = unpack(self.blob)
            assert len(self._messages) == self.size
        return self._messages

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        return self.messages()[index]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.messages())

    def __repr__(self) -> str:
        return f"SubEntryRecords({self.size} messages, {len(self.blob)} bytes)"


def stored_bytes(records: Sequence[bytes | memoryview]) -> int:
    """Bytes the records take as stored (a sub-entry's compressed size: never unpacks)."""
    if isinstance(records, SubEntryRecords):
        return len(records.blob)
    return sum(map(len, records))
