"""The consumer part of an AMQP connection (spate.gateway.driver): links the client receives
on — consumers of a stream and `<stream>/$info`.

Hot path out (`send`, once per pump): per link, up to its room (`links.consumer_room`) in runs
of consecutive records; each run's delivery annotations are encoded once
(`sections.delivery_annotation_parts`) and spliced into every record of it
(`sections.splice_run`); one reused 8-byte tag buffer carries the delivery tags.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

from cproton_ffi import ffi, lib
from proton import Condition, Data, Link, symbol
from spate.core.errors import BrokerError, InvalidArgument
from spate.core.ids import StreamName
from spate.gateway import codec, info, links, sections
from spate.gateway.errors import amqp_error
from spate.gateway.producer import Host, detach_all

_TAG = struct.Struct("<Q")


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


class ConsumerPart:
    def __init__(self, host: Host, ctx: Any) -> None:
        self.host = host
        self.ctx = ctx
        """The listener's Context (broker, node id)."""
        self.loop = asyncio.get_running_loop()
        self.links: dict[Any, ConsumerLink] = {}
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
        for cursor in plan.cursors:
            cursor.partition.add_listener(self.host.schedule_pump)
        link.open()
        self.host.schedule_pump()

    def open_info(self, link: Link, stream: StreamName) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.source.filter.clear()
        if link.remote_snd_settle_mode == Link.SND_SETTLED:
            link.snd_settle_mode = Link.SND_SETTLED
        self.infos[link._impl] = InfoLink(link, link._impl, stream)
        link.open()
        self.host.schedule_pump()

    def forget(self, consumer: ConsumerLink) -> None:
        consumer.closed = True
        for cursor in consumer.plan.cursors:
            cursor.partition.remove_listener(self.host.schedule_pump)
        detach_all(c.partition for c in consumer.plan.cursors)

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
            room = links.consumer_room(
                lib.pn_link_credit(lp), lib.pn_link_unsettled(lp), consumer.presettled
            )
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
            self.host.schedule_pump()  # another turn, after other connections had theirs

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
