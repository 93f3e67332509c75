"""Build and read AMQP messages section by section, without proton: the bulk paths' codec
(the Spark connector reads and writes millions of rows through it, spate.spark).

Reading (`read_parts`): a delivered message is `header? delivery-annotations?
message-annotations? properties? application-properties? body footer?` (002 §3.2). Only the
sections asked for are decoded; the others are stepped over by their size (one step per
section). The body is returned as bytes:

    data sections            their bytes, concatenated (what a producer's bytes body is)
    amqp-value string/binary its UTF-8 / its bytes
    anything else            the body sections' AMQP encoding, byte for byte (nothing lost)

Writing (`MessageParts`): a body (one data section) with optional message annotations,
properties and application properties; `envelope(publishing_id)` is what a producer transfers,
the publishing id (ADR 0011) merged into the message annotations.

Properties (002 §3.2.4) are exchanged as a dict of their field names (`message-id`, `subject`,
...) to text: ids, strings and symbols as they are, binary as UTF-8 (undecodable bytes
replaced), timestamps as milliseconds since the epoch, group-sequence as its number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spate.core.superstreams import GROUP_KEY_ANNOTATION
from spate.gateway import codec as amqp
from spate.gateway import sections

PUBLISHING_ID_ANNOTATION = "x-opt-publishing-id"
PROPERTY_FIELDS = (
    "message-id",
    "user-id",
    "to",
    "subject",
    "reply-to",
    "correlation-id",
    "content-type",
    "content-encoding",
    "absolute-expiry-time",
    "creation-time",
    "group-id",
    "group-sequence",
    "reply-to-group-id",
)
"""The fields of the properties section, in their list order (002 §3.2.4)."""
_SYMBOL_FIELDS = frozenset({"content-type", "content-encoding"})
_TIMESTAMP_FIELDS = frozenset({"absolute-expiry-time", "creation-time"})
_INT_FIELDS = frozenset({"group-sequence"})
_BINARY_FIELDS = frozenset({"user-id"})
_DATA = b"\x00\x53\x75"
_AMQP_VALUE = b"\x00\x53\x77"


class MessageDamaged(ValueError):
    """The delivered bytes are not a well-formed AMQP message."""


@dataclass(frozen=True, slots=True)
class Parts:
    """What `read_parts` found; a section not asked for, or absent, is None."""

    body: bytes | None
    group_key: bytes | None
    """The `event-streams-group-key` message annotation, as UTF-8 (text as it is)."""
    annotations: dict[str, str] | None
    properties: dict[str, str] | None
    application_properties: dict[str, str] | None


def _text(value: Any) -> str | None:
    """A property or annotation value as text (None stays None)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, amqp.Described):
        return _text(value.value)
    return str(value)


def read_parts(
    raw: bytes,
    *,
    body: bool = True,
    annotations: bool = False,
    properties: bool = False,
    application_properties: bool = False,
) -> Parts:
    """Decode the sections asked for (`annotations` also gives the group key)."""
    n = len(raw)
    i = 0
    found_body: bytes | None = None
    chunks: list[bytes] = []
    body_start = -1
    key: bytes | None = None
    ma: dict[str, str] | None = None
    props: dict[str, str] | None = None
    app: dict[str, str] | None = None
    steps = 0
    try:
        while i < n:
            steps += 1
            if steps > sections.SECTIONS_MAX:
                raise MessageDamaged(f"more than {sections.SECTIONS_MAX} sections")
            code = sections.section_code(raw, i)
            if code is None:
                raise MessageDamaged(f"byte {i}: expected a described message section")
            end = amqp.skip(raw, i)
            if code == sections.DATA and body:
                if raw[i : i + 3] == _DATA and raw[i + 3] == 0xA0:
                    chunks.append(raw[i + 5 : end])
                elif raw[i : i + 3] == _DATA and raw[i + 3] == 0xB0:
                    chunks.append(raw[i + 8 : end])
                else:
                    chunks.append(amqp.decode(raw[i:end]).value)
            elif code in (sections.AMQP_VALUE, sections.AMQP_SEQUENCE) and body:
                if body_start < 0:
                    body_start = i
                if code == sections.AMQP_VALUE:
                    value = amqp.decode(raw[i:end]).value
                    if isinstance(value, bytes):
                        found_body = value
                    elif isinstance(value, str) and not isinstance(value, amqp.Symbol):
                        found_body = value.encode()
            elif code == sections.MESSAGE_ANNOTATIONS and annotations:
                decoded = amqp.decode(raw[i:end]).value
                if isinstance(decoded, dict):
                    ma = {str(k): _text(v) or "" for k, v in decoded.items()}
                    value = decoded.get(GROUP_KEY_ANNOTATION)
                    if value is not None:
                        key = value if isinstance(value, bytes) else (_text(value) or "").encode()
            elif code == sections.PROPERTIES and properties:
                fields = amqp.decode(raw[i:end]).value
                if isinstance(fields, list):
                    props = {
                        name: text
                        for name, value in zip(PROPERTY_FIELDS, fields, strict=False)
                        if (text := _text(value)) is not None
                    }
            elif code == sections.APPLICATION_PROPERTIES and application_properties:
                decoded = amqp.decode(raw[i:end]).value
                if isinstance(decoded, dict):
                    app = {str(k): _text(v) or "" for k, v in decoded.items()}
            elif code == sections.FOOTER and body_start >= 0 and found_body is None:
                found_body = raw[body_start:i]
                body_start = -2
            i = end
    except amqp.DecodeError as error:
        raise MessageDamaged(str(error)) from error
    if chunks:
        found_body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    elif body_start >= 0 and found_body is None:
        found_body = raw[body_start:]
    if annotations and ma is None:
        ma = {}
    return Parts(found_body, key, ma, props, app)


def _property_value(name: str, text: str) -> Any:
    if name in _SYMBOL_FIELDS:
        return amqp.Symbol(text)
    if name in _TIMESTAMP_FIELDS:
        return amqp.Timestamp(int(text))
    if name in _INT_FIELDS:
        return int(text)
    if name in _BINARY_FIELDS:
        return text.encode()
    return text


@dataclass(frozen=True, slots=True)
class MessageParts:
    """A message to publish: a body (one data section), an optional group key (the
    `event-streams-group-key` annotation: the partition of a partition-agnostic link, 000
    §4.6.7), properties by field name and application properties (text values)."""

    body: bytes
    group_key: str | None = None
    properties: dict[str, str] | None = None
    application_properties: dict[str, str] | None = None

    def envelope(self, publishing_id: int | None = None) -> bytes:
        if publishing_id is None and not self.properties and not self.application_properties:
            return encode_plain(self.body, self.group_key)
        out = bytearray()
        annotations: dict[Any, Any] = {}
        if self.group_key is not None:
            annotations[amqp.Symbol(GROUP_KEY_ANNOTATION)] = self.group_key
        if publishing_id is not None:
            annotations[amqp.Symbol(PUBLISHING_ID_ANNOTATION)] = amqp.ULong(publishing_id)
        if annotations:
            out += amqp.encode(amqp.Described(amqp.ULong(0x72), annotations))
        if self.properties:
            unknown = set(self.properties) - set(PROPERTY_FIELDS)
            if unknown:
                raise ValueError(
                    f"unknown message properties {sorted(unknown)}: the properties section "
                    f"has {', '.join(PROPERTY_FIELDS)}"
                )
            fields = [
                None if (t := self.properties.get(name)) is None else _property_value(name, t)
                for name in PROPERTY_FIELDS
            ]
            while fields and fields[-1] is None:
                fields.pop()
            out += amqp.encode(amqp.Described(amqp.ULong(0x73), fields))
        if self.application_properties:
            out += amqp.encode(amqp.Described(amqp.ULong(0x74), dict(self.application_properties)))
        out += amqp.encode(amqp.Described(amqp.ULong(0x75), self.body))
        return bytes(out)


_KEY_HEAD = b"\xa3" + bytes((len(GROUP_KEY_ANNOTATION),)) + GROUP_KEY_ANNOTATION.encode()
_MA = b"\x00\x53\x72"


def encode_plain(body: bytes, group_key: str | None = None) -> bytes:
    """`MessageParts(body, group_key).envelope()` without the generic encoder (the bulk path:
    ~1 µs instead of ~30): a data section, after the group key's message annotations when
    there is a key. Byte for byte what `envelope` builds (tests/client/test_messages.py)."""
    data = (
        _DATA + b"\xa0" + bytes((len(body),)) + body
        if len(body) < 256
        else _DATA + b"\xb0" + len(body).to_bytes(4, "big") + body
    )
    if group_key is None:
        return data
    key = group_key.encode()
    if len(key) < 256:
        value = b"\xa1" + bytes((len(key),)) + key
    else:
        value = b"\xb1" + len(key).to_bytes(4, "big") + key
    size = 1 + len(_KEY_HEAD) + len(value)  # count byte + the pair
    if size < 256:
        head = _MA + b"\xc1" + bytes((size, 2))
    else:
        head = _MA + b"\xd1" + (size + 3).to_bytes(4, "big") + (2).to_bytes(4, "big")
    return head + _KEY_HEAD + value + data


_DA_MAP32 = b"\x00\x53\x71\xd1"
_DATA8 = _DATA + b"\xa0"


def _plain_at(raw: bytes) -> int:
    """Where the message a Spate node delivered starts: after its delivery annotations (a
    map32 section, skipped by its size) when it begins with them."""
    return 8 + int.from_bytes(raw[4:8], "big") if raw.startswith(_DA_MAP32) else 0


def read_bodies(raws: list[bytes]) -> list[bytes | None]:
    """`read_parts(raw).body` of each message, the bulk path: the layout a Spate node delivers
    a plain producer's message in — delivery annotations (a map32) or none, then one short
    data section — is sliced at once (~0.3 µs); any other layout goes through `read_parts`."""
    out: list[bytes | None] = []
    append = out.append
    for raw in raws:
        at = _plain_at(raw)
        size = len(raw) - at - 5
        if 0 <= size < 256 and raw.startswith(_DATA8, at) and raw[at + 4] == size:
            append(raw[at + 5 :])
        else:
            append(read_parts(raw).body)
    return out


_KEYED = _MA + b"\xc1"
_KEY_VALUE_AT = 6 + len(_KEY_HEAD)


def read_columns(
    raws: list[bytes], *, properties: bool, application_properties: bool
) -> tuple[list[bytes | None], list[bytes | None], list[Any], list[Any]]:
    """(bodies, group keys, properties, application properties) of each message, as
    `read_parts(raw, annotations=True, ...)` gives them, the bulk path: what `encode_plain`
    builds (a data section, after the group key's annotations or not) is sliced at once; any
    other layout goes through `read_parts`. A column not asked for is all None."""
    bodies: list[bytes | None] = []
    keys: list[bytes | None] = []
    props: list[Any] = []
    apps: list[Any] = []
    for raw in raws:
        at = _plain_at(raw)
        key = None
        if raw.startswith(_KEYED, at) and raw[at + 5] == 2 and raw.startswith(_KEY_HEAD, at + 6):
            end = at + 5 + raw[at + 4]
            value_at = at + _KEY_VALUE_AT
            if raw[value_at] == 0xA1 and value_at + 2 + raw[value_at + 1] == end:
                key = raw[value_at + 2 : end]
                at = end
        size = len(raw) - at - 5
        if 0 <= size < 256 and raw.startswith(_DATA8, at) and raw[at + 4] == size:
            bodies.append(raw[at + 5 :])
            keys.append(key)
            props.append(None)
            apps.append(None)
            continue
        parts = read_parts(
            raw,
            annotations=True,
            properties=properties,
            application_properties=application_properties,
        )
        bodies.append(parts.body)
        keys.append(parts.group_key)
        props.append(parts.properties)
        apps.append(parts.application_properties)
    return bodies, keys, props, apps
