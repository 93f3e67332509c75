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
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cproton_ffi import ffi, lib
from proton import Condition, Data, Link, symbol
from spate.core import bulk
from spate.core import limits as core_limits
from spate.core.backend import Partition
from spate.core.errors import BrokerError, InvalidArgument, Unavailable
from spate.core.ids import MemberId, PartitionId, StreamName
from spate.core.subentry import SubEntryRecords
from spate.gateway import codec, eventhubs, fastsend, info, links, sections
from spate.gateway import subentry as sub_entries
from spate.gateway.errors import STOLEN, amqp_error, plain
from spate.gateway.producer import Host, detach_all
from spate.gateway.stats import ListenerStats
from spate.gateway.tracking import OffsetTracker

log = logging.getLogger(__name__)
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
    tracks: dict[int, Track] | None = None
    """A partition-agnostic group link (ADR 0015): its partitions, by number."""
    sequences: dict[int, int] = field(default_factory=dict)
    """A group link: the last per-partition sequence used, kept across re-claims."""
    associated: list[str] | None = None
    """A group link: the next delivery carries `event-streams-associated-partitions-changed`
    with these partitions (000 §4.6.5)."""
    sub_entries: bool = False
    """It asked for stored sub-entries as they are (`spate:sub-entries`, ADR 0017): each is
    one delivery (`_send_sub_entry`). Plain unnamed links only; others get the messages."""
    bulk: bool = False
    """It asked for bulk deliveries and may have them (`spate:bulk-delivery`, ADR 0029): each
    delivery is a frame of many messages (`spate.core.bulk`, `_send_bulk`); credit counts
    deliveries."""
    bulk_average: int = 0
    """Bulk links: bytes per message of the last frame (how many to take for the next)."""
    address: int = 0
    """`pointer` as an integer (`fastsend.address`), for the C sends."""
    eventhubs: bool = False
    """A link of the Event Hubs dialect (ADR 0021): each message gets the Event Hubs message
    annotations (`eventhubs.annotate`)."""


@dataclass
class Track:
    """A coordinator member's partition (ADR 0015): its cursor, what the client finished of
    it and the store in flight. Delivery tags of a member link carry the partition in their
    top bits (`PARTITION_SHIFT`) and a per-partition sequence below."""

    cursor: links.Cursor
    pid: int
    tracker: OffsetTracker
    next_tag: int
    """The next per-partition sequence number (never reused on the link)."""
    storing: asyncio.Future[Any] | None = None
    storing_tag: int = 0
    """The per-partition sequence through which the store in flight covers every delivery."""
    awaiting: dict[int, Any] = field(default_factory=dict)
    """rcv-settle-mode second: sequence -> accepted delivery waiting for its store."""
    dropped: bool = False
    began: int = 0
    """Where its cursor began: a holder that gives the partition up having finished nothing
    of a partition with no committed offset stores the offset before it, so the next holder
    goes on from there rather than from its own `next` (nothing between is skipped)."""
    stream: str | None = None
    """A super-stream consumer's partition (ADR 0034): the partition stream, named in each
    delivery's `spate:stream` annotation."""
    announce: bool = False
    """A super-stream consumer's partition: the next delivery from it carries `spate:active`
    (the link took the partition over)."""

    def final_offset(self) -> int | None:
        """What to store when the partition is given up (None: nothing)."""
        offset = self.tracker.take()
        if offset is None and not self.cursor.resumed and self.tracker.stored is None:
            return self.began - 1 if self.began > 0 else None
        return offset


PARTITION_SHIFT = 40
SUPER_REJOIN_S = 30.0
"""How long a super-stream consumer's link tries to join a partition stream's group again
after losing it (a leader change: an election, then the gateways' routes catching up, ~1-2 s)
before it is ended (ADR 0034)."""
SUPER_REJOIN_PAUSE_S = 0.2
"""Between its attempts (each one asks the leader as the broker knows it now)."""
_SEQUENCE_MASK = (1 << PARTITION_SHIFT) - 1


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
        self.sender = fastsend.Sender()
        """The runs of plain and group-member links (`fastsend`: C when built)."""

    def open(
        self,
        link: Link,
        plan: links.ConsumerPlan,
        answer: dict[symbol, Any] | None,
        *,
        eventhubs: bool = False,
    ) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.source.filter.clear()
        if plan.selection.echoed_keys:
            original = data_object(link.remote_source.filter) or {}
            link.source.filter.put_object(
                {key: original[key] for key in original if key in plan.selection.echoed_keys}
            )
        in_bulk = not eventhubs and wants_bulk(link, plan)
        as_is = not in_bulk and wants_sub_entries(link, plan)
        if in_bulk:
            answer = {**(answer or {}), symbol(bulk.PROPERTY): True}
        if as_is:
            answer = {**(answer or {}), symbol(sub_entries.AS_IS_PROPERTY): True}
        if answer is not None:
            link.properties = answer
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        if presettled:
            link.snd_settle_mode = Link.SND_SETTLED
        state = ConsumerLink(
            link, link._impl, plan, presettled, sub_entries=as_is, bulk=in_bulk,
            address=fastsend.address(link._impl), eventhubs=eventhubs,
        )  # fmt: skip
        self.links[link._impl] = state
        if plan.name is not None and not presettled and not plan.shared:
            state.confirm = link.remote_rcv_settle_mode == Link.RCV_SECOND
            link.rcv_settle_mode = link.remote_rcv_settle_mode
        if plan.super_stream is not None:
            state.tracks = {}
            for membership in plan.memberships:
                if membership.cursor is not None:
                    self._track(state, membership.cursor).stream = membership.stream
            self.tracked[link._impl] = state
        elif plan.coordinator is not None:
            state.tracks = {}
            for cursor in plan.cursors:
                self._track(state, cursor)
            state.associated = sorted(links.partition_symbol(PartitionId(p)) for p in state.tracks)
            self.tracked[link._impl] = state
        elif plan.name is not None and not plan.shared:
            state.tracker = OffsetTracker(
                self.ctx.offset_commit_messages, self.ctx.offset_commit_interval_ms
            )
            self.tracked[link._impl] = state
        for cursor in plan.cursors:
            cursor.partition.add_listener(self.host.schedule_pump)
        link.open()
        if plan.super_stream is not None:
            for membership in plan.memberships:
                self.host.own(asyncio.ensure_future(self._super_member(state, membership)))
        elif plan.coordinator is not None:
            self.host.own(asyncio.ensure_future(self._group_member(state)))
            for track in (state.tracks or {}).values():
                self.host.own(asyncio.ensure_future(self._hold(state, track)))
        elif plan.group is not None:
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
            self._end_with(
                consumer,
                err,
                lambda description: f"the single-active-consumer hand-over failed: {description}",
            )

    # single active consumers of a super stream (ADR 0034) ----------------------------------------

    async def _super_member(self, consumer: ConsumerLink, membership: links.Membership) -> None:
        """A super-stream consumer's turns on one partition stream, as long as its link lasts
        (ADR 0013's `_membership`, per partition). When the partition stream's group is lost
        (its leader changed, or the leader no longer knows the member), the link joins the
        group again at the leader (`_super_rejoin`) and the other partitions go on; a link that
        cannot rejoin within `SUPER_REJOIN_S` is ended with the error (attach again)."""
        plan = consumer.plan
        try:
            while not consumer.closed and not self.host.closed:
                try:
                    await self._super_turn(consumer, membership)
                except BrokerError as err:
                    if not err.retryable:
                        raise
                    log.info(
                        "super stream %r: rejoining the group of %r (%s)",
                        plan.stream,
                        membership.stream,
                        err.message,
                    )
                    await self._super_rejoin(consumer, membership)
        except BrokerError as err:
            self._end_with(
                consumer,
                err,
                lambda description: (
                    f"super stream {plan.stream!r}, partition stream {membership.stream!r}: "
                    f"{description}; attach again to rejoin"
                ),
            )
        except Exception as err:  # a bug: end the link (the client attaches again), not silence
            log.exception("super-stream consumer of %r failed", membership.stream)
            self._end_with(
                consumer,
                Unavailable(f"the member's work failed ({type(err).__name__}: {err})"),
                lambda description: f"super stream {plan.stream!r}: {description}; attach again",
            )

    async def _super_turn(self, consumer: ConsumerLink, membership: links.Membership) -> None:
        """While a standby, wait for the partition; once active, read it after the group's
        stored offset (its first delivery announces it), until asked to step down — then
        stop, store what the client finished and hand it over. Each change of the link's
        active partitions is told by its next delivery
        (`event-streams-associated-partitions-changed`, as for a group member)."""
        plan = consumer.plan
        name = plan.name
        assert name is not None
        if membership.cursor is None:
            now = await membership.owner.until_active(name, membership.member)
            if consumer.closed or self.host.closed:
                return
            if not now.active:  # the leader does not know the member (its groups went)
                raise Unavailable(f"the group of {membership.stream!r} no longer has this link")
            cursor = await links.begin_membership(plan, membership, now.stored)
            if consumer.closed or self.host.closed:
                cursor.partition.detach()
                return
            membership.cursor = cursor
            plan.cursors.append(cursor)
            cursor.partition.add_listener(self.host.schedule_pump)
            track = self._track(consumer, cursor)
            track.stream, track.announce = membership.stream, True
            self._associations_changed(consumer)
        deposed = await membership.owner.until_deposed(name, membership.member)
        if consumer.closed or self.host.closed:
            return
        if deposed.active:  # "left": not by this link, which is open
            raise Unavailable(f"the group of {membership.stream!r} no longer has this link")
        await self._super_step_down(consumer, membership)

    async def _super_rejoin(self, consumer: ConsumerLink, membership: links.Membership) -> None:
        """The partition stream's group lost this link (ADR 0034): stop reading it (nothing can
        be stored at a former leader; the next member resumes after the last stored offset),
        leave wherever it may still be known, and join the group again at the current leader,
        retrying while there is none. Raises the last error after `SUPER_REJOIN_S`."""
        plan = consumer.plan
        name, broker = plan.name, plan.broker
        assert name is not None and broker is not None
        self._super_drop(consumer, membership)
        old, membership.member = membership.member, 0  # a detach meanwhile leaves nothing
        if old:
            with contextlib.suppress(BrokerError):
                await membership.owner.consumer_detach(name, None, old)
        deadline = self.loop.time() + SUPER_REJOIN_S
        while not consumer.closed and not self.host.closed:
            await asyncio.sleep(SUPER_REJOIN_PAUSE_S)  # an election, routes catching up
            if consumer.closed or self.host.closed:
                return
            owner: Partition | None = None
            try:
                owner = links.partition_or_agnostic_error(
                    broker, membership.stream, PartitionId(0), True, write=True
                )
                attached = await owner.consumer_attach(
                    name, single_active=True, spread=membership.index
                )
            except BrokerError as err:
                if owner is not None:
                    owner.detach()
                if not err.retryable or self.loop.time() > deadline:
                    raise
                continue
            if consumer.closed or self.host.closed:  # its detach did not know this member
                with contextlib.suppress(BrokerError):
                    await owner.consumer_detach(name, None, attached.member)
                owner.detach()
                return
            membership.owner.detach()
            membership.owner, membership.member = owner, attached.member
            return

    def _super_drop(self, consumer: ConsumerLink, membership: links.Membership) -> None:
        """Stop sending a partition stream without storing (its group is gone)."""
        plan, cursor = consumer.plan, membership.cursor
        if cursor is None:
            return
        membership.cursor = None
        if cursor in plan.cursors:
            plan.cursors.remove(cursor)
        cursor.pending.clear()
        cursor.partition.remove_listener(self.host.schedule_pump)
        cursor.partition.detach()
        track = (consumer.tracks or {}).pop(membership.index, None)
        if track is not None:
            track.dropped = True
            consumer.sequences[track.pid] = track.next_tag - 1
        self._associations_changed(consumer)

    async def _super_step_down(self, consumer: ConsumerLink, membership: links.Membership) -> None:
        """Another link is designated on this partition stream: send nothing more of it,
        store what the client finished (what it settles later is the next member's to
        store), hand the partition over and settle the commits that store confirms."""
        plan, cursor = consumer.plan, membership.cursor
        assert cursor is not None and plan.name is not None and consumer.tracks is not None
        membership.cursor = None
        if cursor in plan.cursors:
            plan.cursors.remove(cursor)
        cursor.pending.clear()
        cursor.partition.remove_listener(self.host.schedule_pump)
        offset: int | None = None
        through = 0
        storing: asyncio.Future[Any] | None = None
        track = consumer.tracks.pop(membership.index, None)
        if track is not None:
            track.dropped = True
            consumer.sequences[track.pid] = track.next_tag - 1
            through = track.tracker.done_tag
            offset = track.final_offset()
            storing = track.storing
        self._associations_changed(consumer)  # the next delivery says it (000 §4.6.5)
        step = asyncio.ensure_future(
            _hand_over(membership, plan.name, storing, offset)
        )  # a detach meanwhile waits for it before leaving the group
        membership.step = step
        try:
            await step
        finally:
            membership.step = None
            cursor.partition.detach()
        if track is not None and track.awaiting and not consumer.closed and not self.host.closed:
            self._settle_awaiting(track, through)  # stored: settling confirms the commits
            self.host.schedule_pump()

    # partition-agnostic group links (ADR 0015) --------------------------------------------------

    def _track(self, consumer: ConsumerLink, cursor: links.Cursor) -> Track:
        pid = int(cursor.symbol)
        last = consumer.sequences.get(pid, 0)
        track = Track(
            cursor,
            pid,
            OffsetTracker(
                self.ctx.offset_commit_messages, self.ctx.offset_commit_interval_ms, done_tag=last
            ),
            last + 1,
            began=int(cursor.next_offset),
        )
        assert consumer.tracks is not None
        consumer.tracks[pid] = track
        return track

    def _associations_changed(self, consumer: ConsumerLink) -> None:
        assert consumer.tracks is not None
        consumer.associated = sorted(
            links.partition_symbol(PartitionId(p)) for p in consumer.tracks
        )
        self.host.schedule_pump()

    async def _group_member(self, consumer: ConsumerLink) -> None:
        """A member of its group's coordinator, as long as its link lasts: poll the
        assignment (each poll a heartbeat), give up what it must (stop, commit what the client
        finished, let go of the claim, tell the coordinator), claim what it was given, and
        say so on the next transfer."""
        plan = consumer.plan
        coordinator, group, member = plan.coordinator, plan.group, MemberId(plan.member_id)
        assert coordinator is not None and group is not None and plan.settings is not None
        known = plan.assignment
        try:
            while not consumer.closed and not self.host.closed:
                tracks = consumer.tracks
                assert tracks is not None
                missing = known is not None and bool(known.partitions - set(tracks))
                wait_s = 0.5 if missing else links.poll_s(plan.settings)
                now = await coordinator.sync(group, member, known, wait_s)
                if consumer.closed or self.host.closed:
                    return
                give_up = sorted(PartitionId(p) for p in set(tracks) - now.partitions)
                for pid in give_up:
                    track = tracks.get(pid)
                    if track is not None:  # not dropped meanwhile (taken or its leader gone)
                        await self._drop(consumer, track, store=True)
                # and those it was given but had not claimed yet: the coordinator counts them
                # as held until they are released
                released = sorted(set(give_up) | now.release)
                if released:
                    await coordinator.released(group, member, released, now.generation)
                for pid in sorted(now.partitions - set(tracks)):
                    assert plan.broker is not None
                    cursor = await links.claim_partition(plan.broker, plan, pid, now.generation)
                    if cursor is None:
                        continue  # still held: again at the next poll
                    if consumer.closed or self.host.closed:
                        await _let_go(plan, cursor, None)
                        return
                    plan.cursors.append(cursor)
                    cursor.partition.add_listener(self.host.schedule_pump)
                    track = self._track(consumer, cursor)
                    self.host.own(asyncio.ensure_future(self._hold(consumer, track)))
                    self._associations_changed(consumer)
                if give_up:
                    self._associations_changed(consumer)
                known = now
        except BrokerError as err:
            self._end_with(
                consumer,
                err,
                lambda description: (
                    f"consumer group {group!r} of {plan.stream!r}: {description}; "
                    "attach again to rejoin"
                ),
            )
        except Exception as err:  # a bug: end the link (the client rejoins), never go silent
            log.exception("consumer group member %r of %r failed", group, plan.stream)
            self._end_with(
                consumer,
                Unavailable(f"the member's work failed ({type(err).__name__}: {err})"),
                lambda description: f"consumer group {group!r}: {description}; attach again",
            )

    async def _hold(self, consumer: ConsumerLink, track: Track) -> None:
        """One partition a member holds, until it is given up or taken: a claim of a newer
        generation makes it step down (commit what the client finished) and drop it; a lost
        leadership drops it (the member claims it again at the new leader)."""
        plan, cursor = consumer.plan, track.cursor
        assert plan.name is not None and cursor.owner is not None
        try:
            deposed = await cursor.owner.until_deposed(plan.name, cursor.member)
            if deposed.active or track.dropped or consumer.closed:
                return
            await self._drop(consumer, track, store=True, step_down=True)
        except BrokerError:
            if not track.dropped and not consumer.closed:
                await self._drop(consumer, track, store=False)
        if not consumer.closed and not self.host.closed:
            self._associations_changed(consumer)

    async def _drop(
        self, consumer: ConsumerLink, track: Track, *, store: bool, step_down: bool = False
    ) -> None:
        """Stop sending a partition; commit what the client finished of it (`store`), then
        let go of the claim."""
        if track.dropped:
            return
        track.dropped = True
        plan, cursor = consumer.plan, track.cursor
        assert consumer.tracks is not None and plan.name is not None
        consumer.tracks.pop(track.pid, None)
        consumer.sequences[track.pid] = track.next_tag - 1
        if cursor in plan.cursors:
            plan.cursors.remove(cursor)
        cursor.pending.clear()
        cursor.partition.remove_listener(self.host.schedule_pump)
        through = track.tracker.done_tag
        offset = track.final_offset() if store else None
        if track.storing is not None:
            with contextlib.suppress(BrokerError):
                await asyncio.shield(track.storing)
        assert cursor.owner is not None
        try:
            if step_down:
                await cursor.owner.step_down(plan.name, cursor.member, offset)
                offset = None
            await _let_go(plan, cursor, offset)
        except BrokerError:
            with contextlib.suppress(BrokerError):
                await _let_go(plan, cursor, None)
            return
        if store and track.awaiting and not consumer.closed and not self.host.closed:
            self._settle_awaiting(track, through)  # the last store covered them
            self.host.schedule_pump()

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
            if plan.shared:  # it commits nothing: it stops and goes
                self._stop_shared(consumer)
                await partition.step_down(plan.name, plan.member, None)
                if not consumer.closed and not self.host.closed:
                    self.host.end_consumer(
                        consumer,
                        plain(
                            STOLEN,
                            f"{where}: a receiver with an owner level (epoch) took the "
                            "partition; receivers without one give way (Event Hubs' rule)",
                        ),
                    )
                return
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
            self._end_with(
                consumer,
                err,
                lambda description: (
                    f"{where} is no longer owned by this link: {description}; attach "
                    "again (with the same epoch) to own it"
                ),
            )

    def _end_with(
        self, consumer: ConsumerLink, err: BrokerError, say: Callable[[str], str]
    ) -> None:
        """End a consumer link whose group work failed, with the error's condition and `say`
        of its description (unless the link or the connection is gone already)."""
        if not consumer.closed and not self.host.closed:
            error = amqp_error(err)
            self.host.end_consumer(consumer, plain(error.condition, say(error.description)))

    def _stop_shared(self, consumer: ConsumerLink) -> None:
        """A shared Event Hubs receiver gives way: send nothing more."""
        consumer.plan.active = False
        consumer.announce = False
        for cursor in consumer.plan.cursors:
            cursor.pending.clear()

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
        if consumer.plan.super_stream is not None:
            return self._forget_super(consumer)
        if consumer.tracks is not None:
            self.tracked.pop(consumer.pointer, None)
            flushes = []
            for track in list(consumer.tracks.values()):
                track.dropped = True
                storing = track.storing
                offset = track.final_offset()
                flushes.append(
                    asyncio.ensure_future(_member_flush(consumer.plan, track, storing, offset))
                )
            consumer.tracks.clear()
            leaving = asyncio.ensure_future(_leave(consumer, flushes))
            self.host.own(leaving)
            return leaving
        detach_all(c.partition for c in consumer.plan.cursors)
        if consumer.plan.shared:  # nothing to store: let go of its place at the leader
            plan = consumer.plan
            assert plan.name is not None
            leaving = asyncio.ensure_future(
                plan.cursors[0].partition.consumer_detach(plan.name, None, plan.member)
            )
            self.host.own(leaving)
            return leaving
        if consumer.tracker is None or consumer.plan.name is None:
            return None
        self.tracked.pop(consumer.pointer, None)
        flushing = asyncio.ensure_future(
            _flush(consumer.plan, consumer.storing, consumer.tracker.take())
        )
        self.host.own(flushing)
        return flushing

    def _forget_super(self, consumer: ConsumerLink) -> asyncio.Future[Any]:
        """A super-stream consumer's link is going: on each partition stream, after the store
        in flight, store what the client finished and leave the group (the next member takes
        over after it)."""
        self.tracked.pop(consumer.pointer, None)
        tracks = consumer.tracks or {}
        storing: list[asyncio.Future[Any]] = []
        offsets: dict[int, int | None] = {}
        for pid, track in tracks.items():
            track.dropped = True
            offsets[pid] = track.final_offset()
            if track.storing is not None:
                storing.append(track.storing)
        tracks.clear()
        leaving = asyncio.ensure_future(_leave_super(consumer.plan, storing, offsets))
        self.host.own(leaving)
        return leaving

    # named consumers ----------------------------------------------------------------------------

    def settled(self, consumer: ConsumerLink, delivery: Any) -> bool:
        """The client settled (or gave an outcome for) one of a named consumer's deliveries.
        False: keep it unsettled until its offset is stored (rcv-settle-mode second)."""
        tag = lib.pn_delivery_tag(delivery)
        if tag.size != _TAG.size:
            return True
        (number,) = _TAG.unpack(ffi.buffer(tag.start, tag.size))
        if consumer.tracks is not None:  # a group member: per partition
            track = consumer.tracks.get(number >> PARTITION_SHIFT)
            if track is None:  # given up: its last store was made (or fenced) already
                # an accept from now on is not stored: never confirm it as a commit
                return not (consumer.confirm and not lib.pn_delivery_settled(delivery))
            sequence = number & _SEQUENCE_MASK
            remote_settled = lib.pn_delivery_settled(delivery)
            if sequence in track.awaiting:
                if remote_settled:
                    del track.awaiting[sequence]
                return bool(remote_settled)
            done = lib.pn_delivery_remote_state(delivery) in _DONE_STATES
            track.tracker.settled(sequence, done, self.loop.time() * 1000)
            if done and consumer.confirm and not remote_settled:
                track.awaiting[sequence] = delivery  # settled once its offset is stored
                self.host.schedule_pump()
                return False
            return True
        assert consumer.tracker is not None
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
            if consumer.tracks is not None:
                if not consumer.closed:
                    at = self._store_member(consumer, now_ms)
                    if at is not None:
                        wake = at if wake is None else min(wake, at)
                continue
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

    def _store_member(self, consumer: ConsumerLink, now_ms: float) -> float | None:
        """A group member's due stores, one in flight per partition; when the next is due."""
        assert consumer.tracks is not None and consumer.plan.name is not None
        wake: float | None = None
        for track in consumer.tracks.values():
            if track.storing is not None:
                continue
            if track.tracker.due(now_ms, urgent=bool(track.awaiting)):
                track.storing_tag = track.tracker.done_tag
                offset = track.tracker.take()
                assert offset is not None and track.cursor.owner is not None
                future = asyncio.ensure_future(
                    track.cursor.owner.store_offset(consumer.plan.name, offset, track.cursor.member)
                )
                track.storing = future
                self.host.own(future)
                future.add_done_callback(functools.partial(self._member_stored, track))
            else:
                at = track.tracker.wake_at_ms()
                if at is not None:
                    wake = at if wake is None else min(wake, at)
        return wake

    def _member_stored(self, track: Track, future: asyncio.Future[Any]) -> None:
        """A store is done: settle the deliveries it covers that wait for it (their commit is
        confirmed). A fenced one (another member holds the partition now) is dropped with it."""
        track.storing = None
        failed = future.cancelled() or future.exception() is not None
        if not failed and track.awaiting and not self.host.closed:
            self._settle_awaiting(track, track.storing_tag)
        self.host.schedule_pump()

    def _settle_awaiting(self, track: Track, through: int) -> None:
        kept = {}
        for sequence, delivery in track.awaiting.items():
            if sequence <= through:
                lib.pn_delivery_settle(delivery)
            else:
                kept[sequence] = delivery
        track.awaiting = kept

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
        send_run = self.sender.send_run
        parts = sections.delivery_annotation_parts
        stats: ListenerStats = self.ctx.stats
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
            if consumer.tracks is not None:  # a group member: tags per partition
                sent = self._send_member(consumer, room)
                if sent == room and plan.available():
                    more = True
                elif lib.pn_link_get_drain(lp) and not plan.available():
                    lib.pn_link_drained(lp)
                continue
            if consumer.bulk:
                if self._send_bulk(consumer, room) and plan.available():
                    more = True
                elif lib.pn_link_get_drain(lp) and not plan.available():
                    lib.pn_link_drained(lp)
                continue
            presettled, address = consumer.presettled, consumer.address
            tag = consumer.tag
            sent = 0
            runs_sent = []
            for run in plan.take(room, consumer.sub_entries):
                source = run.cursor.symbol if plan.tag_source_partition else None
                prefix, suffix = parts(run.timestamp_ms, source)
                if consumer.sub_entries and isinstance(run.records, SubEntryRecords):
                    tag = self._send_sub_entry(consumer, run, tag, prefix, suffix)
                    sent += 1
                    continue
                records = run.records
                if consumer.eventhubs:
                    at, ms, annotate = run.first_offset, run.timestamp_ms, eventhubs.annotate
                    records = [annotate(r, at + i, ms) for i, r in enumerate(records)]
                first_offset, count = run.first_offset, len(records)
                if consumer.announce:  # the first delivery since it took over says so
                    consumer.announce = False
                    first, rest = parts(run.timestamp_ms, source, active=True)
                    nbytes = send_run(
                        lp, address, records[:1], first_offset, tag + 1,
                        parts=(first, rest), presettled=presettled,
                    )  # fmt: skip
                    nbytes += send_run(
                        lp, address, records[1:], first_offset + 1, tag + 2,
                        parts=(prefix, suffix), presettled=presettled,
                    )  # fmt: skip
                else:
                    nbytes = send_run(
                        lp, address, records, first_offset, tag + 1,
                        parts=(prefix, suffix), presettled=presettled,
                    )  # fmt: skip
                tag += count
                stats.messages_out += count  # once per run (ADR 0023)
                stats.bytes_out += nbytes
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

    def _send_bulk(self, consumer: ConsumerLink, room: int) -> bool:
        """Up to `room` bulk deliveries (ADR 0029), each a frame of up to
        `limits.bulk_delivery_messages_max` messages and about `limits.bulk_delivery_bytes`,
        two frames' worth of messages per pump in all (then other links have their turn);
        True when it stopped for those limits (there may be more to send), False when the
        link had nothing more."""
        plan, lp = consumer.plan, consumer.pointer
        budget = 2 * core_limits.bulk_delivery_messages_max
        bytes_cap = core_limits.bulk_delivery_bytes
        stats: ListenerStats = self.ctx.stats
        tag = consumer.tag
        for _ in range(room):
            if budget <= 0:
                return True
            cap = min(core_limits.bulk_delivery_messages_max, budget)
            runs: list[links.Run] = []
            count = size = 0
            while count < cap and size < bytes_cap:
                step = cap - count
                average = consumer.bulk_average
                step = min(step, max(1, (bytes_cap - size) // average) if average else 256)
                got = plan.take(step)
                if not got:
                    break
                for run in got:
                    count += len(run.records)
                    size += sum(map(len, run.records))
                runs += got
            if not runs:
                consumer.tag = tag
                return False
            consumer.bulk_average = max(1, size // count)
            frame = bulk.encode([(r.first_offset, r.timestamp_ms, r.records) for r in runs])
            first = runs[0]
            source = first.cursor.symbol if plan.tag_source_partition else None
            prefix, suffix = sections.delivery_annotation_parts(first.timestamp_ms, source)
            out = bulk.wrap(b"%b%020d%b" % (prefix, first.first_offset, suffix), frame)
            tag += 1
            _TAG.pack_into(self._tag_view, 0, tag)
            delivery = lib.pn_delivery(lp, self._tag_value)
            lib.pn_link_send(lp, out, len(out))
            lib.pn_link_advance(lp)
            if consumer.presettled:
                lib.pn_delivery_settle(delivery)
            stats.messages_out += count  # once per frame (ADR 0023)
            stats.bytes_out += len(out)
            budget -= count
        consumer.tag = tag
        return True

    def _send_sub_entry(
        self, consumer: ConsumerLink, run: Any, tag: int, prefix: bytes, suffix: bytes
    ) -> int:
        """A stored sub-entry, whole and still compressed, as one delivery whose offset
        annotation is its first message's (ADR 0017); returns the last tag used."""
        assert isinstance(run.records, SubEntryRecords) and consumer.tracker is None
        message = sub_entries.as_is_message(run.records.blob)
        out = sections.splice_run([message], run.first_offset, prefix, suffix)[0]
        tag += 1
        _TAG.pack_into(self._tag_view, 0, tag)
        delivery = lib.pn_delivery(consumer.pointer, self._tag_value)
        lib.pn_link_send(consumer.pointer, out, len(out))
        lib.pn_link_advance(consumer.pointer)
        if consumer.presettled:
            lib.pn_delivery_settle(delivery)
        stats: ListenerStats = self.ctx.stats
        stats.messages_out += 1
        stats.bytes_out += len(out)
        return tag

    def _send_member(self, consumer: ConsumerLink, room: int) -> int:
        """A group member's sends: each run's deliveries tagged with its partition and that
        partition's sequence; the first after the link's partitions changed carries
        `event-streams-associated-partitions-changed` (000 §4.6.5). A super-stream consumer's
        (ADR 0034) the same way, each delivery with `spate:stream`, and the first from a
        partition it took over with `spate:active`."""
        tracks = consumer.tracks
        assert tracks is not None
        lp, presettled, address = consumer.pointer, consumer.presettled, consumer.address
        parts = sections.delivery_annotation_parts
        send_run = self.sender.send_run
        now_ms = self.loop.time() * 1000
        sent = 0
        for run in consumer.plan.take(room):
            track = tracks.get(int(run.cursor.symbol))
            if track is None:
                continue  # given up meanwhile
            source, stream = run.cursor.symbol, track.stream
            prefix, suffix = parts(run.timestamp_ms, source, stream=stream)
            records, first_offset, count = run.records, run.first_offset, len(run.records)
            base, sequence = track.pid << PARTITION_SHIFT, track.next_tag
            assert sequence + count <= _SEQUENCE_MASK
            track.tracker.sent(sequence, first_offset, count)
            if consumer.associated is not None or track.announce:
                first, rest = parts(
                    run.timestamp_ms,
                    source,
                    stream=stream,
                    active=track.announce,
                    associated=consumer.associated,
                )
                consumer.associated = None
                track.announce = False
                nbytes = send_run(
                    lp, address, records[:1], first_offset, base | sequence,
                    parts=(first, rest), presettled=presettled,
                )  # fmt: skip
                nbytes += send_run(
                    lp, address, records[1:], first_offset + 1, base | (sequence + 1),
                    parts=(prefix, suffix), presettled=presettled,
                )  # fmt: skip
            else:
                nbytes = send_run(
                    lp, address, records, first_offset, base | sequence,
                    parts=(prefix, suffix), presettled=presettled,
                )  # fmt: skip
            sequence += count
            track.next_tag = sequence
            stats: ListenerStats = self.ctx.stats  # once per run (ADR 0023)
            stats.messages_out += count
            stats.bytes_out += nbytes
            if presettled:  # at most once: done as it is sent
                track.tracker.done_through(sequence - 1, now_ms)
            sent += count
        return sent

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


async def _let_go(plan: links.ConsumerPlan, cursor: links.Cursor, offset: int | None) -> None:
    """A group member gives up a partition: store `offset` (if not None, while it still holds
    it), let go of the claim, and stop reading."""
    assert plan.name is not None and cursor.owner is not None
    try:
        await cursor.owner.consumer_detach(plan.name, offset, cursor.member)
    finally:
        cursor.owner.detach()
        if cursor.partition is not cursor.owner:
            cursor.partition.detach()


async def _member_flush(
    plan: links.ConsumerPlan, track: Track, storing: asyncio.Future[Any] | None, offset: int | None
) -> None:
    if storing is not None:
        with contextlib.suppress(BrokerError):
            await asyncio.shield(storing)
    await _let_go(plan, track.cursor, offset)


async def _leave(consumer: ConsumerLink, flushes: Sequence[Awaitable[None]]) -> None:
    """A group member's link is going: commit each partition's rest, then leave the group."""
    plan = consumer.plan
    try:
        for flush in flushes:
            with contextlib.suppress(BrokerError):
                await flush
    finally:
        assert plan.coordinator is not None and plan.group is not None
        with contextlib.suppress(BrokerError):
            await plan.coordinator.leave(plan.group, MemberId(plan.member_id))


async def _hand_over(
    membership: links.Membership,
    name: bytes,
    storing: asyncio.Future[Any] | None,
    offset: int | None,
) -> None:
    """After the store in flight, store `offset` (if any) and step down on the partition."""
    if storing is not None:
        with contextlib.suppress(BrokerError):  # a failed store: this one covers it
            await asyncio.shield(storing)
    await membership.owner.step_down(name, membership.member, offset)


async def _leave_super(
    plan: links.ConsumerPlan, storing: list[asyncio.Future[Any]], offsets: dict[int, int | None]
) -> None:
    for future in storing:
        with contextlib.suppress(BrokerError):  # a failed store: the last one covers it
            await asyncio.shield(future)
    await release_memberships(plan, offsets)


async def release_memberships(plan: links.ConsumerPlan, offsets: dict[int, int | None]) -> None:
    """A super-stream consumer's link is going: on each partition stream at once, after a
    step-down in flight, store its `offsets[index]` (if any) and leave the group, then stop
    reading. A partition's failure does not keep the others from leaving."""
    name = plan.name
    assert name is not None

    async def leave(membership: links.Membership) -> None:
        try:
            if membership.step is not None:
                with contextlib.suppress(BrokerError):
                    await asyncio.shield(membership.step)
            if membership.member:
                offset = offsets.get(membership.index)
                with contextlib.suppress(BrokerError):
                    await membership.owner.consumer_detach(name, offset, membership.member)
        finally:
            membership.owner.detach()
            if membership.cursor is not None:
                membership.cursor.partition.detach()
                membership.cursor = None

    await asyncio.gather(*(leave(m) for m in plan.memberships))


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


def wants_bulk(link: Link, plan: links.ConsumerPlan) -> bool:
    """The link asked for bulk deliveries (ADR 0029) and may have them: a plain consumer of one
    partition (no name, group or single active consumer, whose offsets are tracked per
    delivery; not a room, whose offsets are the room's). Filters are fine: a frame carries
    each message's offset. Others get one delivery per message (the reply says which)."""
    properties = link.remote_properties or {}
    if properties.get(symbol(bulk.PROPERTY)) is not True:
        return False
    return (
        _plain(plan)
        and not plan.shared
        and len(plan.cursors) == 1
        and type(plan.cursors[0]) is links.Cursor
    )


def wants_sub_entries(link: Link, plan: links.ConsumerPlan) -> bool:
    """The link asked for sub-entries as they are and may have them: a plain consumer (no
    name, group or single active consumer, whose offsets are tracked per delivery) without a
    filter choosing messages (ADR 0016: it would be sent the others of a sub-entry too)."""
    properties = link.remote_properties or {}
    if properties.get(symbol(sub_entries.AS_IS_PROPERTY)) is not True:
        return False
    return _plain(plan) and plan.selection.filter is None


def _plain(plan: links.ConsumerPlan) -> bool:
    """No consumer name, group, coordinator or group membership: offsets are not tracked per
    delivery, so deliveries may carry many messages (bulk) or whole sub-entries."""
    return plan.name is None and plan.group is None and plan.coordinator is None and not plan.member
