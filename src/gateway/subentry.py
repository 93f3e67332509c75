"""The AMQP envelope of a sub-entry (ADR 0017, docs/amqp.md "Sub-entries"): pure, no I/O.

A producer sends a sub-entry (spate.core.subentry's layout) as one message whose body is
exactly one `data` section holding its bytes, with the message annotation
`x-opt-spate-sub-entry` = true. Optional annotation of the envelope: `x-opt-publishing-id`
(ulong: the whole batch's id on a named producer link, ADR 0011). The envelope's other sections
are not stored. The inner messages' own `x-stream-filter-value` annotations, read here as they
are checked, become the stored chunk's Bloom filter (`SubEntry.filter_values`, ADR 0016).

`parse` checks everything before anything is stored: the envelope, the sub-entry header, the
data decompressing to exactly the declared size, the count, and every inner message being a
well-formed AMQP message without delivery annotations. A refusal is a `Refused` with the AMQP
condition (amqp:decode-error for bytes that are not what they claim, amqp:invalid-field for a
well-formed sub-entry Spate refuses) and a description a person can act on.
"""

from __future__ import annotations

from dataclasses import dataclass

from spate.core import filtering, subentry
from spate.gateway import codec, sections
from spate.gateway.errors import DECODE_ERROR, INVALID_FIELD

MARKER_ANNOTATION = "x-opt-spate-sub-entry"
RETIRED_FILTER_VALUES_ANNOTATION = "x-opt-spate-filter-values"
"""Once an envelope's list of filter values; refused now, so that a message's filter value has
one source only: its own `x-stream-filter-value`."""
PUBLISHING_ID_ANNOTATION = "x-opt-publishing-id"
MARKER_BYTES = b"\xa3" + bytes((len(MARKER_ANNOTATION),)) + MARKER_ANNOTATION.encode()
"""The marker key as a sym8: a message without these bytes is no sub-entry (one C-speed `in`
per message on the producer's hot path)."""


AS_IS_PROPERTY = "spate:sub-entries"
"""Receiver link property: true asks for stored sub-entries as they are (one delivery each,
`as_is_message`); the attach reply carries it (true) when the link gets them so."""
_AS_IS_HEAD = codec.encode(
    codec.Described(
        codec.ULong(sections.MESSAGE_ANNOTATIONS), {codec.Symbol(MARKER_ANNOTATION): True}
    )
)


def as_is_message(blob: bytes | memoryview) -> bytes:
    """A stored sub-entry as the message a consumer asking for it receives (before its delivery
    annotations, which name the offset of its first message): the envelope a producer sends,
    without publishing id or filter values."""
    return b"".join((_AS_IS_HEAD, b"\x00\x53\x75\xb0", len(blob).to_bytes(4, "big"), blob))


class Refused(ValueError):
    """A sub-entry envelope the gateway refuses; `condition` is the AMQP error condition."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(frozen=True, slots=True)
class Envelope:
    blob: subentry.SubEntry
    """The sub-entry's bytes (header and data), as the node stores them."""
    count: int
    codec: str
    uncompressed_length: int
    publishing_id: int | None
    messages: list[bytes]
    """The messages, unpacked and checked."""


def parse(stored: bytes) -> Envelope | None:
    """The sub-entry of a message (delivery annotations already cut, `sections.scan_incoming`),
    checked; None when its message annotations hold no `x-opt-spate-sub-entry`."""
    annotations: dict[object, object] = {}
    body: bytes | None = None
    i, n = 0, len(stored)
    try:
        while i < n:
            code = sections.section_code(stored, i)
            end = codec.skip(stored, i)
            if code == sections.MESSAGE_ANNOTATIONS:
                value = codec.decode(stored[i:end])
                if isinstance(value, codec.Described) and isinstance(value.value, dict):
                    annotations = value.value
            elif code == sections.DATA:
                if body is not None:
                    raise Refused(DECODE_ERROR, "a sub-entry message has exactly one data section")
                value = codec.decode(stored[i:end])
                assert isinstance(value, codec.Described)
                if not isinstance(value.value, bytes):
                    raise Refused(DECODE_ERROR, "a sub-entry's data section must hold binary")
                body = value.value
            elif code in (sections.AMQP_SEQUENCE, sections.AMQP_VALUE):
                body = b""  # refused below, once we know it is meant as a sub-entry
            i = end
    except codec.DecodeError as err:
        raise Refused(DECODE_ERROR, f"malformed message: {err}") from err
    marker = annotations.get(MARKER_ANNOTATION)
    if marker is None:
        return None
    if marker is not True:
        raise Refused(INVALID_FIELD, f"'{MARKER_ANNOTATION}' must be the boolean true")
    if not body:
        raise Refused(
            DECODE_ERROR, "a sub-entry message's body is one data section holding the sub-entry"
        )
    publishing_id = annotations.get(PUBLISHING_ID_ANNOTATION)
    if publishing_id is not None and (
        not isinstance(publishing_id, int) or isinstance(publishing_id, bool) or publishing_id < 0
    ):
        raise Refused(INVALID_FIELD, f"'{PUBLISHING_ID_ANNOTATION}' must be a ulong")
    try:
        header = subentry.parse_header(body)
        messages = subentry.unpack(body)
    except (subentry.UnknownCodec, subentry.OverLimit) as err:
        raise Refused(INVALID_FIELD, f"sub-entry refused: {err}") from err
    except subentry.SubEntryError as err:
        raise Refused(DECODE_ERROR, f"corrupt sub-entry: {err}") from err
    if RETIRED_FILTER_VALUES_ANNOTATION in annotations:
        raise Refused(
            INVALID_FIELD,
            f"'{RETIRED_FILTER_VALUES_ANNOTATION}' is not accepted: give each inner message its "
            f"own '{filtering.FILTER_VALUE_ANNOTATION}' annotation",
        )
    for index, message in enumerate(messages):
        _check_message(index, message)
    return Envelope(
        subentry.SubEntry.with_values(body, chunk_values(messages)),
        header.count,
        header.codec_name,
        header.uncompressed_length,
        publishing_id,
        messages,
    )


def chunk_values(messages: list[bytes]) -> tuple[str | None, ...]:
    """The inner messages' distinct filter values, plus None when some message has none (what
    the chunk's Bloom filter needs; a value is at most filtering.VALUE_BYTES_MAX bytes)."""
    values = {filtering.filter_value(m) for m in messages}
    return tuple(sorted(values, key=lambda v: (v is not None, v or "")))


def _check_message(index: int, message: bytes) -> None:
    """An inner message must be what a plain producer could have sent, minus delivery
    annotations (the consumer path splices its own in after the header)."""
    if sections.is_plain(message):
        return
    try:
        incoming = sections.scan_incoming(message)
    except sections.MalformedMessage as err:
        raise Refused(DECODE_ERROR, f"sub-entry message {index} is malformed: {err}") from err
    if incoming.delivery_annotations is not None:
        raise Refused(
            INVALID_FIELD, f"sub-entry message {index} has delivery annotations; none are allowed"
        )
