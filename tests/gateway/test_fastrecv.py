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


_DATA_OFFSETS = st.sampled_from([2, 2, 2, 3, 200, 250, 254, 255])
"""Frame data offsets (4-byte words): mostly none extended, some with an extended header of up
to 1012 bytes (core §2.3.1), which leaves a frame's body a few bytes in the guard's first
1024 (what the guard read before `inbound.head_bytes`)."""


def _cut_short(raw: bytes, keep: int) -> bytes:
    """The frame with its size cut to `keep` bytes of body: a performative cut short."""
    doff = raw[4]
    return struct.pack(">I", 4 * doff + keep) + raw[4 : 4 * doff + keep]


@st.composite
def _guard_session(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A few links attached (either role; channels and handles inside and past the C scan's
    table), then transfers on them — mostly format 0, some not, some on a link the client
    receives on, some on no link, some cut short by their frame's size — with detaches, ends,
    heartbeats, and maybe junk at the end; frames with extended headers among them. With the
    places to cut it into reads: anywhere, and often where a frame's head ends."""
    links = draw(
        st.lists(
            st.tuples(st.sampled_from([0, 1, 16]), st.sampled_from([0, 1, 256]), st.booleans()),
            min_size=1,
            max_size=4,
        )
    )
    out = [
        frame("attach", [f"l{c}-{h}", uint(h), r], channel=c, data_offset=draw(_DATA_OFFSETS))
        for c, h, r in links
    ]
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["transfer"] * 6 + ["other", "short", "detach", "end", "beat"]))
        c, h, _r = draw(st.sampled_from(links))
        doff = draw(_DATA_OFFSETS)
        if kind in ("transfer", "short"):
            delivery = draw(st.integers(0, 2**32 - 1))
            fmt = draw(st.sampled_from([0, 0, 0, 1, 0x80013700]))
            body = b"\x00Sw\xa1\x01x" + b"y" * draw(st.integers(0, 1500))
            fields = [uint(h), uint(delivery), b"t%d" % delivery, uint(fmt), False]
            raw = frame("transfer", fields, channel=c, payload=body, data_offset=doff)
            if kind == "short":
                raw = _cut_short(raw, draw(st.integers(0, 24)))
            out.append(raw)
        elif kind == "other":  # a transfer on a handle never attached
            fields = [uint(9), uint(1), b"t", uint(0), False]
            out.append(frame("transfer", fields, channel=c, data_offset=doff))
        elif kind == "detach":
            out.append(frame("detach", [uint(h), True], channel=c, data_offset=doff))
        elif kind == "end":
            out.append(frame("end", [], channel=c, data_offset=doff))
        else:
            out.append(struct.pack(">IBBH", 4 * doff, doff, 0, 0) + b"\xee" * (4 * doff - 8))
    if draw(st.booleans()):
        out.append(draw(st.binary(min_size=1, max_size=40)))  # anything at all
    stream = PROTOCOL_HEADER + b"".join(out)
    starts = [len(PROTOCOL_HEADER)]
    for raw in out:
        starts.append(starts[-1] + len(raw))
    near_a_head = st.builds(
        lambda start, offset: start + offset,
        st.sampled_from(starts),
        st.one_of(
            st.integers(0, 12),
            st.integers(1000, 1040),  # where HEAD_BYTES ends, with or without a header
            st.integers(2030, 2050),  # where the longest head ends (inbound.head_bytes)
        ),
    )
    cuts = draw(st.lists(st.one_of(near_a_head, st.integers(0, len(stream))), max_size=12))
    return stream, sorted({c for c in cuts if 0 < c < len(stream)})


def _feed_all(stream: bytes, cuts: list[int], use_c: bool) -> tuple[object, ...]:
    assert native is not None
    guard = InboundGuard(scan=native.scan_transfers if use_c else None)
    problems = []
    start = 0
    for end in [*cuts, len(stream)]:
        problems += [(start + p.cut, p) for p in guard.feed(stream[start:end])]
        start = end
    return problems, guard.links, guard.skip, guard.head, guard.failed, bytes(guard.senders)


def _found(fed: tuple[object, ...]) -> tuple[object, ...]:
    """What was found, whatever the reads: the problems without their positions (a problem in
    a frame whose head came in pieces is placed at the start of the read that completed it),
    the links, whether the guard failed."""
    problems, links, _skip, _head, failed, senders = fed
    assert isinstance(problems, list)
    found = [(p.kind, p.description, p.link_name, p.client_receives) for _, p in problems]
    return found, links, failed, senders


@settings(max_examples=500, deadline=None)
@given(_guard_session())
def test_the_guard_finds_the_same_with_the_c_scan_as_without(
    session: tuple[bytes, list[int]],
) -> None:
    """Problems (where and what), the links known, and the state left between reads; and the
    same as the whole stream fed in one read, wherever it is cut. Never an exception."""
    stream, cuts = session
    with_c = _feed_all(stream, cuts, use_c=True)
    assert with_c == _feed_all(stream, cuts, use_c=False)
    assert _found(with_c) == _found(_feed_all(stream, [], use_c=False))


def _long_headed_transfer(handle: int, message_format: int = 0, keep: int | None = None) -> bytes:
    """A transfer with the longest extended header (data offset 255: 1012 bytes, core §2.3.1),
    so its performative starts 4 bytes before the guard's first 1024; `keep`: its body cut to
    that many bytes by the frame's size."""
    fields = [uint(handle), uint(7), b"tag-7", uint(message_format), False]
    payload = b"\x00Sw\xa1\x05hello" + b"x" * 2000
    raw = frame("transfer", fields, payload=payload, data_offset=255)
    return raw if keep is None else _cut_short(raw, keep)


@pytest.mark.parametrize(
    ("transfer", "found"),
    [
        (_long_headed_transfer(0), []),
        (_long_headed_transfer(0, message_format=3), ["format"]),
        (_long_headed_transfer(1), ["role"]),
        (_long_headed_transfer(0, keep=14), ["frame"]),  # cut after the handle
        (_long_headed_transfer(0, keep=10), ["frame"]),  # cut inside the list's count
    ],
    ids=["plain", "format", "role", "cut-short", "cut-in-list"],
)
@pytest.mark.parametrize("use_c", [True, False], ids=["c", "python"])
def test_an_extended_header_is_read_past_at_every_cut(
    transfer: bytes, found: list[str], use_c: bool
) -> None:
    """A frame's head is its header, its extended header and 1024 bytes of its body. Before,
    it was 1024 bytes in all: a long extended header left the performative past the head, so
    the guard raised struct.error or IndexError out of `feed` when a read ended at the head's
    end (the C scan too: it handed the frame to the Python step, which read past the read),
    and read a list32 transfer's fields as an empty list when its head came whole: a transfer
    of another format, or on the client's receiving link, went to proton unchecked."""
    stream = PROTOCOL_HEADER + frame("attach", ["p", uint(0), False])
    stream += frame("attach", ["c", uint(1), True])
    at = len(stream)
    stream += transfer + frame("detach", [uint(0), True])
    whole = _feed_all(stream, [], use_c)
    assert [p.kind for _, p in whole[0]] == found
    for cut in range(at + 1, at + min(len(transfer), 1100)):
        assert _found(_feed_all(stream, [cut], use_c)) == _found(whole), cut
    if found == ["frame"]:
        assert "runs past the frame's end" in whole[0][0][1].description


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
