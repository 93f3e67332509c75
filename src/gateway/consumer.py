"""The consumer part of an AMQP connection (spate.gateway.driver): links the client receives
on — consumers of a stream and `<stream>/$info`.

Hot path out (`send`, once per pump): per link, up to its room (`links.consumer_room`) in runs
of consecutive records; each run's delivery annotations are encoded once
(`sections.delivery_annotation_parts`) and spliced into every record of it
(`sections.splice_run`); one reused 8-byte tag buffer carries the delivery tags.

Named consumers (`spate:consumer-name`, ADR 0012): each link's `OffsetTracker` learns which
offsets its tags carry and what the client settled; `store_due` (once per pump) stores what is
due at the partition's leader, one store in flight per link; `forget` stores the rest and
returns the future the link's detach waits for.

Single active consumer (ADR 0013): a standby link (`ConsumerPlan.active` False) is open but
sent nothing; `_membership` waits at the partition's leader for its turn, begins its cursor
after the group's stored offset, and the first delivery it then sends carries the delivery
annotation `spate:active` = true (`announce`); in a spread group it also steps down when
asked (`_stop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
from dataclasses import dataclass, field
from typing import Any

from cproton_ffi import ffi, lib
from proton import Condition, Data, Link, symbol
from spate.core.errors import BrokerError, InvalidArgument
from spate.core.ids import StreamName
from spate.gateway import codec, info, links, sections
from spate.gateway.errors import STOLEN, amqp_error, plain
from spate.gateway.producer import Host, detach_all
from spate.gateway.tracking import OffsetTracker

_TAG = struct.Struct("<Q")
_DONE_STATES = frozenset((0, lib.PN_ACCEPTED, lib.PN_REJECTED))
"""Dispositions after which a named consumer is done with a delivery (0: settled with no
outcome); released and modified ones it gets again after a restart."""


@dataclass
class ConsumerLink:
    link: Link
    pointer: Any
    plan: links.ConsumerPlan
    presettled: bool
    tag: int = 0
    closed: bool = False
    tracker: OffsetTracker | None = None
    """Named consumers: what the client is done with, and what was stored."""
    storing: asyncio.Future[Any] | None = None
    """Named consumers: the store in flight (one at a time per link)."""
    storing_tag: int = 0
    """The tag through which the store in flight covers every delivery."""
    confirm: bool = False
    """Named consumers in rcv-settle-mode second: accepted deliveries are settled once their
    offset is stored (the client's commit confirmation)."""
    awaiting: dict[int, Any] = field(default_factory=dict)
    """tag -> delivery accepted in rcv-settle-mode second, waiting for its store."""
    announce: bool = False
    """Single active consumer: the next delivery carries `spate:active` (it took over)."""


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


class ConsumerPart:
    def __init__(self, host: Host, ctx: Any) -> None:
        self.host = host
        self.ctx = ctx
        """The listener's Context (broker, node id)."""
        self.loop = asyncio.get_running_loop()
        self.links: dict[Any, ConsumerLink] = {}
        self.tracked: dict[Any, ConsumerLink] = {}
        """The named consumers among `links` (by link pointer)."""
        self._store_timer: asyncio.TimerHandle | None = None
        self.infos: dict[Any, InfoLink] = {}
        self._info_timer: asyncio.TimerHandle | None = None
        self._info_tasks: dict[Any, asyncio.Future[Any]] = {}
        # delivery tags are copied by pn_delivery: one 8-byte buffer serves every send
        self._tag_buffer = ffi.new("char[]", _TAG.size)
        self._tag_view = ffi.buffer(self._tag_buffer)
        self._tag_struct = ffi.new("pn_delivery_tag_t *", (_TAG.size, self._tag_buffer))
        self._tag_value = self._tag_struct[0]

    def open(self, link: Link, plan: links.ConsumerPlan, answer: dict[symbol, Any] | None) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.source.filter.clear()
        if plan.selection.accepted_keys:
            original = data_object(link.remote_source.filter) or {}
            link.source.filter.put_object(
                {key: original[key] for key in original if key in plan.selection.accepted_keys}
            )
        if answer is not None:
            link.properties = answer
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        if presettled:
            link.snd_settle_mode = Link.SND_SETTLED
        state = ConsumerLink(link, link._impl, plan, presettled)
        self.links[link._impl] = state
        if plan.name is not None and not presettled:
            state.confirm = link.remote_rcv_settle_mode == Link.RCV_SECOND
            link.rcv_settle_mode = link.remote_rcv_settle_mode
        if plan.name is not None:
            state.tracker = OffsetTracker(
                self.ctx.offset_commit_messages, self.ctx.offset_commit_interval_ms
            )
            self.tracked[link._impl] = state
        for cursor in plan.cursors:
            cursor.partition.add_listener(self.host.schedule_pump)
        link.open()
        if plan.group is not None:
            self.host.own(asyncio.ensure_future(self._ownership(state)))
        elif plan.member:
            self.host.own(asyncio.ensure_future(self._membership(state)))
        self.host.schedule_pump()

    async def _membership(self, consumer: ConsumerLink) -> None:
        """A group member's turns (ADR 0013), as long as its link lasts: a standby waits for
        the partition, begins after the group's stored offset and announces it; in a spread
        group (a super stream's partition) the active member also waits to be asked to step
        down, then stops sending, stores what it finished and hands the partition over."""
        plan = consumer.plan
        assert plan.name is not None
        partition = plan.cursors[0].partition
        try:
            while not consumer.closed:
                if not plan.active:
                    now = await partition.until_active(plan.name, plan.member)
                    if not now.active or consumer.closed:
                        return
                    await links.start_when_active(plan, now)
                    if consumer.closed or self.host.closed:
                        return
                    consumer.announce = True
                    self.host.schedule_pump()
                if plan.spread is None:
                    return  # the first member stays active until it goes
                deposed = await partition.until_deposed(plan.name, plan.member)
                if deposed.active or consumer.closed:
                    return  # it left the group
                offset, covered = self._stop(consumer)
                await partition.step_down(plan.name, plan.member, offset)
                if covered and not consumer.closed and not self.host.closed:
                    for delivery in covered:  # stored: settling confirms the client's commit
                        lib.pn_delivery_settle(delivery)
                    self.host.schedule_pump()
        except BrokerError as err:
            if not consumer.closed and not self.host.closed:
                error = amqp_error(err)
                self.host.end_consumer(
                    consumer,
                    plain(
                        error.condition,
                        f"the single-active-consumer hand-over failed: {error.description}",
                    ),
                )

    async def _ownership(self, consumer: ConsumerLink) -> None:
        """A consumer group's link owns its partition (ADR 0015) until another claims it with
        a greater epoch: then it stops sending, stores what it finished (still the owner), is
        detached with `amqp:link:stolen`, and the claimer starts after that offset."""
        plan = consumer.plan
        assert plan.name is not None
        partition = plan.cursors[0].partition
        where = f"consumer group {plan.group!r} on {plan.stream}/{int(plan.bound or 0)}"
        try:
            deposed = await partition.until_deposed(plan.name, plan.member)
            if deposed.active or consumer.closed or self.host.closed:
                return  # it left
            offset, covered = self._stop(consumer)
            await partition.step_down(plan.name, plan.member, offset)
            if consumer.closed or self.host.closed:
                return
            for delivery in covered:  # stored: settling confirms the client's commit
                lib.pn_delivery_settle(delivery)
            self.host.end_consumer(
                consumer,
                plain(
                    STOLEN,
                    f"{where} was taken over by a link with a greater epoch (this one had "
                    f"{plan.epoch}); what it finished is committed",
                ),
            )
        except BrokerError as err:
            if not consumer.closed and not self.host.closed:
                error = amqp_error(err)
                self.host.end_consumer(
                    consumer,
                    plain(
                        error.condition,
                        f"{where} is no longer owned by this link: {error.description}; attach "
                        "again (with the same epoch) to own it",
                    ),
                )

    def _stop(self, consumer: ConsumerLink) -> tuple[int | None, list[Any]]:
        """The active member steps down: send nothing more, and start afresh on what the client
        finishes (what it settles from now on is the next active member's to store). Returns
        the offset to store (None: nothing new since the last store) and the deliveries
        waiting for a store (rcv-settle-mode second) that it covers, to settle once stored."""
        plan = consumer.plan
        plan.active = False
        consumer.announce = False
        for cursor in plan.cursors:
            cursor.pending.clear()
        tracker = consumer.tracker
        assert tracker is not None
        through = tracker.done_tag
        offset = tracker.take()
        consumer.tracker = OffsetTracker(
            tracker.every, tracker.interval_ms, done_tag=consumer.tag, stored=tracker.stored
        )
        covered = [d for tag, d in consumer.awaiting.items() if tag <= through]
        consumer.awaiting.clear()  # those above a gap are never stored by this member
        return offset, covered

    def open_info(self, link: Link, stream: StreamName) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.source.filter.clear()
        if link.remote_snd_settle_mode == Link.SND_SETTLED:
            link.snd_settle_mode = Link.SND_SETTLED
        self.infos[link._impl] = InfoLink(link, link._impl, stream)
        link.open()
        self.host.schedule_pump()

    def forget(self, consumer: ConsumerLink) -> asyncio.Future[Any] | None:
        """Let go of the link; a named consumer's remaining offset is stored, and the future
        of that is returned (the link's detach is answered when it is done)."""
        consumer.closed = True
        for cursor in consumer.plan.cursors:
            cursor.partition.remove_listener(self.host.schedule_pump)
        detach_all(c.partition for c in consumer.plan.cursors)
        if consumer.tracker is None or consumer.plan.name is None:
            return None
        self.tracked.pop(consumer.pointer, None)
        flushing = asyncio.ensure_future(
            _flush(consumer.plan, consumer.storing, consumer.tracker.take())
        )
        self.host.own(flushing)
        return flushing

    # named consumers ----------------------------------------------------------------------------

    def settled(self, consumer: ConsumerLink, delivery: Any) -> bool:
        """The client settled (or gave an outcome for) one of a named consumer's deliveries.
        False: keep it unsettled until its offset is stored (rcv-settle-mode second)."""
        assert consumer.tracker is not None
        tag = lib.pn_delivery_tag(delivery)
        if tag.size != _TAG.size:
            return True
        (number,) = _TAG.unpack(ffi.buffer(tag.start, tag.size))
        remote_settled = lib.pn_delivery_settled(delivery)
        if number in consumer.awaiting:  # a second disposition for one waiting on its store
            if remote_settled:
                del consumer.awaiting[number]
            return bool(remote_settled)
        done = lib.pn_delivery_remote_state(delivery) in _DONE_STATES
        consumer.tracker.settled(number, done, self.loop.time() * 1000)
        if done and consumer.confirm and not remote_settled:
            consumer.awaiting[number] = delivery
            self.host.schedule_pump()  # a client waits on this store: start it now
            return False
        return True

    def store_due(self) -> None:
        """Start the stores that are due (one in flight per link); wake for the next one."""
        now_ms = self.loop.time() * 1000
        wake: float | None = None
        for consumer in self.tracked.values():
            tracker = consumer.tracker
            assert tracker is not None
            if consumer.closed or consumer.storing is not None:
                continue
            if tracker.due(now_ms, urgent=bool(consumer.awaiting)):
                consumer.storing_tag = tracker.done_tag
                offset = tracker.take()
                assert offset is not None and consumer.plan.name is not None
                store = consumer.plan.cursors[0].partition.store_offset(
                    consumer.plan.name, offset, consumer.plan.member
                )
                future = asyncio.ensure_future(store)
                consumer.storing = future
                self.host.own(future)
                future.add_done_callback(functools.partial(self._stored, consumer))
            else:
                at = tracker.wake_at_ms()
                if at is not None:
                    wake = at if wake is None else min(wake, at)
        if wake is not None and self._store_timer is None:
            self._store_timer = self.loop.call_at(wake / 1000, self._store_wake)

    def _store_wake(self) -> None:
        self._store_timer = None
        self.host.schedule_pump()

    def _stored(self, consumer: ConsumerLink, future: asyncio.Future[Any]) -> None:
        consumer.storing = None
        error = None if future.cancelled() else future.exception()
        if error is not None and not consumer.closed and not self.host.closed:
            amqp = amqp_error(error) if isinstance(error, BrokerError) else None
            self.host.end_consumer(
                consumer,
                plain(
                    amqp.condition if amqp else "amqp:internal-error",
                    f"the consumer's offset could not be stored "
                    f"({amqp.description if amqp else repr(error)}); attach again to resume "
                    f"after '{links.STORED_OFFSET_PROPERTY}'",
                ),
            )
            return
        if consumer.awaiting and not consumer.closed and not self.host.closed:
            through, kept = consumer.storing_tag, {}
            for tag, delivery in consumer.awaiting.items():
                if tag <= through:  # stored: settling it confirms the client's commit
                    lib.pn_delivery_settle(delivery)
                else:
                    kept[tag] = delivery
            consumer.awaiting = kept
        self.host.schedule_pump()

    def forget_info(self, info_link: InfoLink) -> None:
        info_link.closed = True

    def forget_all(self) -> None:
        if self._info_timer is not None:
            self._info_timer.cancel()
        for consumer in self.links.values():
            self.forget(consumer)
        self.links.clear()
        self.infos.clear()

    # hot path: consumers ------------------------------------------------------------------------

    def send(self) -> None:
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
        for consumer in self.links.values():
            if consumer.closed:
                continue
            lp = consumer.pointer
            if not consumer.plan.active:  # a standby: nothing to send (drained when asked)
                if lib.pn_link_get_drain(lp):
                    lib.pn_link_drained(lp)
                continue
            room = links.consumer_room(
                lib.pn_link_credit(lp), lib.pn_link_unsettled(lp), consumer.presettled
            )
            if room <= 0:
                continue
            plan = consumer.plan
            presettled = consumer.presettled
            tag = consumer.tag
            sent = 0
            runs_sent = []
            for run in plan.take(room):
                source = run.cursor.symbol if plan.tag_source_partition else None
                prefix, suffix = parts(run.timestamp_ms, source)
                outs = sections.splice_run(run.records, run.first_offset, prefix, suffix)
                if consumer.announce:  # the first delivery since it took over says so
                    consumer.announce = False
                    first, rest = parts(run.timestamp_ms, source, active=True)
                    outs[0] = sections.splice_run(run.records[:1], run.first_offset, first, rest)[0]
                for out in outs:
                    tag += 1
                    pack_tag(tag_view, 0, tag)
                    delivery = new_delivery(lp, tag_value)
                    send(lp, out, len(out))
                    advance(lp)
                    if presettled:
                        settle(delivery)
                sent += len(run.records)
                runs_sent.append(run)
            if consumer.tracker is not None and sent:
                self._track_sent(consumer, tag, runs_sent)
            consumer.tag = tag
            if sent == room and plan.available():
                more = True
            elif lib.pn_link_get_drain(lp) and not plan.available():
                # Core §2.6.7: asked to drain, and nothing more to send now: use up the rest of
                # the credit (delivery-count advances; the flow goes out with this pump).
                lib.pn_link_drained(lp)
        if more:
            self.host.schedule_pump()  # another turn, after other connections had theirs

    def _track_sent(self, consumer: ConsumerLink, last_tag: int, runs: list[Any]) -> None:
        tracker = consumer.tracker
        assert tracker is not None
        tag = last_tag - sum(len(run.records) for run in runs) + 1
        for run in runs:
            tracker.sent(tag, int(run.first_offset), len(run.records))
            tag += len(run.records)
        if consumer.presettled:  # at most once: done as it is sent
            tracker.done_through(last_tag, self.loop.time() * 1000)

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
        self.host.schedule_pump()

    def send_infos(self) -> None:
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
                self.host.own(task)
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
            self._info_timer = self.loop.call_at(wake, self.host.schedule_pump)


async def _flush(
    plan: links.ConsumerPlan, storing: asyncio.Future[Any] | None, offset: int | None
) -> None:
    """A named consumer's link is going: after the store in flight, store the rest and stop
    counting the link at the leader."""
    if storing is not None:
        with contextlib.suppress(BrokerError):  # a failed store: this one covers it
            await asyncio.shield(storing)
    assert plan.name is not None
    await plan.cursors[0].partition.consumer_detach(plan.name, offset, plan.member)


def filter_map(filter_data: Data) -> dict[Any, Any] | None:
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


def data_object(data: Data) -> Any:
    data.rewind()
    if not data.next():
        return None
    value = data.get_object()
    data.rewind()
    return value
