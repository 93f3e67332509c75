"""The gateway's pure modules without sockets: codec, section scanner, filters, SASL, errors."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest
from proton import Data, Described, Message, symbol, timestamp, ulong
from spate.core import limits
from spate.core.backend import OffsetSpec
from spate.core.errors import (
    BrokerError,
    ErrorCode,
    InvalidArgument,
    NotFound,
    NotLeader,
    StorageFailure,
)
from spate.core.ids import NodeId, Offset, PartitionId, StreamName, offset_to_symbol
from spate.gateway import codec, links, sections
from spate.gateway.errors import CONDITIONS, amqp_error
from spate.gateway.filters import parse_filters, parse_sql
from spate.gateway.sasl import AMQP_HEADER, SASL_HEADER, Authenticate, Close, Done, SaslServer, Send
from spate.gateway.tracking import OffsetTracker
from support.memory_broker import MemoryPartition


def proton_encode(value: object) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def test_codec_decodes_what_proton_encodes() -> None:
    value = {
        symbol("a"): Described(ulong(0x200), {symbol("event-streams-offset"): symbol("x")}),
        "b": [1, -2, 3.5, None, True, b"\x00\x01", timestamp(1234)],
        symbol("c"): "é",
    }
    decoded = codec.decode(proton_encode(value))
    assert decoded["a"] == codec.Described(0x200, {"event-streams-offset": "x"})
    assert decoded["b"] == [1, -2, 3.5, None, True, b"\x00\x01", 1234]
    assert isinstance(decoded["b"][6], codec.Timestamp) and isinstance(decoded["a"].value, dict)
    assert decoded["c"] == "é"


def test_codec_encoding_is_read_back_by_proton() -> None:
    value = {
        "partitions": [
            {"partition": codec.Symbol("0"), "x": None, "t": codec.Timestamp(5), "n": 1 << 40}
        ]
    }
    data = Data()
    data.decode(codec.encode(value))
    data.rewind()
    data.next()
    back = data.get_object()
    assert back == {
        "partitions": [{"partition": symbol("0"), "x": None, "t": timestamp(5), "n": 1 << 40}]
    }


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\xa1\x05ab",
        b"\xd1\x00\x00\x00\x09\x00\x00\x00\x02",
        b"\xff",
        b"\xc1\x03\x01\x41",
        # a char past U+10FFFF, and a surrogate (found by the envelope fuzz test: chr() raised
        # ValueError out of the parser)
        b"\x73\x78\x2d\x6f\x70",
        b"\x73\x00\x00\xd8\x00",
    ],
)
def test_codec_rejects_malformed_input(bad: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode(bad)


def test_scanner_strips_incoming_delivery_annotations_and_splices_ours() -> None:
    """002 §3.2: DA are hop-by-hop; the bare message is kept byte for byte."""
    message = Message(body="x", subject="s", annotations={symbol("m"): 1})
    bare = message.encode()
    message.instructions = {symbol("hop"): 1}
    incoming = sections.scan_incoming(message.encode())
    assert incoming.stored == bare and incoming.delivery_annotations is not None
    assert sections.delivery_annotations_map(incoming.delivery_annotations) == {"hop": 1}
    da = sections.encode_delivery_annotations(offset_to_symbol(Offset(7)), 99, "2")
    out = Message()
    out.decode(sections.splice_delivery_annotations(incoming.stored, da))
    assert out.instructions == {
        symbol("event-streams-offset"): symbol(offset_to_symbol(Offset(7))),
        symbol("event-streams-timestamp"): timestamp(99),
        symbol("event-streams-source-partition"): symbol("2"),
    }
    assert out.subject == "s" and out.annotations == {symbol("m"): 1}


def test_scanner_accepts_symbolic_descriptors_and_rejects_bad_sequences() -> None:
    header = b"\x00\xa3\x10amqp:header:list\x45"
    value = b"\x00\xa3\x11amqp:amqp-value:*\xa1\x01x"
    assert sections.scan_incoming(header + value).stored == header + value
    for bad in (value + header, b"\x00\x53\x70\x45", value + value, b"\x00\x53\x77"):
        with pytest.raises(sections.MalformedMessage):
            sections.scan_incoming(bad)


def test_filters_forms() -> None:
    """000 §5.2.1/§5.2.2 and the simple forms."""
    o5 = offset_to_symbol(Offset(5))
    cases = {
        "first": OffsetSpec.first(),
        "last": OffsetSpec.last(),
        "NEXT": OffsetSpec.next(),
        7: OffsetSpec.offset(7),
        -3: OffsetSpec.relative(3),
        codec.Timestamp(1000): OffsetSpec.timestamp(1000),
    }
    for value, spec in cases.items():
        parsed = parse_filters({"k": codec.Described(0x200, value)})
        assert parsed.specs == (spec,) and parsed.accepted_keys == ("k",)
    assert parse_filters({"k": codec.Described(0x200, {"event-streams-offset": o5})}).specs == (
        OffsetSpec.offset(6),
    )
    assert parse_filters({"k": codec.Described(0x200, {"event-streams-timestamp": 10})}).specs == (
        OffsetSpec.timestamp(11),
    )
    assert parse_filters({"rabbitmq:stream-offset-spec": "first"}).specs == (OffsetSpec.first(),)
    assert parse_filters({"other": codec.Described("x:y", 1)}).specs == (OffsetSpec.next(),)
    assert parse_filters(None).accepted_keys == ()
    assert parse_sql(f"d.event-streams-offset >= '{o5}' AND d.event-streams-timestamp > 4") == [
        OffsetSpec.offset(5),
        OffsetSpec.timestamp(5),
    ]
    assert parse_sql("TRUE") == [OffsetSpec.first()]
    assert parse_sql("d.event-streams-offset > '@latest'") == [OffsetSpec.next()]
    for bad in (
        "d.x > 1",
        "d.event-streams-offset = 'a'",
        "TRUE AND",
        "d.event-streams-offset > 5",
        "d.event-streams-timestamp > 'x'",
        "TRUE OR TRUE",
    ):
        with pytest.raises(InvalidArgument):
            parse_sql(bad)


def test_sasl_plain_flow() -> None:
    server = SaslServer(allow_anonymous=False, allow_plain=True)
    first = server.receive(SASL_HEADER)
    assert isinstance(first[0], Send) and first[0].data.startswith(SASL_HEADER)
    assert b"PLAIN" in first[0].data and b"ANONYMOUS" not in first[0].data
    init = codec.encode(codec.Described(codec.ULong(0x41), [codec.Symbol("PLAIN"), b"\0alice\0pw"]))
    frame = (8 + len(init)).to_bytes(4, "big") + b"\x02\x01\x00\x00" + init
    [auth] = server.receive(frame + AMQP_HEADER)
    assert auth == Authenticate("PLAIN", "alice", "pw")
    sent, done = server.outcome("alice")
    assert isinstance(sent, Send) and sent.data.endswith(b"\x50\x00")
    assert done == Done(AMQP_HEADER, "alice")


def test_sasl_refusals() -> None:
    assert isinstance(
        SaslServer(allow_anonymous=False, allow_plain=True).receive(AMQP_HEADER)[-1], Close
    )
    assert isinstance(
        SaslServer(allow_anonymous=True, allow_plain=False).receive(AMQP_HEADER)[0], Done
    )
    oversize = SaslServer(allow_anonymous=True, allow_plain=False)
    assert isinstance(
        oversize.receive(SASL_HEADER + b"\x7f\x00\x00\x00\x02\x01\x00\x00")[-1], Close
    )
    refused = SaslServer(allow_anonymous=True, allow_plain=False)
    refused.receive(SASL_HEADER)
    init = codec.encode(codec.Described(codec.ULong(0x41), [codec.Symbol("ANONYMOUS")]))
    refused.receive((8 + len(init)).to_bytes(4, "big") + b"\x02\x01\x00\x00" + init)
    assert isinstance(refused.outcome(None)[-1], Close)


def test_error_table_covers_every_code() -> None:
    assert set(CONDITIONS) == set(ErrorCode)
    assert amqp_error(NotFound("x")).condition == "amqp:not-found"
    assert amqp_error(StorageFailure("disk")).info == {
        "spate:code": "storage",
        "spate:retryable": False,
    }
    redirect = amqp_error(NotLeader("moved", leader_host="h", leader_port=1, leader_node="n2"))
    assert redirect.condition == "amqp:link:redirect" and redirect.info["network-host"] == "h"
    assert amqp_error(NotLeader("unknown")).condition == "amqp:resource-locked"
    assert amqp_error(BrokerError("bug")).condition == "amqp:internal-error"


def _layouts() -> list[bytes]:
    """Valid messages in the layouts producers send (proton, rhea, the native clients)."""
    header = b"\x00\x53\x70\xc0\x02\x01\x41"
    data = b"\x00\x53\x75\xa0\x64" + b"x" * 100
    big_data = b"\x00\x53\x75\xb0\x00\x00\x01\x00" + b"y" * 256
    value = b"\x00\x53\x77\xa1\x01x"
    sequence = b"\x00\x53\x76\xc0\x01\x00"
    proton = Message(body="x", subject="s", annotations={symbol("m"): 1}, properties={"k": 1})
    return [
        header + data,
        data,
        b"\x00\x53\x70\x45" + data + data,
        header + big_data,
        value,
        sequence + sequence,
        bytes(proton.encode()),
        bytes(Message(body=b"\x00" * 300).encode()),
    ]


def test_is_plain_never_accepts_what_the_full_scanner_rejects() -> None:
    """002 §3.2: the fast check answers True only for a well-formed section sequence without
    delivery annotations (what scan_incoming stores unchanged); it is tried on valid layouts,
    and on every truncation and many single-byte corruptions of them (a seeded sweep)."""
    rng = random.Random(20261121)
    cases: list[bytes] = []
    for raw in _layouts():
        assert sections.is_plain(raw), raw
        cases += [raw[:cut] for cut in range(len(raw))]
        for _ in range(300):
            i = rng.randrange(len(raw))
            cases.append(raw[:i] + bytes((rng.randrange(256),)) + raw[i + 1 :])
    cases += [
        b"\x00\x53\x71\xc1\x01\x00" + b"\x00\x53\x77\x40",  # DA: the full scanner cuts it
        b"\x00\x53\x77\x40\x00\x53\x78\xc1\x01\x00",  # footer
        b"\x00\x53\x75\xa0\x00\x00\x53\x77\x40",  # two kinds of body
        b"\x00\x53\x77\x40" * 2,  # amqp-value twice
        b"\x00\x53\x75\xa0\x00" * (sections.SECTIONS_MAX + 1),
    ]
    plain_count = 0
    for raw in cases:
        if sections.is_plain(raw):
            plain_count += 1
            incoming = sections.scan_incoming(raw)
            assert incoming.stored == raw and incoming.delivery_annotations is None, raw
    assert plain_count > len(_layouts())  # some corruptions stay valid (payload bytes)
    for raw in cases[-5:]:
        assert not sections.is_plain(raw)


def test_the_publishing_id_fast_path_agrees_with_the_section_walk() -> None:
    """ADR 0011: x-opt-publishing-id read by index arithmetic for the usual layout answers
    what walking the sections answers, on valid layouts and a seeded sweep of corruptions."""
    key = symbol("x-opt-publishing-id")
    layouts = [
        Message(body=b"x" * 100, durable=True, annotations={key: ulong(7)}),
        Message(body=b"x", annotations={key: ulong(2**64 - 1)}),  # no header section
        Message(body=b"x", annotations={key: ulong(0)}),
        Message(body="x", durable=True, annotations={symbol("a"): 1, key: ulong(1), "b": "z"}),
        Message(body="x", durable=True, annotations={key: 9}),  # long: the walk decides
        Message(body="x", durable=True, annotations={symbol("big"): "y" * 300, key: ulong(3)}),
        Message(body="x", properties={"k": "x-opt-publishing-id"}),  # not an annotation
    ]
    raws = [bytes(m.encode()) for m in layouts]
    expected = [7, 2**64 - 1, 0, 1, 9, 3, None]
    assert [sections.publishing_id(raw) for raw in raws] == expected
    rng = random.Random(20261125)
    fast_answers = 0
    for raw in raws:
        for _ in range(500):
            i = rng.randrange(len(raw))
            bad = raw[:i] + bytes((rng.randrange(256),)) + raw[i + 1 :]
            at = bad.find(b"\xa3\x13x-opt-publishing-id")
            fast = sections._publishing_id_fast(bad, at) if at >= 0 else None
            if fast is None:
                continue
            fast_answers += 1
            try:
                walked = sections._publishing_id_scanned(bad)
            except (sections.BadPublishingId, sections.MalformedMessage, codec.DecodeError):
                walked = "error"
            assert fast == walked, (raw, i)
            at = sections.publishing_id_at(bad)
            if at > 0:  # the producer's learned offset reads the same number
                assert walked == sections.ULONG.unpack_from(bad, at)[0], (raw, i)
    assert fast_answers > 1000


def test_a_section_holding_only_the_publishing_id_is_cut_out_and_nothing_else() -> None:
    """ADR 0011: named producers' messages are stored without a message-annotations section
    that holds nothing but x-opt-publishing-id; the rest of the message decodes unchanged."""
    key = symbol("x-opt-publishing-id")
    pid = ulong(2**40)
    sole = [
        Message(body=b"x" * 100, durable=True, annotations={key: pid}, properties={"a": 1}),
        Message(body="x", annotations={key: pid}),
        Message(body="x", annotations={key: pid}, subject="s"),
    ]
    for message in sole:
        raw = bytes(message.encode())
        at = sections.publishing_id_at(raw)
        start = sections.sole_annotation_start(raw, at)
        assert start >= 0
        kept = Message()
        kept.decode(raw[:start] + raw[at + 8 :])
        assert kept.annotations is None
        assert (kept.body, kept.durable, kept.properties, kept.subject) == (
            message.body, message.durable, message.properties, message.subject
        )  # fmt: skip
    # map8 form, written by hand (proton writes map32)
    pair = b"\xa3\x13x-opt-publishing-id\x80" + (2**40).to_bytes(8, "big")
    raw = b"\x00\x53\x72\xc1" + bytes((len(pair) + 1, 2)) + pair + b"\x00\x53\x77\x40"
    at = sections.publishing_id_at(raw)
    assert sections.sole_annotation_start(raw, at) == 0
    for more in (
        {key: pid, symbol("k"): 1},
        {symbol("k"): 1, key: pid},
        {symbol("big"): "y" * 300, key: pid},
    ):
        raw = bytes(Message(body="x", durable=True, annotations=more).encode())
        assert sections.sole_annotation_start(raw, sections.publishing_id_at(raw)) == -1


def test_splice_run_equals_splicing_one_by_one() -> None:
    """000 §5.1.1 / §4.6.4: every delivery carries offset, timestamp and (partitioned) source
    partition; the run encoder must produce the same bytes as the one-message encoder."""
    records: list[bytes | memoryview] = list(_layouts())
    records += [memoryview(r) for r in _layouts()]
    records.append(b"\x00\xa3\x10amqp:header:list\x45\x00\x53\x77\x40")
    records.append(b"\x00\x53\x70\xd0\x00\x00\x00\x05\x00\x00\x00\x01\x41\x00\x53\x77\x40")
    records.append(b"\x00\x53\x77\x40")  # the shortest message: an amqp-value null
    # the second timestamp's bytes hold '%' (0x25), as may a source partition: never a format
    for source, stamp in itertools.product(
        (None, "%", "0", "11"), (0x2525252525, 1_700_000_000_123)
    ):
        for first in (0, 5, 10**19 - len(records)):
            prefix, suffix = sections.delivery_annotation_parts(stamp, source)
            out = sections.splice_run(records, first, prefix, suffix)
            for k, record in enumerate(records):
                da = sections.encode_delivery_annotations(
                    offset_to_symbol(Offset(first + k)), stamp, source
                )
                assert out[k] == sections.splice_delivery_annotations(record, da)
    message = Message()
    message.decode(out[0])
    assert message.instructions[symbol("event-streams-source-partition")] == symbol("11")


def test_a_super_stream_consumers_annotations_name_the_partition_stream() -> None:
    """ADR 0034: `spate:stream` (a string) beside the offset, timestamp and source partition,
    and `spate:active` on the first delivery after a takeover; the parts decode as a map."""
    for active in (False, True):
        prefix, suffix = sections.delivery_annotation_parts(
            1_700_000_000_123, "2", stream="invoices-2", active=active
        )
        (out,) = sections.splice_run([b"\x00\x53\x77\xa1\x01x"], 41, prefix, suffix)
        message = Message()
        message.decode(out)
        annotations = message.instructions
        assert annotations[symbol("event-streams-offset")] == offset_to_symbol(Offset(41))
        assert annotations[symbol("event-streams-source-partition")] == symbol("2")
        assert annotations[symbol("spate:stream")] == "invoices-2"
        assert annotations.get(symbol("spate:active")) is (True if active else None)
        assert message.body == "x"
        assert sections.read_spate_annotations(out) is None  # not the fixed layout: scanned


def test_cursor_takes_runs_across_chunks_in_log_order() -> None:
    """A consumer reads whole chunks and sends runs of consecutive offsets, split at `count`."""

    async def scenario() -> None:
        part = MemoryPartition(StreamName("s"), PartitionId(0), NodeId("n1"))
        for size in (3, 1, 5):
            await part.append([b"%d" % i for i in range(size)])
        cursor = links.Cursor(part, "0", Offset(2))
        taken: list[tuple[int, int]] = []
        while cursor.available():
            runs = cursor.take(2)
            assert 0 < sum(len(run.records) for run in runs) <= 2
            taken += [(run.first_offset, len(run.records)) for run in runs]
        assert taken == [(2, 1), (3, 1), (4, 2), (6, 2), (8, 1)]
        assert cursor.take(5) == []

    asyncio.run(scenario())


def test_producer_credit_is_admission_control() -> None:
    small = 1024  # a window of link_credit_max
    full = limits.link_credit_max
    assert links.producer_credit(0, 0, 0, small) == full
    assert links.producer_credit(full // 2 - 1, 0, 0, small) == full - (full // 2 - 1)
    assert links.producer_credit(full // 2, 0, 0, small) == 0  # still half: no flow frame
    assert links.producer_credit(0, limits.producer_unconfirmed_max, 0, small) == 0  # disk behind
    assert links.producer_credit(0, limits.producer_unconfirmed_max - 1, 0, small) == full
    # ADR 0048: bytes in flight count too, pre-settled ones included (no unconfirmed count)
    assert links.producer_credit(0, 0, limits.producer_in_flight_bytes_max, small) == 0
    assert links.producer_credit(0, 0, limits.producer_in_flight_bytes_max - 1, small) == full


def test_a_producer_links_window_holds_a_bounded_number_of_bytes() -> None:
    """ADR 0048: as many credits as `link_credit_bytes` of the link's messages, within
    `link_credit_min`..`link_credit_max`; a link that sent nothing yet is taken to send
    maximal messages."""
    assert links.producer_window(0) == limits.link_credit_min
    assert links.producer_window(100) == limits.link_credit_max
    assert links.producer_window(16384) == 1024
    assert links.producer_window(limits.message_bytes_max) == limits.link_credit_min
    for size in (1, 100, 1024, 3000, 4096, 16384, 65536, 300_000, limits.message_bytes_max):
        window = links.producer_window(size)
        assert limits.link_credit_min <= window <= limits.link_credit_max
        assert window * size <= limits.link_credit_bytes or window == limits.link_credit_min
        assert window == limits.link_credit_max or (window + 1) * size > limits.link_credit_bytes


def test_consumer_room_is_credit_bounded_by_unsettled_and_the_pump_batch() -> None:
    batch = limits.consumer_send_batch_max
    assert links.consumer_room(10, 0, presettled=False) == 10
    assert links.consumer_room(10**6, 0, presettled=True) == batch
    cap = links.CONSUMER_UNSETTLED_MAX
    assert links.consumer_room(10**6, cap - 3, presettled=False) == min(3, batch)
    assert links.consumer_room(10**6, cap, presettled=False) <= 0
    assert links.consumer_room(10**6, cap, presettled=True) == batch  # settled: no bound


# OffsetTracker (ADR 0012): what a named consumer finished with, and when to store it


def test_the_tracker_stores_the_contiguous_done_prefix_in_batches() -> None:
    tracker = OffsetTracker(every=3, interval_ms=200)
    tracker.sent(1, 100, 4)  # tags 1..4 carry offsets 100..103
    tracker.sent(5, 110, 2)  # a gap in offsets (tracking chunks): tags 5, 6 carry 110, 111
    tracker.settled(2, True, now_ms=0)  # ahead of tag 1: nothing done yet
    assert tracker.done_offset is None and not tracker.due(0)
    tracker.settled(1, True, now_ms=1)
    assert tracker.done_offset == 101 and not tracker.due(2)  # 1 of 3
    assert tracker.due(2, urgent=True)  # a client waits on its commit
    tracker.settled(3, False, now_ms=3)  # released: holds the watermark
    tracker.settled(4, True, now_ms=4)
    assert tracker.done_offset == 101 and tracker.wake_at_ms() == 1 + 200
    assert tracker.due(201) and tracker.take() == 101 and tracker.take() is None
    tracker.settled(3, True, now_ms=300)  # accepted after all: 3, 4 done
    tracker.done_through(6, now_ms=301)
    assert tracker.done_offset == 111 and tracker.due(301)  # 3 since the last store


def test_the_tracker_never_stores_ahead_of_any_order_of_settlement() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        tracker = OffsetTracker(every=rng.randint(1, 5), interval_ms=10)
        count = rng.randint(1, 30)
        tracker.sent(1, 0, count)
        done: set[int] = set()
        for tag in rng.sample(range(1, count + 1), count):
            ok = rng.random() < 0.8
            tracker.settled(tag, ok, now_ms=0)
            done |= {tag} if ok else set()
            prefix = 0
            while prefix + 1 in done:
                prefix += 1
            assert tracker.done_offset == (prefix - 1 if prefix else None), seed
            stored = tracker.take()
            assert stored is None or stored == prefix - 1, seed
