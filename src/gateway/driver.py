"""One AMQP 1.0 connection: an asyncio Protocol driving proton's engine (the only proton module).

Layers, outside in: asyncio transport (TLS already terminated) -> `sasl.SaslServer` until the
outcome -> proton `Transport`/`Connection`/`Collector` (no proton SASL layer) -> our dispatch.

Dispatch (research/proton.md §5): `PN_DELIVERY` events are handled with direct `cproton_ffi.lib`
calls and raw bytes, never `proton.Message` and never proton's Event wrappers; every other event
(open, begin, attach, flow, detach, close) goes through `proton.Event.wrap` and the control
methods below, where link refusals happen in remote-open semantics (attach + detach flushed
together, never undone by a later `open()`).

Pump order: dispatch events -> start appends for the producer batches drained this turn ->
top up producer credit -> send to consumers with credit -> write proton's output -> arm the
heartbeat timer. Input is pushed into proton at most `limits.socket_read_slice_bytes` per loop
turn (reading is paused in between) so one flooding client cannot starve the loop.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from cproton_ffi import ffi, lib
from proton import (
    Collector,
    Condition,
    Connection,
    Data,
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
from spate.core.errors import BrokerError, InvalidArgument, MessageSizeExceeded, NotFound
from spate.core.ids import PartitionId, StreamName
from spate.gateway import codec, inbound, info, links, sections
from spate.gateway.errors import (
    DECODE_ERROR,
    FRAMING_ERROR,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    RESOURCE_LIMIT_EXCEEDED,
    AmqpError,
    amqp_error,
    plain,
)
from spate.gateway.sasl import Authenticate, Close, Done, SaslServer, Send, Stage

log = logging.getLogger(__name__)

EVENT_STREAMS_CAPABILITY = symbol("AMQP_EVENT_STREAMS_V1_0")
LINKS_PER_CONNECTION_MAX = 1024
CONSUMER_UNSETTLED_MAX = 10_000
"""Deliveries one consumer link may hold unsettled (credit beyond this waits for settlements)."""
_TAG = struct.Struct("<Q")
DELIVERY = lib.PN_DELIVERY
ACCEPTED = lib.PN_ACCEPTED
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


@dataclass
class ProducerLink:
    link: Link  # keeps the C link (and its unsettled deliveries) alive while appends are pending
    pointer: Any
    plan: links.ProducerPlan
    presettled: bool
    records: list[bytes] = field(default_factory=list)
    """Drained this turn, for the bound partition (or, on an agnostic link, unannotated ones for
    this batch's round-robin partition)."""
    deliveries: list[Any] = field(default_factory=list)
    """`records[i]`'s delivery, None when it came settled (nothing to confirm)."""
    routed: dict[PartitionId, tuple[list[bytes], list[Any]]] = field(default_factory=dict)
    """Agnostic links: records routed by their event-streams-target-partition annotation."""
    oversize: set[Any] = field(default_factory=set)
    """Deliveries (pointers) being read and dropped: larger than `limits.message_bytes_max`."""
    closed: bool = False


@dataclass
class ConsumerLink:
    link: Link
    pointer: Any
    plan: links.ConsumerPlan
    presettled: bool
    tag: int = 0
    closed: bool = False


@dataclass
class InfoLink:
    link: Link
    pointer: Any
    stream: StreamName
    next_send_s: float = 0.0
    body: dict[str, Any] | None = None
    """Figures gathered for the next message (`_gather_info`)."""
    tag: int = 0
    closed: bool = False


class AmqpConnection(asyncio.Protocol):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.loop = asyncio.get_running_loop()
        self.sasl = SaslServer(
            allow_anonymous=ctx.allow_anonymous, allow_plain=ctx.authenticate_plain is not None
        )
        self.user: str | None = None
        self.engine = Transport(Transport.SERVER)
        self.engine.max_frame_size = limits.frame_bytes_max
        if ctx.idle_timeout_s:
            self.engine.idle_timeout = ctx.idle_timeout_s
        self.conn = Connection()
        self.collector = Collector()
        self.conn.collect(self.collector)
        self.engine.bind(self.conn)
        self.sock: asyncio.Transport | None = None
        self.closed = False
        self._paused_writing = False
        self._rest: memoryview | None = None
        self._pump_scheduled = False
        self._hang_up = False
        """Close the socket once proton's output is written (a framing error was answered)."""
        self.guard = inbound.InboundGuard()
        self._timer: asyncio.TimerHandle | None = None
        self._info_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        # keyed by the C link pointer (cffi pointers hash and compare by address), so the hot
        # path looks a link up by `pn_delivery_link(...)` without converting it to an int
        self.producers: dict[Any, ProducerLink] = {}
        self.consumers: dict[Any, ConsumerLink] = {}
        self.infos: dict[Any, InfoLink] = {}
        self.dirty: set[Any] = set()
        """Producer links (pointers) that drained records this turn."""
        self.attaching: set[Any] = set()
        """Links (pointers) whose attach is being planned (the broker may answer remotely)."""
        self._info_tasks: dict[Any, asyncio.Future[Any]] = {}
        # delivery tags are copied by pn_delivery: one 8-byte buffer serves every send
        self._tag_buffer = ffi.new("char[]", _TAG.size)
        self._tag_view = ffi.buffer(self._tag_buffer)
        self._tag_struct = ffi.new("pn_delivery_tag_t *", (_TAG.size, self._tag_buffer))
        self._tag_value = self._tag_struct[0]
        self.unconfirmed = 0

    # asyncio side -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sock = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        if len(self.ctx.connections) >= limits.connections_max:
            log.warning("refusing connection: %d connections open", limits.connections_max)
            self.sock.abort()
            self.closed = True
            return
        self.ctx.connections.add(self)

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
        for timer in (self._timer, self._info_timer):
            if timer is not None:
                timer.cancel()
        for consumer in self.consumers.values():
            self._forget_consumer(consumer)
        self.consumers.clear()
        for producer in self.producers.values():
            self._forget_producer(producer)
        self.producers.clear()
        self.infos.clear()

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
                self._own(asyncio.ensure_future(self._authenticate(action)))
            else:
                assert isinstance(action, Done)
                self.user = action.user
                if action.rest:
                    self._feed(action.rest)
                else:
                    self.pump()

    async def _authenticate(self, request: Authenticate) -> None:
        user: str | None = None
        if request.mechanism == "ANONYMOUS" and self.ctx.allow_anonymous:
            user = "anonymous"
        elif (
            request.mechanism == "PLAIN"
            and self.ctx.authenticate_plain is not None
            and request.user is not None
            and request.password is not None
            and await self.ctx.authenticate_plain(request.user, request.password)
        ):
            user = request.user
        if not self.closed:
            self._sasl_actions(self.sasl.outcome(user))

    def _own(self, future: asyncio.Future[Any]) -> None:
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
        self._push(bytes(chunk))
        self.pump()
        if len(rest) and not self.closed:
            self._rest = rest
            self.loop.call_soon(self._continue)
        else:
            self._rest = None
            if self.sock is not None and not self.closed:
                self.sock.resume_reading()

    def _push(self, data: bytes) -> None:
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
            [*self.consumers.items(), *self.infos.items()]
            if problem.client_receives
            else [*self.producers.items()]
        )
        for key, state in candidates:
            if state.link.name == problem.link_name and not state.closed:
                condition = NOT_ALLOWED if problem.client_receives else NOT_IMPLEMENTED
                log.info("ending link %r: %s", problem.link_name, problem.description)
                self._forget_key(key)
                state.link.condition = Condition(condition, problem.description)
                state.link.close()
                return

    def _push_engine(self, data: bytes) -> None:
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
                self.engine.push(bytes(view[:n]))
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
        self._flush_appends()
        self._top_up_credit()
        if not self._paused_writing:
            self._send_consumers()
            self._send_infos()
        self._dispatch()
        self._write()

    def _write(self) -> None:
        assert self.sock is not None
        engine = self.engine
        while True:
            pending = engine.pending()
            if pending > 0:
                self.sock.write(engine.peek(pending) or b"")
                engine.pop(pending)
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
        producers = self.producers
        while True:
            ev = peek(collector)
            if ev == ffi.NULL:
                return
            kind = event_type(ev)
            if kind == DELIVERY:
                delivery = event_delivery(ev)
                if readable(delivery):  # a producer link's current delivery: drain the link
                    producer = producers.get(delivery_link(delivery))
                    if producer is not None:
                        self._drain(producer)
                elif (remote_state(delivery) or remote_settled(delivery)) and not is_receiver(
                    delivery_link(delivery)
                ):  # a consumer's disposition: streams are not destructive, any outcome settles
                    settle(delivery)
            elif kind in _CONTROL_EVENTS:
                self._control(kind, _wrap_event(ev))
            pop(collector)

    # control plane ------------------------------------------------------------------------------

    def _control(self, kind: int, event: Any) -> None:
        if kind == lib.PN_LINK_REMOTE_OPEN:
            self._link_remote_open(event.link)
        elif kind == lib.PN_LINK_FLOW:
            self.schedule_pump()
        elif kind in (lib.PN_LINK_REMOTE_CLOSE, lib.PN_LINK_REMOTE_DETACH):
            self._forget_link(event.link)
            if event.link.state & Endpoint.LOCAL_ACTIVE:
                event.link.close()
        elif kind == lib.PN_SESSION_REMOTE_OPEN:
            if event.session.state & Endpoint.LOCAL_UNINIT:
                event.session.open()
        elif kind == lib.PN_SESSION_REMOTE_CLOSE:
            for link_key in self._links_of(event.session):
                self._forget_key(link_key)
            if event.session.state & Endpoint.LOCAL_ACTIVE:
                event.session.close()
        elif kind == lib.PN_CONNECTION_REMOTE_OPEN:
            conn = event.connection
            conn.container = self.ctx.node_id
            conn.offered_capabilities = [EVENT_STREAMS_CAPABILITY]
            conn.properties = {symbol("product"): "spate", symbol("node"): self.ctx.node_id}
            conn.open()
        elif kind == lib.PN_CONNECTION_REMOTE_CLOSE:
            for link_key in list(self.producers) + list(self.consumers) + list(self.infos):
                self._forget_key(link_key)
            event.connection.close()
        elif kind == lib.PN_TRANSPORT_ERROR:
            log.info("AMQP transport error: %s", event.transport.condition)

    def _links_of(self, session: Any) -> list[Any]:
        out = []
        for table in (self.producers, self.consumers, self.infos):
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
        try:
            if (
                len(self.producers) + len(self.consumers) + len(self.infos) + len(self.attaching)
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
            parsed = links.parse_address(address, terminus=terminus)
        except BrokerError as err:
            self._refuse(link, amqp_error(err), address)
            return
        self.attaching.add(link._impl)
        self._own(asyncio.ensure_future(self._attach(link, parsed, address)))

    async def _attach(self, link: Link, parsed: links.Address, address: str | None) -> None:
        """Plan the link with the broker (which may ask a node over the wire), then answer the
        attach: open it, or refuse it (attach + detach) with the broker's error."""
        properties = dict(link.remote_properties or {})
        plan: links.ProducerPlan | links.ConsumerPlan | StreamName | None = None
        answer: dict[symbol, Any] | None = None
        error: AmqpError | None = None
        try:
            broker = self._broker_for(properties)
            if link.is_receiver:
                plan = await links.plan_producer(broker, parsed, properties)
                if properties.get(links.PARTITION_PROPERTY) is not None:
                    assert plan.bound is not None
                    answer = await _bound_properties(plan.bound, plan.targets[plan.bound])
            elif parsed.info:
                plan = await links.plan_info(broker, parsed)
            else:
                filters = _filter_map(link.remote_source.filter)
                plan = await links.plan_consumer(broker, parsed, properties, filters)
                if plan.bound is not None:
                    answer = await _bound_properties(plan.bound, plan.cursors[0].partition)
        except BrokerError as err:
            error = amqp_error(err)
        except Exception as err:
            log.exception("planning link %r to %r failed", link.name, address)
            error = amqp_error(BrokerError(f"the attach failed: {type(err).__name__}: {err}"))
        finally:
            self.attaching.discard(link._impl)
        if self.closed or link.state & Endpoint.REMOTE_CLOSED:
            _detach_all(_partitions_of(plan))  # the client went away meanwhile
            return
        if error is not None:
            _detach_all(_partitions_of(plan))
            self._refuse(link, error, address)
        elif isinstance(plan, links.ProducerPlan):
            self._open_producer(link, plan, answer)
        elif isinstance(plan, links.ConsumerPlan):
            self._open_consumer(link, plan, answer)
        else:
            assert plan is not None
            self._open_info(link, plan)
        self.schedule_pump()

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
        log.info(
            "refused link %r to %r: %s %s", link.name, address, error.condition, error.description
        )

    def _open_producer(
        self, link: Link, plan: links.ProducerPlan, answer: dict[symbol, Any] | None
    ) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if answer is not None:
            link.properties = answer
        link.max_message_size = limits.message_bytes_max
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        state = ProducerLink(link, link._impl, plan, presettled)
        self.producers[link._impl] = state
        link.open()
        self._top_up(state)

    def _open_consumer(
        self, link: Link, plan: links.ConsumerPlan, answer: dict[symbol, Any] | None
    ) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.source.filter.clear()
        if plan.selection.accepted_keys:
            original = _data_object(link.remote_source.filter) or {}
            link.source.filter.put_object(
                {key: original[key] for key in original if key in plan.selection.accepted_keys}
            )
        if answer is not None:
            link.properties = answer
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        if presettled:
            link.snd_settle_mode = Link.SND_SETTLED
        state = ConsumerLink(link, link._impl, plan, presettled)
        self.consumers[link._impl] = state
        for cursor in plan.cursors:
            cursor.partition.add_listener(self.schedule_pump)
        link.open()
        self.schedule_pump()

    def _open_info(self, link: Link, stream: StreamName) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.source.filter.clear()
        if link.remote_snd_settle_mode == Link.SND_SETTLED:
            link.snd_settle_mode = Link.SND_SETTLED
        self.infos[link._impl] = InfoLink(link, link._impl, stream)
        link.open()
        self.schedule_pump()

    def _forget_link(self, link: Link) -> None:
        self._forget_key(link._impl)

    def _forget_key(self, link_key: Any) -> None:
        producer = self.producers.pop(link_key, None)
        if producer is not None:
            self._forget_producer(producer)
        consumer = self.consumers.pop(link_key, None)
        if consumer is not None:
            self._forget_consumer(consumer)
        info_link = self.infos.pop(link_key, None)
        if info_link is not None:
            info_link.closed = True

    def _forget_producer(self, producer: ProducerLink) -> None:
        producer.closed = True
        _detach_all(producer.plan.targets.values())

    def _forget_consumer(self, consumer: ConsumerLink) -> None:
        consumer.closed = True
        for cursor in consumer.plan.cursors:
            cursor.partition.remove_listener(self.schedule_pump)
        _detach_all(c.partition for c in consumer.plan.cursors)

    # hot path: deliveries -----------------------------------------------------------------------

    def _drain(self, producer: ProducerLink) -> None:
        """Read every complete delivery of a producer link (called for its current delivery)."""
        lp = producer.pointer
        buf = self.ctx.recv_buffer
        size_max = limits.message_bytes_max
        current, partial, recv, advance = (
            lib.pn_link_current,
            lib.pn_delivery_partial,
            lib.pn_link_recv,
            lib.pn_link_advance,
        )
        remote_settled, settle, unpack, is_plain = (
            lib.pn_delivery_settled,
            lib.pn_delivery_settle,
            ffi.unpack,
            sections.is_plain,
        )
        presettled = producer.presettled
        records, deliveries = producer.records, producer.deliveries
        oversize = producer.oversize
        got = 0
        while True:
            cur = current(lp)
            if cur == ffi.NULL:
                break
            if partial(cur):
                if lib.pn_delivery_aborted(cur):
                    self._discard_aborted(producer, cur)
                    continue
                if cur in oversize or lib.pn_delivery_pending(cur) > size_max:
                    oversize.add(cur)  # discard what arrived: the message is too big to store
                    while recv(lp, buf, size_max + 1) > 0:
                        pass
                break
            size = recv(lp, buf, size_max + 1)
            if size > size_max or (oversize and cur in oversize):
                self._reject_oversize(producer, cur)
                continue
            if size < 0:
                if lib.pn_delivery_aborted(cur):
                    self._discard_aborted(producer, cur)
                    continue
                size = 0  # an empty transfer: not a message, scan_incoming says why
            raw = unpack(buf, size)
            advance(lp)
            if not is_plain(raw):
                self._accept_incoming(producer, cur, raw)
                got += 1
                continue
            if presettled or remote_settled(cur):
                settle(cur)
                deliveries.append(None)
            else:
                deliveries.append(cur)
                self.unconfirmed += 1
            records.append(raw)
            got += 1
        if got:
            self.dirty.add(lp)

    def _discard_aborted(self, producer: ProducerLink, delivery: Any) -> None:
        producer.oversize.discard(delivery)
        lib.pn_link_advance(producer.pointer)
        lib.pn_delivery_settle(delivery)

    def _reject_oversize(self, producer: ProducerLink, delivery: Any) -> None:
        """The rest of a message over `limits.message_bytes_max` is read and dropped; the
        delivery is rejected and the link stays usable."""
        lp, buf, size_max = producer.pointer, self.ctx.recv_buffer, limits.message_bytes_max
        while lib.pn_link_recv(lp, buf, size_max + 1) > 0:
            pass
        producer.oversize.discard(delivery)
        lib.pn_link_advance(lp)
        error = amqp_error(
            MessageSizeExceeded(f"message larger than {size_max} bytes (limits.message_bytes_max)")
        )
        self._reject(delivery, error)

    def _accept_incoming(self, producer: ProducerLink, delivery: Any, raw: bytes) -> None:
        """The full path for what `sections.is_plain` did not settle: delivery annotations
        (routing by event-streams-target-partition), rarer layouts, and malformed messages."""
        try:
            incoming = sections.scan_incoming(raw)
        except sections.MalformedMessage as err:
            self._reject(delivery, plain(DECODE_ERROR, f"malformed message: {err}"))
            return
        settled = producer.presettled or lib.pn_delivery_settled(delivery)
        if settled:
            lib.pn_delivery_settle(delivery)
            delivery = None
        else:
            self.unconfirmed += 1
        plan = producer.plan
        if incoming.delivery_annotations is not None:
            try:
                annotations = sections.delivery_annotations_map(incoming.delivery_annotations)
                target = annotations.get(links.TARGET_PARTITION_ANNOTATION)
                pid = plan.route(target) if target is not None else None
            except sections.MalformedMessage as err:
                self._reject_counted(delivery, plain(DECODE_ERROR, f"malformed message: {err}"))
                return
            except BrokerError as err:
                self._reject_counted(delivery, amqp_error(err))
                return
            if pid is not None and plan.bound is None:
                records, deliveries = producer.routed.setdefault(pid, ([], []))
                records.append(incoming.stored)
                deliveries.append(delivery)
                return
        # bound links keep arrival order in one list (a routed message there matched the bound
        # partition); agnostic links collect the unannotated for this batch's round-robin turn
        producer.records.append(incoming.stored)
        producer.deliveries.append(delivery)

    def _reject_counted(self, delivery: Any, error: AmqpError) -> None:
        if delivery is not None:
            self.unconfirmed -= 1
            self._reject(delivery, error)

    def _reject(self, delivery: Any, error: AmqpError) -> None:
        if not lib.pn_delivery_settled(delivery):
            condition = lib.pn_disposition_condition(lib.pn_delivery_local(delivery))
            lib.pn_condition_set_name(condition, error.condition.encode())
            lib.pn_condition_set_description(condition, error.description.encode())
            lib.pn_delivery_update(delivery, lib.PN_REJECTED)
        lib.pn_delivery_settle(delivery)

    def _flush_appends(self) -> None:
        while self.dirty:
            producer = self.producers.get(self.dirty.pop())
            if producer is None or producer.closed:
                continue
            plan = producer.plan
            batches, producer.routed = producer.routed, {}
            records, deliveries = producer.records, producer.deliveries
            if records:
                producer.records, producer.deliveries = [], []
                if plan.bound is not None:
                    pid = plan.bound
                else:
                    pid = plan.route(None)
                    plan.next_batch()
                routed = batches.get(pid)
                if routed is None:
                    batches[pid] = (records, deliveries)
                else:
                    routed[0].extend(records)
                    routed[1].extend(deliveries)
            for pid, (batch_records, batch_deliveries) in batches.items():
                for start, end in _chunk_bounds(batch_records):
                    self._append(
                        producer, pid, batch_records[start:end], batch_deliveries[start:end]
                    )

    def _append(
        self,
        producer: ProducerLink,
        pid: PartitionId,
        records: list[bytes],
        deliveries: list[Any],
    ) -> None:
        """One chunk; `deliveries[i]` is record i's delivery, None when it came settled."""
        partition = producer.plan.targets.get(pid)
        try:
            if partition is None:
                raise NotFound(f"partition {int(pid)} is not served on this link")
            pending = partition.append(records)
        except BrokerError as err:
            self._appended(producer, deliveries, err)
            return
        future = asyncio.ensure_future(pending)
        self._own(future)
        future.add_done_callback(lambda f: self._append_done(producer, deliveries, f))

    def _append_done(
        self, producer: ProducerLink, deliveries: list[Any], future: asyncio.Future[Any]
    ) -> None:
        if future.cancelled():
            self._appended(producer, deliveries, BrokerError("append was cancelled"))
            return
        error = future.exception()
        if error is not None and not isinstance(error, BrokerError):
            log.error("append failed with an unexpected error", exc_info=error)
            error = BrokerError(f"append failed: {type(error).__name__}")
        self._appended(producer, deliveries, error)

    def _appended(
        self, producer: ProducerLink, deliveries: list[Any], error: BrokerError | None
    ) -> None:
        self.unconfirmed -= len(deliveries) - deliveries.count(None)
        if self.closed or producer.closed:
            return  # the link or connection is gone; nobody is waiting for the outcome
        if error is None:
            update, settle, accepted = lib.pn_delivery_update, lib.pn_delivery_settle, ACCEPTED
            for delivery in deliveries:
                if delivery is not None:
                    update(delivery, accepted)
                    settle(delivery)
        else:
            amqp = amqp_error(error)
            for delivery in deliveries:
                if delivery is not None:
                    self._reject(delivery, amqp)
        self.schedule_pump()

    def _top_up_credit(self) -> None:
        for producer in self.producers.values():
            self._top_up(producer)

    def _top_up(self, producer: ProducerLink) -> None:
        """Credit is admission control: none while too much waits for durability."""
        if producer.closed or self.unconfirmed >= limits.producer_unconfirmed_max:
            return
        credit = lib.pn_link_credit(producer.pointer)
        if credit < limits.link_credit_max // 2:
            lib.pn_link_flow(producer.pointer, limits.link_credit_max - credit)

    # hot path: consumers ------------------------------------------------------------------------

    def _send_consumers(self) -> None:
        """Per link, up to its room in runs of consecutive records; each run's delivery
        annotations are encoded once (`sections.delivery_annotation_parts`) and spliced into
        every record of it (`sections.splice_run`). Unsettled deliveries are proton's count
        (`pn_link_unsettled`); any ack arrives with input, which is followed by a pump."""
        more = False
        new_delivery, send, advance, settle = (
            lib.pn_delivery,
            lib.pn_link_send,
            lib.pn_link_advance,
            lib.pn_delivery_settle,
        )
        tag_view, tag_value = self._tag_view, self._tag_value
        pack_tag = _TAG.pack_into
        parts = sections.delivery_annotation_parts
        for consumer in self.consumers.values():
            if consumer.closed:
                continue
            lp = consumer.pointer
            room = lib.pn_link_credit(lp)
            if not consumer.presettled:
                room = min(room, CONSUMER_UNSETTLED_MAX - lib.pn_link_unsettled(lp))
            room = min(room, limits.consumer_send_batch_max)
            if room <= 0:
                continue
            plan = consumer.plan
            presettled = consumer.presettled
            tag = consumer.tag
            sent = 0
            for run in plan.take(room):
                prefix, suffix = parts(
                    run.timestamp_ms, run.cursor.symbol if plan.tag_source_partition else None
                )
                for out in sections.splice_run(run.records, run.first_offset, prefix, suffix):
                    tag += 1
                    pack_tag(tag_view, 0, tag)
                    delivery = new_delivery(lp, tag_value)
                    send(lp, out, len(out))
                    advance(lp)
                    if presettled:
                        settle(delivery)
                sent += len(run.records)
            consumer.tag = tag
            if sent == room and plan.available():
                more = True
            elif lib.pn_link_get_drain(lp) and not plan.available():
                # Core §2.6.7: asked to drain, and nothing more to send now: use up the rest of
                # the credit (delivery-count advances; the flow goes out with this pump).
                lib.pn_link_drained(lp)
        if more:
            self.schedule_pump()  # another turn, after other connections had theirs

    async def _gather_info(self, state: InfoLink) -> None:
        """The figures of a `$info` message (the broker may ask the nodes over the wire)."""
        try:
            state.body = await info.runtime_information(
                self.ctx.broker, state.stream, self.ctx.node_id
            )
        except BrokerError as err:
            if not state.closed:
                error = amqp_error(err)
                state.closed = True
                state.link.condition = Condition(error.condition, error.description)
                state.link.close()
        finally:
            del self._info_tasks[state.pointer]
        self.schedule_pump()

    def _send_infos(self) -> None:
        now = self.loop.time()
        wake: float | None = None
        for state in self.infos.values():
            if state.closed or lib.pn_link_credit(state.pointer) <= 0:
                continue
            if now < state.next_send_s:
                wake = state.next_send_s if wake is None else min(wake, state.next_send_s)
                continue
            if state.pointer in self._info_tasks:
                continue  # the figures are being gathered
            body = state.body
            if body is None:
                task = asyncio.ensure_future(self._gather_info(state))
                self._info_tasks[state.pointer] = task
                self._own(task)
                continue
            state.body = None
            message = info.encode_info_message(body)
            state.tag += 1
            tag = _TAG.pack(state.tag)
            delivery = lib.pn_delivery(state.pointer, (len(tag), ffi.from_buffer(tag)))
            lib.pn_link_send(state.pointer, ffi.from_buffer(message), len(message))
            lib.pn_link_advance(state.pointer)
            if lib.pn_link_snd_settle_mode(state.pointer) == lib.PN_SND_SETTLED:
                lib.pn_delivery_settle(delivery)
            state.next_send_s = now + info.INTERVAL_S
            if lib.pn_link_credit(state.pointer) > 0:
                wake = state.next_send_s if wake is None else min(wake, state.next_send_s)
        if wake is not None:
            if self._info_timer is not None:
                self._info_timer.cancel()
            self._info_timer = self.loop.call_at(wake, self.schedule_pump)


def _detach_all(partitions: Iterable[Partition]) -> None:
    for partition in partitions:
        partition.detach()


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


def _chunk_bounds(records: list[bytes]) -> list[tuple[int, int]]:
    """Cut one batch into chunks within limits.chunk_records_max / chunk_bytes_max:
    [(start, end), ...] index ranges."""
    records_max, bytes_max = limits.chunk_records_max, limits.chunk_bytes_max
    if len(records) <= records_max and sum(map(len, records)) <= bytes_max:
        return [(0, len(records))]
    bounds: list[tuple[int, int]] = []
    start = 0
    size = 0
    for i, record in enumerate(records):
        if i > start and (i - start >= records_max or size + len(record) > bytes_max):
            bounds.append((start, i))
            start = i
            size = 0
        size += len(record)
    bounds.append((start, len(records)))
    return bounds


def _filter_map(filter_data: Data) -> dict[Any, Any] | None:
    """The source filter as our codec decodes it (symbols, Described, Timestamp)."""
    raw = filter_data.encode()
    if not raw:
        return None
    try:
        value = codec.decode(raw)
    except codec.DecodeError as err:
        raise InvalidArgument(f"source filter is not a valid AMQP map: {err}") from err
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument("source filter must be a map (filter-set)")
    return value


def _data_object(data: Data) -> Any:
    data.rewind()
    if not data.next():
        return None
    value = data.get_object()
    data.rewind()
    return value
