"""SQL filter expressions: parse once per consumer link, evaluate per message. Pure: no I/O.

The `event-streams-sql` filter (000 §5.2.2) is "a constrained subset of the SQL filter
expression defined in [FILTEX §6]" (OASIS AMQP Filter Expressions 1.0, csd01), which is the
JMS message selector (Jakarta Messaging 3.1 §3.8.1) with AMQP field references. This module
accepts the full expression language, not only the offset/timestamp subset `filters.parse_sql`
turns into a start position, so a link can also select the messages it is sent.

    predicate = parse("m.x-opt-region = 'eu' AND a.amount * 100 > 5000")  # once per link
    predicate.sections          # frozenset({MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES})
    predicate.matches(StoredMessageView(stored, {"event-streams-offset": ...}))  # per message

Grammar accepted (EBNF; keywords are case-insensitive, names are case-sensitive)::

    predicate  = or ;
    or         = and , { "OR" , and } ;
    and        = not , { "AND" , not } ;
    not        = "NOT" , not | comparison ;
    comparison = sum , [ ( "=" | "<>" | "!=" | "<" | "<=" | ">" | ">=" ) , sum
                       | [ "NOT" ] , "LIKE" , string , [ "ESCAPE" , string ]
                       | [ "NOT" ] , "IN" , "(" , sum , { "," , sum } , ")"
                       | [ "NOT" ] , "BETWEEN" , sum , "AND" , sum
                       | "IS" , [ "NOT" ] , "NULL" ] ;
    sum        = product , { ( "+" | "-" ) , product } ;
    product    = unary , { ( "*" | "/" | "%" ) , unary } ;
    unary      = ( "+" | "-" ) , unary | primary ;
    primary    = constant | field | "(" , or , ")" ;
    constant   = integer | decimal | string | binary | "TRUE" | "FALSE" | "NULL" ;
    field      = section , "." , ( name | delimited ) | identifier | delimited ;
    section    = "header" | "h" | "delivery_annotations" | "d" | "message_annotations" | "m"
               | "properties" | "p" | "application_properties" | "a" | "footer" | "f" ;
    identifier = word ;                                   (* not a reserved word *)
    name       = word , { "-" , letter , { letter | digit | "_" } } ;
    word       = ( letter | "_" ) , { letter | digit | "_" } ;
    delimited  = "[" , { character - ( "[" | "]" | control ) | "[[" | "]]" } , "]" ;
    string     = "'" , { character - "'" | "''" } , "'" | '"' , { character - '"' | '""' } , '"' ;
    integer    = digit , { digit } ;
    decimal    = ( digits , "." , [ digits ] | "." , digits ) , [ exponent ] | digits , exponent ;
    exponent   = ( "e" | "E" ) , [ "+" | "-" ] , digits ;
    binary     = "0x" , hex , hex , { hex , hex } ;

Fields (FILTEX §6.4.4.4): a bare identifier or delimited identifier names an application
property; `section.name` names a field of that section. Header fields: durable, priority, ttl,
first_acquirer, delivery_count (AMQP defaults when absent: false, 4, null, false, 0).
Properties fields: message_id, user_id, to, subject, reply_to, correlation_id, content_type,
content_encoding, absolute_expiry_time, creation_time, group_id, group_sequence,
reply_to_group_id; `message-id` spellings are accepted too. Annotation, application-property
and footer names are any map key (symbol or string, compared by its text); the delivery
annotations are the ones Spate generates (`event-streams-offset`: the offset symbol, fixed
width so string order is offset order; `event-streams-timestamp`: ms since the epoch).

Semantics (SQL three-valued logic, JMS §3.8.1.2 and its null-value tables): a value is NULL
when the field is absent; an operation on NULL, on a value of an unsupported type (list, map,
described, decimal) or on operands of mismatched types is *unknown*, and a message matches
only when the predicate is TRUE. NULL AND FALSE = FALSE, NULL OR TRUE = TRUE, NOT NULL = NULL.

* Comparison: numbers with numbers (integer and floating, exactly), strings with strings
  (code point order), binary with binary (byte order), booleans with booleans by = and <>
  only. Anything else is unknown.
* Arithmetic on numbers only: integer op integer is an integer, `/` truncates toward zero and
  `%` takes the dividend's sign (Java numeric promotion, JMS §3.8.1.1); with a floating
  operand the result is floating (`%` is `math.fmod`). Division by zero and an integer result
  outside -2**63 .. 2**64-1 are unknown, never an exception.
* `x IN (a, b)` is `x = a OR x = b` (so a NULL item makes a miss unknown, as in SQL);
  `x BETWEEN a AND b` is `x >= a AND x <= b`; `x LIKE p` needs a string x; `IS [NOT] NULL`
  is never unknown (a value of an unsupported type is not NULL).
* A value used as a condition must be a boolean; anything else is unknown.

Binary values: a binary field (and a uuid, which the codec reads as its 16 bytes) compares
with a binary constant `0xCAFE`.

Limits (RabbitMQ's implementation, citing FILTEX §7.1, bounds the text at 4096 characters and
200 tokens): `TEXT_CHARS_MAX`, `DEPTH_MAX`, `NODES_MAX`, `LIKE_PATTERN_CHARS_MAX`, `IN_ITEMS_MAX`.
Exceeding one is a `SqlError` naming it. Evaluation visits each node at most once, so a
message costs O(nodes) plus decoding each section it reads once (StoredMessageView); LIKE is
the only step that is not constant, and costs at most O(len(value) * pattern) (LikePattern).

Deviations from FILTEX csd01, and why:

* Keywords are case-insensitive (JMS; FILTEX writes them upper case and RabbitMQ accepts only
  that): a superset, so every FILTEX expression is accepted.
* `section.name` accepts '-' followed by a letter (`d.event-streams-offset`, `m.x-opt-foo`):
  000 §5.2.2 writes its examples that way, and AMQP annotation keys are hyphenated. Hence
  `a.count-b` is one name; write `a.count - b`. `a.count-1` is a subtraction. A bare
  identifier never contains '-' (`x-y` is x minus y); `[x-y]` names the property "x-y".
* `section.[any name]` is accepted for names no `name` production can spell.
* `[NOT] BETWEEN` (JMS) is accepted; FILTEX dropped it.
* Decimals also in the JMS forms `1.`, `.5`, `1e3`. An integer constant above 2**64-1 or a
  decimal beyond a double is refused (a negated constant below -2**63 is unknown, like any
  result out of range). Binary constants accept lower-case hex digits too.
* Comparing operands of different types is unknown, not FALSE as JMS §3.8.1.2 says, so that
  `NOT (x = 'a')` does not select messages whose `x` is a number.
* `x = NULL` (a comparison with the NULL constant) is refused at parse time: it is never TRUE;
  write `x IS NULL`.
* Not supported: the functions FILTEX reserves (UTC, DATE, LOWER, UPPER, LEFT, RIGHT,
  SUBSTRING, EXISTS) and the NAN and INF constants: they are refused by name, so a link never
  silently filters differently than asked. UTC() would make matching depend on a clock; a
  later version can pass `now_ms` into `matches`. No string concatenation (neither FILTEX nor
  JMS has one; `'a' + 'b'` is unknown).

FILTEX clause numbers here are the ones RabbitMQ's implementation cites (rabbit_amqp_sql_lexer
.xrl, rabbit_amqp_sql_parser.yrl, rabbit_amqp_util.erl, which follow csd01); where FILTEX's
text was not at hand, the JMS selector semantics decide, as 000 §5.2.2 builds on both.
"""

from __future__ import annotations

import enum
import math
import operator
import re
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from spate.gateway import codec, sections

TEXT_CHARS_MAX = 4096
"""Longest expression text, in characters (the bound RabbitMQ applies, citing FILTEX §7.1)."""
DEPTH_MAX = 32
"""Deepest nesting of parentheses, NOT and unary signs: bounds the parser's recursion."""
NODES_MAX = 256
"""Most operators, operands and IN items in one expression: bounds the per-message cost and
the recursion of compiling and evaluating (a tree of N nodes is at most N deep, and runs of
AND or OR are evaluated in a loop; Python allows ~1000 frames)."""
LIKE_PATTERN_CHARS_MAX = 256
"""Longest LIKE pattern, in characters: a match costs at most O(len(value) * pattern)."""
IN_ITEMS_MAX = 128
"""Most items in one IN list."""

INTEGER_MIN = -(2**63)
"""Smallest integer a constant or an arithmetic result may be (AMQP long)..."""
INTEGER_MAX = 2**64 - 1
"""...and the largest (AMQP ulong); beyond these a constant is refused, a result unknown."""

assert TEXT_CHARS_MAX < 4300, "int() refuses longer digit strings (sys.int_info)"
assert IN_ITEMS_MAX < NODES_MAX and DEPTH_MAX < NODES_MAX < 900


class SqlError(ValueError):
    """The expression text is not an SQL filter expression this module accepts."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"position {position}: {reason}")
        self.position = position
        """0-based character offset in the expression text where the problem is."""
        self.reason = reason


class Section(enum.Enum):
    """The message sections a field reference can read (FILTEX §6.4.4.4)."""

    HEADER = "header"
    DELIVERY_ANNOTATIONS = "delivery_annotations"
    MESSAGE_ANNOTATIONS = "message_annotations"
    PROPERTIES = "properties"
    APPLICATION_PROPERTIES = "application_properties"
    FOOTER = "footer"


HEADER_FIELDS = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")
"""The header list's fields by position (002 §3.2.1)."""
HEADER_DEFAULTS: Mapping[str, object] = {
    "durable": False,
    "priority": 4,
    "first_acquirer": False,
    "delivery_count": 0,
}
"""What a missing header, or a null header field, means (002 §3.2.1)."""
PROPERTIES_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)
"""The properties list's fields by position (002 §3.2.4)."""

_SECTION_PREFIXES = {
    "header": Section.HEADER,
    "h": Section.HEADER,
    "delivery_annotations": Section.DELIVERY_ANNOTATIONS,
    "d": Section.DELIVERY_ANNOTATIONS,
    "message_annotations": Section.MESSAGE_ANNOTATIONS,
    "m": Section.MESSAGE_ANNOTATIONS,
    "properties": Section.PROPERTIES,
    "p": Section.PROPERTIES,
    "application_properties": Section.APPLICATION_PROPERTIES,
    "a": Section.APPLICATION_PROPERTIES,
    "footer": Section.FOOTER,
    "f": Section.FOOTER,
}
_LIST_FIELDS = {Section.HEADER: HEADER_FIELDS, Section.PROPERTIES: PROPERTIES_FIELDS}


class MessageView(Protocol):
    """What a predicate reads a message through."""

    def field(self, section: Section, name: str) -> object:
        """The field's value, None when absent. Header and properties fields come by the names
        in HEADER_FIELDS / PROPERTIES_FIELDS, header defaults applied; map sections by key."""
        ...


class _Opaque:
    """A present value of a type expressions cannot use (list, map, described, decimal)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE = _Opaque()
"""A field that is present but unusable: not NULL, and unknown in every operation."""


# ---------------------------------------------------------------------------------------------
# Lexer

_Kind = Literal["number", "string", "binary", "field", "keyword", "op", "end"]


@dataclass(frozen=True, slots=True)
class _Token:
    kind: _Kind
    text: str
    """The token as written (keywords upper-cased), for messages."""
    at: int
    end: int
    value: object = None


_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "FALSE", "BETWEEN"}
)
_RESERVED = frozenset(
    {"EXISTS", "NAN", "INF", "LOWER", "UPPER", "LEFT", "RIGHT", "SUBSTRING", "UTC", "DATE"}
)
_WHITESPACE = " \t\n\r\f"  # Java's, as JMS §3.8.1.1 says
_DIGITS = "0123456789"
_OPERATORS = ("<>", "!=", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",")
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BINARY = re.compile(r"0[xX]([0-9A-Fa-f]*)")
_WORD = re.compile(r"[^\W\d]\w*")
_NAME = re.compile(r"[^\W\d]\w*(?:-[^\W\d_]\w*)*")  # '-' is not in \w: no backtracking


def _lex(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    n = len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i == n:
            tokens.append(_Token("end", "end of text", n, n))
            return tokens
        token = _lex_one(text, i)
        tokens.append(token)
        i = token.end


def _lex_one(text: str, i: int) -> _Token:
    c = text[i]
    following = text[i + 1 : i + 2]
    if c in "'\"":
        return _string(text, i)
    if c == "[":
        name, end = _delimited(text, i)
        return _Token("field", text[i:end], i, end, (Section.APPLICATION_PROPERTIES, name))
    if c == "0" and following in ("x", "X"):
        return _binary(text, i)
    if c in _DIGITS or (c == "." and following and following in _DIGITS):
        return _number(text, i)
    word = _WORD.match(text, i)
    if word is not None:
        return _word(text, i, word.group())
    for op in _OPERATORS:
        if text.startswith(op, i):
            return _Token("op", op, i, i + len(op), op)
    raise SqlError(i, f"unexpected character {c!r}")


def _string(text: str, start: int) -> _Token:
    quote = text[start]
    parts: list[str] = []
    i = start + 1
    while True:
        close = text.find(quote, i)
        if close < 0:
            raise SqlError(start, f"the string starting here has no closing {quote}")
        parts.append(text[i:close])
        if text[close + 1 : close + 2] != quote:
            end = close + 1
            return _Token("string", text[start:end], start, end, "".join(parts))
        parts.append(quote)  # a doubled quote stands for one
        i = close + 2


def _delimited(text: str, start: int) -> tuple[str, int]:
    """A `[delimited identifier]` at text[start]: (the name, index after the closing ']')."""
    parts: list[str] = []
    i = start + 1
    n = len(text)
    while i < n:
        c = text[i]
        if c in "[]":
            if text[i + 1 : i + 2] == c:  # '[[' and ']]' stand for one bracket
                parts.append(c)
                i += 2
                continue
            if c == "]":
                return "".join(parts), i + 1
            raise SqlError(i, "a '[' inside a delimited identifier is written '[['")
        if ord(c) < 32 or ord(c) == 127:
            raise SqlError(i, "control characters are not permitted in an identifier")
        parts.append(c)
        i += 1
    raise SqlError(start, "the identifier starting here has no closing ']'")


def _binary(text: str, start: int) -> _Token:
    match = _BINARY.match(text, start)
    assert match is not None
    digits, end = match.group(1), match.end()
    if not digits or len(digits) % 2 or (end < len(text) and _is_word_char(text[end])):
        raise SqlError(start, "a binary constant is 0x followed by pairs of hex digits")
    return _Token("binary", match.group(), start, end, bytes.fromhex(digits))


def _number(text: str, start: int) -> _Token:
    match = _NUMBER.match(text, start)
    assert match is not None
    written, end = match.group(), match.end()
    if end < len(text) and (_is_word_char(text[end]) or text[end] == "."):
        raise SqlError(start, f"malformed number {text[start : end + 1]!r}")
    value: int | float
    if written.isdigit():
        value = int(written)
        if value > INTEGER_MAX:
            raise SqlError(start, f"integer {written} is larger than an AMQP ulong ({INTEGER_MAX})")
    else:
        value = float(written)
        if math.isinf(value):
            raise SqlError(start, f"number {written} is out of the range of a double")
    return _Token("number", written, start, end, value)


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _word(text: str, start: int, word: str) -> _Token:
    end = start + len(word)
    folded = word.upper() if word.isascii() else ""  # keywords and sections are ASCII
    if text[end : end + 1] == ".":
        section = _SECTION_PREFIXES.get(folded.lower())
        if section is None:
            rest = _NAME.match(text, end + 1)
            raise SqlError(
                start,
                f"{word!r} is not a section (header/h, delivery_annotations/d, "
                "message_annotations/m, properties/p, application_properties/a, footer/f); "
                "to name an application property containing '.', write it in brackets: "
                f"[{word}.{rest.group() if rest else ''}]",
            )
        return _section_field(text, start, section, end + 1)
    if folded in _KEYWORDS:
        return _Token("keyword", folded, start, end, folded)
    if folded in _RESERVED:
        raise SqlError(
            start,
            f"{folded} is reserved by FILTEX SQL filters and not supported here; to name an "
            f"application property {word!r}, write [{word}]",
        )
    return _Token("field", word, start, end, (Section.APPLICATION_PROPERTIES, word))


def _section_field(text: str, start: int, section: Section, at: int) -> _Token:
    if text[at : at + 1] == "[":
        name, end = _delimited(text, at)
    else:
        match = _NAME.match(text, at)
        if match is None:
            raise SqlError(at, f"expected a field name after {text[start:at]!r}")
        name, end = match.group(), match.end()
    fields = _LIST_FIELDS.get(section)
    if fields is not None:
        name = name.replace("-", "_")
        if name not in fields:
            raise SqlError(
                at,
                f"{section.value} has no field {name!r}; its fields are {', '.join(fields)}",
            )
    return _Token("field", text[start:end], start, end, (section, name))


# ---------------------------------------------------------------------------------------------
# Syntax tree


@dataclass(frozen=True, slots=True)
class Const:
    value: object


@dataclass(frozen=True, slots=True)
class Field:
    section: Section
    name: str


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # '+' | '-'
    operand: Node


@dataclass(frozen=True, slots=True)
class Arithmetic:
    op: str  # '+' | '-' | '*' | '/' | '%'
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # '=' | '<>' | '<' | '<=' | '>' | '>='
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Logic:
    op: str  # 'AND' | 'OR'
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class Like:
    operand: Node
    pattern: LikePattern
    negated: bool


@dataclass(frozen=True, slots=True)
class In:
    operand: Node
    items: tuple[Node, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Between:
    operand: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    negated: bool


Node = Const | Field | Unary | Arithmetic | Compare | Logic | Not | Like | In | Between | IsNull


class LikePattern:
    """A compiled LIKE pattern: '%' any run of characters, '_' any one character.

    The pattern is cut at each '%' into segments; a segment matches exactly as many characters
    as it is long ('_' one, any other one itself). The first segment is anchored at the start,
    the last at the end, and each middle one is taken at its leftmost place after the previous
    one: the leftmost place leaves the most room for the rest, so this finds a match whenever
    one exists, without backtracking. Each segment is a regular expression with no quantifier
    (`re.escape`d characters and '.'), so a search costs at most O(len(value) * len(segment))
    at C speed and no pattern can backtrack catastrophically, as `.*a.*a.*b` would.
    """

    __slots__ = ("_segments", "_widths", "source")

    def __init__(self, source: str, escape: str | None) -> None:
        self.source = source
        segments: list[list[str]] = [[]]
        i = 0
        while i < len(source):
            c = source[i]
            if c == escape:
                if i + 1 == len(source):
                    raise ValueError("the pattern ends with its escape character")
                segments[-1].append(re.escape(source[i + 1]))
                i += 2
                continue
            if c == "%":
                segments.append([])
            else:
                segments[-1].append("." if c == "_" else re.escape(c))
            i += 1
        self._widths = tuple(len(segment) for segment in segments)
        self._segments = tuple(re.compile("".join(s), re.DOTALL) for s in segments)

    def __repr__(self) -> str:
        return f"LikePattern({self.source!r})"

    def matches(self, value: str) -> bool:
        segments, widths = self._segments, self._widths
        if len(segments) == 1:
            return segments[0].fullmatch(value) is not None
        start, end = widths[0], len(value) - widths[-1]
        if start > end or segments[0].match(value) is None:
            return False
        if segments[-1].fullmatch(value, end) is None:
            return False
        for segment, width in zip(segments[1:-1], widths[1:-1], strict=True):
            if width:
                found = segment.search(value, start, end)
                if found is None:
                    return False
                start = found.end()
        return True


# ---------------------------------------------------------------------------------------------
# Parser: recursive descent, one method per grammar rule


_COMPARISONS = frozenset({"=", "<>", "!=", "<", "<=", ">", ">="})


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0
        self.nodes = 0

    # helpers

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def advance(self) -> _Token:
        token = self.tokens[self.i]
        if token.kind != "end":
            self.i += 1
        return token

    def at(self, kind: _Kind, *values: str) -> bool:
        token = self.tokens[self.i]
        return token.kind == kind and (not values or token.value in values)

    def fail(self, expected: str) -> SqlError:
        token = self.peek()
        found = "end of text" if token.kind == "end" else repr(token.text)
        after = f" after {self.tokens[self.i - 1].text!r}" if self.i else ""
        return SqlError(token.at, f"expected {expected}{after}, found {found}")

    def count(self, token: _Token, nodes: int = 1) -> None:
        self.nodes += nodes
        if self.nodes > NODES_MAX:
            raise SqlError(
                token.at,
                f"the expression has more than {NODES_MAX} operators and operands "
                "(sql.NODES_MAX); split the condition or use IN",
            )

    def enter(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > DEPTH_MAX:
            raise SqlError(
                token.at, f"the expression nests deeper than {DEPTH_MAX} levels (sql.DEPTH_MAX)"
            )

    # rules

    def expression(self) -> Node:
        left = self.conjunction()
        while self.at("keyword", "OR"):
            token = self.advance()
            self.count(token)
            left = Logic("OR", left, self.conjunction())
        return left

    def conjunction(self) -> Node:
        left = self.negation()
        while self.at("keyword", "AND"):
            token = self.advance()
            self.count(token)
            left = Logic("AND", left, self.negation())
        return left

    def negation(self) -> Node:
        if not self.at("keyword", "NOT"):
            return self.comparison()
        token = self.advance()
        self.count(token)
        self.enter(token)
        operand = self.negation()
        self.depth -= 1
        return Not(operand)

    def comparison(self) -> Node:
        left = self.sum()
        token = self.peek()
        if token.kind == "op" and token.value in _COMPARISONS:
            self.advance()
            self.count(token)
            right = self.sum()
            if Const(None) in (left, right):
                raise SqlError(
                    token.at,
                    f"a comparison with NULL is never TRUE; write 'IS NULL' or 'IS NOT NULL' "
                    f"instead of {token.text!r} NULL",
                )
            return Compare("<>" if token.value == "!=" else token.text, left, right)
        if self.at("keyword", "IS"):
            return self.is_null(left)
        negated = self.at("keyword", "NOT")
        if negated:
            self.advance()
        if self.at("keyword", "LIKE"):
            return self.like(left, negated)
        if self.at("keyword", "IN"):
            return self.in_list(left, negated)
        if self.at("keyword", "BETWEEN"):
            return self.between(left, negated)
        if negated:
            raise self.fail("LIKE, IN or BETWEEN")
        return left

    def is_null(self, operand: Node) -> Node:
        self.count(self.advance())
        negated = self.at("keyword", "NOT")
        if negated:
            self.advance()
        if not self.at("keyword", "NULL"):
            raise self.fail("NULL")
        self.advance()
        return IsNull(operand, negated)

    def like(self, operand: Node, negated: bool) -> Node:
        self.count(self.advance())
        if not self.at("string"):
            raise self.fail("a quoted pattern")
        pattern = self.advance()
        assert isinstance(pattern.value, str)
        if len(pattern.value) > LIKE_PATTERN_CHARS_MAX:
            raise SqlError(
                pattern.at,
                f"the LIKE pattern is {len(pattern.value)} characters long; at most "
                f"{LIKE_PATTERN_CHARS_MAX} (sql.LIKE_PATTERN_CHARS_MAX)",
            )
        escape = None
        if self.at("keyword", "ESCAPE"):
            self.advance()
            if not self.at("string"):
                raise self.fail("a quoted escape character")
            token = self.advance()
            assert isinstance(token.value, str)
            if len(token.value) != 1:
                raise SqlError(token.at, "the ESCAPE string must be exactly one character")
            escape = token.value
        try:
            compiled = LikePattern(pattern.value, escape)
        except ValueError as err:
            raise SqlError(pattern.at, str(err)) from None
        return Like(operand, compiled, negated)

    def in_list(self, operand: Node, negated: bool) -> Node:
        self.count(self.advance())
        if not self.at("op", "("):
            raise self.fail("'(' starting the IN list")
        self.advance()
        items = [self.sum()]
        while self.at("op", ","):
            comma = self.advance()
            if len(items) == IN_ITEMS_MAX:
                raise SqlError(
                    comma.at, f"the IN list has more than {IN_ITEMS_MAX} items (sql.IN_ITEMS_MAX)"
                )
            items.append(self.sum())
        if not self.at("op", ")"):
            raise self.fail("',' or ')' in the IN list")
        self.advance()
        return In(operand, tuple(items), negated)

    def between(self, operand: Node, negated: bool) -> Node:
        self.count(self.advance())
        low = self.sum()
        if not self.at("keyword", "AND"):
            raise self.fail("AND")
        self.advance()
        return Between(operand, low, self.sum(), negated)

    def sum(self) -> Node:
        left = self.product()
        while self.at("op", "+", "-"):
            token = self.advance()
            self.count(token)
            left = Arithmetic(token.text, left, self.product())
        return left

    def product(self) -> Node:
        left = self.unary()
        while self.at("op", "*", "/", "%"):
            token = self.advance()
            self.count(token)
            left = Arithmetic(token.text, left, self.unary())
        return left

    def unary(self) -> Node:
        if not self.at("op", "+", "-"):
            return self.primary()
        token = self.advance()
        self.count(token)
        self.enter(token)
        operand = self.unary()
        self.depth -= 1
        return Unary(token.text, operand)

    def primary(self) -> Node:
        token = self.peek()
        if token.kind in ("number", "string", "binary"):
            self.count(self.advance())
            return Const(token.value)
        if token.kind == "keyword" and token.value in ("TRUE", "FALSE", "NULL"):
            self.count(self.advance())
            return Const({"TRUE": True, "FALSE": False, "NULL": None}[token.text])
        if token.kind == "field":
            self.count(self.advance())
            assert isinstance(token.value, tuple)
            section, name = token.value
            return Field(section, name)
        if self.at("op", "("):
            self.advance()
            self.enter(token)
            inner = self.expression()
            if not self.at("op", ")"):
                raise self.fail("')'")
            self.advance()
            self.depth -= 1
            return inner
        raise self.fail("a value")


# ---------------------------------------------------------------------------------------------
# Evaluation: the tree compiled to closures. A value is None (NULL or unknown), OPAQUE, bool,
# int, float, str or bytes; a truth value is True, False or None (unknown).

_Eval = Callable[[MessageView], object]
_NUMBERS = frozenset({int, float})
_ORDERED = frozenset({int, float, str, bytes})
_PLAIN = frozenset({type(None), bool, int, float, str, bytes})
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _plain(value: object) -> object:
    """A field value as expressions see it: codec/proton subclasses (Symbol, ULong, Timestamp,
    proton.symbol…) become their base type, a uuid its 16 bytes, anything else OPAQUE."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, int):  # not bool: bool has no subclasses
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, uuid.UUID):
        return value.bytes
    return OPAQUE


def _compare(op: str, a: object, b: object) -> bool | None:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta in _ORDERED or (ta is bool and op in ("=", "<>")):
            return _COMPARE[op](a, b)
        return None
    if ta in _NUMBERS and tb in _NUMBERS:
        return _COMPARE[op](a, b)
    return None


def _integer(value: int) -> int | None:
    return value if INTEGER_MIN <= value <= INTEGER_MAX else None


def _arithmetic(op: str, a: Any, b: Any) -> object:
    if type(a) not in _NUMBERS or type(b) not in _NUMBERS:
        return None
    if op == "+":
        result = a + b
    elif op == "-":
        result = a - b
    elif op == "*":
        result = a * b
    elif b == 0:
        return None  # '/' and '%'
    elif type(a) is int and type(b) is int:
        quotient = abs(a) // abs(b)
        quotient = quotient if (a < 0) == (b < 0) else -quotient  # toward zero, as Java
        result = quotient if op == "/" else a - b * quotient
    elif op == "/":
        result = a / b
    else:
        try:
            result = math.fmod(a, b)
        except ValueError:  # fmod(inf, x)
            return None
    return _integer(result) if type(result) is int else result


def _truth(value: object) -> bool | None:
    return value if type(value) is bool else None


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _not(a: bool | None) -> bool | None:
    return None if a is None else not a


def _is_constant(node: Node) -> bool:
    match node:
        case Field():
            return False
        case Const():
            return True
        case Unary() | Not() | IsNull() | Like():
            return _is_constant(node.operand)
        case Arithmetic() | Compare() | Logic():
            return _is_constant(node.left) and _is_constant(node.right)
        case In():
            return _is_constant(node.operand) and all(map(_is_constant, node.items))
        case Between():
            return all(map(_is_constant, (node.operand, node.low, node.high)))


def _compile(node: Node) -> _Eval:
    evaluate = _compile_node(node)
    if isinstance(node, Const) or not _is_constant(node):
        return evaluate
    value = evaluate(_NO_MESSAGE)  # constant folding: `-5`, `2 * 3`
    return lambda view: value


def _compile_node(node: Node) -> _Eval:
    match node:
        case Const(value):
            return lambda view: value
        case Field(section, name):
            return lambda view: _plain(view.field(section, name))
        case Unary(op, operand):
            return _compile_unary(op, _compile(operand))
        case Arithmetic(op, left, right):
            lhs, rhs = _compile(left), _compile(right)
            return lambda view: _arithmetic(op, lhs(view), rhs(view))
        case Compare(op, left, right):
            lhs, rhs = _compile(left), _compile(right)
            return lambda view: _compare(op, lhs(view), rhs(view))
        case Logic(op):
            operands = tuple(map(_compile, _chain(node, op)))
            return _compile_all(operands) if op == "AND" else _compile_any(operands)
        case Not(operand):
            inner = _compile(operand)
            return lambda view: _not(_truth(inner(view)))
        case Like(operand, pattern, negated):
            return _compile_like(_compile(operand), pattern, negated)
        case In(operand, items, negated):
            return _compile_in(_compile(operand), tuple(map(_compile, items)), negated)
        case Between(operand, low, high, negated):
            return _compile_between(_compile(operand), _compile(low), _compile(high), negated)
        case IsNull(operand, negated):
            inner = _compile(operand)
            return lambda view: (inner(view) is None) is not negated
    raise AssertionError(node)


def _compile_unary(op: str, inner: _Eval) -> _Eval:
    def evaluate(view: MessageView) -> object:
        value: Any = inner(view)
        if type(value) not in _NUMBERS:
            return None
        return value if op == "+" else (_integer(-value) if type(value) is int else -value)

    return evaluate


def _chain(node: Logic, op: str) -> list[Node]:
    """The operands of a run of one logical operator, `a AND b AND c` (however parenthesized),
    in order: evaluated in a loop, so a long chain costs no recursion."""
    operands: list[Node] = []
    pending: list[Node] = [node]
    while pending:
        item = pending.pop()
        if isinstance(item, Logic) and item.op == op:
            pending += (item.right, item.left)
        else:
            operands.append(item)
    return operands


def _compile_all(operands: tuple[_Eval, ...]) -> _Eval:
    """AND over the operands, left to right, stopping at the first FALSE (JMS table 3-4): the
    sections only later operands read are not read then."""

    def evaluate(view: MessageView) -> bool | None:
        result: bool | None = True
        for operand in operands:
            value = _truth(operand(view))
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return evaluate


def _compile_any(operands: tuple[_Eval, ...]) -> _Eval:
    """OR over the operands, left to right, stopping at the first TRUE (JMS table 3-5)."""

    def evaluate(view: MessageView) -> bool | None:
        result: bool | None = False
        for operand in operands:
            value = _truth(operand(view))
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return evaluate


def _compile_like(inner: _Eval, pattern: LikePattern, negated: bool) -> _Eval:
    def evaluate(view: MessageView) -> bool | None:
        value = inner(view)
        if type(value) is not str:
            return None
        return pattern.matches(value) is not negated

    return evaluate


def _compile_in(inner: _Eval, items: tuple[_Eval, ...], negated: bool) -> _Eval:
    def evaluate(view: MessageView) -> bool | None:
        value = inner(view)
        found: bool | None = False
        for item in items:
            equal = _compare("=", value, item(view))
            if equal:
                return not negated
            if equal is None:
                found = None
        return found if found is None else negated

    return evaluate


def _compile_between(inner: _Eval, low: _Eval, high: _Eval, negated: bool) -> _Eval:
    def evaluate(view: MessageView) -> bool | None:
        value = inner(view)
        within = _and(_compare(">=", value, low(view)), _compare("<=", value, high(view)))
        return _not(within) if negated else within

    return evaluate


class _NoMessage:
    """The view constant folding evaluates with: a constant reads no field."""

    def field(self, section: Section, name: str) -> object:
        raise AssertionError(f"constant expression read {section.value}.{name}")


_NO_MESSAGE = _NoMessage()


def _sections(node: Node) -> Iterator[Section]:
    match node:
        case Field(section):
            yield section
        case Const():
            pass
        case Unary() | Not() | IsNull() | Like():
            yield from _sections(node.operand)
        case Arithmetic() | Compare() | Logic():
            yield from _sections(node.left)
            yield from _sections(node.right)
        case In():
            for child in (node.operand, *node.items):
                yield from _sections(child)
        case Between():
            for child in (node.operand, node.low, node.high):
                yield from _sections(child)


@dataclass(frozen=True, slots=True, eq=False)
class Predicate:
    """A parsed SQL filter expression; `parse` makes one."""

    text: str
    tree: Node
    sections: frozenset[Section]
    """The sections the expression reads: the caller need decode no other."""
    _evaluate: _Eval

    def matches(self, view: MessageView) -> bool:
        """True when the expression is TRUE for the message (FALSE and unknown do not match).
        Never raises on message content: a field that cannot be used is unknown."""
        return self._evaluate(view) is True


def parse(text: str) -> Predicate:
    """Parse an SQL filter expression; SqlError (with `.position`) if it is not one."""
    if len(text) > TEXT_CHARS_MAX:
        raise SqlError(
            TEXT_CHARS_MAX,
            f"the expression is {len(text)} characters long; at most {TEXT_CHARS_MAX} "
            "(sql.TEXT_CHARS_MAX)",
        )
    parser = _Parser(_lex(text))
    tree = parser.expression()
    if not parser.at("end"):
        raise parser.fail("AND, OR or the end of the expression")
    return Predicate(text, tree, frozenset(_sections(tree)), _compile(tree))


# ---------------------------------------------------------------------------------------------
# StoredMessageView: fields of stored message bytes, each section decoded on first use

_SECTION_CODES = {
    Section.HEADER: sections.HEADER,
    Section.MESSAGE_ANNOTATIONS: sections.MESSAGE_ANNOTATIONS,
    Section.PROPERTIES: sections.PROPERTIES,
    Section.APPLICATION_PROPERTIES: sections.APPLICATION_PROPERTIES,
    Section.FOOTER: sections.FOOTER,
}
_COMPOUND = frozenset({0x00, 0x45, 0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0})
"""Constructors of described, list, map and array values: OPAQUE, skipped, never decoded."""
_DECIMALS = frozenset({0x74, 0x84, 0x94})
"""decimal32/64/128: the codec reads them as bytes, which would pass for binary: OPAQUE."""
_U32 = struct.Struct(">I")
_NOT_DECODED = object()


class _Unreadable(ValueError):
    """A section's bytes do not decode (a producer's malformed value inside it)."""


class StoredMessageView:
    """A MessageView over a stored message (the bytes the log keeps: no delivery-annotations
    section, `sections.scan_incoming`) and the delivery annotations the broker generates for
    its delivery. A section is located (one step per section) and decoded on the first read of
    one of its fields, then kept; the others are never touched. A section whose content does
    not decode reads as OPAQUE in every field, so a malformed message matches no comparison
    and `matches` does not raise."""

    __slots__ = ("_broken", "_decoded", "_delivery_annotations", "_spans", "_stored", "_walk")

    def __init__(self, stored: bytes | memoryview, delivery_annotations: Mapping[str, Any]) -> None:
        self._stored = stored
        self._delivery_annotations = delivery_annotations
        self._decoded: dict[Section, Mapping[str, object] | None] = {}
        self._spans: dict[int, tuple[int, int]] = {}
        self._walk = (0, 0)  # (next section's index, last section code seen)
        self._broken = False

    def field(self, section: Section, name: str) -> object:
        if section is Section.DELIVERY_ANNOTATIONS:
            return self._delivery_annotations.get(name)
        fields = self._decoded.get(section, _NOT_DECODED)
        if fields is _NOT_DECODED:
            fields = self._decode(section)
            self._decoded[section] = fields
        if fields is None:
            return OPAQUE
        assert isinstance(fields, Mapping)
        return fields.get(name)

    def _decode(self, section: Section) -> Mapping[str, object] | None:
        """The section's fields by name; None when its bytes do not decode."""
        code = _SECTION_CODES[section]
        try:
            span = self._span(code)
            if span is None:
                return HEADER_DEFAULTS if section is Section.HEADER else {}
            return _decode_section(self._stored, section, *span)
        except (_Unreadable, codec.DecodeError):
            return None

    def _span(self, code: int) -> tuple[int, int] | None:
        """(start, end) of the first section with this code, walking only as far as needed."""
        stored = self._stored
        at, last = self._walk
        while last < code and at < len(stored) and not self._broken:
            found = sections.section_code(stored, at)
            try:
                end = codec.skip(stored, at)
            except codec.DecodeError:
                found = None
            if found is None:  # scan_incoming checked this at ingress: not expected
                self._broken = True
                break
            self._spans.setdefault(found, (at, end))
            at, last = end, found
            self._walk = (at, last)
        span = self._spans.get(code)
        if span is None and self._broken:
            raise _Unreadable(f"the stored message does not read as sections from byte {at}")
        return span


def _decode_section(
    stored: bytes | memoryview, section: Section, start: int, end: int
) -> Mapping[str, object]:
    """The fields of the section at stored[start:end] (`00 <descriptor> <value>`)."""
    body = memoryview(stored)[:end]  # no copy; the section's items must end inside it
    at = codec.skip(body, start + 1)  # past the descriptor
    names = _LIST_FIELDS.get(section)
    if names is not None:
        values = dict(zip(names, _items(body, at, list_=True), strict=False))
        if section is Section.HEADER:
            return {**HEADER_DEFAULTS, **{k: v for k, v in values.items() if v is not None}}
        return values
    items = _items(body, at, list_=False)
    fields: dict[str, object] = {}
    for key, value in zip(items, items, strict=True):  # a map's keys and values alternate
        if isinstance(key, str):
            fields[key] = value
    return fields


def _items(body: memoryview, at: int, *, list_: bool) -> Iterator[object]:
    """The plain values of the list (list_) or map (keys and values in turn) at body[at]."""
    constructor = body[at]
    if constructor in (0x40, 0x45):  # null, list0: no fields
        return
    if constructor == (0xC0 if list_ else 0xC1):
        count, i = body[at + 2], at + 3
    elif constructor == (0xD0 if list_ else 0xD1):
        count, i = _U32.unpack_from(body, at + 5)[0], at + 9
    else:
        raise _Unreadable(f"section value is not a {'list' if list_ else 'map'}")
    if not list_ and count % 2:
        raise _Unreadable(f"map with an odd item count {count}")
    end = codec.skip(body, at)
    assert end == len(body), (end, len(body))  # the value is the last thing in its section
    for _ in range(count):
        if i >= end:  # each item takes a byte at least: a bad count ends here, not at 2**32
            raise _Unreadable("compound holds fewer items than its count")
        constructor = body[i]
        if constructor in _COMPOUND or constructor in _DECIMALS:
            i = codec.skip(body, i)
            yield OPAQUE
        else:
            value, i = codec.decode_at(body, i)  # bounds-checked against the section's end
            yield _plain(value)
