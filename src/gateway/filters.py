"""Source filters of a consumer attach -> where the consumer starts. Pure: no I/O, no proton.

A consumer's start is a set of OffsetSpecs; it starts at the largest offset any of them resolves
to (the filters are ANDed: 000 §5.2.1 "true if all annotations match"). No filter of ours means
`next` (000 §3.2). Accepted forms (also in src/gateway/README.md):

* `event-streams-delivery-annotations` filter, descriptor ulong 0x200 or symbol
  `amqp:event-streams-delivery-annotations-filter` (000 §5.2.1), value a map:
  - `event-streams-offset: '<offset symbol>'` -> offsets strictly greater;
    `'@earliest'` -> everything retained; `'@latest'` -> only new messages;
  - `event-streams-timestamp: <timestamp or integer ms>` -> messages stored strictly later;
  - both -> both must hold; empty map -> everything retained.
  The same descriptor also takes a simple value (below) instead of a map.
* `event-streams-sql` filter, descriptor ulong 0x201 or symbol `amqp:event-streams-sql-filter`
  (000 §5.2.2), a string: `TRUE`, or comparisons `<field> > <const>` / `<field> >= <const>`
  joined by `AND`, where field is `d.event-streams-offset` / `delivery_annotations.…` (constant a
  quoted offset symbol, `'@earliest'` or `'@latest'`) or `d.event-streams-timestamp` (constant an
  integer, milliseconds since the epoch, like the timestamp annotation).
* `rabbitmq:stream-offset-spec` (the filter key or descriptor RabbitMQ's AMQP 1.0 clients send)
  and the simple value of 0x200: `first` | `last` | `next` (string or symbol), an integer N >= 0
  (absolute offset, inclusive), a negative integer -N (N messages before the end), an AMQP
  timestamp (first message stored at or after it).

Filters whose descriptor is none of these are not ours: ignored and not echoed (AMQP 3.5.1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from spate.core.backend import OffsetSpec
from spate.core.errors import InvalidArgument
from spate.core.ids import offset_from_symbol
from spate.gateway.codec import Described, Timestamp

DA_FILTER_CODE = 0x0000_0000_0000_0200
SQL_FILTER_CODE = 0x0000_0000_0000_0201
DA_FILTER_NAME = "amqp:event-streams-delivery-annotations-filter"
SQL_FILTER_NAME = "amqp:event-streams-sql-filter"
RABBITMQ_OFFSET_SPEC = "rabbitmq:stream-offset-spec"
OFFSET_KEY = "event-streams-offset"
TIMESTAMP_KEY = "event-streams-timestamp"
EARLIEST = "@earliest"
LATEST = "@latest"
SQL_CHARS_MAX = 1024
"""Longest SQL filter text accepted; the grammar subset never needs more."""

ACCEPTED_FORMS = (
    "accepted: @0x200/amqp:event-streams-delivery-annotations-filter with a map "
    "{event-streams-offset: '<offset>'|'@earliest'|'@latest', event-streams-timestamp: <ms>} or a "
    "simple value; @0x201/amqp:event-streams-sql-filter with "
    "\"d.event-streams-offset > '<offset>'\" (>, >=, AND, TRUE, d.event-streams-timestamp > <ms>); "
    "rabbitmq:stream-offset-spec with a "
    "simple value. Simple values: first | last | next | offset N >= 0 | -N (N before the end) | "
    "timestamp"
)


@dataclass(frozen=True, slots=True)
class StartSelection:
    """Where a consumer starts: the largest offset any spec resolves to."""

    specs: tuple[OffsetSpec, ...]
    accepted_keys: tuple[Any, ...]
    """The filter-map keys in force: echoed in the attach answer, in order of appearance."""


def _refuse(what: str) -> InvalidArgument:
    return InvalidArgument(f"{what}; {ACCEPTED_FORMS}")


def parse_filters(filters: dict[Any, Any] | None) -> StartSelection:
    """Parse a decoded source filter map. Raises InvalidArgument naming the bad filter."""
    specs: list[OffsetSpec] = []
    keys: list[Any] = []
    for key, value in (filters or {}).items():
        kind = _kind(key, value)
        if kind is None:
            continue
        inner = value.value if isinstance(value, Described) else value
        if kind == "da":
            if isinstance(inner, dict):
                specs += _da_map(key, inner)
            else:
                specs.append(simple_spec(key, inner))
        elif kind == "sql":
            if not isinstance(inner, str):
                raise _refuse(f"filter {key!s}: the SQL filter value must be a string")
            specs += parse_sql(inner)
        else:
            specs.append(simple_spec(key, inner))
        keys.append(key)
    if not specs:
        return StartSelection((OffsetSpec.next(),), ())
    return StartSelection(tuple(specs), tuple(keys))


def _kind(key: Any, value: Any) -> str | None:
    if isinstance(value, Described):
        d = value.descriptor
        if isinstance(d, int) and not isinstance(d, bool):
            return {DA_FILTER_CODE: "da", SQL_FILTER_CODE: "sql"}.get(d)
        if isinstance(d, str):
            return {
                DA_FILTER_NAME: "da",
                SQL_FILTER_NAME: "sql",
                RABBITMQ_OFFSET_SPEC: "simple",
            }.get(d)
        return None
    if key == RABBITMQ_OFFSET_SPEC:
        return "simple"
    return None


def simple_spec(key: Any, value: Any) -> OffsetSpec:
    """first | last | next | N (absolute, inclusive) | -N (relative) | timestamp."""
    if isinstance(value, Timestamp):
        if value < 0:
            raise _refuse(f"filter {key!s}: negative timestamp {int(value)}")
        return OffsetSpec.timestamp(int(value))
    if isinstance(value, bool):
        raise _refuse(f"filter {key!s}: a boolean is not an offset")
    if isinstance(value, int):
        return OffsetSpec.offset(value) if value >= 0 else OffsetSpec.relative(-value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word == "first":
            return OffsetSpec.first()
        if word == "last":
            return OffsetSpec.last()
        if word == "next":
            return OffsetSpec.next()
        raise _refuse(f"filter {key!s}: unknown offset specification {value!r}")
    raise _refuse(f"filter {key!s}: cannot use a {type(value).__name__} as an offset specification")


def _da_map(key: Any, entries: dict[Any, Any]) -> list[OffsetSpec]:
    if not entries:
        return [OffsetSpec.first()]
    specs: list[OffsetSpec] = []
    for name, value in entries.items():
        if name == OFFSET_KEY:
            specs.append(_offset_after(key, value, inclusive=False))
        elif name == TIMESTAMP_KEY:
            specs.append(_timestamp_after(key, value, inclusive=False))
        else:
            raise _refuse(
                f"filter {key!s}: annotation {name!r} cannot be filtered on (only "
                f"{OFFSET_KEY} and {TIMESTAMP_KEY})"
            )
    return specs


def _offset_after(key: Any, value: Any, *, inclusive: bool) -> OffsetSpec:
    if not isinstance(value, str):
        raise _refuse(
            f"filter {key!s}: {OFFSET_KEY} must be compared with a symbol, "
            f"got {type(value).__name__}"
        )
    if value == EARLIEST:
        return OffsetSpec.first()
    if value == LATEST:
        return OffsetSpec.next()
    offset = offset_from_symbol(value)
    if offset is None:
        raise _refuse(f"filter {key!s}: {value!r} is not an offset this broker issued")
    return OffsetSpec.offset(offset if inclusive else offset + 1)


def _timestamp_after(key: Any, value: Any, *, inclusive: bool) -> OffsetSpec:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _refuse(
            f"filter {key!s}: {TIMESTAMP_KEY} must be compared with a timestamp or a "
            f"non-negative integer of milliseconds, got {value!r}"
        )
    return OffsetSpec.timestamp(int(value) if inclusive else int(value) + 1)


# SQL subset (000 §5.2.2) ------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>'(?:[^']|'')*')
  | (?P<int>-?\d+)
  | (?P<op>>=|>)
  | (?P<word>[A-Za-z_][A-Za-z0-9_.\-]*)
)""",
    re.VERBOSE,
)
_FIELDS = {
    "d.event-streams-offset": OFFSET_KEY,
    "delivery_annotations.event-streams-offset": OFFSET_KEY,
    "d.event-streams-timestamp": TIMESTAMP_KEY,
    "delivery_annotations.event-streams-timestamp": TIMESTAMP_KEY,
}


def parse_sql(text: str) -> list[OffsetSpec]:
    """`TRUE` | `<field> (>|>=) <constant>` joined by AND."""
    if len(text) > SQL_CHARS_MAX:
        raise _refuse(f"SQL filter longer than {SQL_CHARS_MAX} characters")
    tokens: list[tuple[str, str]] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        m = _TOKEN.match(stripped, pos)
        if m is None or m.end() == pos:
            raise _refuse(f"SQL filter {text!r}: cannot read it at character {pos}")
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    specs: list[OffsetSpec] = []
    i = 0
    while True:
        if i < len(tokens) and tokens[i][0] == "word" and tokens[i][1].upper() == "TRUE":
            specs.append(OffsetSpec.first())
            i += 1
        else:
            if i + 3 > len(tokens):
                raise _refuse(f"SQL filter {text!r}: incomplete comparison")
            (fk, field), (ok, op), (ck, const) = tokens[i : i + 3]
            name = _FIELDS.get(field.lower()) if fk == "word" else None
            if name is None:
                raise _refuse(f"SQL filter {text!r}: {field!r} is not a filterable field")
            if ok != "op":
                raise _refuse(f"SQL filter {text!r}: operator {op!r} is not supported")
            inclusive = op == ">="
            if name == OFFSET_KEY:
                if ck != "str":
                    raise _refuse(f"SQL filter {text!r}: compare the offset with a quoted symbol")
                specs.append(
                    _offset_after("sql", const[1:-1].replace("''", "'"), inclusive=inclusive)
                )
            else:
                if ck != "int":
                    raise _refuse(f"SQL filter {text!r}: compare the timestamp with an integer")
                specs.append(_timestamp_after("sql", int(const), inclusive=inclusive))
            i += 3
        if i == len(tokens):
            return specs
        if tokens[i][0] != "word" or tokens[i][1].upper() != "AND":
            raise _refuse(f"SQL filter {text!r}: expected AND, got {tokens[i][1]!r}")
        i += 1
