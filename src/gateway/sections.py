"""Raw message section scanner: the only code that looks inside message bytes on the hot path.

A message on the wire is a sequence of described sections (002 §3.2), in this order:

    header? delivery-annotations? message-annotations? properties? application-properties?
    body (data* | amqp-sequence* | amqp-value) footer?

Each section is `00 <descriptor> <value>`; the descriptor is a ulong (`53 70` smallulong or
`80 <8 bytes>`) or its symbolic name (`a3 <len> amqp:header:list`). Compound and variable values
carry their size, so walking the top level costs one step per section, never per field.

Ingress (`scan_incoming`): check that the bytes are a well-formed section sequence, and cut out
the delivery-annotations section, which is hop-by-hop (002 §3.2.2): stored = header + everything
after the DA, byte for byte. Egress (`splice_delivery_annotations`): stored bytes with our own DA
section inserted right after the header (or at the front when there is no header).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from spate.gateway import codec

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_SYMBOLIC = {
    b"amqp:header:list": HEADER,
    b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES,
    b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": AMQP_SEQUENCE,
    b"amqp:amqp-value:*": AMQP_VALUE,
    b"amqp:footer:map": FOOTER,
}
_U64 = struct.Struct(">Q")
_BODY = (DATA, AMQP_SEQUENCE, AMQP_VALUE)
SECTIONS_MAX = 64
"""Most top-level sections a message may have (a body of many data sections counts each)."""


class MalformedMessage(ValueError):
    """The transfer's payload is not a sequence of AMQP message sections."""


@dataclass(frozen=True, slots=True)
class Incoming:
    stored: bytes
    """What the log keeps: the message without its delivery-annotations section."""
    delivery_annotations: bytes | None
    """The raw DA section that was cut out (descriptor included), if there was one."""


def section_code(b: bytes | memoryview, i: int) -> int | None:
    """The section code of the described value at b[i], or None if it is not a section."""
    if len(b) - i < 3 or b[i] != 0x00:
        return None
    d = b[i + 1]
    if d == 0x53:
        code = b[i + 2]
    elif d == 0x80:
        if len(b) - i < 10:
            return None
        code = _U64.unpack_from(b, i + 2)[0]
    elif d == 0xA3:
        size = b[i + 2]
        code = _SYMBOLIC.get(bytes(b[i + 3 : i + 3 + size]), -1)
    else:
        return None
    return code if HEADER <= code <= FOOTER else None


def scan_incoming(raw: bytes) -> Incoming:
    """Validate the top-level section sequence and cut out delivery annotations."""
    n = len(raw)
    if n == 0:
        raise MalformedMessage("empty message: a message needs at least a body section")
    i = 0
    last = 0
    header_end = 0
    da: tuple[int, int] | None = None
    bodies = 0
    count = 0
    while i < n:
        count += 1
        if count > SECTIONS_MAX:
            raise MalformedMessage(f"more than {SECTIONS_MAX} sections")
        code = section_code(raw, i)
        if code is None:
            raise MalformedMessage(f"byte {i}: expected a described message section")
        if code < last or (code == last and code not in (DATA, AMQP_SEQUENCE)):
            raise MalformedMessage(f"byte {i}: section 0x{code:02x} out of order")
        if code in _BODY:
            if bodies and code != last:
                raise MalformedMessage(f"byte {i}: a message has one kind of body")
            bodies += 1
        elif code == FOOTER and not bodies:
            raise MalformedMessage(f"byte {i}: footer before any body section")
        try:
            end = codec.skip(raw, i)
        except codec.DecodeError as err:
            raise MalformedMessage(str(err)) from err
        if code == HEADER:
            header_end = end
        elif code == DELIVERY_ANNOTATIONS:
            da = (i, end)
        last = code
        i = end
    if not bodies:
        raise MalformedMessage("no body section (data, amqp-sequence or amqp-value)")
    if da is None:
        return Incoming(raw, None)
    start, end = da
    assert start == header_end, (start, header_end)
    return Incoming(raw[:start] + raw[end:], raw[start:end])


def delivery_annotations_map(section: bytes) -> dict[Any, Any]:
    """Decode a DA section cut out by `scan_incoming` (only done when one is present)."""
    try:
        value = codec.decode(section)
    except codec.DecodeError as err:
        raise MalformedMessage(f"delivery annotations: {err}") from err
    if not isinstance(value, codec.Described) or not isinstance(value.value, dict):
        raise MalformedMessage("delivery annotations section is not a map")
    return value.value


def header_end(stored: bytes | memoryview) -> int:
    """Length of the header section at the front of stored bytes (0 when there is none)."""
    if section_code(stored, 0) == HEADER:
        return codec.skip(stored, 0)
    return 0


def splice_delivery_annotations(stored: bytes | memoryview, da_section: bytes) -> bytes:
    """Stored message with `da_section` inserted after its header (002 §3.2 section order)."""
    cut = header_end(stored)
    if cut:
        return bytes(stored[:cut]) + da_section + bytes(stored[cut:])
    return da_section + bytes(stored)


def find_message_annotations(stored: bytes | memoryview) -> dict[Any, Any] | None:
    """Decode the message-annotations section if there is one (not on the hot path)."""
    i = header_end(stored)
    n = len(stored)
    while i < n:
        code = section_code(stored, i)
        if code is None or code > MESSAGE_ANNOTATIONS:
            return None
        end = codec.skip(stored, i)
        if code == MESSAGE_ANNOTATIONS:
            value = codec.decode(stored[i:end])
            assert isinstance(value, codec.Described)
            return value.value if isinstance(value.value, dict) else None
        i = end
    return None


# Outgoing delivery annotations (000 §5.1, §4.6.4), pre-encoded keys.
def _sym8(text: str) -> bytes:
    raw = text.encode("ascii")
    assert len(raw) < 256
    return b"\xa3" + bytes((len(raw),)) + raw


_K_OFFSET = _sym8("event-streams-offset")
_K_TIMESTAMP = _sym8("event-streams-timestamp")
_K_SOURCE = _sym8("event-streams-source-partition")
_I64 = struct.Struct(">q")
_MAP32_HEAD = struct.Struct(">II")
_DA_DESCRIPTOR = b"\x00\x53\x71"


def encode_delivery_annotations(
    offset_symbol: str, timestamp_ms: int, source_partition: str | None = None
) -> bytes:
    """The DA section every consumer delivery carries: offset (symbol), timestamp (AMQP
    timestamp, ms) and, on partitioned streams, the source partition (symbol)."""
    body = _K_OFFSET + _sym8(offset_symbol) + _K_TIMESTAMP + b"\x83" + _I64.pack(timestamp_ms)
    count = 4
    if source_partition is not None:
        body += _K_SOURCE + _sym8(source_partition)
        count = 6
    return _DA_DESCRIPTOR + b"\xd1" + _MAP32_HEAD.pack(len(body) + 4, count) + body
