"""One AMQP 1.0 connection: an asyncio BufferedProtocol driving proton's engine (the only proton
module).

Layers, outside in: asyncio transport (TLS already terminated) -> `sasl.SaslServer` until the
outcome -> proton `Transport`/`Connection`/`Collector` (no proton SASL layer) -> our dispatch.

Dispatch (research/proton.md §5): `PN_DELIVERY` events are handled with direct `cproton_ffi.lib`
calls and raw bytes, never `proton.Message` and never proton's Event wrappers; every other event
(open, begin, attach, flow, detach, close) goes through `proton.Event.wrap` and the control
methods below, where link refusals happen in remote-open semantics (attach + detach flushed
together, never undone by a later `open()`).

Parts: this module is the connection's I/O, SASL, pump and control plane (open, begin, attach
planning and refusals, detach, end, close); `producer.ProducerPart` holds the links the client
sends on and the ingress hot path, `consumer.ConsumerPart` the links it receives on and the
egress hot path; the decisions they take without proton live in `links` (pure).

Pump order: dispatch events -> start appends for the producer batches drained this turn ->
top up producer credit -> send to consumers with credit -> write proton's output -> arm the
heartbeat timer. Input is read up to `limits.socket_read_bytes` at a time (ADR 0047) and pushed
into proton at most `limits.socket_read_slice_bytes` per loop turn (reading is paused in
between) so one flooding client cannot starve the loop; the appends wait for the read's last
slice (`_holding`), so a read is one chunk, not one per slice.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from cproton_ffi import ffi, lib
from proton import (
    Collector,
    Condition,
    Connection,
    Endpoint,
    Event,
    Link,
    Terminus,
    Transport,
    TransportException,
    symbol,
    ulong,
    ushort,
)
from spate.core import limits
from spate.core.backend import Broker, Partition
from spate.core.errors import BrokerError, InvalidArgument, NotFound, Unauthorized
from spate.core.ids import MemberId, PartitionId, StreamName
from spate.core.permissions import ANONYMOUS, Permission, UserStore
from spate.gateway import eventhubs, fastsend, inbound, links
from spate.gateway.consumer import ConsumerLink, ConsumerPart, InfoLink, filter_map
from spate.gateway.errors import (
    FRAMING_ERROR,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    RESOURCE_LIMIT_EXCEEDED,
    AmqpError,
    amqp_error,
    plain,
)
from spate.gateway.hubnodes import RequestNodes
from spate.gateway.producer import ProducerLink, ProducerPart, detach_all
from spate.gateway.sasl import CBS_USER, Authenticate, Close, Done, SaslServer, Send, Stage
from spate.gateway.stats import ListenerSnapshot, ListenerStats

log = logging.getLogger(__name__)

EVENT_STREAMS_CAPABILITY = symbol("AMQP_EVENT_STREAMS_V1_0")
LINKS_PER_CONNECTION_MAX = 1024
DELIVERY = lib.PN_DELIVERY
_CONTROL_EVENTS = frozenset(
    (
        lib.PN_CONNECTION_REMOTE_OPEN,
        lib.PN_CONNECTION_REMOTE_CLOSE,
        lib.PN_SESSION_REMOTE_OPEN,
        lib.PN_SESSION_REMOTE_CLOSE,
        lib.PN_LINK_REMOTE_OPEN,
        lib.PN_LINK_REMOTE_CLOSE,
        lib.PN_LINK_REMOTE_DETACH,
        lib.PN_LINK_FLOW,
        lib.PN_TRANSPORT_ERROR,
    )
)
_ENDING_EVENTS = frozenset(
    (
        lib.PN_CONNECTION_REMOTE_CLOSE,
        lib.PN_SESSION_REMOTE_CLOSE,
        lib.PN_LINK_REMOTE_CLOSE,
        lib.PN_LINK_REMOTE_DETACH,
    )
)


GATEWAY_MODE_PROPERTY = "spate:gateway-mode"
"""Link or connection property: "proxy" or "redirect", which a gateway then uses for the link
(docs/gateway.md); nodes ignore it."""
LEADER_EPOCH_PROPERTY = symbol("spate:leader-epoch")
"""Answered on partition-bound links: a client that sees it change on a later attach (or in
`$info`) knows its partition changed leader."""


async def _bound_properties(bound: PartitionId, partition: Partition) -> dict[symbol, Any]:
    properties: dict[symbol, Any] = {
        symbol(links.PARTITION_PROPERTY): symbol(links.partition_symbol(bound))
    }
    epoch = (await partition.describe()).leader_epoch
    if epoch is not None:
        properties[LEADER_EPOCH_PROPERTY] = ulong(epoch)
    return properties


@dataclass
class Context:
    """What every connection of one listener shares (all on the listener's loop)."""

    broker: Broker
    node_id: str
    allow_anonymous: bool
    authenticate_plain: Callable[[str, str], Awaitable[bool]] | None
    idle_timeout_s: float | None
    recv_buffer: Any = field(
        default_factory=lambda: ffi.new("char[]", limits.message_bytes_max + 1)
    )
    connections: set[AmqpConnection] = field(default_factory=set)
    modes: dict[str, Broker] = field(default_factory=dict)
    """A gateway's brokers by mode ("proxy", "redirect"): a client picks one per connection or
    per link with the `spate:gateway-mode` property; empty on a node (which serves locally)."""
    rooms: links.Rooms | None = None
    """A gateway's rooms (ADR 0018): `$rooms/<room>` links; None on a node (not found)."""
    permissions: UserStore | None = None
    """Who may write to and read from which stream (ADR 0023); None: everyone everything."""
    anonymous_remote: bool = True
    """SASL ANONYMOUS from a non-loopback peer (else only from 127.0.0.0/8 and ::1)."""
    stats: ListenerStats = field(default_factory=ListenerStats)
    """Counters for /metrics (ADR 0023)."""
    offset_commit_messages: int = limits.offset_commit_messages
    offset_commit_interval_ms: int = limits.offset_commit_interval_ms
    """A named consumer's offset is stored after this many done deliveries or this long after
    the first one not stored, whichever comes first (ADR 0012)."""
    dialects: frozenset[str] = frozenset()
    """Vendor dialects this listener speaks besides Spate's own ("eventhubs": ADR 0021)."""
    sas_keys: dict[str, str] = field(default_factory=dict)
    """Event Hubs dialect: shared access keys (name -> key) that sign the tokens put on `$cbs`;
    empty: any token is taken."""

    @property
    def eventhubs(self) -> bool:
        return eventhubs.DIALECT in self.dialects


_reads = threading.local()
"""Each thread's (each event loop's) read buffer (`AmqpConnection.get_buffer`)."""


def _read_buffer() -> memoryview:
    view: memoryview | None = getattr(_reads, "view", None)
    if view is None:
        view = _reads.view = memoryview(bytearray(limits.socket_read_bytes))
    return view


class AmqpConnection(asyncio.BufferedProtocol):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.loop = asyncio.get_running_loop()
        self.eventhubs = ctx.eventhubs
        self.sasl = SaslServer(
            allow_anonymous=ctx.allow_anonymous,
            allow_plain=ctx.authenticate_plain is not None,
            allow_cbs=self.eventhubs,
        )
        self.padder = eventhubs.FramePadder() if self.eventhubs else None
        """Event Hubs dialect: every performative written with all its fields (ADR 0021)."""
        self.user: str | None = None
        self.engine = Transport(Transport.SERVER)
        self.engine.max_frame_size = limits.frame_bytes_max
        if ctx.idle_timeout_s:
            self.engine.idle_timeout = ctx.idle_timeout_s
        self.conn = Connection()
        self.collector = Collector()
        self.conn.collect(self.collector)
        self._collector_address = int(ffi.cast("uintptr_t", self.collector._impl))
        self.engine.bind(self.conn)
        self.sock: asyncio.Transport | None = None
        self.closed = False
        self._paused_writing = False
        self._rest: memoryview | None = None
        self._held_bytes = 0
        """Input pushed since the producers' batches were last appended (`_holding`)."""
        self._pump_scheduled = False
        self._hang_up = False
        """Close the socket once proton's output is written (a framing error was answered)."""
        self.guard = inbound.InboundGuard(
            eventhubs.BATCH_FORMAT if self.eventhubs else None,
            None if fastsend.native is None else fastsend.native.scan_transfers,
        )
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self.producer = ProducerPart(self, ctx.recv_buffer, ctx.stats)
        """Links the client sends on (spate.gateway.producer)."""
        self.consumer = ConsumerPart(self, ctx)
        """Links the client receives on: consumers and `$info` (spate.gateway.consumer)."""
        self.attaching: set[Any] = set()
        """Links (pointers) whose attach is being planned (the broker may answer remotely)."""
        self.nodes = RequestNodes(
            lambda: self._broker_for({}),
            ctx.sas_keys,
            bool(ctx.sas_keys),
            self.schedule_pump,
            self.own,
        )
        """Event Hubs dialect: `$cbs` and `$management` (spate.gateway.hubnodes)."""

    # asyncio side -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sock = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        if len(self.ctx.connections) >= limits.connections_max:
            log.warning("refusing connection: %d connections open", limits.connections_max)
            self.ctx.stats.connections_refused += 1
            self.sock.abort()
            self.closed = True
            return
        self.ctx.stats.connections_accepted += 1
        self.ctx.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the loop reads this connection's next bytes: one buffer of
        `limits.socket_read_bytes` per thread, shared by its connections. `buffer_updated`
        copies out what was read before anything else can read into it: a flooding producer's
        read is up to 1 MiB and one chunk, where uvloop's own reads were 256 KiB (ADR 0047)."""
        return _read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(_read_buffer()[:nbytes]))

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.sasl.stage is not Stage.DONE:
            self._sasl_actions(self.sasl.receive(data))
            return
        self._feed(data)

    def eof_received(self) -> bool | None:
        if self.sasl.stage is Stage.DONE and not self.closed:
            self.engine.close_tail()
            self.pump()
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.ctx.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        self.consumer.forget_all()
        self.producer.forget_all()
        self._free_engine()

    def _free_engine(self) -> None:
        """Give proton's memory back when the connection ends, not at the next full collection
        (ADR 0048): the connection's objects refer to each other (its parts to their host,
        callbacks to the parts), so only the cyclic collector frees them, and once they have
        lived a while only a full collection, which the collector's thresholds put off because
        they do not see proton's memory: the connection's pool of finished deliveries (as many
        as were ever in flight at once, each keeping its message's buffer) and its transport's
        buffers, 180 MiB after three W1 runs of 16 KiB messages (RESULTS §59). Released here,
        and the wrappers dropped, that is freed at once; nothing uses them once `closed` is set
        (a use would raise AttributeError, not touch freed memory)."""
        self.collector.release()  # its events hold the connection, links and deliveries
        self.engine.unbind()
        self.conn.free()  # pn_connection_release: its sessions and links go now
        del self.engine, self.conn, self.collector

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        self.schedule_pump()

    # SASL ---------------------------------------------------------------------------------------

    def _sasl_actions(self, actions: list[Any]) -> None:
        assert self.sock is not None
        for action in actions:
            if isinstance(action, Send):
                self.sock.write(action.data)
            elif isinstance(action, Close):
                log.info("closing connection during SASL: %s", action.reason)
                self.sock.close()
                self.closed = True
            elif isinstance(action, Authenticate):
                self.own(asyncio.ensure_future(self._authenticate(action)))
            else:
                assert isinstance(action, Done)
                user = action.user
                if not action.sasl and user == ANONYMOUS and not self._anonymous_here():
                    if not self.eventhubs:
                        log.warning(
                            "refusing a connection without SASL from %s: anonymous access is "
                            "for loopback clients only (allow_remote_anonymous is off)",
                            self._peer(),
                        )
                        self.ctx.stats.authentication_failures += 1
                        self.sock.close()
                        self.closed = True
                        return
                    user = CBS_USER  # only as far as its $cbs tokens let it
                self.user = user
                # a connection in by MSSBCBS, without SASL, or by ANONYMOUS where only tokens
                # let one in, uses the hubs its $cbs tokens cover (ADR 0021); its other links
                # are refused (the user CBS_USER has no grants)
                self.nodes.require_token = user == CBS_USER and bool(self.ctx.sas_keys)
                if action.rest:
                    self._feed(action.rest)
                else:
                    self.pump()

    async def _authenticate(self, request: Authenticate) -> None:
        user: str | None = None
        if request.mechanism == "ANONYMOUS" and self._anonymous_here():
            user = ANONYMOUS
        elif request.mechanism in ("ANONYMOUS", "MSSBCBS") and self.eventhubs:
            # Event Hubs clients: who it is comes with its tokens on $cbs, which every link
            # needs (ADR 0021), from any host
            user = CBS_USER
        elif request.mechanism == "ANONYMOUS" and self.ctx.allow_anonymous:
            log.warning(
                "refusing SASL ANONYMOUS from %s: anonymous access is for loopback clients "
                "only (allow_remote_anonymous is off)",
                self._peer(),
            )
        elif (
            request.mechanism == "PLAIN"
            and self.ctx.authenticate_plain is not None
            and request.user is not None
            and request.password is not None
            and await self.ctx.authenticate_plain(request.user, request.password)
        ):
            user = request.user
        if user is None:
            self.ctx.stats.authentication_failures += 1
        if not self.closed:
            self._sasl_actions(self.sasl.outcome(user))

    def _anonymous_here(self) -> bool:
        """Anonymous access for this peer: allowed, and from anywhere or from loopback."""
        return self.ctx.allow_anonymous and (self.ctx.anonymous_remote or self._from_loopback())

    def _peer(self) -> str:
        peer = self.sock.get_extra_info("peername") if self.sock is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else "?"

    def _from_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self._peer()).is_loopback
        except ValueError:
            return False  # not an IP peer (a Unix socket is not served): refuse

    def own(self, future: asyncio.Future[Any]) -> None:
        self._tasks.add(future)
        future.add_done_callback(self._tasks.discard)

    # input --------------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        assert self.sock is not None
        slice_bytes = limits.socket_read_slice_bytes
        if len(data) <= slice_bytes and self._rest is None:
            self._push(data)
            self.pump()
            return
        if self._rest is not None:  # data arrived before reading paused; queue it behind
            self._rest = memoryview(bytes(self._rest) + data)
            return
        self.sock.pause_reading()
        self._rest = memoryview(data)
        self._continue()

    def _continue(self) -> None:
        if self.closed or self._rest is None:
            return
        chunk, rest = (
            self._rest[: limits.socket_read_slice_bytes],
            self._rest[limits.socket_read_slice_bytes :],
        )
        # Set before the pump: the producers' batches are appended once the read is all
        # pushed (or `ingress_hold_bytes_max` of it), not once per slice (`_holding`).
        self._rest = rest if len(rest) else None
        self._held_bytes += len(chunk)
        self._push(chunk)  # a view of the read: proton copies what it takes (RESULTS §41)
        if (
            self._rest is not None
            and not self.closed
            and not self._hang_up
            and self._held_bytes < limits.ingress_hold_bytes_max
        ):
            # A held slice: `_push` had proton read it and drained its deliveries; the rest of a
            # pump (credit, consumers' sends, proton's output, the idle timer) waits for the
            # read's last slice, a few loop turns on (at 16 KiB messages a slice is about four,
            # and a pump per slice was a cost per byte; RESULTS §41). A pump scheduled
            # meanwhile (an append's outcome) still runs in full.
            self.loop.call_soon(self._continue)
            return
        self.pump()
        if self._rest is not None and not self.closed:
            self.loop.call_soon(self._continue)
        else:
            self._rest = None
            if self.sock is not None and not self.closed:
                self.sock.resume_reading()

    def _holding(self) -> bool:
        """While one large read is pushed slice by slice, the messages drained from its slices
        are held and appended together at its last slice (or every
        `limits.ingress_hold_bytes_max` of input): one chunk per read, not one per 64 KiB
        slice. Every chunk costs the same work on its way, whatever it holds (encoding, a Raft
        entry, an Append and its ack to each follower, a write and an fsync share, an apply:
        ~0.5-0.7 ms of the leader's CPU and ~0.4 ms of each follower's; ADR 0035, RESULTS
        §37), and a flooding producer's reads are up to
        `limits.socket_read_bytes` (1 MiB)."""
        if self._rest is None or self._held_bytes >= limits.ingress_hold_bytes_max:
            self._held_bytes = 0
            return False
        return True

    def _push(self, data: bytes | memoryview) -> None:
        problems = self.guard.feed(data)
        if not problems:
            self._push_engine(data)
            return
        done = 0
        for problem in problems:
            if problem.cut > done:
                self._push_engine(data[done : problem.cut])
                done = problem.cut
            self._dispatch()  # the links attached before the problem are known now
            self._guard_problem(problem)
            if problem.kind == "frame":
                return
            # write the detach before proton reads the offending frame: proton drops a local
            # detach it has not encoded yet when a transfer arrives for the same link
            self._write()
        self._push_engine(data[done:])

    def _guard_problem(self, problem: inbound.Problem) -> None:
        """What the inbound guard found: a bad frame ends the connection, a transfer with a
        message-format other than 0 or on the client's receiving link ends that link."""
        if problem.kind == "frame":
            log.info("closing connection: %s", problem.description)
            self.conn.condition = Condition(FRAMING_ERROR, problem.description)
            self.conn.close()
            self._hang_up = True
            return
        candidates: list[tuple[Any, ProducerLink | ConsumerLink | InfoLink]] = (
            [*self.consumer.links.items(), *self.consumer.infos.items()]
            if problem.client_receives
            else [*self.producer.links.items()]
        )
        for key, state in candidates:
            if state.link.name == problem.link_name and not state.closed:
                condition = NOT_ALLOWED if problem.client_receives else NOT_IMPLEMENTED
                log.info("ending link %r: %s", problem.link_name, problem.description)
                self._forget_key(key)
                state.link.condition = Condition(condition, problem.description)
                state.link.close()
                return

    def _push_engine(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view and not self.closed:
            capacity = self.engine.capacity()
            if capacity < 0:
                return  # tail closed: proton is shutting the connection down
            if capacity == 0:
                self._dispatch()
                capacity = self.engine.capacity()
                if capacity <= 0:
                    return
            n = min(capacity, len(view))
            try:
                self.engine.push(view[:n])  # type: ignore[arg-type]  # any buffer: ffi.from_buffer
            except TransportException:
                log.info("transport error from peer input: %s", self.engine.condition)
                return
            view = view[n:]
            self._dispatch()

    # pump ---------------------------------------------------------------------------------------

    def schedule_pump(self) -> None:
        if not self._pump_scheduled and not self.closed:
            self._pump_scheduled = True
            self.loop.call_soon(self.pump)

    def pump(self) -> None:
        self._pump_scheduled = False
        if self.closed or self.sasl.stage is not Stage.DONE:
            return
        self._dispatch()
        if not self._holding():
            self.producer.flush()
        self.producer.top_up_all()
        if not self._paused_writing:
            self.consumer.send()
            self.consumer.send_infos()
        self._dispatch()
        if self.consumer.tracked:
            self.consumer.store_due()
        self._write()

    def _write(self) -> None:
        assert self.sock is not None
        engine = self.engine
        while True:
            pending = engine.pending()
            if pending > 0:
                out = engine.peek(pending) or b""
                engine.pop(pending)
                self.sock.write(out if self.padder is None else self.padder.feed(out))
                continue
            if pending < 0 or self._hang_up:  # head closed (or given up): all is written
                self.sock.close()
                self.closed = True
                return
            break
        deadline = engine.tick(self.loop.time())
        if engine.pending() > 0:
            self.schedule_pump()
        if deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_at(deadline, self.pump)

    def _dispatch(self) -> None:
        collector = self.collector._impl
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        event_delivery, readable, delivery_link = (
            lib.pn_event_delivery,
            lib.pn_delivery_readable,
            lib.pn_delivery_link,
        )
        remote_state, remote_settled = lib.pn_delivery_remote_state, lib.pn_delivery_settled
        is_receiver, settle = lib.pn_link_is_receiver, lib.pn_delivery_settle
        producers, drain = self.producer.links, self.producer.drain
        tracked, settled = self.consumer.tracked, self.consumer.settled
        skip = None if fastsend.native is None else fastsend.native.skip_events
        skip_functions, collector_address = fastsend.SKIP_FUNCTIONS, self._collector_address
        if skip is not None:
            skip(skip_functions, collector_address, DELIVERY)
        while True:
            ev = peek(collector)
            if ev == ffi.NULL:
                return
            kind = event_type(ev)
            if kind == DELIVERY:
                delivery = event_delivery(ev)
                link = delivery_link(delivery)
                if is_receiver(link):
                    if readable(delivery):  # a producer link's current delivery: drain it
                        producer = producers.get(link)
                        if producer is not None:
                            drain(producer)
                            if skip is not None:
                                # one event per transfer: the later ones find their delivery
                                # taken by this drain; C pops them without a Python step
                                # each (ADR 0038)
                                pop(collector)
                                skip(skip_functions, collector_address, DELIVERY)
                                continue
                        elif self.eventhubs:
                            self.nodes.readable(delivery)
                elif remote_settled(delivery) or remote_state(delivery):
                    # a consumer's disposition (one event per delivery of a range, so as few
                    # calls as can be: RESULTS §26): streams are not destructive, any outcome
                    # settles
                    if tracked:
                        consumer = tracked.get(link)
                        # a named consumer: note what it is done with; in rcv-settle-mode
                        # second its accepted deliveries are settled once they are stored
                        if consumer is not None and not settled(consumer, delivery):
                            pop(collector)
                            continue
                    settle(delivery)
            elif kind in _CONTROL_EVENTS:
                self._control(kind, _wrap_event(ev))
            pop(collector)

    # control plane ------------------------------------------------------------------------------

    def _control(self, kind: int, event: Any) -> None:
        if kind in _ENDING_EVENTS and self._held_bytes and self.producer.dirty:
            # A link, session or connection ends during a read whose messages are held
            # (`_holding`): what came before the end is appended first, as the pumps of the
            # earlier slices did without holding.
            self.producer.flush()
        if kind == lib.PN_LINK_REMOTE_OPEN:
            self._link_remote_open(event.link)
        elif kind == lib.PN_LINK_FLOW:
            self.schedule_pump()
        elif kind in (lib.PN_LINK_REMOTE_CLOSE, lib.PN_LINK_REMOTE_DETACH):
            flushing = self._forget_key(event.link._impl)
            if event.link.state & Endpoint.LOCAL_ACTIVE:
                if flushing is None:
                    event.link.close()
                else:  # a named consumer: answer the detach once its offset is stored
                    link = event.link
                    flushing.add_done_callback(lambda f: self._close_flushed(link, f))
        elif kind == lib.PN_SESSION_REMOTE_OPEN:
            if event.session.state & Endpoint.LOCAL_UNINIT:
                event.session.open()
        elif kind == lib.PN_SESSION_REMOTE_CLOSE:
            flushes = [self._forget_key(key) for key in self._links_of(event.session)]
            if event.session.state & Endpoint.LOCAL_ACTIVE:
                self._close_after(event.session, flushes)
        elif kind == lib.PN_CONNECTION_REMOTE_OPEN:
            conn = event.connection
            conn.container = self.ctx.node_id
            conn.offered_capabilities = [EVENT_STREAMS_CAPABILITY]
            conn.properties = {symbol("product"): "spate", symbol("node"): self.ctx.node_id}
            conn.open()
        elif kind == lib.PN_CONNECTION_REMOTE_CLOSE:
            keys = [*self.producer.links, *self.consumer.links, *self.consumer.infos]
            self._close_after(event.connection, [self._forget_key(key) for key in keys])
        elif kind == lib.PN_TRANSPORT_ERROR:
            log.info("AMQP transport error: %s", event.transport.condition)

    def _links_of(self, session: Any) -> list[Any]:
        out = []
        tables: list[dict[Any, Any]] = [
            self.producer.links,
            self.consumer.links,
            self.consumer.infos,
        ]
        for table in tables:
            for link_key, state in table.items():
                if state.link.session == session:
                    out.append(link_key)
        return out

    def _link_remote_open(self, link: Link) -> None:
        if link.state & Endpoint.LOCAL_ACTIVE or link._impl in self.attaching:
            return
        terminus = "target" if link.is_receiver else "source"
        remote = link.remote_target if link.is_receiver else link.remote_source
        address = remote.address
        idempotent: eventhubs.IdempotentProducer | None = None
        try:
            if (
                len(self.producer.links)
                + len(self.consumer.links)
                + len(self.consumer.infos)
                + len(self.attaching)
                + len(self.nodes.node_of)
                >= LINKS_PER_CONNECTION_MAX
            ):
                self._refuse(
                    link,
                    plain(
                        RESOURCE_LIMIT_EXCEEDED,
                        f"a connection may have {LINKS_PER_CONNECTION_MAX} links",
                    ),
                    address,
                )
                return
            links.check_terminus(remote.dynamic, terminus)
            hub = (
                eventhubs.parse_address(address, bare=self.nodes.client) if self.eventhubs else None
            )
            if hub is not None and hub.node is not None:
                self.nodes.open(link, hub.node)
                return
            if hub is not None:
                if not self.nodes.covers(hub.path):
                    raise Unauthorized(
                        f"no token put on $cbs covers event hub {hub.hub!r} (or it expired)"
                    )
                hub_remote = dict(link.remote_properties or {})
                extra = eventhubs.link_properties(hub, hub_remote)
                desired = link.name in self.guard.idempotent
                self.guard.idempotent.discard(link.name)
                if link.is_receiver and desired:  # a Spate producer name (ADR 0011)
                    idempotent = eventhubs.idempotent_producer(
                        hub, hub_remote, secrets.randbits(48) + 1
                    )
                    if idempotent is not None:
                        extra[links.PRODUCER_NAME_PROPERTY] = idempotent.name
                parsed = links.Address(StreamName(hub.hub), False)
            else:
                extra = None
                parsed = links.parse_address(address, terminus=terminus)
        except BrokerError as err:
            self._refuse(link, amqp_error(err), address)
            return
        self.attaching.add(link._impl)
        self.own(asyncio.ensure_future(self._attach(link, parsed, address, extra, idempotent)))

    async def _attach(
        self,
        link: Link,
        parsed: links.Address,
        address: str | None,
        hub_properties: dict[str, Any] | None = None,
        idempotent: eventhubs.IdempotentProducer | None = None,
    ) -> None:
        """Plan the link with the broker (which may ask a node over the wire), then answer the
        attach: open it, or refuse it (attach + detach) with the broker's error.
        `hub_properties`: an Event Hubs link's, as Spate's link properties (ADR 0021)."""
        properties = dict(link.remote_properties or {})
        if hub_properties is not None:
            properties.update(hub_properties)
        plan: links.ProducerPlan | links.ConsumerPlan | StreamName | None = None
        answer: dict[symbol, Any] | None = None
        error: AmqpError | None = None
        try:
            if hub_properties is None:  # an Event Hubs link is authorized by its $cbs token
                self._authorize(link, parsed)
            broker = self._broker_for(properties)
            if parsed.room is not None:
                rooms_host = self.ctx.rooms
                if rooms_host is None:
                    raise NotFound(
                        f"{address!r}: rooms are served by gateways (spate gateway), not here"
                    )
                if link.is_receiver:
                    plan = await links.plan_room_producer(rooms_host, parsed, properties)
                else:
                    filters = filter_map(link.remote_source.filter)
                    plan = await links.plan_room_consumer(rooms_host, parsed, properties, filters)
            elif link.is_receiver:
                plan = await links.plan_producer(broker, parsed, properties)
                if plan.bound is not None:  # requested, or chosen by us (000 §4.1)
                    answer = await _bound_properties(plan.bound, plan.targets[plan.bound])
                if plan.producer is not None:
                    assert plan.bound is not None
                    answer = answer or {}
                    last = await plan.targets[plan.bound].last_publishing_id(plan.producer)
                    if last is not None:
                        answer[symbol(links.LAST_PUBLISHING_ID_PROPERTY)] = ulong(
                            last.last_publishing_id
                        )
                    if idempotent is not None:  # what the Event Hubs SDK continues from
                        found = None if last is None else last.last_publishing_id
                        for key, value in idempotent.answer(found).items():
                            answer[symbol(key)] = value
            elif parsed.info:
                plan = await links.plan_info(broker, parsed)
            else:
                filters = filter_map(link.remote_source.filter)
                if hub_properties is not None:
                    filters = eventhubs.start_filters(filters)
                plan = await links.plan_consumer(broker, parsed, properties, filters)
                if plan.bound is not None:  # requested, or chosen by us (000 §4.3)
                    answer = await _bound_properties(plan.bound, plan.cursors[0].partition)
                if plan.stored is not None:
                    answer = answer or {}
                    answer[symbol(links.STORED_OFFSET_PROPERTY)] = plan.stored.offset
                if plan.super_stream is not None:  # ADR 0034: where it is active now
                    active = [m.stream for m in plan.memberships if m.cursor is not None]
                    answer = {
                        symbol(links.ACTIVE_PROPERTY): bool(active),
                        symbol(links.ACTIVE_PARTITIONS_PROPERTY): active,
                        symbol(links.PARTITION_STREAMS_PROPERTY): list(
                            plan.super_stream.partitions
                        ),
                    }
                elif plan.coordinator is not None:  # partition-agnostic: no partition, no epoch
                    answer = answer or {}
                    answer[symbol(links.CONSUMER_GROUP_PROPERTY)] = plan.group
                elif plan.group is not None:  # 000 §4.5.2: the granted epoch, a ulong
                    answer = answer or {}
                    answer[symbol(links.CONSUMER_GROUP_PROPERTY)] = plan.group
                    answer[symbol(links.EPOCH_PROPERTY)] = ulong(plan.epoch or 0)
                elif plan.member:
                    answer = answer or {}
                    answer[symbol(links.ACTIVE_PROPERTY)] = plan.active
        except BrokerError as err:
            error = amqp_error(err)
        except Exception as err:
            log.exception("planning link %r to %r failed", link.name, address)
            error = amqp_error(BrokerError(f"the attach failed: {type(err).__name__}: {err}"))
        finally:
            self.attaching.discard(link._impl)
        if self.closed or link.state & Endpoint.REMOTE_CLOSED:
            self._release(plan)  # the client went away meanwhile
            return
        if error is not None:
            self._release(plan)
            self._refuse(link, error, address)
        elif isinstance(plan, links.ProducerPlan):
            self.producer.open(link, plan, answer, eventhubs=hub_properties is not None)
        elif isinstance(plan, links.ConsumerPlan):
            self.consumer.open(link, plan, answer, eventhubs=hub_properties is not None)
        else:
            assert plan is not None
            self.consumer.open_info(link, plan)
        self.schedule_pump()

    def _authorize(self, link: Link, parsed: links.Address) -> None:
        """The user's write permission on a producer's stream, read on a consumer's (and
        `$info`'s); a room is named `$rooms/<room>` (ADR 0023)."""
        store = self.ctx.permissions
        if store is None:
            return
        user = self.user or ANONYMOUS
        name = f"{links.ROOMS_NODE}/{parsed.room}" if parsed.room is not None else parsed.stream
        permission = Permission.WRITE if link.is_receiver else Permission.READ
        store.grants_of(user).check(user, permission, name)

    def _release(self, plan: links.ProducerPlan | links.ConsumerPlan | StreamName | None) -> None:
        """A planned link that will not open: let go of its partitions (and a named consumer's
        place at the leader)."""
        if isinstance(plan, links.ConsumerPlan) and plan.super_stream is not None:
            self.own(asyncio.ensure_future(links.leave_memberships(plan)))
            return
        if isinstance(plan, links.ConsumerPlan) and plan.coordinator is not None:
            self.own(asyncio.ensure_future(_release_member(plan)))
            return
        detach_all(_partitions_of(plan))
        if isinstance(plan, links.ConsumerPlan) and plan.name is not None:
            release = plan.cursors[0].partition.consumer_detach(plan.name, None, plan.member)
            self.own(asyncio.ensure_future(release))

    def _broker_for(self, properties: dict[Any, Any]) -> Broker:
        """The link's `spate:gateway-mode` property, else the connection's, else the default."""
        modes = self.ctx.modes
        if not modes:
            return self.ctx.broker
        mode = properties.get(GATEWAY_MODE_PROPERTY)
        if mode is None:
            mode = (self.conn.remote_properties or {}).get(GATEWAY_MODE_PROPERTY)
        if mode is None:
            return self.ctx.broker
        broker = modes.get(str(mode))
        if broker is None:
            raise InvalidArgument(
                f"{GATEWAY_MODE_PROPERTY} {mode!r}: this gateway serves "
                + " or ".join(repr(m) for m in sorted(modes))
            )
        return broker

    def _refuse(self, link: Link, error: AmqpError, address: str | None) -> None:
        """Attach with a null terminus, then detach with the error, in one flush (AMQP 2.6.3)."""
        if link.is_sender:
            link.source.type = Terminus.UNSPECIFIED
            link.target.copy(link.remote_target)
        else:
            link.target.type = Terminus.UNSPECIFIED
            link.source.copy(link.remote_source)
        info: dict[Any, Any] = {}
        for key, value in error.info.items():
            info[symbol(key)] = ushort(value) if key == "port" else value
        if error.condition == "amqp:link:redirect":
            info[symbol("address")] = address or ""
        link.open()
        link.condition = Condition(error.condition, error.description, info or None)
        link.close()
        refused = self.ctx.stats.links_refused
        refused[error.condition] = refused.get(error.condition, 0) + 1
        log.info(
            "refused link %r to %r: %s %s",
            link.name,
            address,
            error.condition,
            error.description,
            extra={"link": link.name, "user": self.user, "condition": error.condition},
        )

    def end_producer(self, producer: ProducerLink, error: AmqpError) -> None:
        """Detach a producer link with an error (its later deliveries stay unsettled)."""
        if producer.closed:
            return
        self._forget_key(producer.pointer)
        log.info(
            "ending producer link %r: %s",
            producer.link.name,
            error.description,
            extra={"link": producer.link.name, "condition": error.condition},
        )
        producer.link.condition = Condition(error.condition, error.description)
        producer.link.close()
        self.schedule_pump()

    def end_consumer(self, consumer: ConsumerLink, error: AmqpError) -> None:
        """Detach a consumer link with an error (a named one whose offset could not be stored)."""
        if consumer.closed:
            return
        self._forget_key(consumer.pointer)
        log.info(
            "ending consumer link %r: %s",
            consumer.link.name,
            error.description,
            extra={"link": consumer.link.name, "condition": error.condition},
        )
        consumer.link.condition = Condition(error.condition, error.description)
        consumer.link.close()
        self.schedule_pump()

    def _close_flushed(self, link: Link, flushed: asyncio.Future[Any]) -> None:
        """A named consumer's detach, answered after its last offset was stored (or not)."""
        if self.closed or not link.state & Endpoint.LOCAL_ACTIVE:
            return
        error = None if flushed.cancelled() else flushed.exception()
        if isinstance(error, BrokerError):
            amqp = amqp_error(error)
            link.condition = Condition(
                amqp.condition, f"the consumer's last offset was not stored: {amqp.description}"
            )
        link.close()
        self.schedule_pump()

    def _close_after(self, endpoint: Any, flushes: list[asyncio.Future[Any] | None]) -> None:
        """Answer a session's or the connection's close once the named consumers' last offsets
        on it are stored, as a link's detach is: a client whose close returned may rely on them
        (found by CI: a leader killed right after a consumer's connection closed lost its
        offset, stored after the close was answered)."""
        pending = [f for f in flushes if f is not None]
        if not pending:
            endpoint.close()
            return

        def close(_: object) -> None:
            if not self.closed and endpoint.state & Endpoint.LOCAL_ACTIVE:
                endpoint.close()
                self.schedule_pump()

        asyncio.gather(*pending, return_exceptions=True).add_done_callback(close)

    def _forget_link(self, link: Link) -> None:
        self._forget_key(link._impl)

    def _forget_key(self, link_key: Any) -> asyncio.Future[Any] | None:
        """Forget a link; for a named consumer, the future of storing its last offset."""
        flushing = None
        producer = self.producer.links.pop(link_key, None)
        if producer is not None:
            self.producer.forget(producer)
        consumer = self.consumer.links.pop(link_key, None)
        if consumer is not None:
            flushing = self.consumer.forget(consumer)
        info_link = self.consumer.infos.pop(link_key, None)
        if info_link is not None:
            self.consumer.forget_info(info_link)
        self.nodes.forget(link_key)
        return flushing


async def _release_member(plan: links.ConsumerPlan) -> None:
    """A group member's link that will not open: let go of its claims, leave the group."""
    assert plan.name is not None and plan.coordinator is not None and plan.group is not None
    try:
        for cursor in plan.cursors:
            assert cursor.owner is not None
            with contextlib.suppress(BrokerError):
                await cursor.owner.consumer_detach(plan.name, None, cursor.member)
            cursor.owner.detach()
            if cursor.partition is not cursor.owner:
                cursor.partition.detach()
    finally:
        with contextlib.suppress(BrokerError):
            await plan.coordinator.leave(plan.group, MemberId(plan.member_id))


def _partitions_of(
    plan: links.ProducerPlan | links.ConsumerPlan | StreamName | None,
) -> list[Partition]:
    if isinstance(plan, links.ProducerPlan):
        return list(plan.targets.values())
    if isinstance(plan, links.ConsumerPlan):
        return [cursor.partition for cursor in plan.cursors]
    return []


def _wrap_event(ev: Any) -> Any:
    """proton's Event wrapper for a control event (typed Any: proton's stubs are partial)."""
    return cast(Any, Event).wrap(ev)


def snapshot(ctx: Context) -> ListenerSnapshot:
    """Connections, links and credit of one listener, for a /metrics scrape (O(links))."""
    producers = consumers = infos = attaching = 0
    producer_credit = consumer_credit = unconfirmed = 0
    credit = lib.pn_link_credit
    for connection in ctx.connections:
        producer_part, consumer_part = connection.producer, connection.consumer
        producers += len(producer_part.links)
        consumers += len(consumer_part.links)
        infos += len(consumer_part.infos)
        attaching += len(connection.attaching)
        unconfirmed += producer_part.unconfirmed
        for producer in producer_part.links.values():
            if not producer.closed:
                producer_credit += credit(producer.pointer)
        for consumer in consumer_part.links.values():
            if not consumer.closed:
                consumer_credit += credit(consumer.pointer)
    return ListenerSnapshot(
        connections=len(ctx.connections),
        producer_links=producers,
        consumer_links=consumers,
        info_links=infos,
        attaching_links=attaching,
        producer_credit=producer_credit,
        consumer_credit=consumer_credit,
        unconfirmed=unconfirmed,
    )
