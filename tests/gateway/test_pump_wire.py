"""Connection-level behaviour through the pump rig, read off the frames on the wire
(`client.sent` / `client.heard`): SASL, malformed transfers and frames (only the offending
connection ends, with its condition; another connection on the same broker carries on), aborted
deliveries, the transfer's message-format, and what the listener forgets when a connection goes.
Clauses: "core" is the AMQP 1.0 core specification (transport §2, security §5), 002 AMQP 1.0
messaging (../shared/seeds/002_97824e4f1076426d.txt)."""

from __future__ import annotations

import pytest
from proton import Delivery, Described, symbol, uint
from spate.client.offsets import offset_filter
from spate.core.ids import PartitionId, StreamName
from support.memory_broker import MemoryBroker
from support.pump import Client, PumpRig, decode, encode, frame

BATCH_FORMAT = 0x80013700
"""A non-zero message-format (the one Azure Event Hubs and RabbitMQ use for batches)."""


def stored(memory: MemoryBroker, stream: str = "orders") -> int:
    return int(memory.partition(StreamName(stream), PartitionId(0), write=False).end_offset())


def close_error(client: Client) -> tuple[str, str]:
    """(condition, description) of the listener's close frame."""
    closes = client.heard_of("close")
    assert closes, "the listener sent no close"
    error = closes[-1].field(0)
    assert isinstance(error, Described), error
    return str(error.value[0]), str(error.value[1])


def publish_one(rig: PumpRig, client: Client, body: str) -> Delivery:
    sender = client.sender("orders")
    rig.pump()
    delivery = client.send(sender, encode(body=body))
    rig.pump()
    rig.release()
    return delivery


# -- SASL (core §5.3)


@pytest.fixture
def plain_rig(memory: MemoryBroker) -> PumpRig:
    return PumpRig(memory, users={"alice": "secret"}, allow_anonymous=False)


def test_sasl_plain_with_the_right_password_opens(plain_rig: PumpRig) -> None:
    """core §5.3.3.1: the listener offers PLAIN (a users file) and not ANONYMOUS (disabled);
    sasl-outcome code 0 (ok), then the AMQP header and open."""
    try:
        client = plain_rig.connect(mechanism="PLAIN", user="alice", password="secret")
        mechanisms = client.heard_of("sasl-mechanisms")[0].field(0)
        assert [str(m) for m in mechanisms] == ["PLAIN"]
        assert client.heard_of("sasl-outcome")[0].field(0) == 0
        assert client.connection.remote_container == "n1"
        assert client.server.user == "alice"
    finally:
        plain_rig.close()


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("mallory", "secret")])
def test_sasl_failure_is_outcome_auth_and_hang_up(
    plain_rig: PumpRig, user: str, password: str
) -> None:
    """core §5.3.3.6: sasl-outcome code 1 (auth), then the listener hangs up; no AMQP frame
    is ever answered."""
    try:
        client = plain_rig.connect(mechanism="PLAIN", user=user, password=password)
        assert [f.name for f in client.heard] == ["header", "sasl-mechanisms", "sasl-outcome"]
        assert client.heard_of("sasl-outcome")[0].field(0) == 1
        assert client.server_transport.closed and client.server.user is None
        assert plain_rig.context.connections == set()
    finally:
        plain_rig.close()


def test_anonymous_is_not_offered_when_disabled(plain_rig: PumpRig) -> None:
    """core §5.3.3.1: only offered mechanisms may be chosen; a client that knows only
    ANONYMOUS finds none and never gets an AMQP open."""
    try:
        client = plain_rig.connect(mechanism="ANONYMOUS")
        assert [f.name for f in client.heard] == ["header", "sasl-mechanisms"]
        assert client.server.user is None and client.heard_of("open") == []
    finally:
        plain_rig.close()


# -- malformed transfers: the offending connection ends, the others carry on


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # handle 7 was never attached (core §2.7.5 handle; proton answers with a connection
        # error rather than the session error unattached-handle of core §2.8.15)
        ([uint(7), uint(0), b"t", uint(0), False], "no such handle: 7"),
        # the first transfer of a delivery must carry its delivery-id (core §2.7.5)
        ([uint(0)], "delivery-id required"),
    ],
)
def test_a_malformed_transfer_closes_its_connection_and_no_other(
    rig: PumpRig, client: Client, memory: MemoryBroker, fields: list[object], expected: str
) -> None:
    bystander = rig.connect()
    receiver = bystander.receiver("orders", filters=offset_filter("first"), credit=10)
    client.sender("orders")
    rig.pump()
    client.inject(frame("transfer", fields, payload=encode(body="smuggled")))
    rig.pump()
    rig.release()
    condition, description = close_error(client)
    assert condition == "amqp:invalid-field" and expected in description, description
    assert client.server_transport.closed and client.server.closed
    assert stored(memory) == 0, "nothing of the malformed transfer is stored"
    assert publish_one(rig, bystander, "still here").remote_state == Delivery.ACCEPTED
    assert [decode(d).body for d, _ in bystander.received(receiver)] == ["still here"]


def test_a_transfer_after_its_link_was_detached_closes_the_connection(
    rig: PumpRig, client: Client
) -> None:
    sender = client.sender("orders")
    rig.pump()
    client.detach(sender)
    rig.pump()
    client.inject(frame("transfer", [uint(0), uint(0), b"t", uint(0), False], payload=b"x"))
    rig.pump()
    assert close_error(client) == ("amqp:invalid-field", "no such handle: 0")


def test_a_frame_larger_than_max_frame_size_is_a_framing_error(
    rig: PumpRig, client: Client
) -> None:
    """core §2.4.1 / §2.7.1: a frame over the max-frame-size the listener announced is a
    framing error; the connection closes."""
    max_frame_size = int(client.heard_of("open")[0].field(2))
    oversize = (max_frame_size + 1).to_bytes(4, "big") + b"\x02\x00\x00\x00"
    client.inject(oversize + b"\x00" * 64)
    rig.pump()
    assert close_error(client)[0] == "amqp:connection:framing-error"
    assert client.server_transport.closed


def test_an_undecodable_performative_closes_the_connection(rig: PumpRig, client: Client) -> None:
    """core §2.3.2: a frame body that is not a performative is a framing/decode error."""
    client.inject(b"\x00\x00\x00\x0c\x02\x00\x00\x00\xde\xad\xbe\xef")
    rig.pump()
    assert client.server_transport.closed
    assert close_error(client)[0] in ("amqp:connection:framing-error", "amqp:decode-error")


# -- extended frame headers (core §2.3.1) wherever the reads cut them


def _extended(body: str, *, keep: int | None = None) -> bytes:
    """A transfer on handle 0 with the longest extended header (data offset 255: 1012 bytes
    the receiver ignores, core §2.3.1); `keep`: its body cut to that many bytes by the frame's
    size (a performative cut short)."""
    fields = [uint(0), uint(0), b"t0", uint(0), False]
    raw = frame("transfer", fields, payload=encode(body=body), data_offset=255)
    if keep is not None:
        raw = (4 * 255 + keep).to_bytes(4, "big") + raw[4 : 4 * 255 + keep]
    return raw


@pytest.mark.parametrize("scan", ["c", "python"])
def test_a_transfer_with_an_extended_header_is_taken_wherever_the_read_ends(
    rig: PumpRig, client: Client, scan: str
) -> None:
    """The listener's inbound guard reads each frame's head before proton: the header, the
    extended header and the start of the performative. Before, it read 1024 bytes of a frame
    in all, and a read ending at that point left the performative 4 bytes in: `feed` raised
    struct.error out of the connection's input (the C scan gave the frame to the Python step,
    which read past the read), so the transfer was never answered."""
    if scan == "python":
        client.server.guard.scan = None
    sender = client.sender("orders")
    rig.pump()
    assert sender.credit > 0
    raw = _extended("extended")
    assert len(raw) > 1024
    client.inject(raw[:1024])
    rig.pump()
    client.inject(raw[1024:])
    rig.pump()
    rig.release()
    assert not client.heard_of("close")
    outcomes = [f.field(4) for f in client.heard_of("disposition")]
    assert [o.descriptor for o in outcomes if isinstance(o, Described)] == [0x24], outcomes
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=10)
    rig.pump()
    assert [decode(d).body for d, _ in client.received(receiver)] == ["extended"]


@pytest.mark.parametrize("scan", ["c", "python"])
def test_a_performative_cut_short_by_its_frame_closes_only_its_connection(
    rig: PumpRig, client: Client, memory: MemoryBroker, scan: str
) -> None:
    """A transfer frame whose size ends inside its fields (after an extended header) is a
    framing error (core §2.3.2), found before proton reads it: the connection closes with
    `amqp:connection:framing-error` naming the frame, another connection carries on."""
    if scan == "python":
        client.server.guard.scan = None
    bystander = rig.connect()
    client.sender("orders")
    rig.pump()
    raw = _extended("never", keep=14)
    client.inject(raw[:1020])
    rig.pump()
    client.inject(raw[1020:])
    rig.pump()
    condition, description = close_error(client)
    assert condition == "amqp:connection:framing-error", description
    assert "runs past the frame's end" in description and "data offset 255" in description
    assert client.server_transport.closed
    assert stored(memory) == 0
    assert publish_one(rig, bystander, "still here").remote_state == Delivery.ACCEPTED


def test_a_transfer_on_a_link_the_listener_sends_on_is_refused(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """core §2.6: only the sending role transfers on a link. A transfer from the client on its
    receiving link must end that link (or the connection) with an error, never mix into what
    the listener sends there."""
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=10)
    rig.pump()
    client.inject(frame("transfer", [uint(0), uint(0), b"t", uint(0), False], payload=b"x"))
    rig.pump()
    assert stored(memory) == 0
    publish_one(rig, rig.connect(), "after")
    if receiver.remote_condition is None:  # the link lives on: it must carry only messages
        got = client.received(receiver)
        assert [data[:2] for data, _ in got] == [b"\x00S"], "each starts with a section"
        assert [decode(data).body for data, _ in got] == ["after"]


# -- aborted deliveries (core §2.6.14)


def test_an_aborted_delivery_is_dropped_and_the_link_carries_on(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """core §2.6.14: an aborted delivery is discarded by the receiver; nothing is stored."""
    sender = client.sender("orders")
    rig.pump()
    aborted = sender.delivery(b"aborted")
    sender.send(encode(body="x" * 100)[:40])  # the first frame of a multi-frame transfer
    rig.pump()
    aborted.abort()
    rig.pump()
    after = client.send(sender, encode(body="after"))
    rig.pump()
    rig.release()
    assert after.remote_state == Delivery.ACCEPTED
    assert stored(memory) == 1
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=10)
    rig.pump()
    assert [decode(d).body for d, _ in client.received(receiver)] == ["after"]


# -- message-format (core §2.7.5; 002 MESSAGE-FORMAT = 0)


def test_a_non_zero_message_format_ends_the_link_with_not_implemented(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """core §2.7.5: message-format 0 is the AMQP message this document defines; Spate stores
    only those (another format would come back as 0 and change meaning). A transfer with
    format 0x80013700 ends its link with amqp:not-implemented naming the format; nothing of it
    is stored, what came before it is, and the connection serves other links."""
    sender = client.sender("orders")
    rig.pump()
    before = client.send(sender, encode(body="before"))
    rig.pump()
    rig.release()
    assert before.remote_state == Delivery.ACCEPTED
    client.send(sender, encode(body="batch?"), message_format=BATCH_FORMAT)
    rig.pump()
    rig.release()
    assert client.sent_of("transfer")[-1].field(3) == BATCH_FORMAT, "the rig put it on the wire"
    condition = sender.remote_condition
    assert condition is not None and condition.name == "amqp:not-implemented"
    assert "0x80013700" in condition.description
    assert stored(memory) == 1
    publish_one(rig, client, "after")  # a new link on the same connection works
    rig.release()
    assert stored(memory) == 2


def test_message_format_0_is_the_default_both_ways(rig: PumpRig, client: Client) -> None:
    delivery = publish_one(rig, client, "plain")
    assert delivery.remote_state == Delivery.ACCEPTED
    assert client.sent_of("transfer")[-1].field(3) == 0
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=1)
    rig.pump()
    assert len(client.received(receiver)) == 1
    assert client.heard_of("transfer")[-1].field(3) == 0


# -- what a closed connection leaves behind


def test_a_closed_connection_is_forgotten_by_the_listener(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """core §2.4.3 (close): after the close exchange the listener hangs up and drops the
    connection and its consumers' tail listeners (no callbacks into a dead connection)."""
    partition = memory.partition(StreamName("orders"), PartitionId(0), write=False)
    client.receiver("orders", credit=10)
    rig.pump()
    assert len(rig.context.connections) == 1
    assert len(partition.listeners) == 1
    client.close()
    rig.pump()
    assert client.heard_of("close"), "the listener answered the close"
    assert client.server_transport.closed
    assert rig.context.connections == set()
    assert len(partition.listeners) == 0


def test_a_listener_close_carries_no_error_for_a_clean_close(rig: PumpRig, client: Client) -> None:
    client.close()
    rig.pump()
    assert client.heard_of("close")[-1].field(0) is None
    assert symbol("AMQP_EVENT_STREAMS_V1_0") in (
        client.connection.remote_offered_capabilities or []
    )
