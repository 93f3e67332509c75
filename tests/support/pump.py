"""The in-memory pump rig: the production AMQP listener (`spate.gateway.driver.AmqpConnection`)
and a python-qpid-proton client engine wired together in memory, no sockets (the way h11 tests
its protocol: two ends, bytes moved by hand).

Server side: the real `AmqpConnection` over an in-memory stand-in for its asyncio transport
(`MemoryTransport`: write collects bytes, pause/resume/close are recorded), on a private event
loop, in front of a Broker (the in-memory broker; `MemoryBroker(commit_delay_s=None)` holds
appends until `rig.release()`, so a test decides when the "fsync" is done). Client side: a
proton `Connection` + `Transport` (with proton's client SASL) + `Collector`, no reactor.

`rig.pump()` moves bytes both ways and runs the loop's ready callbacks until nothing moves
(bounded by `pump_rounds_max`; a rig that does not settle is a failure, not a hang). Every
step is deterministic: no sleeps, no wall-clock waits.

Between the two ends sits a frame tap (`FrameTap`): every byte that crosses is also parsed into
`Frame`s (protocol headers, SASL and AMQP performatives decoded with proton's `Data`), kept in
`client.sent` / `client.heard`, so a test can assert what went over the wire (a refusal's attach
and detach in one flush, a transfer's message-format). The client-to-server direction is cut at
frame boundaries, which lets the rig put on the wire what proton's client API cannot: a
`message-format` on a transfer (`client.send(..., message_format=N)`) and hand-made frames
(`client.inject(frame(...))`).

Why the rig lives in tests/ and not in `spate.gateway`: it drives a proton client engine, and the
import contract keeps proton in `spate.gateway.driver` alone. Why only the in-memory broker: the
node's broker resolves appends after an fsync on a worker thread and elects its one-replica
leaders on wall-clock timers, so a pumped exchange with it would have to wait for real time; the
socket suite (tests/gateway/conftest.py) runs both brokers, which is where the fake is held to the
same suite as the real thing.

    rig = PumpRig(MemoryBroker(commit_delay_s=None))
    client = rig.connect()
    sender = client.sender("orders")
    rig.pump()
    delivery = client.send(sender, encode(body=b"x"))
    rig.pump(); assert delivery.remote_state == 0   # not durable yet: no outcome
    rig.release(); assert delivery.remote_state == Delivery.ACCEPTED
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from proton import (
    Collector,
    Connection,
    Data,
    DataException,
    Delivery,
    Described,
    Link,
    Message,
    Receiver,
    Sender,
    Transport,
    uint,
    ulong,
)
from spate.core.backend import Broker
from spate.gateway.driver import AmqpConnection, Context

pump_rounds_max = 1000
"""Rounds one pump may take before the rig calls the exchange livelocked."""
loop_turns_max = 10_000
"""Event-loop iterations one round may run before the rig calls the loop livelocked (the
listener feeds big input to proton in 16 KiB slices, one loop turn each)."""
tap_frame_bytes_max = 4 * 1024 * 1024
"""Largest frame the tap accepts (the listener's own limit, `limits.frame_bytes_max`, is
1.06 MiB; a larger size field means the tap lost frame alignment)."""

_T = TypeVar("_T")
_FRAME_HEADER = struct.Struct(">IBBH")  # size, data offset (4-byte words), type, channel
_AMQP_FRAME, _SASL_FRAME = 0, 1
PERFORMATIVES = {
    0x10: "open",
    0x11: "begin",
    0x12: "attach",
    0x13: "flow",
    0x14: "transfer",
    0x15: "disposition",
    0x16: "detach",
    0x17: "end",
    0x18: "close",
    0x40: "sasl-mechanisms",
    0x41: "sasl-init",
    0x42: "sasl-challenge",
    0x43: "sasl-response",
    0x44: "sasl-outcome",
}
"""Descriptor codes of the AMQP 1.0 performatives (core §2.7) and SASL frames (core §5.3.3)."""
CODES = {name: code for code, name in PERFORMATIVES.items()}


class MemoryTransport:
    """What AmqpConnection needs of an asyncio transport, in memory. Like asyncio's, closing it
    calls the protocol's `connection_lost` on a later loop turn."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False
        self.reading_paused = False
        self.protocol: asyncio.Protocol | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.out += data

    def take(self) -> bytes:
        data, self.out = bytes(self.out), bytearray()
        return data

    def close(self) -> None:
        if not self.closed and self.protocol is not None:
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)
        self.closed = True

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def get_write_buffer_size(self) -> int:
        return len(self.out)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


# -- frames on the wire


@dataclass
class Frame:
    """One unit on the wire: a protocol header (`name` "header", `raw` its 8 bytes), an empty
    frame (`name` "empty", a heartbeat), or a performative with its fields and payload."""

    name: str
    channel: int
    fields: list[Any]
    payload: bytes
    raw: bytes
    flush: int
    """Which write (one `pending()`/`take()` of the sending end) carried it, counted per
    direction: frames of one flush reach the peer together."""

    def field(self, index: int) -> Any:
        return self.fields[index] if index < len(self.fields) else None


def frame(
    name: str,
    fields: list[Any],
    *,
    channel: int = 0,
    payload: bytes = b"",
    sasl: bool = False,
    data_offset: int = 2,
) -> bytes:
    """A frame's bytes: `name` a performative of `PERFORMATIVES`, `fields` its list (typed with
    proton's `uint`, `ulong`, `symbol`... where the type matters on the wire). `data_offset`
    above 2 (4-byte words, up to 255) puts an extended header of that many words less two
    before the body (core §2.3.1: the receiver ignores it)."""
    data = Data()
    data.put_object(Described(ulong(CODES[name]), fields))
    body = bytes(data.encode()) + payload
    kind = _SASL_FRAME if sasl else _AMQP_FRAME
    extended = b"\xee" * (4 * data_offset - 8)
    head = _FRAME_HEADER.pack(4 * data_offset + len(body), data_offset, kind, channel)
    return head + extended + body


def _plain(value: Any) -> Any:
    """proton's decoded value with memoryviews (binary) as bytes, so it can be compared and
    encoded again."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Described):
        return Described(_plain(value.descriptor), _plain(value.value))
    return value


def _parse(raw: bytes, flush: int) -> Frame:
    size, doff, _kind, channel = _FRAME_HEADER.unpack_from(raw)
    body = raw[doff * 4 : size]
    if not body:
        return Frame("empty", channel, [], b"", raw, flush)
    data = Data()
    try:
        used = data.decode(body)
    except DataException:
        return Frame("undecodable", channel, [], bytes(body), raw, flush)  # e.g. injected junk
    data.rewind()
    data.next()
    described = _plain(data.get_object())
    if not isinstance(described, Described):
        return Frame("undecodable", channel, [described], bytes(body[used:]), raw, flush)
    name = PERFORMATIVES.get(int(described.descriptor), f"0x{int(described.descriptor):x}")
    return Frame(name, channel, list(described.value or []), bytes(body[used:]), raw, flush)


class FrameTap:
    """Cuts one direction's bytes into `Frame`s; incomplete input waits for the rest."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.flushes = 0

    def feed(self, data: bytes) -> list[Frame]:
        self.buffer += data
        self.flushes += 1
        frames = []
        while True:
            if self.buffer[:4] == b"AMQP":  # protocol header (a frame size never starts so)
                if len(self.buffer) < 8:
                    break
                raw = bytes(self.buffer[:8])
                frames.append(Frame("header", 0, list(raw[4:]), b"", raw, self.flushes))
                del self.buffer[:8]
                continue
            if len(self.buffer) < 8:
                break
            size = int.from_bytes(self.buffer[:4], "big")
            assert 8 <= size <= tap_frame_bytes_max, f"frame size {size}: the tap lost alignment"
            if len(self.buffer) < size:
                break
            frames.append(_parse(bytes(self.buffer[:size]), self.flushes))
            del self.buffer[:size]
        return frames


def _injected_frames(raw: bytes, flush: int) -> list[Frame]:
    """What the tap records for injected bytes: their frames, or one "junk" entry when they
    are not whole frames (injected garbage is allowed to be garbage)."""
    tap = FrameTap()
    try:
        frames = tap.feed(raw)
    except AssertionError:
        frames, tap.buffer = [], bytearray(raw)
    if tap.buffer:
        return [Frame("junk", 0, [], raw, raw, flush)]
    for f in frames:
        f.flush = flush
    return frames


def with_message_format(transfer: Frame, message_format: int) -> bytes:
    """The transfer frame's bytes with its message-format field (index 3, core §2.7.5) set."""
    fields = list(transfer.fields) + [None] * (4 - len(transfer.fields))
    fields[3] = uint(message_format)
    return frame("transfer", fields, channel=transfer.channel, payload=transfer.payload)


# -- messages


def encode(body: Any = None, **fields: Any) -> bytes:
    """A message encoded by proton (what an ordinary client puts in a transfer)."""
    return bytes(Message(body=body, **fields).encode())


def decode(data: bytes) -> Message:
    message = Message()
    message.decode(data)
    return message


def annotations(data: bytes) -> dict[str, Any]:
    """The delivery annotations of a received message, keys as plain strings."""
    return {str(k): v for k, v in (decode(data).instructions or {}).items()}


class Client:
    """One proton client connection, driven by the rig."""

    def __init__(
        self,
        rig: PumpRig,
        *,
        mechanism: str = "ANONYMOUS",
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.rig = rig
        self.connection = Connection()
        self.connection.container = "pump-client"
        self.connection.hostname = "localhost"
        if user is not None:
            self.connection.user = user
            self.connection.password = password
        self.transport = Transport()
        sasl = self.transport.sasl()
        sasl.allowed_mechs(mechanism)
        sasl.allow_insecure_mechs = True  # PLAIN in the clear: there is no wire to snoop
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self._names = itertools.count(1)
        self._tags = itertools.count(1)
        self._formats: dict[bytes, int] = {}
        self._injected = bytearray()
        self._inbound = bytearray()
        """Listener bytes the client engine had no room for yet."""
        self.sent: list[Frame] = []
        """Frames the client put on the wire, in order."""
        self.heard: list[Frame] = []
        """Frames the listener put on the wire, in order."""
        self._tap_out, self._tap_in = FrameTap(), FrameTap()
        self.server_transport = MemoryTransport()
        self.server: AmqpConnection = rig.run(rig.make_connection(self.server_transport))

    # links

    def sender(
        self,
        address: str | None,
        *,
        properties: dict[Any, Any] | None = None,
        dynamic: bool = False,
        settled: bool = False,
    ) -> Sender:
        """Attach a sending link (the listener's producer). `settled`: snd-settle-mode settled."""
        link = self.session.sender(f"sender-{next(self._names)}")
        if address is not None:
            link.target.address = address
        link.target.dynamic = dynamic
        if properties:
            link.properties = properties
        if settled:
            link.snd_settle_mode = Link.SND_SETTLED
        link.open()
        return link

    def receiver(
        self,
        address: str | None,
        *,
        filters: dict[Any, Any] | None = None,
        properties: dict[Any, Any] | None = None,
        credit: int = 0,
        dynamic: bool = False,
        settled: bool = False,
    ) -> Receiver:
        """Attach a receiving link (the listener's consumer) and grant `credit`. `settled`:
        ask for pre-settled deliveries (snd-settle-mode settled)."""
        link = self.session.receiver(f"receiver-{next(self._names)}")
        if address is not None:
            link.source.address = address
        link.source.dynamic = dynamic
        if filters:
            link.source.filter.put_dict(filters)
        if properties:
            link.properties = properties
        if settled:
            link.snd_settle_mode = Link.SND_SETTLED
        link.open()
        if credit:
            link.flow(credit)
        return link

    # transfers

    def send(
        self,
        sender: Sender,
        data: bytes,
        *,
        settled: bool = False,
        message_format: int | None = None,
    ) -> Delivery:
        """One transfer of `data`. `message_format`: the transfer's message-format field
        (core §2.7.5), written into the frame by the rig (proton's Python API cannot set it)."""
        tag = str(next(self._tags)).encode()
        delivery = sender.delivery(tag)
        if message_format is not None:
            self._formats[tag] = message_format
        sender.send(data)
        sender.advance()
        if settled:
            delivery.settle()
        return delivery

    def received(self, receiver: Receiver, *, settle: bool = True) -> list[tuple[bytes, Delivery]]:
        """Every complete delivery waiting on the link, read (and, with `settle`, accepted and
        settled), oldest first."""
        out = []
        while True:
            delivery = receiver.current
            if delivery is None or delivery.partial or not delivery.readable:
                break
            data = receiver.recv(delivery.pending)
            receiver.advance()
            out.append((bytes(data or b""), delivery))
            if settle and not delivery.settled:
                delivery.update(Delivery.ACCEPTED)
                delivery.settle()
        return out

    def inject(self, raw: bytes) -> None:
        """Put `raw` on the wire to the listener after what the client has written so far."""
        self._injected += raw

    def heard_of(self, name: str) -> list[Frame]:
        return [f for f in self.heard if f.name == name]

    def sent_of(self, name: str) -> list[Frame]:
        return [f for f in self.sent if f.name == name]

    def detach(self, link: Link, *, closed: bool = True) -> None:
        """End a link: detach with closed=true (core §2.6.6), or without it (a suspension)."""
        if closed:
            link.close()
        else:
            link.detach()

    def close(self) -> None:
        self.connection.close()

    # bytes

    def move(self, *, whole: bool = False) -> int:
        """Client bytes to the server, server bytes to the client; how many moved. Runs on
        the rig's loop (the server schedules callbacks and tasks on it). `whole`: all the
        client engine has to send, in one read (proton hands its output over in pieces of its
        buffer's size; a flooding client's socket delivers it in 256 KB reads)."""
        moved = 0
        out = b""
        while (pending := self.transport.pending()) > 0:
            out += bytes(self.transport.peek(pending) or b"")
            self.transport.pop(pending)
            if not whole:
                break
        if out or self._injected:
            frames = self._tap_out.feed(out)
            wire = bytearray()
            for tapped in frames:
                tag = tapped.field(2) if tapped.name == "transfer" else None
                if tag is not None and tag in self._formats:
                    rewritten = with_message_format(tapped, self._formats.pop(tag))
                    tapped = _parse(rewritten, tapped.flush)  # noqa: PLW2901
                self.sent.append(tapped)
                wire += tapped.raw
            if self._injected:
                self.sent.extend(_injected_frames(bytes(self._injected), self._tap_out.flushes))
                wire += self._injected
                self._injected = bytearray()
            if wire and not self.server.closed:
                moved += len(wire)
                self.server.data_received(bytes(wire))
        back = self.server_transport.take()
        if back:
            self.heard.extend(self._tap_in.feed(back))
            self._inbound += back
        while self._inbound and self.transport.capacity() > 0:  # proton takes what it has room for
            n = min(self.transport.capacity(), len(self._inbound))
            self.transport.push(bytes(self._inbound[:n]))
            del self._inbound[:n]
            moved += n
        if not self._inbound and self.server_transport.closed and self.transport.capacity() > 0:
            self.transport.close_tail()  # the listener hung up: the client sees end of input
        return moved


class PumpRig:
    """The listener side: one `Context` (as `GatewayServer` builds it) on a private loop.
    `users` (name -> password) enables SASL PLAIN, checked on the loop (the server checks
    scrypt hashes on a worker thread; the SASL exchange is the same)."""

    def __init__(
        self,
        broker: Broker,
        *,
        node_id: str = "n1",
        allow_anonymous: bool = True,
        users: Mapping[str, str] | None = None,
    ) -> None:
        self.broker = broker
        self.loop = asyncio.new_event_loop()
        authenticate: Callable[[str, str], Coroutine[Any, Any, bool]] | None = None
        if users is not None:
            known = dict(users)

            async def authenticate(user: str, password: str) -> bool:
                return known.get(user) == password

        self.context = Context(
            broker=broker,
            node_id=node_id,
            allow_anonymous=allow_anonymous,
            authenticate_plain=authenticate,
            idle_timeout_s=None,
        )
        self.clients: list[Client] = []

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coroutine)

    async def make_connection(self, transport: MemoryTransport) -> AmqpConnection:
        connection = AmqpConnection(self.context)
        transport.protocol = connection
        connection.connection_made(transport)  # type: ignore[arg-type]
        return connection

    def connect(self, **options: Any) -> Client:
        client = Client(self, **options)
        self.clients.append(client)
        self.pump()
        return client

    def pump(self) -> int:
        """Move bytes and run callbacks until nothing moves; returns the rounds taken."""
        for rounds in range(1, pump_rounds_max + 1):
            if not self.run(self._round()):
                return rounds
        raise AssertionError(f"the exchange did not settle within {pump_rounds_max} rounds")

    async def _round(self) -> int:
        moved = sum(client.move() for client in self.clients)
        await asyncio.sleep(0)
        turns = 1
        # Run every callback that is ready (and those they schedule); timers in the future
        # (heartbeats, an $info interval) are not waited for. `_ready` is the default
        # asyncio loop's queue of ready handles (the rig never runs on uvloop).
        while self.loop._ready:  # type: ignore[attr-defined]
            turns += 1
            assert turns <= loop_turns_max, "the loop keeps scheduling callbacks"
            await asyncio.sleep(0)
        return moved + sum(client.move() for client in self.clients)

    def pump_one_read(self, client: Client) -> int:
        """Hand all `client` has to send to the listener as one read, then pump."""

        async def move() -> int:
            return client.move(whole=True)

        moved = self.run(move())
        self.pump()
        return moved

    def release(self) -> int:
        """Let held appends commit (MemoryBroker(commit_delay_s=None)), then pump."""
        released: int = self.run(self._release())
        self.pump()
        return released

    async def _release(self) -> int:
        released: int = self.broker.release()  # type: ignore[attr-defined]
        return released

    def close(self) -> None:
        async def lose() -> None:
            for client in self.clients:  # the client side hangs up
                if not client.server_transport.closed:
                    client.server_transport.closed = True
                    client.server.connection_lost(None)

        self.run(lose())
        self.loop.close()


def condition(link: Link) -> tuple[str | None, str | None, dict[Any, Any]]:
    """(condition name, description, info) of the peer's detach, or Nones."""
    remote = link.remote_condition
    if remote is None:
        return None, None, {}
    return remote.name, remote.description, dict(remote.info or {})


def properties(link: Link) -> dict[str, Any]:
    """The properties of the peer's attach, keys as plain strings."""
    return {str(k): v for k, v in (link.remote_properties or {}).items()}
