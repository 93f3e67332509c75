"""spate.gateway.eventhubs, the pure part of the Event Hubs dialect (ADR 0021): addresses,
selectors, annotations, batches, SAS tokens and the frame padding."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from urllib.parse import quote_plus, urlencode

import pytest
from proton import Message, symbol
from spate.core.errors import InvalidArgument, NotFound
from spate.gateway import codec, eventhubs, sections
from spate.gateway.eventhubs import FramePadder, HubAddress, TokenRefused


def test_addresses() -> None:
    parse = eventhubs.parse_address
    assert parse("$cbs") == HubAddress("$cbs")
    assert parse("$management") == HubAddress("$management")
    assert parse("amqps://ns.example/hub1") == HubAddress(None, "hub1")
    assert parse("hub1") is None  # Spate's own stream address...
    assert parse("hub1", bare=True) == HubAddress(None, "hub1")  # ...unless an EH client's
    assert parse("hub1/Partitions/3") == HubAddress(None, "hub1", "3")
    assert parse("amqps://h:5671/hub1/ConsumerGroups/$Default/Partitions/0") == HubAddress(
        None, "hub1", "0", "$Default"
    )
    assert parse("orders/$info") is None
    assert parse("$rooms/lobby") is None
    with pytest.raises(NotFound, match="partition ids"):
        parse("hub1/Partitions/x")


def test_owner_level_maps_onto_a_spate_consumer_group_and_epoch() -> None:
    receiver = HubAddress(None, "hub1", "2", "$Default")
    assert eventhubs.link_properties(receiver, {"com.microsoft:epoch": 7}) == {
        "event-streams-partition": "2",
        "event-streams-consumer-group": "eventhubs:$Default",
        "event-streams-epoch": 7,
    }
    # without owner level: a shared member of the group (reads beside others like it)
    assert eventhubs.link_properties(receiver, {}) == {
        "event-streams-partition": "2",
        "event-streams-consumer-group": "eventhubs:$Default",
    }
    sender = HubAddress(None, "hub1", "2")
    assert eventhubs.link_properties(sender, {}) == {"event-streams-partition": "2"}
    with pytest.raises(InvalidArgument):
        eventhubs.link_properties(HubAddress(None, "hub1"), {"com.microsoft:epoch": 1})
    with pytest.raises(InvalidArgument):
        eventhubs.link_properties(receiver, {"com.microsoft:epoch": -1})


@pytest.mark.parametrize(
    ("expression", "spec"),
    [
        ("amqp.annotation.x-opt-offset > '-1'", "first"),
        ("amqp.annotation.x-opt-offset > '@latest'", "next"),
        ("amqp.annotation.x-opt-offset > '4'", 5),
        ("amqp.annotation.x-opt-offset >= '4'", 4),
        ("amqp.annotation.x-opt-sequence-number > '0'", 1),
        ("amqp.annotation.x-opt-sequence-number >= '0'", "first"),
        ("amqp.annotation.x-opt-enqueued-time > '1000'", codec.Timestamp(1001)),
        ("amqp.annotation.x-opt-enqueued-time >= '1000'", codec.Timestamp(1000)),
    ],
)
def test_selectors(expression: str, spec: object) -> None:
    filters = {
        codec.Symbol(eventhubs.SELECTOR_FILTER): codec.Described(
            codec.Symbol(eventhubs.SELECTOR_FILTER), expression
        )
    }
    assert eventhubs.start_filters(filters) == {codec.Symbol(eventhubs.OFFSET_SPEC_KEY): spec}


def test_a_selector_of_another_form_refuses_the_link() -> None:
    with pytest.raises(InvalidArgument, match="x-opt-offset"):
        eventhubs.selector_spec("amqp.annotation.x-opt-offset < '4'")
    with pytest.raises(InvalidArgument):
        eventhubs.selector_spec("amqp.annotation.x-opt-offset > 'abc'")


def _annotations(raw: bytes) -> dict[str, object]:
    message = Message()
    message.decode(raw)
    return {str(k): v for k, v in (message.annotations or {}).items()}


def test_annotations_are_added_and_the_messages_own_kept() -> None:
    plain = Message(body="x").encode()
    annotated = eventhubs.annotate(plain, 42, 1_700_000_000_123)
    assert _annotations(annotated) == {
        "x-opt-sequence-number": 42,
        "x-opt-offset": "42",
        "x-opt-enqueued-time": 1_700_000_000_123,
    }
    keyed = Message(body="y", annotations={symbol("x-opt-partition-key"): "k"}, durable=True)
    out = Message()
    out.decode(eventhubs.annotate(keyed.encode(), 1, 5))
    assert out.durable and out.body == "y"
    assert _annotations(eventhubs.annotate(keyed.encode(), 1, 5))["x-opt-partition-key"] == "k"
    resent = eventhubs.annotate(annotated, 7, 9)  # a received event sent again
    assert _annotations(resent) == {
        "x-opt-sequence-number": 7,
        "x-opt-offset": "7",
        "x-opt-enqueued-time": 9,
    }


def test_a_batch_is_split_into_its_messages() -> None:
    inner = [Message(body=f"e{i}", properties={"i": i}).encode() for i in range(3)]
    envelope = Message(body=None, annotations={symbol("x-opt-partition-key"): "pk"}).encode()
    if b"\x00\x53\x77" in envelope:  # drop its (null) amqp-value body
        envelope = envelope[: envelope.index(b"\x00\x53\x77")]
    for raw in inner:
        envelope += b"\x00\x53\x75\xb0" + struct.pack(">I", len(raw)) + raw
    assert eventhubs.split_batch(envelope) == inner
    with pytest.raises(sections.MalformedMessage):
        eventhubs.split_batch(Message(body="not a batch").encode())
    with pytest.raises(sections.MalformedMessage):
        eventhubs.split_batch(b"\x00\x53\x75\xa0\x03abc")  # a data section holding no message


def _token(key: str, resource: str, expires: int, name: str = "root") -> str:
    signed = f"{quote_plus(resource)}\n{expires}".encode()
    sig = base64.b64encode(hmac.new(key.encode(), signed, hashlib.sha256).digest())
    return "SharedAccessSignature " + urlencode(
        {"sr": resource, "sig": sig, "se": str(expires), "skn": name}
    )


def test_sas_tokens() -> None:
    keys = {"root": "k" * 32}
    grant = eventhubs.check_sas_token(_token("k" * 32, "sb://h/hub1", 2000), keys, now_s=1000)
    assert grant.path == "hub1" and grant.expires_s == 2000
    assert eventhubs.covers([grant], "hub1", 1500)
    assert not eventhubs.covers([grant], "hub2", 1500)
    namespace = eventhubs.check_sas_token(_token("k" * 32, "sb://h/", 2000), keys, now_s=1000)
    assert eventhubs.covers([namespace], "anything", 1500)
    with pytest.raises(TokenRefused, match="signature does not match"):
        eventhubs.check_sas_token(_token("x" * 32, "sb://h/hub1", 2000), keys, now_s=1000)
    with pytest.raises(TokenRefused, match="ExpiredToken"):
        eventhubs.check_sas_token(_token("k" * 32, "sb://h/hub1", 100), keys, now_s=1000)
    with pytest.raises(TokenRefused, match="no shared access key"):
        eventhubs.check_sas_token(_token("k" * 32, "sb://h/", 2000, "other"), keys, now_s=1000)
    with pytest.raises(TokenRefused):
        eventhubs.check_sas_token("Bearer abc", keys, now_s=1000)


def _frame(code: int, fields: bytes, count: int, payload: bytes = b"") -> bytes:
    body = b"\x00\x53" + bytes((code, 0xC0, len(fields) + 1, count)) + fields + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 1) + body


def _fields(frame: bytes) -> tuple[int, int]:
    """(performative, field count) of a padded frame."""
    code, kind = frame[10], frame[11]
    count = frame[13] if kind == 0xC0 else struct.unpack_from(">I", frame, 16)[0]
    return code, count


def test_frames_are_padded_to_all_their_fields_whatever_the_write_boundaries() -> None:
    begin = _frame(0x11, b"\x40\x43\x70\x00\x00\x08\x00\x70\x00\x00\x08\x00", 4)
    transfer = _frame(0x14, b"\x43\x43\xa0\x01\x01\x43", 4, payload=b"\x00\x53\x77\xa1\x01x")
    heartbeat = struct.pack(">IBBH", 8, 2, 0, 0)
    stream = b"AMQP\x00\x01\x00\x00" + begin + heartbeat + transfer
    for cut in (1, 7, 9, 30, len(stream) - 1):
        padder = FramePadder()
        out = padder.feed(stream[:cut]) + padder.feed(stream[cut:])
        assert out[:8] == b"AMQP\x00\x01\x00\x00"
        at, frames = 8, []
        while at < len(out):
            size = struct.unpack_from(">I", out, at)[0]
            frames.append(out[at : at + size])
            at += size
        assert [len(f) for f in frames][1] == 8  # the heartbeat as it was
        assert _fields(frames[0]) == (0x11, 8)
        assert _fields(frames[2]) == (0x14, 11)
        assert frames[2].endswith(b"\x40" * 7 + b"\x00\x53\x77\xa1\x01x")  # payload kept


def test_a_full_frame_is_written_as_it_is() -> None:
    close = _frame(0x18, b"\x40", 1)
    padder = FramePadder()
    assert padder.feed(b"AMQP\x00\x01\x00\x00" + close) == b"AMQP\x00\x01\x00\x00" + close


def test_sasl_offers_mssbcbs_on_dialect_listeners_only() -> None:
    from spate.gateway import sasl

    plain = sasl.SaslServer(allow_anonymous=False, allow_plain=True)
    assert plain.mechanisms == ("PLAIN",)
    dialect = sasl.SaslServer(allow_anonymous=False, allow_plain=True, allow_cbs=True)
    assert dialect.mechanisms == ("PLAIN", "MSSBCBS", "ANONYMOUS")
    actions = dialect.receive(sasl.SASL_HEADER + sasl.frame(sasl.INIT, [codec.Symbol("MSSBCBS")]))
    assert actions[-1] == sasl.Authenticate("MSSBCBS", None, None)
    refused = sasl.SaslServer(allow_anonymous=False, allow_plain=True)
    actions = refused.receive(sasl.SASL_HEADER + sasl.frame(sasl.INIT, [codec.Symbol("MSSBCBS")]))
    assert actions[-1] == sasl.Authenticate("MSSBCBS", None, None)  # the shell refuses it
    # no SASL at all (@azure/event-hubs with a SharedAccessSignature= connection string): a
    # dialect listener lets it in as far as its $cbs tokens go; others close
    tokens_only = sasl.SaslServer(allow_anonymous=False, allow_plain=True, allow_cbs=True)
    open_frame = b"\x00\x00\x00\x08\x02\x00\x00\x00"
    assert tokens_only.receive(sasl.AMQP_HEADER + open_frame) == [
        sasl.Done(sasl.AMQP_HEADER + open_frame, sasl.CBS_USER, sasl=False)
    ]
    closed = sasl.SaslServer(allow_anonymous=False, allow_plain=True).receive(sasl.AMQP_HEADER)
    assert isinstance(closed[-1], sasl.Close)


def test_the_inbound_guard_notes_batches_on_dialect_listeners_and_refuses_other_formats() -> None:
    from proton import uint
    from spate.gateway.inbound import PROTOCOL_HEADER, InboundGuard
    from support.pump import frame

    def transfer(delivery_id: int, message_format: int) -> bytes:
        return frame(
            "transfer",
            [uint(0), uint(delivery_id), b"tag-%d" % delivery_id, uint(message_format), False],
            payload=b"\x00Sw\xa1\x05hello",
        )

    stream = (
        PROTOCOL_HEADER
        + frame("open", ["client"])
        + frame("begin", [None, uint(0), uint(100), uint(100)])
        + frame("attach", ["hub-sender", uint(0), False])
        + transfer(1, eventhubs.BATCH_FORMAT)
        + transfer(2, 0)
        + transfer(3, 5)
    )
    guard = InboundGuard(eventhubs.BATCH_FORMAT)
    problems = [p for at in range(len(stream)) for p in guard.feed(stream[at : at + 1])]
    assert guard.batches == {("hub-sender", b"tag-1")}
    assert [p.kind for p in problems] == ["format"]  # format 5 is still refused
    plain = InboundGuard()  # without the dialect a batch is refused like any other format
    assert [p.kind for p in plain.feed(stream)] == ["format", "format"]
    assert not plain.batches


# Event Hubs' own partition-key hash: the test vectors of azure-sdk-for-net's
# PartitionResolverTests.HashCodeAssignmentIsStable (its resolver is "a direct port of the Event
# Hubs service code")
_NET_HASHES = [
    ("7", -15263),
    ("131", 30562),
    ("7149583486996073602", 12977),
    ("FWfAT", -22341),
    ("sOdeEAsyQoEuEFPGerWO", -6503),
    (
        "FAyAIctPeCgmiwLKbJcyswoHglHVjQdvtBowLACDNORsYvOcLddNJYDmhAVkbyLOrHTKLneMNcbgWVlasVyw"
        "OByANjs",
        5226,
    ),
    (
        "1XYM6!(7(lF5wq4k4m*e$Nc!1ezLJv*1YK1Y-C^*&B$O)lq^iUkG(TNzXG;Zi#z2Og*Qq0#^*k):vXh$3,C7"
        "We7%W0meJ;b3,rQCg^J;^twXgs5E$$hWKxqp",
        23950,
    ),
    (
        "E(x;RRIaQcJs*P;D&jTPau-4K04oqr:lF6Z):ERpo&;9040qyV@G1_c9mgOs-8_8/10Fwa-7b7-yP!T-!IH&9"
        "68)FWuI;(^g$2fN;)HJ^^yTn:",
        -29304,
    ),
    ("!c*_!I@1^c", 15372),
    ("p4*!jioeO/z-!-;w:dh", -3104),
    ("$0cb", 26269),
    ("-4189260826195535198", 453),
]


@pytest.mark.parametrize(("key", "expected"), _NET_HASHES)
def test_partition_keys_hash_as_event_hubs_does(key: str, expected: int) -> None:
    assert eventhubs.key_hash(key) == expected
    # C#'s Math.Abs(hash % count): the remainder keeps the hash's sign, then its magnitude
    for count in (1, 2, 3, 4, 7, 32):
        assert eventhubs.key_partition(key, count) == abs(expected) % count


def test_partition_keys_of_every_tail_length_and_beyond_ascii() -> None:
    """lookup3's tail cases (1..12 bytes left) and multi-byte UTF-8, against the released
    Python SDK's own port (azure-eventhub's buffered producer; ASCII only: it hashes code
    points, not UTF-8 bytes, and takes Python's floored modulo, so only the hash is compared)."""
    from azure.eventhub._buffered_producer._partition_resolver import generate_hash_code

    for length in range(1, 40):
        key = "".join(chr(ord("a") + (i * 7) % 26) for i in range(length))
        assert eventhubs.key_hash(key) == generate_hash_code(key), key
    assert eventhubs.key_hash("") == 0


def test_idempotent_producers_map_onto_spate_producer_names_and_publishing_ids() -> None:
    partition = HubAddress(None, "hub1", "1")
    fresh = eventhubs.idempotent_producer(partition, {}, new_id=77)
    assert (fresh.name, fresh.epoch) == ("eventhubs:77", 0)
    assert fresh.answer(None) == {
        "com.microsoft:producer-id": 77,
        "com.microsoft:producer-epoch": 0,
        "com.microsoft:producer-sequence-number": -1,
    }
    resumed = eventhubs.idempotent_producer(
        partition, {"com.microsoft:producer-id": 5, "com.microsoft:producer-epoch": 2}, new_id=77
    )
    assert (resumed.name, resumed.answer(4)["com.microsoft:producer-sequence-number"]) == (
        "eventhubs:5",
        3,  # publishing id 4 = sequence number 3
    )
    with pytest.raises(InvalidArgument, match="partition id"):
        eventhubs.idempotent_producer(HubAddress(None, "hub1"), {}, new_id=1)
    event = Message(
        body=b"x", annotations={symbol("com.microsoft:producer-sequence-number"): 0}
    ).encode()
    assert eventhubs.publishing_ids([event, event]) == [1, 1]  # the caller checks the order
    with pytest.raises(InvalidArgument, match="producer-sequence-number"):
        eventhubs.publishing_ids([Message(body=b"x").encode()])


def test_the_inbound_guard_notes_senders_desiring_idempotent_publishing() -> None:
    from proton import UNDESCRIBED, Array, Data, uint
    from spate.gateway.inbound import PROTOCOL_HEADER, InboundGuard
    from support.pump import frame

    def attach(name: str, desired: list[str]) -> bytes:
        return frame(
            "attach",
            [name, uint(0), False, *[None] * 9, Array(UNDESCRIBED, Data.SYMBOL, *desired)],
        )

    guard = InboundGuard(eventhubs.BATCH_FORMAT)
    guard.feed(PROTOCOL_HEADER + attach("tx", ["com.microsoft:idempotent-producer"]))
    guard.feed(attach("other", ["com.microsoft:georeplication"]))
    assert guard.idempotent == {"tx"}
    plain = InboundGuard()
    plain.feed(PROTOCOL_HEADER + attach("tx", ["com.microsoft:idempotent-producer"]))
    assert plain.idempotent == set()
