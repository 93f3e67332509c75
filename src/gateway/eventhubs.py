"""The Event Hubs dialect of the AMQP listener (ADR 0021, docs/event-hubs.md). Pure: no I/O.

Applications written for Azure Event Hubs (`azure-eventhub`, `@azure/event-hubs`) speak AMQP 1.0
with a few conventions of their own. This module maps them onto Spate's model; the driver calls
it only on listeners configured with the dialect (`ListenerConfig.dialects`):

- event hub -> stream; partition id "3" -> partition 3; sequence number -> offset; offset (a
  string) -> the offset in decimal; enqueued time -> the chunk's append time;
- a receiver with an owner level (`com.microsoft:epoch`) in consumer group `<cg>` -> a member
  of Spate consumer group `eventhubs:<cg>` with that epoch (ADR 0015); without one, a plain
  consumer (Event Hubs lets several read a partition);
- a batch transfer (message-format 0x80013700) -> its inner messages, consecutive records;
- `$cbs` put-token (SAS) -> checked against the listener's SAS keys (users file);
- `$management` READ -> the stream's partitions and their offsets.

The full table is in docs/event-hubs.md.

Addresses: `<hub>`, `<hub>/Partitions/<n>`, `<hub>/ConsumerGroups/<cg>/Partitions/<n>`, each
optionally prefixed by `amqps://<host>/` (or `amqp://`, `sb://`); `$cbs`, `$management`.

Frames: the released `azure-eventhub` 5.15.1 (its pure-Python AMQP stack) indexes performative
fields by position without a bounds check (`frame[7]` of a begin, `frame[11]` of a transfer is
its payload), so frames whose trailing null fields are omitted (AMQP 1.0 part 1 §1.4 allows it,
proton does it) crash it. `FramePadder` rewrites the listener's output so that every
performative carries all its fields.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote_plus, urlsplit

from spate.core import groups
from spate.core.errors import InvalidArgument, NotFound
from spate.gateway import codec, sections

DIALECT = "eventhubs"
DIALECTS = (DIALECT,)
BATCH_FORMAT = 0x80013700
"""message-format of an Event Hubs batch: the body's data sections are encoded messages."""
CBS_NODE = "$cbs"
MANAGEMENT_NODE = "$management"
EPOCH_PROPERTY = "com.microsoft:epoch"
GROUP_PREFIX = groups.EVENTHUBS_PREFIX
"""Spate consumer-group names of Event Hubs consumer groups with owner levels (Event Hubs'
default group is `$Default`, and Spate reserves names starting with `$`)."""
SEQUENCE_NUMBER = "x-opt-sequence-number"
OFFSET = "x-opt-offset"
ENQUEUED_TIME = "x-opt-enqueued-time"
PARTITION_KEY = "x-opt-partition-key"
SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_CODE = 0x0000_468C_0000_0004
OFFSET_SPEC_KEY = "rabbitmq:stream-offset-spec"
SAS_TOKEN_TYPE = "servicebus.windows.net:sastoken"
TOKEN_CLOCK_SKEW_S = 300
"""A token is taken until this long after its `se` (Event Hubs allows clock skew too)."""


# Addresses ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HubAddress:
    """An Event Hubs address, in Spate's terms."""

    node: str | None
    """`$cbs` or `$management` (request/response nodes); None for a hub."""
    hub: str = ""
    partition: str | None = None
    consumer_group: str | None = None
    path: str = field(default="", compare=False)
    """The entity path (`hub1/ConsumerGroups/$Default/Partitions/0`): what a token must cover."""


_PATH = re.compile(r"^(?:(?:amqps?|sb)://[^/]*/)?(.*)$", re.IGNORECASE)


def parse_address(address: str | None, *, bare: bool = False) -> HubAddress | None:
    """The Event Hubs form of `address`, or None when it is not one (Spate's own forms:
    `<stream>`, `<stream>/$info`, `$rooms/<room>`, which the caller parses). A bare `<hub>`
    (no `amqps://host/` prefix) is Spate's stream address too: it is a hub only with `bare`
    (the connection is an Event Hubs client's: it put a token on `$cbs`)."""
    if not address:
        return None
    match = _PATH.match(address)
    path = match.group(1) if match else address
    prefixed = path != address
    path = path.strip("/")
    if path in (CBS_NODE, MANAGEMENT_NODE):
        return HubAddress(path, path=path)
    parts = path.split("/")
    if len(parts) == 3 and parts[1].lower() == "partitions":
        return HubAddress(None, parts[0], _partition_id(parts[2], address), path=path)
    if (
        len(parts) == 5
        and parts[1].lower() == "consumergroups"
        and parts[3].lower() == "partitions"
    ):
        if not parts[2]:
            raise NotFound(f"{address!r}: the consumer group is empty")
        return HubAddress(None, parts[0], _partition_id(parts[4], address), parts[2], path=path)
    if len(parts) == 2 and parts[1] == MANAGEMENT_NODE:
        return HubAddress(MANAGEMENT_NODE, parts[0], path=path)
    if (prefixed or bare) and len(parts) == 1 and parts[0] and not parts[0].startswith("$"):
        return HubAddress(None, parts[0], path=path)
    return None


def _partition_id(text: str, address: str) -> str:
    if not text.isdigit() or len(text) > 9:
        raise NotFound(f"{address!r}: partition ids are '0'..'N-1', not {text!r}")
    return str(int(text))


def link_properties(parsed: HubAddress, remote: dict[Any, Any]) -> dict[str, Any]:
    """Spate link properties for an Event Hubs link: the partition, and for a receiver with an
    owner level (`com.microsoft:epoch`) its consumer group and epoch (ADR 0015)."""
    out: dict[str, Any] = {}
    if parsed.partition is not None:
        out["event-streams-partition"] = parsed.partition
    epoch = remote.get(EPOCH_PROPERTY)
    if epoch is None and parsed.consumer_group is not None and parsed.partition is not None:
        # a receiver without owner level: a shared member of the group (reads beside others
        # like it, gives way to one with an owner level; ADR 0021 addendum)
        out["event-streams-consumer-group"] = GROUP_PREFIX + parsed.consumer_group
    if epoch is not None:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgument(f"'{EPOCH_PROPERTY}' must be a non-negative long, not {epoch!r}")
        if parsed.consumer_group is None or parsed.partition is None:
            raise InvalidArgument(
                f"'{EPOCH_PROPERTY}' needs a receiver of one partition of a consumer group "
                "('<hub>/ConsumerGroups/<group>/Partitions/<id>')"
            )
        out["event-streams-consumer-group"] = GROUP_PREFIX + parsed.consumer_group
        out["event-streams-epoch"] = int(epoch)
    return out


# Idempotent publishing ---------------------------------------------------------------------------

PRODUCER_ID = "com.microsoft:producer-id"
PRODUCER_EPOCH = "com.microsoft:producer-epoch"
PRODUCER_SEQUENCE = "com.microsoft:producer-sequence-number"
"""Link properties of an idempotent Event Hubs sender (`com.microsoft:idempotent-producer`);
each event carries the same names as message annotations (its own sequence number)."""
PRODUCER_PREFIX = "eventhubs:"
"""Spate producer names (ADR 0011) of Event Hubs producer groups: `eventhubs:<producer id>`."""


@dataclass(frozen=True, slots=True)
class IdempotentProducer:
    producer_id: int
    epoch: int

    @property
    def name(self) -> str:
        """Its Spate producer name (`spate:producer-name`)."""
        return f"{PRODUCER_PREFIX}{self.producer_id}"

    def answer(self, last_publishing_id: int | None) -> dict[str, Any]:
        """The attach's answer: the producer group id, owner level and last published sequence
        number (-1: none) the SDK continues from. Publishing ids are sequence numbers + 1 (a
        first event's sequence number is 0; Spate's ids start above 0)."""
        last = -1 if last_publishing_id is None else last_publishing_id - 1
        return {
            PRODUCER_ID: self.producer_id,
            PRODUCER_EPOCH: self.epoch,
            PRODUCER_SEQUENCE: last,
        }


def idempotent_producer(
    parsed: HubAddress, remote: dict[Any, Any], new_id: int
) -> IdempotentProducer:
    """The producer of a sender that desires `com.microsoft:idempotent-producer` (the inbound
    guard notes it: proton does not show a link's capabilities), from the
    `com.microsoft:producer-*` properties it sends (absent or null on its first attach).
    `new_id`: the id given to a producer that has none."""
    if parsed.partition is None:
        raise InvalidArgument(
            "idempotent publishing needs a partition id ('<hub>/Partitions/<id>'): Event Hubs "
            "keeps sequence numbers per partition"
        )
    producer_id, epoch = remote.get(PRODUCER_ID), remote.get(PRODUCER_EPOCH)
    for value, what in ((producer_id, PRODUCER_ID), (epoch, PRODUCER_EPOCH)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidArgument(f"'{what}' must be an integer, not {value!r}")
    if producer_id is None or producer_id < 0:
        producer_id = new_id
    return IdempotentProducer(int(producer_id), int(epoch or 0))


def publishing_ids(records: list[bytes]) -> list[int]:
    """Each event's publishing id (its `com.microsoft:producer-sequence-number` annotation +
    1). Raises InvalidArgument when one has none."""
    out = []
    for record in records:
        annotations = sections.find_message_annotations(record) or {}
        sequence = annotations.get(PRODUCER_SEQUENCE)
        if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
            raise InvalidArgument(
                f"an idempotent producer's event needs a non-negative '{PRODUCER_SEQUENCE}' "
                f"message annotation, not {sequence!r}"
            )
        out.append(sequence + 1)
    return out


# Selectors ---------------------------------------------------------------------------------------

_SELECTOR = re.compile(
    r"^\s*amqp\.annotation\.(x-opt-offset|x-opt-sequence-number|x-opt-enqueued-time)"
    r"\s*(>=|>)\s*'([^']*)'\s*$",
    re.IGNORECASE,
)


def start_filters(filters: dict[Any, Any] | None) -> dict[Any, Any] | None:
    """The source filter map with Event Hubs' selector filter (`amqp.annotation.x-opt-offset >
    '12'`, `x-opt-sequence-number`, `x-opt-enqueued-time` in ms; `>=` inclusive) replaced by
    the equivalent `rabbitmq:stream-offset-spec` (spate.gateway.filters); other filters stay.
    An expression of another form refuses the link (InvalidArgument)."""
    if not filters:
        return filters
    out: dict[Any, Any] = {}
    for key, value in filters.items():
        descriptor = value.descriptor if isinstance(value, codec.Described) else None
        if key != SELECTOR_FILTER and descriptor not in (SELECTOR_FILTER, SELECTOR_CODE):
            out[key] = value
            continue
        inner = value.value if isinstance(value, codec.Described) else value
        out[codec.Symbol(OFFSET_SPEC_KEY)] = selector_spec(inner)
    return out


def selector_spec(expression: Any) -> Any:
    """A selector expression -> a simple offset-spec value (an inclusive offset, `first`,
    `next`, or a timestamp: the first message stored at or after it)."""
    if isinstance(expression, bytes):
        expression = expression.decode("utf-8", "replace")
    match = _SELECTOR.match(expression) if isinstance(expression, str) else None
    if match is None:
        raise InvalidArgument(
            f"selector {expression!r}: accepted are amqp.annotation.x-opt-offset, "
            "x-opt-sequence-number or x-opt-enqueued-time, then > or >=, then a quoted value"
        )
    field, operator, value = match.group(1).lower(), match.group(2), match.group(3)
    inclusive = operator == ">="
    if field == OFFSET and value == "@latest":
        return "next"
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"selector {expression!r}: {value!r} is not a number") from None
    if field == ENQUEUED_TIME:
        return codec.Timestamp(max(number if inclusive else number + 1, 0))
    start = number if inclusive else number + 1
    if start <= 0:
        return "first"
    return start


# Deliveries --------------------------------------------------------------------------------------

_LONG = struct.Struct(">Bq")
_STAMP = struct.Struct(">Bq")
_MAP32 = struct.Struct(">BII")


def _sym(text: str) -> bytes:
    raw = text.encode()
    return b"\xa3" + bytes((len(raw),)) + raw


_K_SEQUENCE = _sym(SEQUENCE_NUMBER)
_K_OFFSET = _sym(OFFSET)
_K_TIME = _sym(ENQUEUED_TIME)
_OURS = (SEQUENCE_NUMBER.encode(), OFFSET.encode(), ENQUEUED_TIME.encode())
_MA_HEAD = b"\x00\x53\x72"


def annotate(stored: bytes | memoryview, offset: int, timestamp_ms: int) -> bytes:
    """The stored message with Event Hubs' message annotations added (sequence number = the
    offset, offset = its decimal string, enqueued time = the chunk's time); annotations the
    message has are kept (its `x-opt-partition-key` among them)."""
    raw = bytes(stored)
    digits = b"%d" % offset
    ours = b"".join(
        (
            _K_SEQUENCE,
            _LONG.pack(0x81, offset),
            _K_OFFSET,
            b"\xa1",
            bytes((len(digits),)),
            digits,
            _K_TIME,
            _STAMP.pack(0x83, timestamp_ms),
        )
    )
    if raw.startswith(b"\x00\x53\x70\x45"):  # an empty header (what proton writes)
        at = 4
    elif raw.startswith(b"\x00\x53\x70\xc0"):
        at = 5 + raw[4]
    elif raw.startswith(b"\x00\x53\x70"):
        at = sections.header_end(raw)
    else:
        at = 0
    if not raw.startswith(_MA_HEAD, at):  # the common case: no annotations of its own
        head = _MAP32.pack(0xD1, len(ours) + 4, 6)
        return b"".join((raw[:at], _MA_HEAD, head, ours, raw[at:]))
    end = codec.skip(raw, at)
    kind = raw[at + 3]
    if kind == 0xC1:
        pairs, entries = raw[at + 5], raw[at + 6 : end]
    elif kind == 0xD1:
        pairs, entries = struct.unpack_from(">I", raw, at + 8)[0], raw[at + 12 : end]
    else:
        pairs, entries = 0, b""
    if any(key in entries for key in _OURS):  # a re-sent event: ours replace its own
        old = codec.decode(raw[at:end])
        kept = {
            k: v
            for k, v in (old.value if isinstance(old.value, dict) else {}).items()
            if str(k) not in (SEQUENCE_NUMBER, OFFSET, ENQUEUED_TIME)
        }
        entries = codec.encode(kept)
        entries = entries[9:] if entries[0] == 0xD1 else entries[3:]
        pairs = 2 * len(kept)
    body = ours + entries
    head = _MAP32.pack(0xD1, len(body) + 4, 6 + pairs)
    return b"".join((raw[:at], _MA_HEAD, head, body, raw[end:]))


# Batches -----------------------------------------------------------------------------------------


def split_batch(raw: bytes) -> list[bytes]:
    """The messages of an Event Hubs batch (message-format 0x80013700): each data section of
    the body is one encoded message. Raises sections.MalformedMessage when one is not."""
    incoming = sections.scan_incoming(raw).stored
    out: list[bytes] = []
    at = 0
    while at < len(incoming):
        code = sections.section_code(incoming, at)
        end = codec.skip(incoming, at)
        if code == sections.DATA:
            value = codec.decode(incoming[at:end])
            inner = value.value if isinstance(value, codec.Described) else None
            if not isinstance(inner, bytes):
                raise sections.MalformedMessage("a batch's data section holds no binary")
            sections.scan_incoming(inner)  # each must be a message itself
            out.append(inner)
        elif code in (sections.AMQP_VALUE, sections.AMQP_SEQUENCE):
            raise sections.MalformedMessage("a batch's body must be data sections")
        at = end
    if not out:
        raise sections.MalformedMessage("an empty batch (no data sections)")
    return out


def partition_key(stored: bytes) -> str | None:
    """The `x-opt-partition-key` message annotation (a string), if the message has one."""
    if PARTITION_KEY.encode() not in stored:
        return None
    annotations = sections.find_message_annotations(stored) or {}
    value = annotations.get(PARTITION_KEY)
    return value if isinstance(value, str) else None


# Partition keys ----------------------------------------------------------------------------------

_M32 = 0xFFFF_FFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M32


def _lookup3(data: bytes) -> tuple[int, int]:
    """Bob Jenkins' lookup3 `hashlittle2` with both seeds 0: (c, b), as the Event Hubs service
    computes it (ported from azure-sdk-for-net's `PartitionResolver.ComputeHash`, which says it
    is a direct port of the service's code)."""
    length = len(data)
    a = b = c = (0xDEADBEEF + length) & _M32
    at = 0
    while length - at > 12:
        a = (a + int.from_bytes(data[at : at + 4], "little")) & _M32
        b = (b + int.from_bytes(data[at + 4 : at + 8], "little")) & _M32
        c = (c + int.from_bytes(data[at + 8 : at + 12], "little")) & _M32
        a = ((a - c) & _M32) ^ _rot(c, 4)
        c = (c + b) & _M32
        b = ((b - a) & _M32) ^ _rot(a, 6)
        a = (a + c) & _M32
        c = ((c - b) & _M32) ^ _rot(b, 8)
        b = (b + a) & _M32
        a = ((a - c) & _M32) ^ _rot(c, 16)
        c = (c + b) & _M32
        b = ((b - a) & _M32) ^ _rot(a, 19)
        a = (a + c) & _M32
        c = ((c - b) & _M32) ^ _rot(b, 4)
        b = (b + a) & _M32
        at += 12
    if at == length:
        return c, b
    tail = data[at:] + bytes(12 - (length - at))  # the last 1..12 bytes, zero-padded
    a = (a + int.from_bytes(tail[0:4], "little")) & _M32
    b = (b + int.from_bytes(tail[4:8], "little")) & _M32
    c = (c + int.from_bytes(tail[8:12], "little")) & _M32
    c = ((c ^ b) - _rot(b, 14)) & _M32
    a = ((a ^ c) - _rot(c, 11)) & _M32
    b = ((b ^ a) - _rot(a, 25)) & _M32
    c = ((c ^ b) - _rot(b, 16)) & _M32
    a = ((a ^ c) - _rot(c, 4)) & _M32
    b = ((b ^ a) - _rot(a, 14)) & _M32
    c = ((c ^ b) - _rot(b, 24)) & _M32
    return c, b


def key_hash(key: str) -> int:
    """Event Hubs' hash of a partition key: lookup3 of its UTF-8 bytes, the two halves xored,
    as a signed 16-bit number (azure-sdk-for-net `PartitionResolver.GenerateHashCode`)."""
    first, second = _lookup3(key.encode("utf-8", "surrogatepass"))
    folded = (first ^ second) & 0xFFFF
    return folded - 0x1_0000 if folded >= 0x8000 else folded


@functools.lru_cache(maxsize=4096)
def key_partition(key: str, partitions: int) -> int:
    """The partition Event Hubs puts an event with partition key `key` on, of `partitions`
    (`Math.Abs(hash % count)` in C#: the remainder of the magnitude). Cached: keys repeat
    (tenants, devices), and hashing one costs ~16 µs in pure Python."""
    return abs(key_hash(key)) % partitions


# $management ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionFigures:
    begin: int
    """First retained offset."""
    end: int
    """Next offset to be written."""
    last_time_ms: int


def hub_properties(hub: str, created_ms: int, partitions: int) -> dict[str, Any]:
    return {
        "name": hub,
        "created_at": codec.Timestamp(created_ms),
        "partition_count": partitions,
        "partition_ids": [str(p) for p in range(partitions)],
        "type": codec.Symbol("com.microsoft:eventhub"),
    }


def partition_properties(hub: str, partition: str, figures: PartitionFigures) -> dict[str, Any]:
    empty = figures.end <= figures.begin
    return {
        "name": hub,
        "partition": partition,
        "type": codec.Symbol("com.microsoft:partition"),
        "begin_sequence_number": figures.begin if not empty else figures.end,
        "last_enqueued_sequence_number": figures.end - 1,
        "last_enqueued_offset": str(max(figures.end - 1, -1)),
        "last_enqueued_time_utc": codec.Timestamp(figures.last_time_ms),
        "is_partition_empty": empty,
    }


# SAS tokens --------------------------------------------------------------------------------------


class TokenRefused(Exception):
    """A put-token refused: `status` is the HTTP-like code Event Hubs answers (401)."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


@dataclass(frozen=True, slots=True)
class Grant:
    audience: str
    """The token's resource (`sr`), e.g. `sb://host/hub`."""
    path: str
    """Its path: the hubs it covers are those whose name starts with it ('' = all)."""
    expires_s: int


def check_sas_token(token: str, keys: dict[str, str], now_s: float | None = None) -> Grant:
    """Validate a `SharedAccessSignature sr=...&sig=...&se=...&skn=...` token against the
    listener's keys (name -> key). Raises TokenRefused(401, why)."""
    now = time.time() if now_s is None else now_s
    prefix = "SharedAccessSignature "
    if not isinstance(token, str) or not token.startswith(prefix):
        raise TokenRefused(401, "InvalidSignature: the token is not a SharedAccessSignature")
    fields = {k: v[0] for k, v in parse_qs(token[len(prefix) :], keep_blank_values=True).items()}
    missing = [name for name in ("sr", "sig", "se", "skn") if not fields.get(name)]
    if missing:
        raise TokenRefused(401, f"InvalidSignature: the token has no {', '.join(missing)}")
    key = keys.get(fields["skn"])
    if key is None:
        raise TokenRefused(401, f"InvalidSignature: no shared access key {fields['skn']!r}")
    try:
        expires = int(fields["se"])
    except ValueError:
        raise TokenRefused(401, "InvalidSignature: se is not a number") from None
    signed = f"{quote_plus(fields['sr'])}\n{expires}".encode()
    expected = base64.b64encode(hmac.new(key.encode(), signed, hashlib.sha256).digest())
    if not hmac.compare_digest(expected, fields["sig"].encode()):
        raise TokenRefused(401, "InvalidSignature: the token's signature does not match")
    if expires + TOKEN_CLOCK_SKEW_S < now:
        raise TokenRefused(401, f"ExpiredToken: the token expired at {expires} (now {int(now)})")
    return Grant(fields["sr"], urlsplit(fields["sr"]).path.strip("/"), expires)


def covers(grants: list[Grant], entity: str, now_s: float) -> bool:
    """A grant of the connection, not expired, whose resource is the entity (a hub, or a
    path under it such as `hub1/ConsumerGroups/$Default/Partitions/0`), a path above it, or
    the whole namespace. Compared without case, like Event Hubs' entity names."""
    wanted = entity.strip("/").lower()
    for grant in grants:
        if grant.expires_s + TOKEN_CLOCK_SKEW_S < now_s:
            continue
        scope = grant.path.lower()
        if not scope or wanted == scope or wanted.startswith(scope + "/"):
            return True
    return False


# Frames -----------------------------------------------------------------------------------------

FIELDS = {0x10: 10, 0x11: 8, 0x12: 14, 0x13: 11, 0x14: 11, 0x15: 6, 0x16: 3, 0x17: 1, 0x18: 1}
"""Performative code -> its number of fields (core §2.7): open .. close."""
_HEAD = struct.Struct(">IBBH")


class FramePadder:
    """Rewrites an outgoing AMQP frame stream so every performative lists all its fields
    (trailing nulls explicit). Stateful: a frame cut between two writes waits for its rest."""

    def __init__(self) -> None:
        self._rest = b""
        self.started = False
        """The protocol header went by (it is 8 bytes without a frame head)."""

    def feed(self, data: bytes) -> bytes:
        buf = self._rest + data if self._rest else data
        out = bytearray()
        at, n = 0, len(buf)
        if not self.started:
            if n < 8:
                self._rest = buf
                return b""
            out += buf[:8]
            at = 8
            self.started = True
        unpack, fields = _HEAD.unpack_from, FIELDS
        while n - at >= 8:
            size, doff, kind, _ = unpack(buf, at)
            if n - at < size:
                break
            body = at + 4 * doff
            full = fields.get(buf[body + 2]) if size - 4 * doff >= 4 and kind == 0 else None
            if full is None or buf[body] != 0 or buf[body + 1] != 0x53:
                out += buf[at : at + size]  # a heartbeat, or not a performative we know
            else:
                _pad_into(out, buf, at, size, body=body, full=full)
            at += size
        self._rest = buf[at:]
        return bytes(out)


def _pad_into(out: bytearray, buf: bytes, at: int, size: int, *, body: int, full: int) -> None:
    """One frame, its performative's list holding `full` fields (missing ones null)."""
    list_at = body + 3
    code = buf[list_at]
    if code == 0x45:
        count, items_at, items_end = 0, list_at + 1, list_at + 1
    elif code == 0xC0:
        count, items_at, items_end = buf[list_at + 2], list_at + 3, list_at + 2 + buf[list_at + 1]
    elif code == 0xD0:
        length, count = _COUNTS.unpack_from(buf, list_at + 1)
        items_at, items_end = list_at + 9, list_at + 5 + length
    else:
        count, items_at, items_end = full, 0, 0
    if count >= full:
        out += buf[at : at + size]
        return
    missing = full - count
    items = items_end - items_at + missing
    if items + 1 <= 255:
        grown = size - (items_at - list_at) + 3 + missing
        out += _U32.pack(grown)
        out += buf[at + 4 : list_at]
        out += bytes((0xC0, items + 1, full))
    else:
        grown = size - (items_at - list_at) + 9 + missing
        out += _U32.pack(grown)
        out += buf[at + 4 : list_at]
        out += _LIST32.pack(0xD0, items + 4, full)
    out += buf[items_at:items_end]
    out += _NULLS[:missing]
    out += buf[items_end : at + size]


_U32 = struct.Struct(">I")
_COUNTS = struct.Struct(">II")
_LIST32 = struct.Struct(">BII")
_NULLS = b"\x40" * 16
