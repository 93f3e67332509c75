"""The client's one adapter over python-qpid-proton: every `proton` and `cproton_ffi` import of
spate.client is here (the cores and shells see plain bytes, ints, strings and dicts).

What it does:
- `Engine`: one AMQP connection — proton's `Connection`/`Transport`/`Collector` in client mode
  inside an `asyncio.Protocol`, as the node's listener drives its side (research/proton.md
  §1b). Input is pushed in slices of at most the transport's capacity; output is written once
  per loop turn (`schedule_pump`), so the transfers made in one turn leave in one write.
- `attach(...)`: connect, open a sender or receiver with the link properties and the start
  filter, and wait for the broker's answer: the link, or `AttachRefused` with the condition
  and its info as a plain dict (`network-host`, `port`, `spate:retryable`, ...).
- `SenderLink.transfer` / `ReceiverLink` deliveries: the hot path, proton's C calls through
  cffi (`pn_delivery` + `pn_link_send` + `pn_link_advance` with a reused 8-byte tag; outcomes
  read with `pn_delivery_remote_state`; received bytes with `pn_link_recv`), never proton's
  Python `Event`/`Delivery` wrappers, which cost 30-45 µs per message (research/proton.md §5).
  Control events (attach, detach, close) go through the wrappers.
- Codecs that need proton: `offset_filter` (the Event Streams filter), `encode_message`,
  `decode_message`.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from cproton_ffi import ffi, lib
from proton import (
    Collector,
    Connection,
    Delivery,
    Described,
    Event,
    Link,
    Message,
    Transport,
    symbol,
    timestamp,
    ulong,
)
from proton.reactor import Filter
from spate.client.core import ACCEPTED, Outcome, Start, StartSpec, start_spec
from spate.client.errors import (
    STOLEN,
    UNAUTHORIZED,
    AttachRefused,
    AuthenticationFailed,
    LinkStolen,
)
from spate.core.ids import Offset, offset_to_symbol

__all__ = [
    "Engine",
    "LinkSpec",
    "Message",
    "ReceiverLink",
    "SenderLink",
    "attach",
    "decode_message",
    "encode_message",
    "offset_filter",
]

read_slice_bytes = 16 * 1024
idle_timeout_s = 4.0
"""The AMQP idle timeout the client sets on its transport: proton advertises it in the open
frame, the broker then sends an empty frame every 1 s when idle (measured: every 2 s at 8.0),
and proton closes a connection that received nothing for twice this (measured: 16 s at 8.0),
so a dead, paused (SIGSTOP) or cut-off broker is given up after 8 s and reconnecting takes
over. Without it a client connected to a paused leader waited on that TCP connection for as
long as the pause lasted (found by the chaos suite). Not less than 8 s of silence: a loaded
machine's broker may stall a few seconds without being dead."""
"""Input pushed into proton at a time, so one flood cannot starve the loop (research §1b)."""
receive_buffer_bytes = 64 * 1024
"""Initial receive buffer; grown to the largest delivery seen."""

# The Event Streams offset filter (000 §5.2.1).
ES_FILTER = ulong(0x00000000_00000200)
SQL_FILTER = ulong(0x00000000_00000201)
FILTER_KEY = symbol("event-streams-offset-filter")
K_OFFSET = symbol("event-streams-offset")
K_TIMESTAMP = symbol("event-streams-timestamp")

_TAG = struct.Struct("<Q")
_STATES = {
    lib.PN_ACCEPTED: "accepted",
    lib.PN_REJECTED: "rejected",
    lib.PN_RELEASED: "released",
    lib.PN_MODIFIED: "modified",
}


def _filter_value(spec: StartSpec) -> Any:
    if spec.kind == "earliest":
        return {K_OFFSET: symbol("@earliest")}
    if spec.kind == "latest":
        return {K_OFFSET: symbol("@latest")}
    if spec.kind == "after-offset":
        return {K_OFFSET: symbol(offset_to_symbol(Offset(spec.value)))}
    if spec.kind == "after-timestamp":
        return {K_TIMESTAMP: timestamp(spec.value)}
    if spec.kind == "relative":
        return spec.value  # Spate's form: |value| messages before the end
    assert spec.kind == "last", spec
    return symbol("last")


def offset_filter(start: Start) -> dict[symbol, Any]:
    """The source filter map selecting where a consumer starts (`core.start_spec`); empty
    for `stored` (the broker resumes a named consumer after its stored offset)."""
    spec = start_spec(start)
    if spec.kind == "stored":
        return {}
    return {FILTER_KEY: Described(ES_FILTER, _filter_value(spec))}


def selection_filters(
    filter_values: Sequence[str] | None, match_unfiltered: bool, sql: str | None
) -> dict[symbol, Any]:
    """The source filters choosing which messages a consumer is sent (ADR 0016):
    `rabbitmq:stream-filter` (+ `rabbitmq:stream-match-unfiltered`) and `event-streams-sql`."""
    filters: dict[symbol, Any] = {}
    if filter_values is not None:
        filters[symbol("rabbitmq:stream-filter")] = [str(v) for v in filter_values]
        if match_unfiltered:
            filters[symbol("rabbitmq:stream-match-unfiltered")] = True
    elif match_unfiltered:
        raise ValueError("match_unfiltered goes with filter_values=[...]")
    if sql is not None:
        filters[symbol("sql")] = Described(SQL_FILTER, sql)
    return filters


def encode_message(message: Message) -> bytes:
    """The message's AMQP bytes (proton's `encode` returns a bytearray, which
    `pn_link_send` does not take)."""
    return bytes(message.encode())


def decode_message(raw: bytes) -> Message:
    message = Message()
    message.decode(raw)
    return message


def _plain(value: Any) -> Any:
    """A condition's info value as plain Python (symbols and strings become str)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int | bool | float | bytes) or value is None:
        return value
    return str(value)


def _condition(raw_condition: Any) -> tuple[str | None, str | None, dict[str, Any]]:
    if raw_condition is None:
        return None, None, {}
    raw: Any = raw_condition.info
    info = {str(k): _plain(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    name = None if raw_condition.name is None else str(raw_condition.name)
    description = None if raw_condition.description is None else str(raw_condition.description)
    return name, description, info


class Engine(asyncio.Protocol):
    """One AMQP connection: proton's engine in client mode, driven by asyncio."""

    def __init__(self, hostname: str, user: str | None, password: str | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport = Transport()
        self.transport.idle_timeout = idle_timeout_s
        sasl = self.transport.sasl()
        sasl.allowed_mechs("PLAIN" if user is not None else "ANONYMOUS")
        # PLAIN inside TLS that asyncio terminates looks unencrypted to proton, which then
        # refuses to send it; over plain TCP the user chose it by giving a password (found by
        # the TLS and the deploy tests: such a client lost every attach).
        sasl.allow_insecure_mechs = True
        self.connection = Connection()
        self.connection.container = f"spate-client-{id(self):x}"
        self.connection.hostname = hostname
        if user is not None:
            self.connection.user = user
            self.connection.password = password or ""
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.sock: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self.on_event: Callable[[Event], None] = lambda event: None
        """Control events (proton's wrapper)."""
        self.on_delivery: Callable[[Any], None] = lambda delivery: None
        """Delivery events on the fast path: called with the C delivery (cffi pointer)."""
        self.on_deliveries: Callable[[], None] | None = None
        """Set instead (receivers): called once per pump that saw delivery events, after
        them, so a burst of deliveries is read in one call rather than one per event."""
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sock = cast(asyncio.Transport, transport)
        self.connection.open()
        self.pump()

    def data_received(self, data: bytes) -> None:
        """Push what arrived into proton, a slice at a time, and pump once at the end (and
        whenever proton's input buffer is full): each pump writes output, ticks the transport
        and re-arms its timer, a fixed cost not worth paying per 16 KiB slice."""
        view = memoryview(data)
        while view:
            capacity = self.transport.capacity()
            if capacity <= 0:
                self.pump()  # let proton hand over what it has, then look again
                capacity = self.transport.capacity()
                if capacity <= 0:
                    return  # the transport is closed for input: `pump` closed the socket
            chunk = min(capacity, read_slice_bytes)
            self.transport.push(bytes(view[:chunk]))
            view = view[chunk:]
        self.pump()

    def eof_received(self) -> bool | None:
        self.transport.close_tail()
        self.pump()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.lost.done():
            self.lost.set_result(None)

    def schedule_pump(self) -> None:
        """Write what the engine has, once, at the end of this loop turn."""
        if not self._scheduled and not self.lost.done():
            self._scheduled = True
            self.loop.call_soon(self.pump)

    def pump(self) -> None:
        self._scheduled = False
        collector = self.collector._impl
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        batched, delivered = self.on_deliveries, False
        while True:
            ev = peek(collector)
            if ev == ffi.NULL:
                break
            if event_type(ev) == lib.PN_DELIVERY:
                if batched is None:
                    self.on_delivery(lib.pn_event_delivery(ev))
                else:
                    delivered = True
            else:
                self.on_event(cast(Any, Event).wrap(ev))
                batched = self.on_deliveries  # an event handler may have changed it
            pop(collector)
        if delivered and self.on_deliveries is not None:
            self.on_deliveries()
        if self.sock is None or self.lost.done():
            return
        while True:
            pending = self.transport.pending()
            if pending > 0:
                self.sock.write(self.transport.peek(pending) or b"")
                self.transport.pop(pending)
                continue
            if pending < 0:
                self.sock.close()
            break
        deadline = self.transport.tick(self.loop.time())
        if deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_at(deadline, self.pump)

    def close(self) -> None:
        """Close the connection politely and drop the socket (callbacks are detached first)."""
        self.on_event = lambda event: None
        self.on_delivery = lambda delivery: None
        self.on_deliveries = None
        if self.lost.done():
            return
        self.connection.close()
        self.pump()
        if self.sock is not None:
            self.sock.close()

    def abort(self) -> None:
        """Drop the socket at once (tests: a connection cut under the client)."""
        if self.sock is not None:
            self.sock.abort()


@dataclass(frozen=True)
class LinkSpec:
    """What to attach: a sender (`start` None) or a receiver, with its link properties."""

    name: str
    address: str
    properties: dict[str, str | bool | int] = field(default_factory=dict)
    start: Start | None = None
    filters: dict[symbol, Any] = field(default_factory=dict)
    """More source filters of a receiver (filtering, ADR 0016), beside its start."""
    confirm_commits: bool = False
    """A receiver in rcv-settle-mode second (002 §2.7.3 receiver-settle-mode): it accepts
    without settling and the broker settles once it has stored the offset (ADR 0012)."""
    presettled: bool = False
    """A receiver asking for deliveries sent settled (snd-settle-mode settled, 002 §2.7.3):
    an unnamed consumer's accept stores nothing, so nothing is sent back per delivery (no
    disposition frames either way; the link's credit still bounds what is in flight)."""

    @property
    def is_sender(self) -> bool:
        return self.start is None


class _AttachedLink:
    """What senders and receivers share: the engine's events for this link, and `on_lost(error)`
    when the link or its connection goes away."""

    def __init__(self, engine: Engine, link: Link) -> None:
        self.engine = engine
        self._link = link
        self._lp = link._impl
        self.on_lost: Callable[[BaseException], None] = lambda error: None
        engine.on_event = self._on_event
        engine.lost.add_done_callback(self._on_connection_lost)

    def _on_event(self, event: Event) -> None:
        if event.type == Event.LINK_REMOTE_CLOSE and event.link == self._link:
            name, description, _ = _condition(self._link.remote_condition)
            lost = LinkStolen if name == STOLEN else ConnectionError
            self.on_lost(lost(f"link detached: {name}: {description}"))
        elif event.type == Event.CONNECTION_REMOTE_CLOSE:
            name, description, _ = _condition(self.engine.connection.remote_condition)
            self.on_lost(ConnectionError(f"connection closed: {name}: {description}"))

    def _on_connection_lost(self, _: object) -> None:
        self.on_lost(ConnectionError("connection lost"))


class SenderLink(_AttachedLink):
    """A producer's attached link. `on_outcome(sequence, Outcome)` is called once per
    settled delivery; `on_lost(error)` when the link or its connection goes away."""

    def __init__(self, engine: Engine, link: Link) -> None:
        super().__init__(engine, link)
        self._in_flight: dict[Any, int] = {}  # C delivery -> sequence
        self._tag_buffer = ffi.new("char[]", _TAG.size)
        self._tag_view = ffi.buffer(self._tag_buffer)
        self._tag = ffi.new("pn_delivery_tag_t *", (_TAG.size, self._tag_buffer))[0]
        self.on_outcome: Callable[[int, Outcome], None] = lambda sequence, outcome: None
        engine.on_delivery = self._on_delivery

    def transfer(self, sequence: int, data: bytes) -> None:
        """Queue one encoded message on the link (written at the end of the loop turn)."""
        _TAG.pack_into(self._tag_view, 0, sequence)
        delivery = lib.pn_delivery(self._lp, self._tag)
        lib.pn_link_send(self._lp, data, len(data))
        lib.pn_link_advance(self._lp)
        self._in_flight[delivery] = sequence

    def _on_delivery(self, delivery: Any) -> None:
        state = lib.pn_delivery_remote_state(delivery)
        if not state:
            return
        sequence = self._in_flight.pop(delivery, None)
        if sequence is None:
            return
        if state == lib.PN_ACCEPTED:
            lib.pn_delivery_settle(delivery)
            self.on_outcome(sequence, ACCEPTED)
            return
        wrapped = cast(Any, Delivery).wrap(delivery)  # the rare path: read the condition
        name, description, info = _condition(wrapped.remote.condition)
        lib.pn_delivery_settle(delivery)
        self.on_outcome(sequence, Outcome(_STATES.get(state, str(state)), name, description, info))


class ReceiverLink(_AttachedLink):
    """A consumer's attached link. `on_message(raw)` per complete delivery, then
    `on_drained()` after each burst; `on_lost(error)` as for senders.

    Without `hold` each delivery is accepted and settled as it arrives. With `hold` (named
    consumers, ADR 0012) `on_message` returns the offset it handed to the application (None:
    a repeat, see `_repeats`) and the delivery stays unsettled until `accept`; on a link in
    rcv-settle-mode second (`settle=False`) the broker settles accepted deliveries once it has
    stored their offset, reported by `on_committed(count)` in order."""

    def __init__(self, engine: Engine, link: Link, *, hold: bool = False) -> None:
        super().__init__(engine, link)
        self._buffer = ffi.new("char[]", receive_buffer_bytes)
        self._buffer_bytes = receive_buffer_bytes
        self.on_message: Callable[[bytes], int | None] = lambda raw: None
        self.on_drained: Callable[[], None] = lambda: None
        self.on_committed: Callable[[int], None] = lambda count: None
        self.hold = hold
        self._held: collections.deque[tuple[Any, int, object]] = collections.deque()
        """(delivery, offset, partition) handed to the application and not yet accepted."""
        self.partition: object = None
        """Set by `on_message`: the partition of the delivery it was given."""
        self.repeat: int | None = None
        """Set by `on_message` when it returns None for a repeat: the repeat's (last) offset."""
        self._repeats: dict[object, collections.deque[tuple[Any, int]]] = {}
        """Per partition, (delivery, offset) of repeats (not handed out) not yet accepted: each
        is accepted with the first delivery of its partition above it that the application
        finishes (accepting it on arrival would store an offset the application has not
        finished: after a cut, a group member's new link starts at the stored offset and
        repeats what the old one delivered)."""
        self._committing: collections.deque[tuple[Any, bool]] = collections.deque()
        """Accepted, not settled: waiting for the broker to settle (store) them; False: a
        repeat (not counted in `on_committed`)."""
        self.on_messages: Callable[[list[bytes]], None] | None = None
        """Set instead of `on_message` (links without `hold`): every complete delivery of a
        pump in one call, in order."""
        self.detached: asyncio.Future[None] = engine.loop.create_future()
        engine.on_deliveries = self._on_deliveries

    @property
    def credit(self) -> int:
        credit: int = lib.pn_link_credit(self._lp)
        return credit

    def flow(self, credit: int) -> None:
        if credit > 0:
            lib.pn_link_flow(self._lp, credit)
            self.engine.schedule_pump()

    def accept(self, count: int, *, settle: bool) -> int | None:
        """Accept the next `count` held deliveries (settled, or left for the broker to settle
        when `settle` is False); the offset of the last one (None: count 0)."""
        held, update, committing, repeats = (
            self._held,
            lib.pn_delivery_update,
            self._committing,
            self._repeats,
        )
        offset = None
        for _ in range(count):
            delivery, offset, partition = held.popleft()
            waiting = repeats.get(partition) if repeats else None
            while waiting and waiting[0][1] < offset:  # its partition's repeats below it
                repeat = waiting.popleft()[0]
                update(repeat, lib.PN_ACCEPTED)
                if settle:
                    lib.pn_delivery_settle(repeat)
                else:
                    committing.append((repeat, False))
            update(delivery, lib.PN_ACCEPTED)
            if settle:
                lib.pn_delivery_settle(delivery)
            else:
                committing.append((delivery, True))
        if count:
            self.engine.schedule_pump()
        return offset

    def detach(self) -> None:
        """Detach the link (`detached` resolves on the broker's answer)."""
        self._link.close()
        self.engine.schedule_pump()

    def _on_event(self, event: Event) -> None:
        closed = event.type == Event.LINK_REMOTE_CLOSE and event.link == self._link
        if closed and not self.detached.done():
            self.detached.set_result(None)
        super()._on_event(event)

    def _on_deliveries(self) -> None:
        """Every complete delivery queued on the link, once per pump."""
        lp = self._lp
        if self._committing:
            self._broker_settled()
        hold, batch = self.hold, self.on_messages
        raws: list[bytes] = []
        current_of, readable, partial = (
            lib.pn_link_current,
            lib.pn_delivery_readable,
            lib.pn_delivery_partial,
        )
        pending, recv, advance = lib.pn_delivery_pending, lib.pn_link_recv, lib.pn_link_advance
        settled, settle, unpack = lib.pn_delivery_settled, lib.pn_delivery_settle, ffi.unpack
        while True:
            current = current_of(lp)
            if current == ffi.NULL or not readable(current) or partial(current):
                break
            size = pending(current)
            if size > self._buffer_bytes:
                self._buffer, self._buffer_bytes = ffi.new("char[]", size), size
            got = recv(lp, self._buffer, size)
            raw = unpack(self._buffer, max(got, 0))
            advance(lp)
            if not hold:
                if not settled(current):  # sent settled: nothing to answer
                    lib.pn_delivery_update(current, lib.PN_ACCEPTED)
                settle(current)
                if batch is not None:
                    raws.append(raw)
                else:
                    self.on_message(raw)
                continue
            offset = self.on_message(raw)
            if offset is not None:
                self._held.append((current, offset, self.partition))
            elif self.repeat is not None:  # held too: see `_repeats`
                self._repeats.setdefault(self.partition, collections.deque()).append(
                    (current, self.repeat)
                )
                self.repeat = None
            else:  # not one of the broker's deliveries, or the consumer is closing
                lib.pn_delivery_update(current, lib.PN_ACCEPTED)
                settle(current)
        if raws:
            assert batch is not None
            batch(raws)
        self.on_drained()

    def _broker_settled(self) -> None:
        """Settle, in order, the accepted deliveries the broker has settled."""
        committing, settled = self._committing, 0
        while committing and lib.pn_delivery_settled(committing[0][0]):
            delivery, counted = committing.popleft()
            lib.pn_delivery_settle(delivery)
            settled += counted
        if settled:
            self.on_committed(settled)


async def attach(
    host: str,
    port: int,
    spec: LinkSpec,
    user: str | None,
    password: str | None,
    *,
    tls: ssl.SSLContext | None = None,
) -> tuple[Engine, Link]:
    """Connect and attach one link, over TLS with `tls` (asyncio terminates it: proton's
    engine sees the plain AMQP bytes; the certificate is checked against `host`). Raises
    `AttachRefused` (the broker's condition and info; `AuthenticationFailed` when SASL refused
    the credentials) or `ConnectionError` (ssl.SSLError for a
    failed handshake is one); the connection is closed on any failure, cancellation
    included."""
    loop = asyncio.get_running_loop()
    engine: Engine | None = None

    def factory() -> Engine:
        nonlocal engine
        engine = Engine(host, user, password)
        return engine

    await loop.create_connection(
        factory, host, port, ssl=tls, server_hostname=host if tls is not None else None
    )
    assert engine is not None
    session = engine.connection.session()
    session.open()
    link: Link
    if spec.is_sender:
        link = session.sender(spec.name)
        link.target.address = spec.address
    else:
        assert spec.start is not None
        link = session.receiver(spec.name)
        link.source.address = spec.address
        start_filter = offset_filter(spec.start) | spec.filters
        if start_filter:
            Filter(start_filter).apply(link)
        if spec.confirm_commits:
            link.rcv_settle_mode = Link.RCV_SECOND
        if spec.presettled:
            link.snd_settle_mode = Link.SND_SETTLED
    if spec.properties:
        link.properties = {symbol(k): v for k, v in spec.properties.items()}
    link.open()
    opened: asyncio.Future[None] = loop.create_future()

    def on_event(event: Event) -> None:
        if opened.done():
            return
        if event.type == Event.LINK_REMOTE_CLOSE and event.link == link:
            opened.set_exception(AttachRefused(*_condition(link.remote_condition)))
        elif event.type == Event.LINK_REMOTE_OPEN and event.link == link:
            # A refusal is an attach with a null terminus followed by a detach: wait for it.
            if (link.remote_target if link.is_sender else link.remote_source).address is None:
                return
            opened.set_result(None)
        elif event.type in (Event.TRANSPORT_CLOSED, Event.CONNECTION_REMOTE_CLOSE):
            condition = engine.transport.condition or engine.connection.remote_condition
            if condition is not None and condition.name == UNAUTHORIZED:
                opened.set_exception(
                    AuthenticationFailed(condition.name, condition.description or "", {})
                )
            else:
                opened.set_exception(ConnectionError("the connection closed while attaching"))

    engine.on_event = on_event
    try:
        engine.pump()
        lost = asyncio.ensure_future(asyncio.shield(engine.lost))
        try:
            done, _ = await asyncio.wait({opened, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if opened not in done:
            raise ConnectionError(f"connection to {host}:{port} lost while attaching")
        opened.result()
    except BaseException:
        engine.close()
        if not opened.done():
            opened.cancel()
        elif not opened.cancelled():
            opened.exception()  # a refusal that came with the cancellation: dropped with it
        raise
    return engine, link


def link_property(link: Link, name: str) -> Any:
    """A property of the broker's attach (None when absent)."""
    return (link.remote_properties or {}).get(symbol(name))


def annotate(message: Message, name: str, value: int) -> None:
    """Set a ulong message annotation."""
    annotations = dict(message.annotations or {})
    annotations[symbol(name)] = ulong(value)
    message.annotations = annotations
