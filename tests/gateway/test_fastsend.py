"""The consumer's run sends (`spate.gateway.fastsend`, ADR 0030): the C extension and the Python
fallback put the same bytes on the wire — frames, delivery tags, annotations, settlement — for
every header layout a stored record can have (those the C reads, and those it hands back to
the Python splice one record at a time). Two real proton engines pumped in memory: the
listener's side sends, a client's side grants credit and receives."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from cproton_ffi import ffi, lib
from proton import Collector, Connection, Endpoint, Link, Transport
from spate.gateway import fastsend, sections

_FIELDS = b"\x00\x53\x75\xa0"  # a data section: descriptor, binary8 (length follows)


def data(body: bytes) -> bytes:
    return _FIELDS + bytes([len(body)]) + body


def records() -> list[bytes | memoryview]:
    """Each header layout: none, list0, list8 (empty and with fields), list32 and a list8 whose
    size overruns the record (both handed back to Python), another first section, a
    non-small descriptor, short records, and views into one big buffer (a chunk's)."""
    big = bytearray()
    views: list[tuple[int, int]] = []
    for i in range(5):
        rec = b"\x00\x53\x70\xc0\x04\x02\x41\x50\x05" + data(bytes([i]) * (40 + i))
        views.append((len(big), len(rec)))
        big += struct.pack(">I", len(rec)) + rec
        views[-1] = (views[-1][0] + 4, len(rec))
    chunk = memoryview(bytes(big))
    return [
        data(b"no header"),
        b"\x00\x53\x70\x45" + data(b"list0 header"),
        b"\x00\x53\x70\xc0\x01\x00" + data(b"empty list8 header"),
        b"\x00\x53\x70\xc0\x04\x02\x41\x50\x05" + data(b"durable, priority 5"),
        b"\x00\x53\x70\xd0\x00\x00\x00\x05\x00\x00\x00\x01\x41" + data(b"list32 header"),
        b"\x00\x53\x72\xc1\x01\x00" + data(b"message annotations first"),
        b"\x00\x80\x00\x00\x00\x00\x00\x00\x00\x75\xa0\x03abc",  # ulong descriptor
        *(chunk[at : at + n] for at, n in views),
        data(b"x" * 200) + data(b"y" * 200) + data(b"z" * 200),  # 1 KiB-ish, three sections
        b"\x00\x53\x70\x45",  # a header and nothing else
    ]


class Pair:
    """A sending engine (the listener's side) and a receiving one, pumped in memory."""

    def __init__(self, presettled: bool) -> None:
        self.out = bytearray()
        """Every byte the sending side put on the wire."""
        self.a, self.b = Connection(), Connection()
        self.a.container, self.b.container = "listener", "client"
        self.ta, self.tb = Transport(Transport.SERVER), Transport()
        self.ta.bind(self.a)
        self.tb.bind(self.b)
        self.collector = Collector()
        self.b.collect(self.collector)
        self.b.open()
        session = self.b.session()
        session.open()
        self.receiver = session.receiver("r")
        self.receiver.source.address = "orders"
        if presettled:
            self.receiver.snd_settle_mode = Link.SND_SETTLED
        self.receiver.open()
        self.receiver.flow(1000)
        self.pump()
        self.a.open()
        ssn = self.a.session_head(Endpoint.LOCAL_UNINIT)
        assert ssn is not None
        ssn.open()
        link = self.a.link_head(Endpoint.LOCAL_UNINIT)
        assert link is not None and link.is_sender
        link.source.copy(link.remote_source)
        if presettled:
            link.snd_settle_mode = Link.SND_SETTLED
        link.open()
        self.sender = link
        self.pump()
        assert self.sender.credit == 1000

    def pump(self) -> None:
        for _ in range(10):
            moved = 0
            for src, dst, tap in ((self.ta, self.tb, True), (self.tb, self.ta, False)):
                n = src.pending()
                if n > 0:
                    raw = bytes(src.peek(n) or b"")
                    src.pop(n)
                    if tap:
                        self.out += raw
                    dst.push(raw)
                    moved += n
            if not moved:
                return

    def received(self) -> list[tuple[bytes, bytes, bool]]:
        """(tag, message bytes, settled) of each delivery the client got."""
        got = []
        while True:
            delivery = self.receiver.current
            if delivery is None or delivery.partial:
                return got
            data = self.receiver.recv(delivery.pending) or b""
            tag = lib.pn_delivery_tag(delivery._impl)  # proton's Delivery.tag decodes it
            got.append((bytes(ffi.buffer(tag.start, tag.size)), bytes(data), delivery.settled))
            self.receiver.advance()


def run(use_native: bool, presettled: bool, first_tag: int) -> tuple[bytes, list[Any], int]:
    pair = Pair(presettled)
    sender = fastsend.Sender(use_native=use_native)
    assert (sender.native is not None) == (use_native and fastsend.native is not None)
    prefix, suffix = sections.delivery_annotation_parts(1_700_000_000_123, "3")
    link = pair.sender._impl
    sent = sender.send_run(
        link, fastsend.address(link), records(), 41, first_tag,
        parts=(prefix, suffix), presettled=presettled,
    )  # fmt: skip
    pair.pump()
    return bytes(pair.out), pair.received(), sent


@pytest.mark.parametrize("presettled", [True, False], ids=["presettled", "unsettled"])
@pytest.mark.parametrize("first_tag", [1, (7 << 40) | 12345], ids=["plain", "group-member"])
def test_c_and_python_sends_put_the_same_bytes_on_the_wire(
    presettled: bool, first_tag: int
) -> None:
    wire_c, got_c, sent_c = run(True, presettled, first_tag)
    wire_py, got_py, sent_py = run(False, presettled, first_tag)
    assert wire_c == wire_py
    assert got_c == got_py and sent_c == sent_py
    prefix, suffix = sections.delivery_annotation_parts(1_700_000_000_123, "3")
    expected = sections.splice_run(records(), 41, prefix, suffix)
    assert [message for _, message, _ in got_c] == expected
    assert [tag for tag, _, _ in got_c] == [
        struct.pack("<Q", first_tag + i) for i in range(len(expected))
    ]
    assert {settled for _, _, settled in got_c} == {presettled}
    assert sent_c == sum(map(len, expected))
    for i, message in enumerate(expected):  # the offset each one carries
        assert sections.read_spate_annotations(message) in (None, (41 + i, 1_700_000_000_123, "3"))


def test_an_empty_run_sends_nothing() -> None:
    pair = Pair(True)
    link = pair.sender._impl
    sent = fastsend.Sender().send_run(
        link, fastsend.address(link), [], 0, 1, parts=(b"", b""), presettled=True
    )
    assert sent == 0
    assert pair.sender.unsettled == 0 and pair.sender.queued == 0


def test_the_c_extension_is_built() -> None:
    """tools/bootstrap.sh builds it (tools/build_native.py); the Python sends are the fallback
    of a machine without a compiler, not what CI measures or ships."""
    assert fastsend.native is not None, "run `python tools/build_native.py`"


def test_the_c_sends_hand_back_only_the_layouts_it_does_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The list32 header and the ulong descriptor go through the Python splice, one record
    each; every other record of the run is the C's."""
    careful: list[int] = []
    python_send = fastsend.Sender._send_python

    def counted(self: fastsend.Sender, link: Any, recs: Any, first_offset: int, *rest: Any) -> int:
        careful.extend(range(first_offset, first_offset + len(recs)))
        return python_send(self, link, recs, first_offset, *rest)

    monkeypatch.setattr(fastsend.Sender, "_send_python", counted)
    run(True, True, 1)
    assert careful == [41 + 4, 41 + 6]
