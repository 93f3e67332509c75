"""SQL filter expressions (spate.gateway.sql): grammar, three-valued semantics, limits, laziness,
and the view over stored message bytes. Pure: no listener, no broker.

Sources the docstrings cite:
  FILTEX  OASIS AMQP Filter Expressions 1.0 csd01 §6 "SQL filter expressions" (the clause
          numbers as RabbitMQ's implementation quotes them: rabbit_amqp_sql_lexer.xrl,
          rabbit_amqp_sql_parser.yrl, rabbit_amqp_util.erl);
  JMS     Jakarta Messaging 3.1 §3.8.1 "Message selector" (null tables 3-4, 3-5, 3-6);
  000     the event-streams specification (seed 000) §5.2.2 event-streams-sql filter;
  002     AMQP 1.0 part 3, messaging (header defaults §3.2.1).
"""

from __future__ import annotations

import itertools
import re
import time
import uuid
from collections.abc import Callable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, char, decimal64, symbol, timestamp, ulong
from spate.core.ids import offset_to_symbol
from spate.gateway import codec, sql
from spate.gateway.sql import (
    DEPTH_MAX,
    IN_ITEMS_MAX,
    LIKE_PATTERN_CHARS_MAX,
    NODES_MAX,
    OPAQUE,
    TEXT_CHARS_MAX,
    Arithmetic,
    Field,
    LikePattern,
    Section,
    SqlError,
    StoredMessageView,
    parse,
)

A = Section.APPLICATION_PROPERTIES
H = Section.HEADER
D = Section.DELIVERY_ANNOTATIONS
M = Section.MESSAGE_ANNOTATIONS
P = Section.PROPERTIES
F = Section.FOOTER


class DictView:
    """A MessageView over plain dicts that records every section it is asked for."""

    def __init__(self, **by_section: Mapping[str, object]) -> None:
        self.fields = {Section(name): values for name, values in by_section.items()}
        self.read: list[Section] = []

    def field(self, section: Section, name: str) -> object:
        self.read.append(section)
        return self.fields.get(section, {}).get(name)


APP: dict[str, object] = {
    "weight": 5,
    "price": 10.5,
    "country": "UK",
    "active": True,
    "premium": False,
    "nothing": None,  # present with the AMQP null value
    "data": b"\xde\xad",
    "list": [1, 2],  # a value of a type expressions cannot use
    "big": 2**64 - 1,
    "symbol": codec.Symbol("sym"),
    "ulong": codec.ULong(7),
    "stamp": codec.Timestamp(1_000),
}


def view(**app: object) -> DictView:
    return DictView(application_properties={**APP, **app})


def truth(text: str, on: DictView | None = None) -> bool | None:
    """TRUE, FALSE or None (unknown), told apart by matching the expression and its negation."""
    on = view() if on is None else on
    if parse(text).matches(on):
        return True
    if parse(f"NOT ({text})").matches(on):
        return False
    return None


def error(text: str) -> SqlError:
    with pytest.raises(SqlError) as caught:
        parse(text)
    return caught.value


# ---------------------------------------------------------------------------------------------
# Literals and field references


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TRUE", True),
        ("FALSE", False),
        ("true", True),  # JMS §3.8.1.1: keywords are case-insensitive (FILTEX writes them upper)
        ("NOT false", True),
        ("'it''s' = 'it''s'", True),  # FILTEX: a doubled quotation mark stands for one
        ("'' = ''", True),
        ('"say ""hi""" = \'say "hi"\'', True),  # FILTEX: strings in single or double quotes
        ("\"it's\" = 'it''s'", True),
        ("'🥕' = '🥕'", True),
        ("1.5 = 15e-1", True),  # FILTEX decimal / approximate constants
        ("1.5E+1 = 15", True),
        ("1e3 = 1000", True),  # JMS approximate literal forms
        (".5 = 0.5", True),
        ("5. = 5", True),
        ("0x0A = 0x0a", True),  # FILTEX binary constant
        ("0xDEAD = data", True),
        ("0xDEAD = 0xDEADBE", False),
        ("18446744073709551615 = big", True),  # an AMQP ulong constant
        ("NULL IS NULL", True),
        ("weight between 1 and 9", True),
    ],
)
def test_literals(text: str, expected: bool) -> None:
    """FILTEX §6 constants: string (either quote, doubled to escape), integer, decimal,
    approximate, binary (0x pairs), boolean, NULL; keywords in any case (JMS)."""
    assert truth(text) is expected


@pytest.mark.parametrize(
    ("reference", "section", "name"),
    [
        ("x", A, "x"),  # FILTEX §6.4.4.4: no section means application-properties
        ("a.x", A, "x"),
        ("application_properties.x", A, "x"),
        ("_under", A, "_under"),
        ("größe", A, "größe"),
        ("[x-y]", A, "x-y"),  # FILTEX delimited identifier
        ("[a.b]", A, "a.b"),
        ("[my key]", A, "my key"),
        ("[[[k]]]", A, "[k]"),  # '[[' and ']]' stand for one bracket
        ("[NOT]", A, "NOT"),
        ("[]", A, ""),
        ("a.[my key]", A, "my key"),
        ("h.priority", H, "priority"),
        ("header.priority", H, "priority"),
        ("H.priority", H, "priority"),
        ("h.delivery-count", H, "delivery_count"),
        ("d.event-streams-offset", D, "event-streams-offset"),  # 000 §5.2.2's spelling
        ("delivery_annotations.event-streams-timestamp", D, "event-streams-timestamp"),
        ("m.x-opt-foo", M, "x-opt-foo"),
        ("message_annotations.x_opt", M, "x_opt"),
        ("m.[x-opt 2]", M, "x-opt 2"),
        ("p.message_id", P, "message_id"),
        ("p.message-id", P, "message_id"),
        ("properties.reply-to-group-id", P, "reply_to_group_id"),
        ("f.sig", F, "sig"),
        ("footer.sig", F, "sig"),
    ],
)
def test_field_references(reference: str, section: Section, name: str) -> None:
    """FILTEX §6.4.4.4 field references: `section.name` with the long and the one-letter section
    names, properties fields by their underscore names (the AMQP hyphen spelling accepted too),
    a bare or [delimited] identifier for application properties."""
    predicate = parse(f"{reference} IS NULL")
    assert predicate.tree == sql.IsNull(Field(section, name), negated=False)
    assert predicate.sections == {section}


def test_a_dash_after_a_section_continues_a_name_only_before_a_letter() -> None:
    """Deviation (module docstring): `d.event-streams-offset` is one name (000 §5.2.2), but
    `a.count-1` subtracts and a bare `x-y` is x minus y (FILTEX identifiers have no '-')."""
    assert parse("a.count-b = 1").sections == {A}
    assert isinstance(parse("a.count-1 = 4").tree.left, Arithmetic)  # type: ignore[union-attr]
    assert truth("a.count-1 = 4", DictView(application_properties={"count": 5})) is True
    assert truth("weight-2 = 3") is True


def test_event_streams_examples() -> None:
    """000 §5.2.2's examples evaluate over the delivery annotations Spate generates: the offset
    symbol (fixed width, so string order is offset order) and the timestamp in ms."""
    annotations = {"event-streams-offset": offset_to_symbol(42), "event-streams-timestamp": 1_000}
    delivery = DictView(delivery_annotations=annotations)
    assert parse(f"d.event-streams-offset > '{offset_to_symbol(41)}'").matches(delivery)
    assert parse(f"d.event-streams-offset >= '{offset_to_symbol(42)}'").matches(delivery)
    assert not parse(f"d.event-streams-offset > '{offset_to_symbol(42)}'").matches(delivery)
    assert parse("d.event-streams-timestamp > 999 AND TRUE").matches(delivery)
    assert parse("d.event-streams-offset > 'a4c5'").sections == {D}


# ---------------------------------------------------------------------------------------------
# Operators


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("weight = 5", True),
        ("weight = 5.0", True),  # JMS: exact and approximate numbers compare
        ("5.0 = weight", True),
        ("weight <> 5", False),
        ("weight != 4", True),  # FILTEX: '!=' is '<>'
        ("weight < 6", True),
        ("weight <= 5", True),
        ("weight > 5", False),
        ("weight >= 5.5", False),
        ("price > 10", True),
        ("country = 'UK'", True),
        ("country < 'US'", True),
        ("'Zurich' > country", True),
        ("symbol = 'sym'", True),  # a symbol compares by its text
        ("ulong = 7 AND stamp = 1000", True),  # AMQP integer types are integers
        ("active = TRUE", True),
        ("premium <> TRUE", True),
        ("data < 0xDEAE", True),
        ("big > 18446744073709551614", True),
        # mismatched types, NULL, unusable values: unknown (deviation from JMS's FALSE)
        ("weight = '5'", None),
        ("country = 5", None),
        ("active = 1", None),
        ("active > FALSE", None),  # JMS: booleans compare by = and <> only
        ("data = 'x'", None),
        ("list = 1", None),
        ("nothing = nothing", None),
        ("absent <> 1", None),
        ("weight < TRUE", None),
    ],
)
def test_comparison(text: str, expected: bool | None) -> None:
    """JMS §3.8.1.2 comparison: like types only (numbers across integer and floating), strings
    and binary in order, booleans by = and <>; anything else is unknown."""
    assert truth(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("weight + 2 * 3 = 11", True),  # * before +
        ("(weight + 2) * 3 = 21", True),
        ("weight - 2 - 1 = 2", True),  # left associative
        ("20 / 2 / 5 = 2", True),
        ("weight * 2 > 5 + 3", True),  # arithmetic before comparison
        ("7 / 2 = 3", True),  # integer division truncates toward zero (Java, JMS §3.8.1.1)
        ("-7 / 2 = -3", True),
        ("7 % 3 = 1", True),
        ("-7 % 3 = -1", True),  # the remainder takes the dividend's sign
        ("7 % -3 = 1", True),
        ("7 / 2.0 = 3.5", True),
        ("7.5 % 2 = 1.5", True),
        ("weight + price = 15.5", True),
        ("-weight = -5", True),
        ("- -weight = 5", True),
        ("+weight = 5", True),
        ("2 * -3 = -6", True),
        ("weight / 0 = 0", None),  # division by zero is unknown, never an exception
        ("weight % 0 = 0", None),
        ("1.0 / 0 = 1", None),
        ("'a' + 1 = 1", None),
        ("'a' + 'b' = 'ab'", None),  # no concatenation operator
        ("-country = 1", None),
        ("-active = 1", None),
        ("nothing + 1 = 1", None),
        ("big + 1 > 0", None),  # beyond an AMQP ulong: unknown
        ("-big - big < 0", None),
        ("big * 1.0 > 0", True),
        ("1e308 * 10 > 0", True),  # floating overflow is infinity, as in Java
    ],
)
def test_arithmetic(text: str, expected: bool | None) -> None:
    """JMS §3.8.1.1 arithmetic with Java numeric promotion; unknown on non-numbers, NULL,
    division by zero and integer results outside -2**63 .. 2**64-1."""
    assert truth(text) is expected


_TV = {"TRUE": True, "FALSE": False, "UNKNOWN": None}
_ATOMS = {"TRUE": "TRUE", "FALSE": "FALSE", "UNKNOWN": "absent = 1"}
_AND = {  # JMS table 3-4
    ("TRUE", "TRUE"): "TRUE",
    ("TRUE", "FALSE"): "FALSE",
    ("TRUE", "UNKNOWN"): "UNKNOWN",
    ("FALSE", "TRUE"): "FALSE",
    ("FALSE", "FALSE"): "FALSE",
    ("FALSE", "UNKNOWN"): "FALSE",
    ("UNKNOWN", "TRUE"): "UNKNOWN",
    ("UNKNOWN", "FALSE"): "FALSE",
    ("UNKNOWN", "UNKNOWN"): "UNKNOWN",
}
_OR = {  # JMS table 3-5
    ("TRUE", "TRUE"): "TRUE",
    ("TRUE", "FALSE"): "TRUE",
    ("TRUE", "UNKNOWN"): "TRUE",
    ("FALSE", "TRUE"): "TRUE",
    ("FALSE", "FALSE"): "FALSE",
    ("FALSE", "UNKNOWN"): "UNKNOWN",
    ("UNKNOWN", "TRUE"): "TRUE",
    ("UNKNOWN", "FALSE"): "UNKNOWN",
    ("UNKNOWN", "UNKNOWN"): "UNKNOWN",
}


@pytest.mark.parametrize(("a", "b"), list(itertools.product(_TV, _TV)))
def test_three_valued_and_or(a: str, b: str) -> None:
    """JMS tables 3-4 (AND) and 3-5 (OR): NULL AND FALSE = FALSE, NULL OR TRUE = TRUE; a
    message matches only when the predicate is TRUE."""
    left, right = _ATOMS[a], _ATOMS[b]
    assert truth(f"{left} AND {right}") is _TV[_AND[a, b]]
    assert truth(f"{left} OR {right}") is _TV[_OR[a, b]]


@pytest.mark.parametrize(("a", "expected"), [("TRUE", False), ("FALSE", True), ("UNKNOWN", None)])
def test_three_valued_not(a: str, expected: bool | None) -> None:
    """JMS table 3-6: NOT NULL = NULL, so neither a predicate nor its negation matches."""
    on = view()
    assert parse(f"NOT {_ATOMS[a]}").matches(on) is (expected is True)
    assert parse(f"NOT NOT {_ATOMS[a]}").matches(on) is (_TV[a] is True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NOT country = 'US' AND weight > 3", True),  # NOT binds tighter than AND...
        ("weight > 9 AND weight > 3 OR active", True),  # ...AND than OR
        ("active OR weight > 9 AND weight > 99", True),
        ("(active OR weight > 9) AND weight > 99", False),
        ("weight", None),  # JMS: a non-boolean value used as a condition is unknown
        ("weight OR TRUE", True),
        ("country AND FALSE", False),
        ("NOT weight", None),
        ("(weight = 5) = TRUE", True),
    ],
)
def test_logic(text: str, expected: bool | None) -> None:
    """JMS §3.8.1.1 precedence NOT > AND > OR; non-boolean operands of logic are unknown."""
    assert truth(text) is expected


@pytest.mark.parametrize(
    ("value", "pattern", "expected"),
    [
        ("UK", "UK", True),
        ("UK", "U_", True),
        ("UK", "_", False),
        ("UK", "%", True),
        ("", "%", True),
        ("", "%%", True),
        ("", "_", False),
        ("", "", True),
        ("aa", "a%a", True),
        ("a", "a%a", False),
        ("This is a test", "T_i% a %e_t", True),
        ("xaxbx", "%a%b%", True),
        ("xbxax", "%a%b%", False),
        ("abcabd", "%ab_", True),
        ("abcab", "%ab_", False),
        ("a.c", "a.c", True),  # regular-expression characters are literal
        ("abc", "a.c", False),
        ("a+b(c)*[d]$^\\|{1}?#", "a+b(c)*[d]$^\\|{1}?#", True),
        ("line\nbreak", "line_break", True),  # '_' and '%' match line breaks too
        ("line\nbreak", "line%", True),
        ("🥕x", "_x", True),  # one character is one code point
    ],
)
def test_like(value: str, pattern: str, expected: bool) -> None:
    """JMS §3.8.1.2 LIKE: '_' any one character, '%' any sequence, everything else literal."""
    on = DictView(application_properties={"v": value})
    quoted = pattern.replace("'", "''")
    assert truth(f"v LIKE '{quoted}'", on) is expected
    assert truth(f"v NOT LIKE '{quoted}'", on) is (not expected)


@pytest.mark.parametrize(
    ("value", "pattern", "escape", "expected"),
    [
        ("_foo", "z_%", "z", True),
        ("afoo", "z_%", "z", False),
        ("5%", "_!%", "!", True),
        ("50", "_!%", "!", False),
        ("a\\b", "a\\\\b", "\\", True),
        ("100%", "100\\%", "\\", True),
        ("a%", "a%%", "%", True),  # the escape character may be a wildcard itself
        ("ab", "a%%", "%", False),
        ("zz", "zz", "z", False),  # 'zz' is one literal z
        ("z", "zz", "z", True),
    ],
)
def test_like_escape(value: str, pattern: str, escape: str, expected: bool) -> None:
    """JMS §3.8.1.2 LIKE ... ESCAPE 'c': the escape character makes the next one literal."""
    on = DictView(application_properties={"v": value})
    assert truth(f"v LIKE '{pattern}' ESCAPE '{escape}'", on) is expected


@pytest.mark.parametrize(
    "text", ["weight LIKE '5'", "absent LIKE '%'", "absent NOT LIKE '%'", "list LIKE '%'"]
)
def test_like_needs_a_string(text: str) -> None:
    """JMS §3.8.1.2: LIKE on NULL is unknown; on a number, unknown too (types must match)."""
    assert truth(text) is None


def test_like_costs_at_most_value_times_pattern() -> None:
    """A pattern that would backtrack catastrophically as a regular expression (`.*a.*a...`)
    is a few leftmost searches here."""
    pattern = LikePattern("%a_a%a_a%a_a%a_a%a_a%b_b", None)
    started = time.perf_counter()
    assert not pattern.matches("a" * 200_000)
    assert pattern.matches("a" * 200_000 + "bxb")
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("country IN ('US', 'UK')", True),
        ("country IN ('US')", False),
        ("country NOT IN ('US')", True),
        ("country NOT IN ('UK')", False),
        ("country IN ('UK', NULL)", True),
        ("country IN ('US', NULL)", None),  # x IN (a, b) is x = a OR x = b (SQL)
        ("country NOT IN ('US', NULL)", None),
        ("absent IN ('UK')", None),  # JMS: IN on NULL is unknown
        ("absent NOT IN ('UK')", None),
        ("weight IN (5.0, 'x')", True),
        ("weight IN ('5')", None),
        ("weight IN (price - 5.5)", True),  # FILTEX: the items are expressions
        ("'UK' IN (country, 'x')", True),
    ],
)
def test_in(text: str, expected: bool | None) -> None:
    """JMS §3.8.1.2 [NOT] IN, as the disjunction of equalities: a NULL item turns a miss
    into unknown."""
    assert truth(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("weight BETWEEN 1 AND 5", True),
        ("weight BETWEEN 6 AND 9", False),
        ("weight NOT BETWEEN 6 AND 9", True),
        ("weight NOT BETWEEN 1 AND 5", False),
        ("country BETWEEN 'A' AND 'Z'", True),
        ("absent BETWEEN 1 AND 2", None),
        ("weight BETWEEN 6 AND absent", False),  # x >= 6 is FALSE already
        ("weight BETWEEN 1 AND absent", None),
        ("weight BETWEEN 1 AND 9 AND active", True),  # the second AND is the logical one
    ],
)
def test_between(text: str, expected: bool | None) -> None:
    """JMS §3.8.1.2 [NOT] BETWEEN a AND b: `x >= a AND x <= b` (FILTEX dropped it; kept)."""
    assert truth(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nothing IS NULL", True),  # present with the AMQP null value
        ("absent IS NULL", True),
        ("weight IS NULL", False),
        ("weight IS NOT NULL", True),
        ("absent IS NOT NULL", False),
        ("list IS NULL", False),  # present, of a type expressions cannot use: not NULL
        ("list IS NOT NULL", True),
        ("'a' + 1 IS NULL", True),  # unknown is NULL
    ],
)
def test_is_null(text: str, expected: bool) -> None:
    """JMS §3.8.1.2 IS [NOT] NULL is never unknown."""
    assert truth(text) is expected


# ---------------------------------------------------------------------------------------------
# Errors: where, and what to do


def test_error_message_names_position_expected_and_found() -> None:
    """A message a person can act on: where (0-based character), what was expected, what
    was there."""
    err = error("weight >")
    assert err.position == 8
    assert str(err) == "position 8: expected a value after '>', found end of text"
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("", 0, "expected a value, found end of text"),
        ("weight > > 1", 9, "expected a value after '>', found '>'"),
        ("(weight > 1", 11, "expected ')'"),
        ("weight > 1)", 10, "expected AND, OR or the end of the expression"),
        ("weight = 1 2", 11, "found '2'"),
        ("weight = 1 AND", 14, "after 'AND', found end of text"),
        ("weight = 'UK", 9, "no closing '"),
        ("weight # 1", 7, "unexpected character '#'"),
        ("country LIKE 5", 13, "expected a quoted pattern"),
        ("country LIKE 'a' ESCAPE 'ab'", 24, "exactly one character"),
        ("country LIKE 'ab!' ESCAPE '!'", 13, "ends with its escape character"),
        ("weight IN 1", 10, "'(' starting the IN list"),
        ("weight IN (1, 2", 15, "',' or ')' in the IN list"),
        ("weight BETWEEN 1 OR 2", 17, "expected AND"),
        ("weight IS 1", 10, "expected NULL"),
        ("weight NOT 1", 11, "expected LIKE, IN or BETWEEN after 'NOT'"),
        ("weight = NULL", 7, "write 'IS NULL'"),
        ("p.nosuch = 1", 2, "properties has no field 'nosuch'"),
        ("h.ttl_ms = 1", 2, "header has no field 'ttl_ms'"),
        ("q.x = 1", 0, "'q' is not a section"),
        ("my.key = 1", 0, "write it in brackets: [my.key]"),
        ("h. = 1", 2, "expected a field name after 'h.'"),
        ("weight = 0x123", 9, "pairs of hex digits"),
        ("12abc = 1", 0, "malformed number '12a'"),
        ("1.2.3 = 1", 0, "malformed number"),
        ("18446744073709551616 = 1", 0, "larger than an AMQP ulong"),
        ("1e999 = 1", 0, "out of the range of a double"),
        ("EXISTS(weight)", 0, "EXISTS is reserved"),
        ("utc() > 0", 0, "write [utc]"),
        ("[open = 1", 0, "no closing ']'"),
        ("[a[b] = 1", 2, "written '[['"),
        ("[a\nb] = 1", 2, "control characters"),
    ],
)
def test_error_positions(text: str, position: int, fragment: str) -> None:
    """Malformed expressions fail at parse time (once per link), naming the exact place."""
    err = error(text)
    assert (err.position, fragment in err.reason) == (position, True), str(err)
    assert str(err).startswith(f"position {position}: ")


# ---------------------------------------------------------------------------------------------
# Limits


def test_text_length_limit() -> None:
    """TEXT_CHARS_MAX (RabbitMQ's bound, citing FILTEX §7.1): the longest text is accepted,
    one more character is not."""
    longest = "x = '" + "a" * (TEXT_CHARS_MAX - 6) + "'"
    assert len(longest) == TEXT_CHARS_MAX
    parse(longest)
    err = error(longest + " ")
    assert err.position == TEXT_CHARS_MAX and "sql.TEXT_CHARS_MAX" in err.reason


@pytest.mark.parametrize(("opener", "closer"), [("(", ")"), ("NOT ", ""), ("-", "")])
def test_depth_limit(opener: str, closer: str) -> None:
    """DEPTH_MAX bounds the parser's recursion: parentheses, NOT and signs nest that deep."""
    atom = "1 = 1" if opener != "-" else "1"
    parse(opener * DEPTH_MAX + atom + closer * DEPTH_MAX)
    err = error(opener * (DEPTH_MAX + 1) + atom + closer * (DEPTH_MAX + 1))
    assert err.position == len(opener) * DEPTH_MAX
    assert "sql.DEPTH_MAX" in err.reason


def test_node_limit() -> None:
    """NODES_MAX: 128 ones and 127 '+' and IS are 256 nodes; a 129th one is refused where it
    stands."""
    assert NODES_MAX == 256
    ones = " + ".join(["1"] * 128)
    parse(ones + " IS NULL")
    err = error(" + ".join(["1"] * 129))
    assert err.position == 4 * 128 and "sql.NODES_MAX" in err.reason


def _at_stack_depth(frames: int, call: Callable[[], bool]) -> bool:
    return call() if frames == 0 else _at_stack_depth(frames - 1, call)


def test_deepest_trees_evaluate_from_a_deep_stack() -> None:
    """The longest chains NODES_MAX allows evaluate with hundreds of frames already on the
    stack: a run of OR is a loop, and an arithmetic chain costs a frame per operator."""
    ors = parse(" OR ".join(f"weight = {n}" for n in range(64)))  # 64 * 3 + 63 = 255 nodes
    sums = parse(" + ".join(["weight"] * 127) + " = 635")  # 127 + 126 + 2 = 255 nodes
    assert _at_stack_depth(600, lambda: ors.matches(view()) and sums.matches(view()))
    assert not _at_stack_depth(600, lambda: ors.matches(view(weight=64)))


def test_like_pattern_limit() -> None:
    """LIKE_PATTERN_CHARS_MAX bounds a match to O(len(value) * pattern)."""
    parse("x LIKE '" + "%" * LIKE_PATTERN_CHARS_MAX + "'")
    err = error("x LIKE '" + "_" * (LIKE_PATTERN_CHARS_MAX + 1) + "'")
    assert err.position == 7 and "sql.LIKE_PATTERN_CHARS_MAX" in err.reason


def test_in_list_limit() -> None:
    """IN_ITEMS_MAX: the comma that would start item 129 is refused."""
    parse("x IN (" + ", ".join(["1"] * IN_ITEMS_MAX) + ")")
    err = error("x IN (" + ", ".join(["1"] * (IN_ITEMS_MAX + 1)) + ")")
    assert err.position == 7 + 3 * (IN_ITEMS_MAX - 1) and "sql.IN_ITEMS_MAX" in err.reason


# ---------------------------------------------------------------------------------------------
# Laziness: only the sections an expression needs


def test_sections_are_the_ones_the_expression_reads() -> None:
    assert parse("TRUE").sections == frozenset()
    assert parse("x = 1 AND a.y = 2 OR [z] IS NULL").sections == {A}
    assert parse("h.priority > 4 OR m.x-opt-a = 1").sections == {H, M}
    assert parse("p.to IN (d.x, f.y)").sections == {P, D, F}


def test_an_expression_on_application_properties_never_reads_annotations() -> None:
    on = DictView(application_properties={"x": 1}, message_annotations={"x": 1})
    assert parse("x = 1 OR a.y = 2").matches(on)
    assert set(on.read) == {A}


def test_short_circuit_skips_the_other_side() -> None:
    """AND stops at FALSE and OR at TRUE, so the other side's sections are not read at all."""
    on = DictView(application_properties={"x": 1})
    assert not parse("x = 2 AND m.y = 1").matches(on)
    assert parse("x = 1 OR m.y = 1").matches(on)
    assert M not in on.read


# ---------------------------------------------------------------------------------------------
# StoredMessageView over real encoded messages


def full_message() -> bytes:
    message = Message(
        body="x",
        durable=True,
        priority=7,
        ttl=1.5,
        first_acquirer=True,
        delivery_count=3,
        id="id-1",
        user_id=b"u",
        address="q",
        subject="s",
        reply_to="r",
        correlation_id=ulong(5),
        content_type=symbol("text/plain"),
        content_encoding=symbol("gzip"),
        expiry_time=12.5,
        creation_time=11.0,
        group_id="g",
        group_sequence=9,
        reply_to_group_id="rg",
        annotations={
            symbol("x-opt-foo"): 1,
            symbol("lst"): [1, 2],
            symbol("c"): char("z"),
            symbol("key"): "m",
        },
        properties={
            "k": "v",
            "u": ulong(2**64 - 1),
            "neg": -3,
            "f": 1.5,
            "yes": True,
            "bin": b"\x01\x02",
            "ts": timestamp(5_000),
            "dec": decimal64(5),
            "none": None,
            "key": "a",
        },
    )
    return bytes(message.encode())


@pytest.mark.parametrize(
    "text",
    [
        "h.durable AND h.first_acquirer",
        "h.priority = 7 AND h.ttl = 1500 AND h.delivery_count = 3",
        "p.message_id = 'id-1' AND p.user_id = 0x75 AND p.to = 'q' AND p.subject = 's'",
        "p.reply_to = 'r' AND p.correlation_id = 5 AND p.content_type = 'text/plain'",
        "p.content_encoding = 'gzip' AND p.absolute_expiry_time = 12500",
        "p.creation_time = 11000 AND p.group_id = 'g' AND p.group_sequence = 9",
        "p.reply_to_group_id = 'rg'",
        "m.x-opt-foo = 1 AND m.c = 'z' AND m.key = 'm' AND key = 'a'",
        "m.lst IS NOT NULL AND (m.lst = 1 OR m.lst <> 1) IS NULL",  # a list: present, unusable
        "k = 'v' AND u = 18446744073709551615 AND neg = -3 AND f = 1.5 AND yes",
        "bin = 0x0102 AND ts = 5000 AND none IS NULL AND absent IS NULL",
        "dec IS NOT NULL AND (dec = 0x0000000000000005 OR dec <> 0x00) IS NULL",  # decimal: OPAQUE
        "d.event-streams-timestamp = 77 AND d.event-streams-offset LIKE '0%'",
        "f.anything IS NULL",
    ],
)
def test_stored_message_view_reads_every_section(text: str) -> None:
    """Each section of a message python-qpid-proton encoded, read from its stored bytes: header
    and properties lists by field position, annotation and property maps by key (symbol or
    string, by text); delivery annotations from the broker's map."""
    annotations = {"event-streams-offset": offset_to_symbol(3), "event-streams-timestamp": 77}
    assert parse(text).matches(StoredMessageView(full_message(), annotations))


def test_a_message_without_header_reads_the_header_defaults() -> None:
    """002 §3.2.1: an absent header means durable false, priority 4, first-acquirer false,
    delivery-count 0, no ttl."""
    stored = bytes(Message(body="x").encode())
    text = "h.priority = 4 AND NOT h.durable AND NOT h.first_acquirer AND h.delivery_count = 0"
    assert parse(text + " AND h.ttl IS NULL").matches(StoredMessageView(stored, {}))


def test_uuid_and_binary_ids_are_binary() -> None:
    """A uuid message-id is its 16 bytes (the codec reads it so): compare with 0x…."""
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    stored = bytes(Message(body="x", id=ident).encode())
    assert parse(f"p.message_id = 0x{ident.hex.upper()}").matches(StoredMessageView(stored, {}))


def test_footer_is_read_after_the_body() -> None:
    footer = codec.encode(codec.Described(codec.ULong(0x78), {codec.Symbol("sig"): "s1"}))
    stored = bytes(Message(body="x", properties={"k": 1}).encode()) + footer
    assert parse("f.sig = 's1' AND footer.sig LIKE 's_' AND k = 1").matches(
        StoredMessageView(stored, {})
    )


def _with_bad_annotation() -> bytes:
    """A message whose message-annotations map holds a value with constructor 0x03 (none such):
    the section still walks (its size is right) but its content does not decode."""
    stored = bytearray(
        Message(body="x", annotations={symbol("x-opt-foo"): 1}, properties={"k": "v"}).encode()
    )
    value_at = stored.index(b"x-opt-foo") + len("x-opt-foo")
    assert stored[value_at] in (0x54, 0x55, 0x71, 0x81)  # some int constructor
    stored[value_at] = 0x03
    return bytes(stored)


def test_stored_view_decodes_only_the_sections_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parse messages lazily: an expression on application properties never decodes the
    (here undecodable) message annotations, and each section is decoded once."""
    decoded: list[Section] = []
    real = sql._decode_section

    def counting(stored: bytes | memoryview, section: Section, start: int, end: int) -> object:
        decoded.append(section)
        return real(stored, section, start, end)

    monkeypatch.setattr(sql, "_decode_section", counting)
    message = StoredMessageView(_with_bad_annotation(), {})
    assert parse("k = 'v' AND a.k LIKE 'v' AND [k] IN ('v')").matches(message)
    assert decoded == [A]


def test_an_undecodable_section_is_unknown_not_an_exception() -> None:
    """A producer's malformed value inside a section makes its fields OPAQUE: no comparison
    matches, IS NULL is FALSE, and matching never raises."""
    message = StoredMessageView(_with_bad_annotation(), {})
    assert not parse("m.x-opt-foo = 1 OR m.x-opt-foo <> 1").matches(message)
    assert not parse("m.x-opt-foo IS NULL").matches(message)
    assert parse("k = 'v'").matches(message)
    assert parse("m.x-opt-foo IS NOT NULL AND k = 'v'").matches(message)


def test_an_unreadable_section_walk_is_unknown_too() -> None:
    """Stored bytes that stop being sections (not expected: ingress checks them) leave the
    sections not reached unknown."""
    stored = bytes(Message(body="x", properties={"k": "v"}).encode())
    cut = StoredMessageView(stored[: stored.index(b"\x00\x53\x74")] + b"\x05\x05", {})
    assert parse("k IS NOT NULL").matches(cut) and not parse("k = 'v'").matches(cut)
    assert StoredMessageView(stored, {}).field(A, "k") == "v"
    assert cut.field(A, "k") is OPAQUE


# ---------------------------------------------------------------------------------------------
# Properties


_PIECES = [
    "x", "a.y", "m.x-opt", "[k]", "h.priority", "p.subject", "'s'", '"d"', "1", "2.5", "0xAB",
    "TRUE", "FALSE", "NULL", "AND", "OR", "NOT", "LIKE", "ESCAPE", "IN", "IS", "BETWEEN", "=",
    "<>", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "(", ")", ",", "'%_'", "'!'",
]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(st.sampled_from(_PIECES), max_size=12)))
def test_parse_raises_only_sql_error_and_matching_never_raises(source: str | list[str]) -> None:
    """Any text either parses or raises SqlError with a position inside it; whatever parses
    evaluates to a bool on any message."""
    text = source if isinstance(source, str) else " ".join(source)
    try:
        predicate = parse(text)
    except SqlError as err:
        assert 0 <= err.position <= len(text)
        return
    on = DictView(
        application_properties={"x": 3, "y": "yes", "k": [1]},
        message_annotations={"x-opt": 2.5},
        header={"priority": 4},
    )
    assert isinstance(predicate.matches(on), bool)


def _reference_like(pattern: str, value: str) -> bool:
    """LIKE as a backtracking regular expression: fine for the tiny inputs below."""
    translated = "".join({"%": ".*", "_": "."}.get(c, re.escape(c)) for c in pattern)
    return re.fullmatch(translated, value, re.DOTALL) is not None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab%_", max_size=8), st.text(alphabet="ab\n", max_size=10))
def test_like_agrees_with_a_backtracking_reference(pattern: str, value: str) -> None:
    assert LikePattern(pattern, None).matches(value) is _reference_like(pattern, value)


_CONDITIONS = st.sampled_from(
    ["x = 3", "x > y", "y LIKE 'y%'", "z IS NULL", "x IN (1, z)", "y = 3", "w BETWEEN 1 AND x"]
)
_PREDICATES = st.recursive(
    _CONDITIONS,
    lambda inner: st.one_of(
        st.builds("NOT ({})".format, inner),
        st.builds("({}) AND ({})".format, inner, inner),
        st.builds("({}) OR ({})".format, inner, inner),
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(_PREDICATES, st.sampled_from([None, 3, 2.5, "yes", True]))
def test_excluded_middle_fails_exactly_when_unknown(text: str, x: object) -> None:
    """Three-valued logic: P and NOT P never both match; P OR NOT P matches unless P is
    unknown, and P is unknown exactly when `(P) IS NULL`."""
    on = DictView(application_properties={"x": x, "y": "yes", "w": 2})
    holds = parse(text).matches(on)
    fails = parse(f"NOT ({text})").matches(on)
    unknown = parse(f"({text}) IS NULL").matches(on)
    assert not (holds and fails)
    assert parse(f"({text}) OR NOT ({text})").matches(on) is (not unknown)
    assert (holds or fails) is (not unknown)
