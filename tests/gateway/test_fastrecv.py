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
from proton import uint
from spate.core import filtering
from spate.gateway import fastsend, sections
from spate.gateway.inbound import PROTOCOL_HEADER, InboundGuard
from support.pump import frame

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


# -- the inbound guard's C scan (`scan_transfers`) ------------------------------------------------


@st.composite
def _guard_session(draw: st.DrawFn) -> bytes:
    """A few links attached (either role; channels and handles inside and past the C scan's
    table), then transfers on them — mostly format 0, some not, some on a link the client
    receives on, some on no link — with detaches, ends, heartbeats, and maybe junk at the end."""
    links = draw(
        st.lists(
            st.tuples(st.sampled_from([0, 1, 16]), st.sampled_from([0, 1, 256]), st.booleans()),
            min_size=1,
            max_size=4,
        )
    )
    out = [frame("attach", [f"l{c}-{h}", uint(h), r], channel=c) for c, h, r in links]
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["transfer"] * 6 + ["other", "detach", "end", "beat"]))
        c, h, _r = draw(st.sampled_from(links))
        if kind == "transfer":
            delivery = draw(st.integers(0, 2**32 - 1))
            fmt = draw(st.sampled_from([0, 0, 0, 1, 0x80013700]))
            body = b"\x00Sw\xa1\x01x" + b"y" * draw(st.integers(0, 1500))
            fields = [uint(h), uint(delivery), b"t%d" % delivery, uint(fmt), False]
            out.append(frame("transfer", fields, channel=c, payload=body))
        elif kind == "other":  # a transfer on a handle never attached
            out.append(frame("transfer", [uint(9), uint(1), b"t", uint(0), False], channel=c))
        elif kind == "detach":
            out.append(frame("detach", [uint(h), True], channel=c))
        elif kind == "end":
            out.append(frame("end", [], channel=c))
        else:
            out.append(b"\x00\x00\x00\x08\x02\x00\x00\x00")
    if draw(st.booleans()):
        out.append(draw(st.binary(min_size=1, max_size=40)))  # anything at all
    return PROTOCOL_HEADER + b"".join(out)


def _feed_all(stream: bytes, cuts: list[int], use_c: bool) -> tuple[object, ...]:
    assert native is not None
    guard = InboundGuard(scan=native.scan_transfers if use_c else None)
    problems = []
    start = 0
    for end in [*sorted(set(cuts)), len(stream)]:
        problems += [(start + p.cut, p) for p in guard.feed(stream[start:end])]
        start = max(start, end)
    return problems, guard.links, guard.skip, guard.head, guard.failed, bytes(guard.senders)


@settings(max_examples=500, deadline=None)
@given(_guard_session(), st.lists(st.integers(0, 40_000), max_size=12))
def test_the_guard_finds_the_same_with_the_c_scan_as_without(
    stream: bytes, cuts: list[int]
) -> None:
    """Problems (where and what), the links known, and the state left between reads."""
    cuts = [c for c in cuts if c < len(stream)]
    assert _feed_all(stream, cuts, use_c=True) == _feed_all(stream, cuts, use_c=False)


def test_the_c_scan_passes_over_producer_transfers_only() -> None:
    """Held to what it must skip: a test of the scan itself, not only of agreement."""
    assert native is not None
    senders = bytearray(16 * 256)
    senders[1 * 256 + 3] = 1  # channel 1, handle 3: the client sends
    ok = frame(
        "transfer",
        [uint(3), uint(9), b"t", uint(0), False],
        channel=1,
        payload=b"\x00Sw\xb0\x00\x00\x07\xd0" + b"z" * 2000,  # longer than a frame head
    )
    other_handle = frame("transfer", [uint(4), uint(9), b"t", uint(0), False], channel=1)
    wrong_format = frame("transfer", [uint(3), uint(9), b"t", uint(1), False], channel=1)
    assert native.scan_transfers(ok * 3, 0, senders) == (3 * len(ok), 0)
    assert native.scan_transfers(ok + other_handle, 0, senders) == (len(ok), 0)
    assert native.scan_transfers(ok + wrong_format, 0, senders) == (len(ok), 0)
    assert native.scan_transfers(ok[:-2], 0, senders) == (len(ok) - 2, 2)  # the rest skipped
    assert native.scan_transfers(ok[:7], 0, senders) == (0, 0)  # no whole frame head
