"""Sub-entry batching and compression over AMQP (issue 11, ADR 0017; 004 "Sub-Entry Batching and
Compression"), through python-qpid-proton and rhea, against every broker of the gateway suite
(memory, node, proxy).

Contract (docs/amqp.md "Sub-entries"): a message whose body is one data section holding a
sub-entry (RabbitMQ's layout) and whose message annotations hold `x-opt-spate-sub-entry` = true
is stored as one entry; each message in it has an offset of its own, and a plain consumer
receives them one by one as if they had been published singly. A corrupt or unknown-codec
sub-entry is rejected alone, with a condition that says why.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, symbol, ulong
from spate.client import Consumer
from spate.client.core import SubEntryBatch
from spate.core import filtering, subentry
from support.amqp_clients import (
    LinkProperties,
    RunningGateway,
    blocking,
    da,
    offset_filter,
    receive,
    run_rhea,
    stream_bodies,
    unique,
)

CODECS = list(subentry.CODECS)


def encoded(bodies: list[str]) -> list[bytes]:
    return [Message(body=body).encode() for body in bodies]


def envelope(blob: bytes, **annotations: object) -> Message:
    """A sub-entry as a python-qpid-proton message: one data section, the marker annotation."""
    marks: dict[symbol, object] = {symbol("x-opt-spate-sub-entry"): True}
    marks |= {symbol(k.replace("_", "-")): v for k, v in annotations.items()}
    return Message(body=blob, inferred=True, annotations=marks)


def consume(gateway: RunningGateway, stream: str, count: int, start: object = "first") -> list:
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=500, options=[offset_filter(start)]
        )
        return [(int(da(m, "event-streams-offset")), m.body) for m in receive(receiver, count)]


@pytest.mark.parametrize("codec", CODECS)
def test_a_sub_entry_is_stored_as_one_entry_and_read_one_message_at_a_time(
    gateway: RunningGateway, make_stream: Callable[..., str], codec: str
) -> None:
    stream = make_stream()
    inner = [f'{{"id": {i}, "sensor": "s-17", "value": {i * 1.5}}}' for i in range(5)]
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        assert sender.send(Message(body="before"), error_states=[]).remote_state == 36  # accepted
        blob = subentry.encode(encoded(inner), codec)
        delivery = sender.send(envelope(bytes(blob)), error_states=[])
        assert delivery.remote_state == delivery.ACCEPTED
        sender.send(Message(body="after"), error_states=[])
    expected = ["before", *inner, "after"]
    assert consume(gateway, stream, 7) == list(enumerate(expected))
    # a consumer starting inside the batch gets the messages from there, offsets as if single
    assert consume(gateway, stream, 4, 3) == list(enumerate(expected))[3:]
    assert stream_bodies(gateway, stream, 7) == expected


def test_a_named_producer_s_sub_entry_has_one_publishing_id(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    props = LinkProperties({symbol("spate:producer-name"): "batcher"})
    pid = "x_opt_publishing_id"
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"), options=props)
        for n in range(3):
            blob = subentry.encode(encoded([f"b{n}-{i}" for i in range(4)]), "zstd")
            assert (
                sender.send(envelope(bytes(blob), **{pid: ulong(n)}), error_states=[]).remote_state
                == 36
            )
        again = conn.create_sender(stream, name=unique("tx"), options=props)
        assert again.link.remote_properties[symbol("spate:last-publishing-id")] == 2
        blob = subentry.encode(encoded(["b1-0", "b1-1", "b1-2", "b1-3"]), "zstd")
        assert (
            again.send(envelope(bytes(blob), **{pid: ulong(1)}), error_states=[]).remote_state == 36
        )  # dup
        # without an id, a named link refuses the sub-entry (and goes on)
        refused = again.send(envelope(bytes(blob)), error_states=[])
        assert refused.remote_state == refused.REJECTED
        assert refused.remote.condition.name == "amqp:invalid-field"
    assert stream_bodies(gateway, stream, 12) == [f"b{n}-{i}" for n in range(3) for i in range(4)]


def _corrupt(kind: str) -> bytes:
    blob = bytearray(subentry.encode(encoded(["x" * 50] * 4), "gzip"))
    if kind == "unknown codec":
        blob[0] = 0x80 | 6 << 4
    elif kind == "corrupt data":
        blob[-10] ^= 0xFF  # (bytes 4-9 of a gzip header, mtime and OS, change nothing)
    elif kind == "count mismatch":
        struct.pack_into(">H", blob, 1, 5)
    elif kind == "size mismatch":
        struct.pack_into(">I", blob, 3, struct.unpack_from(">I", blob, 3)[0] - 1)
    elif kind == "over the limit":
        struct.pack_into(">H", blob, 1, 60_000)
    elif kind == "truncated":
        del blob[-5:]
    return bytes(blob)


@pytest.mark.parametrize(
    ("kind", "condition", "words"),
    [
        ("unknown codec", "amqp:invalid-field", "unknown sub-entry codec 6"),
        ("corrupt data", "amqp:decode-error", "gzip data does not decompress"),
        ("count mismatch", "amqp:decode-error", "messages end after 4 of 5"),
        ("size mismatch", "amqp:decode-error", "the header says"),
        ("over the limit", "amqp:invalid-field", "sub_entry_messages_max"),
        ("truncated", "amqp:decode-error", "data bytes"),
    ],
)
def test_a_bad_sub_entry_is_refused_alone_and_the_link_goes_on(
    gateway: RunningGateway,
    make_stream: Callable[..., str],
    kind: str,
    condition: str,
    words: str,
) -> None:
    stream = make_stream()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        sender.send(Message(body="m0"), error_states=[])
        bad = sender.send(envelope(_corrupt(kind)), error_states=[])
        assert bad.remote_state == bad.REJECTED
        assert bad.remote.condition.name == condition
        assert words in bad.remote.condition.description
        good = sender.send(
            envelope(bytes(subentry.encode(encoded(["m1", "m2"]), "lz4"))), error_states=[]
        )
        assert good.remote_state == good.ACCEPTED
    assert consume(gateway, stream, 3) == [(0, "m0"), (1, "m1"), (2, "m2")]


def test_inner_messages_with_delivery_annotations_and_bad_envelopes_are_refused(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    with_da = Message(body="x", instructions={symbol("k"): 1}).encode()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        bad = sender.send(envelope(bytes(subentry.encode([with_da], "none"))), error_states=[])
        assert bad.remote.condition.name == "amqp:invalid-field"
        assert "delivery annotations" in bad.remote.condition.description
        blob = bytes(subentry.encode(encoded(["a", "b"]), "snappy"))
        retired = sender.send(
            envelope(blob, **{"x_opt_spate_filter_values": ["a", None]}), error_states=[]
        )  # a message's filter value is its own x-stream-filter-value, nothing else
        assert retired.remote.condition.name == "amqp:invalid-field"
        assert "x-stream-filter-value" in retired.remote.condition.description
        ok = sender.send(envelope(blob), error_states=[])
        assert ok.remote_state == ok.ACCEPTED
        not_data = Message(body="text", annotations={symbol("x-opt-spate-sub-entry"): True})
        refused = sender.send(not_data, error_states=[])
        assert refused.remote.condition.name == "amqp:decode-error"
    assert stream_bodies(gateway, stream, 2) == ["a", "b"]


def test_spate_client_batches_with_its_envelope(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """SubEntryBatch.envelope (what spate.client sends) is accepted as is."""
    stream = make_stream()
    batch = SubEntryBatch(encoded(["c0", "c1", "c2"]), "zstd")
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        message = Message()
        message.decode(batch.envelope())
        assert sender.send(message, error_states=[]).remote_state == 36
    assert stream_bodies(gateway, stream, 3) == ["c0", "c1", "c2"]


@pytest.mark.parametrize("codec", CODECS)
def test_rhea_publishes_sub_entries_and_consumes_them_one_by_one(
    gateway: RunningGateway, make_stream: Callable[..., str], codec: str
) -> None:
    stream = make_stream()
    blobs = [
        bytes(subentry.encode(encoded([f"r{n}-{i}" for i in range(3)]), codec)).hex()
        for n in range(2)
    ]
    bad = bytearray.fromhex(blobs[0])
    bad[0] = 0x80 | 7 << 4  # codec 7: unknown
    report = run_rhea(
        gateway,
        [
            {"op": "publish", "address": stream, "sub_entries": [blobs[0], bad.hex(), blobs[1]]},
            {
                "op": "consume",
                "address": stream,
                "count": 6,
                "filter": {"f": {"descriptor": 0x200, "type": "string", "value": "first"}},
            },
        ],
    )
    publish, consumed = report["steps"]
    assert publish["outcomes"][0] == "accepted" and publish["outcomes"][2] == "accepted"
    assert publish["outcomes"][1]["condition"] == "amqp:invalid-field"
    assert "unknown sub-entry codec 7" in publish["outcomes"][1]["description"]
    got = [(int(m["offset"]), m["body"]) for m in consumed["messages"]]
    assert got == list(enumerate(f"r{n}-{i}" for n in range(2) for i in range(3)))


AS_IS = symbol("spate:sub-entries")


def test_a_consumer_asking_for_sub_entries_gets_each_whole_and_compressed(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """`spate:sub-entries` = true: the stored sub-entry, byte for byte, in one delivery whose
    offset is its first message's; plain messages around it as usual. A consumer starting
    inside a sub-entry gets the messages from there one by one."""
    stream = make_stream()
    blob = bytes(subentry.encode(encoded([f"z{i}" for i in range(5)]), "zstd"))
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for message in (Message(body="before"), envelope(blob), Message(body="after")):
            assert sender.send(message, error_states=[]).remote_state == 36
        receiver = conn.create_receiver(
            stream,
            name=unique("rx"),
            credit=10,
            options=[offset_filter("first"), LinkProperties({AS_IS: True})],
        )
        assert receiver.link.remote_properties[AS_IS] is True
        got = receive(receiver, 3)
        assert [int(da(m, "event-streams-offset")) for m in got] == [0, 1, 6]
        assert got[0].body == "before" and got[2].body == "after"
        assert got[1].annotations[symbol("x-opt-spate-sub-entry")] is True
        assert bytes(got[1].body) == blob  # never re-encoded on the way
        middle = conn.create_receiver(
            stream,
            name=unique("rx"),
            credit=10,
            options=[offset_filter(3), LinkProperties({AS_IS: True})],
        )
        assert [m.body for m in receive(middle, 4)] == ["z2", "z3", "z4", "after"]


def test_spate_client_unpacks_sub_entries_it_asked_for(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    url = f"amqp://{gateway.host}:{gateway.port}"
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for n, codec in enumerate(CODECS):
            blob = subentry.encode(encoded([f"{codec}-{i}" for i in range(4)]), codec)
            assert sender.send(envelope(bytes(blob)), error_states=[]).remote_state == 36
            sender.send(Message(body=f"single-{n}"), error_states=[])
    expected = [
        body
        for n, c in enumerate(CODECS)
        for body in [*(f"{c}-{i}" for i in range(4)), f"single-{n}"]
    ]
    for as_is in (True, False):
        with Consumer(url, stream, start="first", sub_entries=as_is, credit=8) as consumer:
            events = [consumer.receive(timeout=10) for _ in expected]
        assert [e.offset for e in events] == list(range(len(expected)))
        assert [e.body for e in events] == expected
    with Consumer(url, stream, start=6, sub_entries=True) as consumer:  # inside the second
        assert [consumer.receive(timeout=10).body for _ in range(3)] == [
            "gzip-1",
            "gzip-2",
            "gzip-3",
        ]


def test_named_consumers_get_the_messages_of_sub_entries_one_by_one(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """Offsets are tracked per delivery: a named consumer's link is not given sub-entries whole
    even if it asks (the attach reply does not say it will)."""
    stream = make_stream()
    blob = bytes(subentry.encode(encoded(["n0", "n1", "n2"]), "lz4"))
    with blocking(gateway) as conn:
        conn.create_sender(stream, name=unique("tx")).send(envelope(blob), error_states=[])
        named = LinkProperties({AS_IS: True, symbol("spate:consumer-name"): "reader"})
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=10, options=[offset_filter("first"), named]
        )
        assert AS_IS not in (receiver.link.remote_properties or {})
        assert [m.body for m in receive(receiver, 3)] == ["n0", "n1", "n2"]


def test_the_envelope_parser_reads_the_inner_filter_values_for_the_chunk() -> None:
    """The gateway hands the node each sub-entry's distinct inner filter values (None: some
    message has none) for the chunk's Bloom filter (ADR 0016), read as it checks them."""
    from spate.gateway import subentry as envelopes

    def parse(messages: list[Message]) -> tuple[str | None, ...] | None:
        blob = bytes(subentry.encode([m.encode() for m in messages], "gzip"))
        parsed = envelopes.parse(envelope(blob).encode())
        assert parsed is not None
        return parsed.blob.filter_values

    value = symbol("x-stream-filter-value")
    tagged = [Message(body=i, annotations={value: v}) for i, v in enumerate("bab")]
    assert parse(tagged) == ("a", "b")
    assert parse([*tagged, Message(body="plain")]) == (None, "a", "b")
    assert parse([Message(body="plain")]) == (None,)
    too_long = "x" * (filtering.VALUE_BYTES_MAX + 1)  # no value, as for a message sent singly
    assert parse([Message(body=1, annotations={value: too_long})]) == (None,)


@settings(max_examples=300, deadline=None)
@given(
    cut=st.integers(min_value=0, max_value=400),
    flips=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 255)), max_size=4),
    codec=st.sampled_from(CODECS),
)
def test_the_envelope_parser_refuses_damage_with_a_condition_and_never_crashes(
    cut: int, flips: list[tuple[int, int]], codec: str
) -> None:
    """Fuzz: a sub-entry envelope cut short or with flipped bytes is either still a valid
    sub-entry (parsed whole, every message checked) or refused with an AMQP condition; nothing
    else escapes the parser (the gateway turns a Refused into the rejection of that delivery
    alone)."""
    from spate.gateway import subentry as envelopes

    value = symbol("x-stream-filter-value")
    inner = [Message(body=f"m{i}", annotations={value: f"v{i % 2}"}).encode() for i in range(4)]
    raw = bytearray(envelope(bytes(subentry.encode(inner, codec))).encode())
    for at, xor in flips:
        raw[at % len(raw)] ^= xor
    if cut:
        del raw[len(raw) - cut % len(raw) :]
    try:
        parsed = envelopes.parse(bytes(raw))
    except envelopes.Refused as refused:
        assert refused.condition in ("amqp:decode-error", "amqp:invalid-field")
        assert str(refused)
        return
    if parsed is not None:
        assert parsed.count == len(parsed.messages) >= 1
