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

Filters that choose messages (ADR 0016), combined with the start (a message is sent when it is
at or after the start and every one of these holds):

* `rabbitmq:stream-filter` (filter key or descriptor, RabbitMQ's name): a string or a list or
  array of strings, the filter values (message annotation `x-stream-filter-value`) wanted; with
  `rabbitmq:stream-match-unfiltered` = true, messages without a filter value too. The node
  passes over chunks whose Bloom filter holds none of them; the link sends only messages whose
  value is one of them (RabbitMQ leaves that second step to the client).
* `event-streams-sql` with any other expression than the start subset above: the full SQL
  filter language (spate.gateway.sql, FILTEX §6) over header, delivery annotations (the
  offset symbol and timestamp), message annotations, properties and application properties;
  a message is sent when it is TRUE. Conjuncts of the start subset at its top level (ANDed)
  also set the start. A malformed or too complex expression refuses the attach
  (`amqp:invalid-field`, naming the position).

Filters whose descriptor is none of these are not ours: ignored and not echoed (AMQP 3.5.1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from spate.core.backend import ChunkView, OffsetSpec
from spate.core.errors import InvalidArgument
from spate.core.filtering import VALUES_PER_LINK_MAX, ChunkFilter, ValueFilter
from spate.core.ids import Offset, offset_from_symbol, offset_to_symbol
from spate.gateway import sql
from spate.gateway.codec import Described, SymbolArray, Timestamp

DA_FILTER_CODE = 0x0000_0000_0000_0200
SQL_FILTER_CODE = 0x0000_0000_0000_0201
DA_FILTER_NAME = "amqp:event-streams-delivery-annotations-filter"
SQL_FILTER_NAME = "amqp:event-streams-sql-filter"
RABBITMQ_OFFSET_SPEC = "rabbitmq:stream-offset-spec"
RABBITMQ_STREAM_FILTER = "rabbitmq:stream-filter"
RABBITMQ_MATCH_UNFILTERED = "rabbitmq:stream-match-unfiltered"
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
class MessageFilter:
    """Which messages a consumer link is sent (ADR 0016): by filter value, by SQL, or both."""

    values: ValueFilter | None = None
    predicate: sql.Predicate | None = None

    def chunk_may_match(self, section: ChunkFilter | None) -> bool:
        return self.values is None or self.values.chunk_may_match(section)

    def matches(self, record: bytes | memoryview, offset: int, timestamp_ms: int) -> bool:
        if self.values is not None and not self.values.matches(record):
            return False
        if self.predicate is None:
            return True
        annotations = {
            OFFSET_KEY: offset_to_symbol(Offset(offset)),
            TIMESTAMP_KEY: Timestamp(timestamp_ms),
        }
        return self.predicate.matches(sql.StoredMessageView(record, annotations))

    def select(self, chunk: ChunkView, start: int) -> list[tuple[int, list[Any]]]:
        """The chunk's wanted records from offset `start` on, as runs of consecutive offsets
        (first offset, records)."""
        if chunk.filter is not None and not self.chunk_may_match(chunk.filter):
            return []  # (a view without a filter may come from a node that chose already)
        first = int(chunk.first_offset)
        records = chunk.records
        runs: list[tuple[int, list[Any]]] = []
        current: list[Any] = []
        begun = first
        for i in range(max(start - first, 0), len(records)):
            record = records[i]
            if self.matches(record, first + i, chunk.timestamp_ms):
                if not current:
                    begun = first + i
                current.append(record)
            elif current:
                runs.append((begun, current))
                current = []
        if current:
            runs.append((begun, current))
        return runs


@dataclass(frozen=True, slots=True)
class StartSelection:
    """Where a consumer starts (the largest offset any spec resolves to), and which messages
    it is sent from there."""

    specs: tuple[OffsetSpec, ...]
    accepted_keys: tuple[Any, ...]
    """The filter-map keys that set the start, in order of appearance (none: the consumer
    starts at `next`, or after a named consumer's stored offset)."""
    filter: MessageFilter | None = None
    filter_keys: tuple[Any, ...] = ()
    """The keys of filters that choose messages (and do not set the start)."""

    @property
    def echoed_keys(self) -> tuple[Any, ...]:
        """Every filter in force: echoed in the attach answer."""
        return self.accepted_keys + self.filter_keys


def _refuse(what: str) -> InvalidArgument:
    return InvalidArgument(f"{what}; {ACCEPTED_FORMS}")


def parse_filters(filters: dict[Any, Any] | None) -> StartSelection:
    """Parse a decoded source filter map. Raises InvalidArgument naming the bad filter."""
    specs: list[OffsetSpec] = []
    keys: list[Any] = []
    filter_keys: list[Any] = []
    values: ValueFilter | None = None
    match_unfiltered: bool | None = None
    predicate: sql.Predicate | None = None
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
            try:
                specs += parse_sql(inner)
            except InvalidArgument:
                if predicate is not None:
                    raise _refuse(f"filter {key!s}: one SQL filter per link") from None
                predicate = _predicate(key, inner)
                starts = _start_conjuncts(predicate.tree)
                specs += starts
                (keys if starts else filter_keys).append(key)
                continue
        elif kind == "values":
            values = ValueFilter(_filter_values(key, inner))
            filter_keys.append(key)
            continue
        elif kind == "unfiltered":
            if not isinstance(inner, bool):
                raise _refuse(f"filter {key!s}: a boolean, not {type(inner).__name__}")
            match_unfiltered = inner
            filter_keys.append(key)
            continue
        else:
            specs.append(simple_spec(key, inner))
        keys.append(key)
    if match_unfiltered is not None:
        if values is None:
            raise _refuse(
                f"filter {RABBITMQ_MATCH_UNFILTERED} needs a {RABBITMQ_STREAM_FILTER} filter"
            )
        values = ValueFilter(values.values, match_unfiltered)
    chosen = None if values is None and predicate is None else MessageFilter(values, predicate)
    if not specs:
        return StartSelection((OffsetSpec.next(),), (), chosen, tuple(filter_keys))
    return StartSelection(tuple(specs), tuple(keys), chosen, tuple(filter_keys))


def _filter_values(key: Any, value: Any) -> frozenset[str]:
    items = value.items if isinstance(value, SymbolArray) else value
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list | tuple) or not items:
        raise _refuse(f"filter {key!s}: a string or a non-empty list of strings")
    if not all(isinstance(v, str) for v in items):
        raise _refuse(f"filter {key!s}: every filter value must be a string")
    if len(items) > VALUES_PER_LINK_MAX:
        raise _refuse(f"filter {key!s}: at most {VALUES_PER_LINK_MAX} filter values per link")
    return frozenset(str(v) for v in items)


def _predicate(key: Any, text: str) -> sql.Predicate:
    try:
        return sql.parse(text)
    except sql.SqlError as error:
        raise InvalidArgument(
            f"filter {key!s}: SQL filter {text!r}: {error}; accepted: a FILTEX SQL expression "
            "(comparisons, AND/OR/NOT, IN, LIKE, BETWEEN, IS NULL, arithmetic) over fields "
            "h.<header field>, d.event-streams-offset, d.event-streams-timestamp, "
            "m.<annotation>, p.<property>, a.<application property> (docs/amqp.md, Filtering)"
        ) from None


def _start_conjuncts(node: sql.Node) -> list[OffsetSpec]:
    """Start positions from the top-level AND conjuncts of a full SQL filter that compare
    the offset or the timestamp with a constant by > or >= (the whole filter still decides
    each message: these only skip what it would refuse anyway)."""
    if isinstance(node, sql.Logic) and node.op == "AND":
        return _start_conjuncts(node.left) + _start_conjuncts(node.right)
    if not (
        isinstance(node, sql.Compare)
        and node.op in (">", ">=")
        and isinstance(node.left, sql.Field)
        and node.left.section is sql.Section.DELIVERY_ANNOTATIONS
        and isinstance(node.right, sql.Const)
    ):
        return []
    inclusive, value = node.op == ">=", node.right.value
    if node.left.name == OFFSET_KEY and isinstance(value, str):
        offset = offset_from_symbol(value)
        return [] if offset is None else [OffsetSpec.offset(offset + (0 if inclusive else 1))]
    if node.left.name == TIMESTAMP_KEY and isinstance(value, int) and value >= 0:
        return [OffsetSpec.timestamp(value + (0 if inclusive else 1))]
    return []


def chunk_filter_of(selection: StartSelection) -> ValueFilter | None:
    """What the node can use to pass over chunks for this link (the filter values)."""
    return None if selection.filter is None else selection.filter.values


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
                RABBITMQ_STREAM_FILTER: "values",
                RABBITMQ_MATCH_UNFILTERED: "unfiltered",
            }.get(d)
        return None
    if not isinstance(key, str):
        return None
    return {
        RABBITMQ_OFFSET_SPEC: "simple",
        RABBITMQ_STREAM_FILTER: "values",
        RABBITMQ_MATCH_UNFILTERED: "unfiltered",
    }.get(key)


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
