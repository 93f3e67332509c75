"""Credit, settlement, filters and annotations through the pump rig, beyond test_pump_links.py.
Clauses: "core" is the AMQP 1.0 core specification (flow control §2.6.7, settlement §2.6.12),
000 the Event Streams extension (../shared/seeds/000_e36e0ffc94de3955.txt), 002 AMQP 1.0
messaging (../shared/seeds/002_97824e4f1076426d.txt)."""

from __future__ import annotations

import gc
import random
import weakref
from typing import Any

from proton import Delivery, Described, symbol, timestamp, ulong
from spate.client.offsets import offset_filter
from spate.core import limits
from spate.core.ids import PartitionId, StreamName, offset_to_symbol
from spate.gateway import links
from support.memory_broker import MemoryBroker
from support.pump import Client, PumpRig, annotations, decode, encode, properties

DA_FILTER = ulong(0x200)
SQL_FILTER = ulong(0x201)
PARTITION = symbol("event-streams-partition")


def publish(rig: PumpRig, client: Client, address: str, bodies: list[Any], **kw: Any) -> None:
    sender = client.sender(address, **kw)
    rig.pump()
    deliveries = [client.send(sender, encode(body=body)) for body in bodies]
    rig.pump()
    rig.release()
    assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}


def bodies(got: list[tuple[bytes, Delivery]]) -> list[Any]:
    return [decode(data).body for data, _ in got]


def es_filter(value: Any, descriptor: Any = DA_FILTER) -> dict[symbol, Any]:
    return {symbol("offset"): Described(descriptor, value)}


# -- producer credit (core §2.6.7)


def test_a_producer_gets_the_credit_window_and_it_is_topped_up(
    rig: PumpRig, client: Client
) -> None:
    """ADR 0048: a new link's first window is `limits.link_credit_min` (its messages are taken
    to be maximal); once its first small messages are appended it is `limits.link_credit_max`,
    topped up once it falls below half, as soon as the batch is handed to the partition."""
    sender = client.sender("orders")
    rig.pump()
    assert sender.credit == limits.link_credit_min
    deliveries = [client.send(sender, encode(body=i)) for i in range(limits.link_credit_min)]
    rig.pump()
    assert sender.credit == limits.link_credit_max  # before they are durable
    spent = limits.link_credit_max // 2 + 1
    deliveries += [client.send(sender, encode(body=i)) for i in range(spent)]
    rig.pump()
    rig.release()
    assert all(d.remote_state == Delivery.ACCEPTED for d in deliveries)
    assert sender.credit == limits.link_credit_max


def test_a_producer_of_large_messages_gets_a_window_of_bounded_bytes(
    rig: PumpRig, client: Client
) -> None:
    """ADR 0048: 16 KiB messages get a window of 1024 (16 MiB of them), not 5000 (80 MiB)."""
    sender = client.sender("orders")
    rig.pump()
    for _ in range(limits.link_credit_min):
        client.send(sender, encode(body=b"x" * 16_300))
    rig.pump()
    (link,) = client.server.producer.links.values()
    assert 16_300 < link.message_bytes < 16_384
    assert links.producer_window(link.message_bytes) == 1028
    assert 1028 // 2 <= sender.credit <= 1028  # topped up to the window, not to 5000
    for _ in range(sender.credit // 2 + 1):
        client.send(sender, encode(body=b"x" * 16_300))
    rig.pump()
    assert sender.credit == 1028


def test_what_a_connection_holds_unanswered_is_bounded_in_bytes_pre_settled_included(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """ADR 0048: pre-settled transfers wait for nobody's outcome, so the count of unconfirmed
    deliveries never stops their credit; the bytes handed to a partition and not answered
    yet do. A producer sending as fast as credit allows into a partition that does not commit
    stops at `producer_in_flight_bytes_max` plus one window; once the appends are answered its
    credit comes back."""
    sender = client.sender("orders", settled=True)
    rig.pump()
    body = b"x" * 16_300
    sent = 0
    for _ in range(200):  # rounds; each spends all the credit there is
        credit = sender.credit
        if credit == 0:
            break
        for _ in range(credit):
            client.send(sender, encode(body=body), settled=True)
        sent += credit
        rig.pump()
    part = client.server.producer
    assert sender.credit == 0 and part.unconfirmed == 0
    held = part.in_flight_bytes
    assert limits.producer_in_flight_bytes_max <= held
    assert held <= limits.producer_in_flight_bytes_max + limits.link_credit_bytes
    assert sent * 16_300 <= held  # every message sent is handed over: none was dropped
    rig.pump()
    assert sender.credit == 0  # nothing answered, nothing more
    rig.release()
    assert part.in_flight_bytes == 0
    assert sender.credit == 1028  # 16 MiB of these
    assert sum(held_records(memory)) == 0
    partition = memory.partition(StreamName("orders"), PartitionId(0), write=False)
    assert int(partition.end_offset()) == sent


# -- consumer credit and settlement


def test_a_consumer_without_credit_gets_nothing_until_it_grants_some(
    rig: PumpRig, client: Client
) -> None:
    """core §2.6.7: no transfer without link credit."""
    publish(rig, client, "orders", ["a", "b"])
    receiver = client.receiver("orders", filters=offset_filter("first"))
    rig.pump()
    assert client.received(receiver) == [] and client.heard_of("transfer") == []
    receiver.flow(1)
    rig.pump()
    assert bodies(client.received(receiver)) == ["a"]


def test_drain_with_nothing_to_send_gives_the_credit_back_at_once(
    rig: PumpRig, client: Client
) -> None:
    """core §2.6.7: a drain the sender cannot fill advances delivery-count by the remaining
    credit and answers with a flow; the receiver's credit is 0."""
    receiver = client.receiver("orders", filters=offset_filter("next"))
    rig.pump()
    receiver.drain(10)
    rig.pump()
    assert receiver.credit == 0
    assert not receiver.draining()
    flows = [f for f in client.heard_of("flow") if f.field(4) == 0]  # handle 0: the receiver
    assert flows and flows[-1].field(5) == 10, "delivery-count advanced by the drained credit"


def test_a_consumer_asking_for_settled_deliveries_gets_them_settled(
    rig: PumpRig, client: Client
) -> None:
    """core §2.6.12 / 002 §3.5 (snd-settle-mode settled): deliveries arrive pre-settled."""
    publish(rig, client, "orders", ["a", "b"])
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=10, settled=True)
    rig.pump()
    got = client.received(receiver, settle=False)
    assert bodies(got) == ["a", "b"]
    assert all(delivery.settled for _, delivery in got)
    assert [f.field(4) for f in client.heard_of("transfer")] == [True, True]


def test_unsettled_deliveries_are_settled_by_any_outcome(rig: PumpRig, client: Client) -> None:
    """Streams are not destructive (002 §3.4: the outcome does not remove the message): the
    listener settles on any disposition, and a rejected message stays readable."""
    publish(rig, client, "orders", ["a"])
    receiver = client.receiver("orders", filters=offset_filter("first"), credit=10)
    rig.pump()
    [(_, delivery)] = client.received(receiver, settle=False)
    assert not delivery.settled
    delivery.update(Delivery.REJECTED)
    rig.pump()
    assert delivery.settled
    again = client.receiver("orders", filters=offset_filter("first"), credit=10)
    rig.pump()
    assert bodies(client.received(again)) == ["a"]


# -- annotations on consumer transfers (000 §4.4, §5.1)


def test_an_agnostic_consumer_of_a_partitioned_stream_gets_the_source_partition(
    rig: PumpRig, client: Client
) -> None:
    """000 §4.4: event-streams-source-partition MUST be on every transfer of a
    partition-agnostic link."""
    for p in range(3):
        publish(rig, client, "clicks", [f"p{p}"], properties={PARTITION: symbol(str(p))})
    receiver = client.receiver("clicks", filters=offset_filter("first"), credit=10)
    rig.pump()
    got = client.received(receiver)
    seen = {decode(d).body: annotations(d)["event-streams-source-partition"] for d, _ in got}
    assert seen == {"p0": symbol("0"), "p1": symbol("1"), "p2": symbol("2")}


def test_a_bound_consumer_reads_only_its_partition(rig: PumpRig, client: Client) -> None:
    """000 §4.3: partition-bound links carry only their partition's transfers (the
    source-partition annotation is optional there and, if present, equal to the binding)."""
    for p in range(3):
        publish(rig, client, "clicks", [f"p{p}"], properties={PARTITION: symbol(str(p))})
    receiver = client.receiver(
        "clicks", filters=offset_filter("first"), properties={PARTITION: symbol("1")}, credit=10
    )
    rig.pump()
    got = client.received(receiver)
    assert bodies(got) == ["p1"]
    assert annotations(got[0][0]).get("event-streams-source-partition", symbol("1")) == "1"
    assert properties(receiver)["event-streams-partition"] == symbol("1")


# -- start filters and their echo (000 §5.2)


def test_the_delivery_annotations_filter_starts_strictly_after_the_offset(
    rig: PumpRig, client: Client
) -> None:
    """000 §5.2.1: event-streams-offset in the filter selects the offsets strictly greater."""
    publish(rig, client, "orders", [f"m{i}" for i in range(5)])
    after_1 = {symbol("event-streams-offset"): symbol(offset_to_symbol(1))}  # type: ignore[arg-type]
    receiver = client.receiver("orders", filters=es_filter(after_1), credit=10)
    rig.pump()
    assert bodies(client.received(receiver)) == ["m2", "m3", "m4"]


def test_the_timestamp_filter_starts_strictly_after_the_instant(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """000 §5.2.1: event-streams-timestamp selects messages stored strictly later."""
    partition = memory.partition(StreamName("orders"), PartitionId(0), write=False)
    partition.clock_ms = lambda: 1_000
    publish(rig, client, "orders", ["old"])
    partition.clock_ms = lambda: 2_000
    publish(rig, client, "orders", ["new"])
    at_old = {symbol("event-streams-timestamp"): timestamp(1_000)}
    receiver = client.receiver("orders", filters=es_filter(at_old), credit=10)
    rig.pump()
    assert bodies(client.received(receiver)) == ["new"]


def test_the_sql_filter_compares_offsets(rig: PumpRig, client: Client) -> None:
    """000 §5.2.2: `>` is exclusive, `>=` inclusive, TRUE is everything retained."""
    publish(rig, client, "orders", [f"m{i}" for i in range(5)])
    o2 = offset_to_symbol(2)  # type: ignore[arg-type]
    cases = [
        (f"d.event-streams-offset > '{o2}'", ["m3", "m4"]),
        (f"delivery_annotations.event-streams-offset >= '{o2}'", ["m2", "m3", "m4"]),
        ("TRUE", [f"m{i}" for i in range(5)]),
    ]
    for expression, expected in cases:
        receiver = client.receiver("orders", filters=es_filter(expression, SQL_FILTER), credit=10)
        rig.pump()
        assert bodies(client.received(receiver)) == expected, expression


def test_filters_in_force_are_echoed_and_foreign_ones_are_not(rig: PumpRig, client: Client) -> None:
    """002 §3.5.3 (source filter): the attach answer lists the filters actually applied;
    a filter with a descriptor the node does not know is ignored and left out."""
    publish(rig, client, "orders", ["m0", "m1"])
    receiver = client.receiver(
        "orders",
        filters={
            symbol("rabbitmq:stream-offset-spec"): Described(
                symbol("rabbitmq:stream-offset-spec"), 1
            ),
            symbol("x-selector"): Described(symbol("com.example:selector"), "colour = 'red'"),
        },
        credit=10,
    )
    rig.pump()
    assert bodies(client.received(receiver)) == ["m1"]
    echoed = receiver.remote_source.filter
    echoed.rewind()
    echoed.next()
    assert set(echoed.get_object()) == {symbol("rabbitmq:stream-offset-spec")}


def test_several_filters_are_anded_the_latest_start_wins(rig: PumpRig, client: Client) -> None:
    publish(rig, client, "orders", [f"m{i}" for i in range(5)])
    receiver = client.receiver(
        "orders",
        filters={
            symbol("a"): Described(DA_FILTER, symbol("first")),
            symbol("b"): Described(symbol("rabbitmq:stream-offset-spec"), 3),
        },
        credit=10,
    )
    rig.pump()
    assert bodies(client.received(receiver)) == ["m3", "m4"]


def test_deliveries_of_a_link_that_ends_before_its_batch_is_appended_stop_counting(
    rig: PumpRig, client: Client
) -> None:
    """Transfers and their link's detach in one read: the batch is never appended (nobody
    waits for its outcome), and the connection's count of deliveries waiting for durability —
    which bounds every producer link's credit — does not keep them."""
    first = client.sender("orders")
    rig.pump()
    for i in range(5):
        client.send(first, encode(body=i))
    client.detach(first)  # in the same bytes as the transfers
    rig.pump()
    rig.release()
    assert client.server.producer.unconfirmed == 0
    second = client.sender("orders")
    rig.pump()
    assert second.credit == limits.link_credit_min  # a new link's first window (ADR 0048)


# -- one read, one chunk (issue 16)


def opened(rig: PumpRig, client: Client, settled: bool = False) -> Any:
    """A producer link to orders past its first window (ADR 0048): `limits.link_credit_min`
    small messages appended and committed, so it has `limits.link_credit_max` credit."""
    sender = client.sender("orders", settled=settled)
    rig.pump()
    for i in range(limits.link_credit_min):
        client.send(sender, encode(body=i), settled=settled)
    rig.pump()
    rig.release()
    assert sender.credit == limits.link_credit_max
    return sender


def held_records(memory: MemoryBroker) -> list[int]:
    """Records per append waiting for `rig.release()` on orders/0, in order."""
    partition = memory.partition(StreamName("orders"), PartitionId(0), write=True)
    return [len(chunk.records) for chunk, _ in partition.held]


def test_the_messages_of_one_large_read_are_appended_as_one_chunk(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """A read larger than `limits.socket_read_slice_bytes` goes into proton one slice per loop
    turn (a flooding client cannot starve the loop), and the messages of all its slices are
    appended together at its last: one chunk per read, not one per slice (issue 16: every
    chunk costs the same CPU through Raft, encoding, an Append and an ack per follower, a
    write and an apply, whatever it holds)."""
    sender = opened(rig, client)
    count = 12 * limits.socket_read_slice_bytes // 1000
    deliveries = [client.send(sender, encode(body=bytes(1000))) for _ in range(count)]
    transfers = len(client.sent_of("transfer"))
    rig.pump_one_read(client)
    sent = client.sent_of("transfer")[transfers:]
    assert len({f.flush for f in sent}) == 1, "the rig moved the transfers in one read"
    assert sum(len(f.raw) for f in sent) > 10 * limits.socket_read_slice_bytes
    assert held_records(memory) == [count]
    assert all(d.remote_state == 0 for d in deliveries)  # nothing accepted before it is stored
    rig.release()
    assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}


def test_a_read_into_the_shared_buffer_is_one_chunk_and_copied_out_at_once(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """ADR 0047: the loop reads a connection's input into one buffer of
    `limits.socket_read_bytes` per thread (four times uvloop's own 256 KiB reads); the
    messages of such a read are one chunk, and what was read is copied out before the next
    read, of any connection, overwrites the buffer, although its slices go into proton over
    several loop turns."""
    other = rig.connect()
    sender = opened(rig, client)
    count = (limits.socket_read_bytes - 64 * 1024) // 1100
    messages = [encode(body=bytes([i % 251]) * 1000) for i in range(count)]
    for message in messages:
        client.send(sender, message)
    out = b""
    while (pending := client.transport.pending()) > 0:
        out += bytes(client.transport.peek(pending) or b"")
        client.transport.pop(pending)
    assert 4 * 256 * 1024 > len(out) > 3 * 256 * 1024  # more than uvloop's reads held

    async def read() -> None:
        view = client.server.get_buffer(-1)
        assert len(view) == limits.socket_read_bytes
        assert other.server.get_buffer(-1).obj is view.obj  # one per thread, not per connection
        view[: len(out)] = out
        client.server.buffer_updated(len(out))
        view[: len(out)] = bytes(len(out))  # the next read, before the slices are all pushed

    rig.run(read())
    rig.pump()
    assert held_records(memory) == [count]
    assert held_bytes(memory) == messages


def test_a_read_past_the_hold_limit_is_appended_every_hold_limit(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """Holding is bounded: every `limits.ingress_hold_bytes_max` of a read's input, what was
    drained so far is appended, then the rest at the read's last slice."""
    sender = opened(rig, client)
    count = 3 * limits.ingress_hold_bytes_max // 2 // 1000
    deliveries = [client.send(sender, encode(body=bytes(1000))) for _ in range(count)]
    transfers = len(client.sent_of("transfer"))
    rig.pump_one_read(client)
    sent = client.sent_of("transfer")[transfers:]
    assert len({f.flush for f in sent}) == 1, "the rig moved the transfers in one read"
    wire = sum(len(f.raw) for f in sent) / count  # bytes of one transfer frame
    held = held_records(memory)
    assert len(held) == 2 and sum(held) == count, held
    assert abs(held[0] - limits.ingress_hold_bytes_max / wire) <= 2, (held, wire)
    rig.release()
    assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}


def test_messages_held_in_a_large_read_are_appended_before_their_link_ends(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """Settled transfers, then their link's detach, in one read of many slices: the messages
    held from the earlier slices are appended before the detach is handled (core §2.6.12: a
    settled transfer is the sender's last word on it; the listener still stores what it read)."""
    sender = opened(rig, client, settled=True)
    for i in range(200):
        client.send(sender, encode(body=b"%04d" % i + bytes(1000)))
    client.detach(sender)  # in the same bytes as the transfers: the read's last slice
    rig.pump_one_read(client)
    assert held_records(memory) == [200]
    rig.release()
    assert client.server.producer.unconfirmed == 0


def held_bytes(memory: MemoryBroker) -> list[bytes]:
    """Every record waiting for `rig.release()` on orders/0, as stored, in order."""
    partition = memory.partition(StreamName("orders"), PartitionId(0), write=True)
    return [bytes(r) for chunk, _ in partition.held for r in chunk.records]


def test_messages_straddling_the_slices_of_a_read_are_stored_byte_for_byte(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """The slices of a read go to proton as views of the read, not copies (RESULTS §41): every
    message, whatever slice boundaries and frame heads it straddles, is stored as it was sent,
    in order; so is a message of the largest size a producer may send (`limits.
    message_bytes_max`, 16 slices) between them."""
    sender = opened(rig, client)
    rng = random.Random(41)
    messages = [
        encode(body=rng.randbytes(rng.randrange(1, 3 * limits.socket_read_slice_bytes)))
        for _ in range(40)
    ]
    overhead = len(encode(body=b"")) + 8  # the data section's vbin32 length and more
    messages.insert(17, encode(body=rng.randbytes(limits.message_bytes_max - overhead)))
    assert len(messages[17]) <= limits.message_bytes_max
    deliveries = [client.send(sender, m) for m in messages]
    rig.pump_one_read(client)
    assert held_bytes(memory) == messages
    rig.release()
    assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}


def test_the_slices_of_a_held_read_run_one_pump_not_one_each(
    rig: PumpRig, client: Client, memory: MemoryBroker
) -> None:
    """RESULTS §41: a read's slices before its last are pushed into proton and drained, and
    the rest of a pump (credit, sends, proton's output, the idle timer) runs once, at its last
    slice: with 16 KiB messages a slice was about one message, and a pump per slice was a cost
    per byte."""
    sender = opened(rig, client)
    count = 12 * limits.socket_read_slice_bytes // 1000
    for _ in range(count):
        client.send(sender, encode(body=bytes(1000)))
    server = client.server
    pumps = 0
    pump = server.pump

    def counted() -> None:
        nonlocal pumps
        pumps += 1
        pump()

    server.pump = counted  # type: ignore[method-assign]
    rig.pump_one_read(client)
    slices = -(
        -sum(len(f.raw) for f in client.sent_of("transfer")) // limits.socket_read_slice_bytes
    )
    assert slices > 10
    assert pumps <= 3, (pumps, slices)
    assert held_records(memory) == [count]
    rig.release()


# -- a connection's end frees proton's memory at once (ADR 0048)


def test_a_lost_connection_lets_go_of_protons_objects_without_a_collection(
    rig: PumpRig, client: Client
) -> None:
    """A connection's objects refer to each other, so without help only a full collection
    frees them, and with them proton's pool of every delivery the connection ever had in flight
    at once, each keeping its message's buffer (RESULTS §59: 180 MiB after three W1 runs of
    16 KiB messages through a gateway). Once the connection is lost the proton wrappers are
    released and dropped: with the cyclic collector off they are gone."""
    sender = client.sender("orders")
    rig.pump()
    for i in range(3 * limits.link_credit_min):
        client.send(sender, encode(body=b"%04d" % i + bytes(16_000)))
    rig.pump()
    rig.release()
    server = client.server
    held = [weakref.ref(server.conn), weakref.ref(server.engine), weakref.ref(server.collector)]
    gc.disable()
    try:

        async def lose() -> None:
            client.server_transport.closed = True
            server.connection_lost(None)

        rig.run(lose())
        assert [ref() for ref in held] == [None, None, None]
        assert server.closed
        rig.pump()  # a pump scheduled before the loss finds the connection closed
    finally:
        gc.enable()
