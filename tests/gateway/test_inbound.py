"""spate.gateway.inbound: the guard that reads frame heads before proton (core §2.3 framing,
§2.7.3 attach, §2.7.5 transfer message-format), fed whole, byte by byte and in random cuts."""

from __future__ import annotations

import random

import pytest
from proton import uint
from spate.gateway.inbound import HEAD_BYTES, PROTOCOL_HEADER, InboundGuard, Problem
from support.pump import frame

HEARTBEAT = b"\x00\x00\x00\x08\x02\x00\x00\x00"


def attach(name: str, handle: int, *, client_receives: bool, channel: int = 0) -> bytes:
    return frame("attach", [name, uint(handle), client_receives], channel=channel)


def transfer(handle: int, delivery_id: int, message_format: int = 0, channel: int = 0) -> bytes:
    return frame(
        "transfer",
        [uint(handle), uint(delivery_id), b"tag-%d" % delivery_id, uint(message_format), False],
        channel=channel,
        payload=b"\x00Sw\xa1\x05hello" + b"x" * 200,
    )


def feed_in_cuts(stream: bytes, cuts: list[int]) -> list[tuple[int, Problem]]:
    """Feeds `stream` split at `cuts`; returns (absolute position of cut, problem)."""
    guard = InboundGuard()
    out = []
    start = 0
    for end in [*cuts, len(stream)]:
        for problem in guard.feed(stream[start:end]):
            out.append((start + problem.cut, problem))
        start = end
    return out


def session(*frames: bytes) -> bytes:
    opening = frame("open", ["client"]) + frame("begin", [None, uint(0), uint(100), uint(100)])
    return PROTOCOL_HEADER + opening + b"".join(frames)


def test_plain_traffic_has_no_problems() -> None:
    stream = session(
        attach("producer", 0, client_receives=False),
        *(transfer(0, i) for i in range(50)),
        HEARTBEAT,
        attach("consumer", 1, client_receives=True),
        frame("flow", [uint(0), uint(100), uint(0), uint(100), uint(1), uint(0), uint(10)]),
        frame("detach", [uint(0), True]),
    )
    assert feed_in_cuts(stream, []) == []
    assert feed_in_cuts(stream, list(range(1, len(stream)))) == []  # byte by byte


@pytest.mark.parametrize("seed", range(20))
def test_problems_are_found_wherever_the_reads_are_cut(seed: int) -> None:
    rng = random.Random(seed)
    bad_format = transfer(0, 7, message_format=0x80013700)
    wrong_role = transfer(1, 0)
    before = session(
        attach("producer", 0, client_receives=False),
        transfer(0, 6),
        attach("consumer", 1, client_receives=True),
    )
    stream = before + bad_format + wrong_role
    cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 40)))
    found = feed_in_cuts(stream, cuts)
    assert [p.kind for _, p in found] == ["format", "role"]
    (at_format, format_problem), (at_role, role_problem) = found
    assert format_problem.link_name == "producer" and "0x80013700" in format_problem.description
    assert role_problem.link_name == "consumer" and role_problem.client_receives
    # acted on before the offending frame is complete: nothing of it went to proton whole
    assert at_format < len(before) + len(bad_format)
    assert at_role < len(before) + len(bad_format) + len(wrong_role)
    assert at_format >= max([c for c in cuts if c <= len(before)], default=0)


def test_handles_are_per_channel_and_forgotten_on_detach_and_end() -> None:
    stream = session(
        attach("a", 0, client_receives=True, channel=0),
        transfer(0, 0, channel=1),  # handle 0 of channel 1 is not attached: proton's business
        frame("detach", [uint(0), True]),
        attach("b", 0, client_receives=False, channel=0),
        transfer(0, 1, message_format=5),
        frame("end", [], channel=0),
        transfer(0, 2, message_format=5),  # handle gone with the session
    )
    found = feed_in_cuts(stream, [])
    assert [(p.kind, p.link_name) for _, p in found] == [("format", "b")]


def test_an_undecodable_frame_is_a_framing_problem_and_ends_the_scan() -> None:
    junk = b"\x00\x00\x00\x0c\x02\x00\x00\x00\xde\xad\xbe\xef"
    stream = session(attach("a", 0, client_receives=False)) + junk + transfer(0, 0, 9)
    found = feed_in_cuts(stream, [len(stream) - 3])
    assert [p.kind for _, p in found] == ["frame"]
    assert found[0][0] == len(stream) - len(junk) - len(transfer(0, 0, 9))
    for bad in (
        b"\x00\x00\x00\x04\x02\x00\x00\x00",  # size below the header
        b"\x00\x00\x00\x0c\x01\x00\x00\x00\x00\x53\x10\x45",  # data offset 1
        b"\x00\x00\x00\x0c\x02\x01\x00\x00\x00\x53\x40\x45",  # a SASL frame after SASL
        b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x30\x45",  # performative 0x30
    ):
        assert [p.kind for _, p in feed_in_cuts(PROTOCOL_HEADER + bad, [])] == ["frame"], bad


def test_long_attach_names_and_large_transfers() -> None:
    name = "n" * 3000  # beyond HEAD_BYTES: the name is cut, the handle cannot be read
    big = transfer(0, 0, message_format=3)
    stream = session(attach(name, 0, client_receives=False), big)
    assert len(attach(name, 0, client_receives=False)) > HEAD_BYTES
    # an attach the guard cannot read within its head is left to proton, unchecked
    assert feed_in_cuts(stream, []) == feed_in_cuts(stream, [len(stream) - 10]) == []
    huge = frame(
        "transfer",
        [uint(0), uint(1), b"t", uint(0)],
        payload=b"\x00Su\xb0" + (100_000).to_bytes(4, "big") + b"y" * 100_000,
    )
    stream = session(attach("p", 0, client_receives=False), huge, transfer(0, 2, 7))
    cuts = list(range(0, len(stream), 4096))[1:]
    assert [p.kind for _, p in feed_in_cuts(stream, cuts)] == ["format"]


def test_ulong_descriptors_are_read_too() -> None:
    # proton encodes small ulong descriptors compactly; this is the long form by hand
    body = b"\x00\x80" + (0x14).to_bytes(8, "big") + b"\xc0\x07\x04\x43\x43\xa0\x00\x52\x02"
    long_transfer = (8 + len(body)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body
    stream = session(attach("p", 0, client_receives=False), long_transfer)
    assert [p.kind for _, p in feed_in_cuts(stream, [])] == ["format"]
