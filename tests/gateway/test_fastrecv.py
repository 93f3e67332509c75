"""The producer's C loop (`_fastsend.recv_run`, ADR 0038) decides with C copies of two Python
readers: `sections.is_plain` (the hot path takes a message as it is) and
`filtering.key_search_end` (where an annotation key can be). They must answer as the Python
does for every byte string — a message the C takes that Python would have scanned, or a key it
misses, would store what the slow path would have refused or routed elsewhere. Held to it here
over hand-made layouts and generated ones (hypothesis); the whole producer path with the C loop
and without it runs the same gateway tests (conftest.py: `ingress`)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spate.core import filtering
from spate.gateway import fastsend, sections

native = fastsend.native


def test_the_c_loop_is_built() -> None:
    """CI builds the extension (tools/bootstrap.sh): the C loop is what these tests hold."""
    assert native is not None
    assert native.recv_run and native.skip_events and native.accept_run


def _section(code: int, value: bytes) -> bytes:
    return b"\x00\x53" + bytes([code]) + value


def _binary(body: bytes) -> bytes:
    if len(body) < 256:
        return b"\xa0" + bytes([len(body)]) + body
    return b"\xb0" + struct.pack(">I", len(body)) + body


def _map8(payload: bytes, count: int) -> bytes:
    return b"\xc1" + bytes([len(payload) + 1, count]) + payload


def _map32(payload: bytes, count: int) -> bytes:
    return b"\xd1" + struct.pack(">II", len(payload) + 4, count) + payload


KEY = b"\xa3\x16event-streams-group-key"
HEADER = _section(0x70, b"\xc0\x04\x02\x41\x50\x05")
ANNOTATIONS = _section(0x72, _map8(KEY + b"\xa1\x03abc", 2))
BIG_ANNOTATIONS = _section(0x72, _map32(KEY + b"\xb1" + struct.pack(">I", 1500) + b"k" * 1500, 2))
PROPERTIES = _section(0x73, b"\xc0\x03\x01\xa1\x00")
APP = _section(0x74, _map8(b"\xa1\x01a\x54\x01", 2))
DA = _section(0x71, _map8(b"\xa3\x01x\x40", 2))
FOOTER = _section(0x78, _map8(b"", 0))


def _data(body: bytes) -> bytes:
    return _section(0x75, _binary(body))


LAYOUTS = [
    _data(b"plain"),
    HEADER + _data(b"header"),
    HEADER + ANNOTATIONS + PROPERTIES + APP + _data(b"all but DA"),
    ANNOTATIONS + _data(b"k" * 2000),  # large: the key search stops at the annotations' end
    BIG_ANNOTATIONS + _data(b"b" * 10),
    HEADER + _data(KEY * 100),  # the key only in a large body: not where an annotation can be
    _data(KEY),  # the key in a small body: the whole message is searched
    HEADER + DA + _data(b"delivery annotations"),  # not plain: the DA section is cut
    _data(b"a") + FOOTER,  # not plain: a footer
    _data(b"a") + _section(0x77, b"\x40"),  # two body kinds
    _data(b"a") + _data(b"b"),  # data sections repeat
    _section(0x77, b"\xa1\x03abc"),  # an amqp-value body
    PROPERTIES + HEADER + _data(b"out of order"),
    b"\x00\x80" + b"\x00" * 7 + b"\x75\xa0\x01a",  # a ulong descriptor
    HEADER,  # no body
    _data(b"x")[:-1],  # cut short
    b"",
    _section(0x70, b"\xa1\x02hi") + _data(b"y" * 1100),  # a header that is no list
    _section(0x72, b"\x40") + _data(b"z" * 1100),  # null annotations
    *(  # either side of the size up to which the whole message is searched
        ANNOTATIONS + _data(b"q" * (size - len(ANNOTATIONS) - 8))
        for size in (filtering.SMALL_MESSAGE_BYTES, filtering.SMALL_MESSAGE_BYTES + 1)
    ),
]


@pytest.mark.parametrize("raw", LAYOUTS, ids=range(len(LAYOUTS)))
def test_the_c_readers_answer_as_the_python_ones(raw: bytes) -> None:
    assert native is not None
    assert native.is_plain(raw) == sections.is_plain(raw)
    assert native.key_search_end(raw) == filtering.key_search_end(raw)


_PIECES = st.sampled_from(
    [HEADER, ANNOTATIONS, BIG_ANNOTATIONS, PROPERTIES, APP, DA, FOOTER, _data(b"d" * 40)]
)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    """Sections in any order, a body of any size, then maybe one byte changed or a cut."""
    raw = b"".join(draw(st.lists(_PIECES, max_size=5)))
    raw += _data(draw(st.binary(max_size=3000)))
    raw += b"".join(draw(st.lists(_PIECES, max_size=2)))
    if raw and draw(st.booleans()):
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    if draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


@settings(max_examples=1500, deadline=None)
@given(st.one_of(messages(), st.binary(max_size=2000)))
def test_generated_messages_get_the_same_answers(raw: bytes) -> None:
    assert native is not None
    assert native.is_plain(raw) == sections.is_plain(raw)
    assert native.key_search_end(raw) == filtering.key_search_end(raw)
