"""The node's side of the gateway wire (ADR 0008, spate.core.wire): a gateway's session served
over this node's partitions.

A session starts when a gateway passes the cluster-secret handshake on the replication port
(spate.core.frames KIND_SESSION); the replication transport then hands the connection here.

- APPEND goes to the local leader replica. It is refused with `stored=0` when nothing was
  written (this node does not lead the partition, or not in the epoch the gateway asked for, or
  the replica refused at once): the gateway may send it to the new leader. Once proposed, its
  outcome is APPENDED after the majority fsync, or FAILED with `stored=1` (may commit anyway).
- SUBSCRIBE starts a reader at the largest of its offset specifications, answers STARTED and
  pushes committed records as RECORDS frames, at most `credit` records ahead of the CREDIT the
  gateway grants back; any replica serves, up to its commit index. A stored sub-entry goes
  whole and compressed in a SUB_ENTRY frame (ADR 0017; it may overrun the credit by its size),
  unless the reader starts inside it.
- INFO and STREAM answer from the local replica and stream configuration.
- GROUP is a member's call to its stream's consumer-group coordinator (ADR 0015), served when
  this node leads the stream's partition 0. The session keeps the members it joined, each with
  the coordinator that numbered it: their later calls go there (NotLeader once it is disbanded;
  a member this session did not join is unknown here), and they leave when the session closes,
  so a gateway that dies does not hold its partitions until their session timeout. A
  `describe` (`spate group describe` at another node) needs no member: it asks this node's
  coordinator, NotLeader when this node does not lead the home.

A session's frames are handled as the loop reads them (the transport's FrameReceiver, no
reading task), an APPEND's outcome is taken when the replica applies it (`Replica.propose`'s
callback, not a future's), and the frames a session queues go out in one write at the end of
the read, batch or send under way on the node (`Transport.flush_with`), else at the end of
the loop turn: no loop turn between a commit and the gateway hearing of it (ADR 0045).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from spate.core import frames, wire
from spate.core.backend import ChunkView, OffsetSpec, ProducerInfo, PublishingIds
from spate.core.coordinator import GroupCoordinator
from spate.core.errors import (
    BrokerError,
    InvalidArgument,
    NotFound,
    NotLeader,
    ResourceLimitExceeded,
    Unavailable,
)
from spate.core.filtering import ChunkFilter, ValueFilter
from spate.core.ids import MemberId, Offset, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.subentry import SubEntryRecords
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.transport import Transport

log = logging.getLogger(__name__)

RECORDS_FRAME_BYTES_MAX = 1024 * 1024
"""Bytes of records one RECORDS frame carries at most (one record may exceed it alone)."""
PUSH_READS_PER_TURN = 16
"""Reads one push makes before it yields the loop (a value filter may pass over many chunks:
16 MiB of them at most per turn)."""
SUBSCRIPTIONS_MAX = 65_536
"""Readers one session may hold."""
FRAME_BYTES_MAX = 64 * 1024 * 1024
"""An APPEND frame at most (the listener appends at most `limits.append_bytes_max`)."""
GROUP_MEMBERS_MAX = 65_536
"""Consumer-group members one session may have joined (its gateway's group links)."""

Member = tuple[StreamName, str, MemberId]
"""(stream, group, member number) of a consumer-group member joined over a session."""


class Partitions(Protocol):
    """What the wire server needs of the node: spate.node.manager.LocalBroker."""

    def stream(self, name: StreamName) -> StreamConfig: ...

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool
    ) -> ReplicatedPartition: ...

    def group_coordinator(self, stream: StreamName) -> GroupCoordinator: ...


@dataclass
class _Reader:
    sub: int
    partition: ReplicatedPartition
    next_offset: int
    credit: int
    wake: Callable[[], None]
    where: Callable[[ChunkFilter | None], bool] | None = None
    """The link's filter values (ADR 0016): chunks holding none are passed over."""
    resuming: bool = False
    """A push that passed over many chunks yielded; it goes on at the next loop turn."""
    pending: deque[ChunkView] = field(default_factory=deque)
    """Chunks read but not (wholly) pushed for want of credit, in log order: the next credit
    takes from them before reading again. A read is up to `RECORDS_FRAME_BYTES_MAX` of whole
    chunks (~8,000 records at 100 B) and the gateway grants credit a quarter of
    `READ_CREDIT_RECORDS` (1,024) at a time: re-reading at each grant read, CRC-checked and
    sliced about 8 times what it pushed (RESULTS §31). Bounded by one read per reader (~1 MiB,
    or one chunk when larger), the order of what the gateway buffers for it (4,096 records)."""


class WireSession:
    frame_bytes_max = FRAME_BYTES_MAX

    def __init__(
        self,
        broker: Partitions,
        gateway: str,
        writer: asyncio.StreamWriter,
        transport: Transport,
        on_close: Callable[[WireSession], None] | None = None,
    ) -> None:
        self.broker = broker
        self.gateway = gateway
        self.writer = writer
        self._flush_with = transport.flush_with
        """Where queued frames are written: at the transport's next flush (ADR 0045)."""
        self._on_close = on_close
        self.loop = asyncio.get_running_loop()
        self.readers: dict[int, _Reader] = {}
        self.refused_producers: dict[tuple[frames.GroupKey, bytes], tuple[int, int]] = {}
        """(partition, producer name) -> (first publishing id refused, leader epoch then)."""
        self.attached: dict[tuple[frames.GroupKey, bytes], list[int]] = {}
        """Named consumer links this session's gateway attached at this node (ADR 0012), by
        their group member numbers (0: a plain link; ADR 0013)."""
        self.joined: dict[Member, GroupCoordinator] = {}
        """Consumer-group members this session joined, with the coordinator that numbered
        them (ADR 0015): they leave when the session closes."""
        self.group_calls: set[asyncio.Future[Any]] = set()
        """Coordinator calls not answered yet (a sync waits there): cancelled at close."""
        self.out: list[bytes] = []
        self.closed = False
        self.heard = self.loop.time()
        """When the gateway last sent a frame (loop time)."""
        self._watchdog: asyncio.TimerHandle | None = None
        self._watch_due = 0.0
        self._watch_later()

    # -- output

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.out:
            self._flush_with(self.flush)
        self.out.append(data)

    def flush(self) -> None:
        if self.out and not self.closed and not self.writer.transport.is_closing():
            self.writer.write(b"".join(self.out) if len(self.out) > 1 else self.out[0])
        self.out.clear()

    # -- input

    def on_frame(self, kind: int, body: memoryview) -> None:
        """One frame, as the loop reads it (ADR 0045)."""
        self.heard = self.loop.time()
        self.handle(kind, body)

    def _watch_later(self) -> None:
        self._watch_due = self.loop.time() + wire.KEEPALIVE_S
        self._watchdog = self.loop.call_at(self._watch_due, self._watch)

    def _watch(self) -> None:
        """Close the session when the gateway sent nothing (not even its pings) for
        NODE_SILENCE_S: it is dead, paused or cut off, and its group members leave (ADR 0008
        "Liveness")."""
        if self.closed:
            return
        now = self.loop.time()
        late = now - self._watch_due > wire.KEEPALIVE_S  # this loop stalled: frames may wait
        if now - self.heard > wire.NODE_SILENCE_S and not late:
            log.warning(
                "gateway %s sent nothing for %.0f s: closing its session",
                self.gateway,
                wire.NODE_SILENCE_S,
            )
            self.writer.transport.abort()
            return
        self._watch_later()

    def handle(self, kind: int, body: memoryview) -> None:
        if kind == wire.APPEND:
            self._append(*wire.decode_append(body))
        elif kind == wire.PRODUCER:
            request, (topic, pid), producer_name = wire.decode_producer(body)
            try:
                partition = self.broker.partition(topic, pid, write=True)
                query = partition.last_publishing_id(producer_name)
            except BrokerError as error:
                self.send(wire.encode_failed(request, error))
            else:
                query.add_done_callback(lambda f: self._producer_answer(request, f))
        elif kind == wire.CONSUMER:
            self._consumer(*wire.decode_consumer(body))
        elif kind == wire.GROUP:
            self._group(*wire.decode_group(body))
        elif kind == wire.PING:
            self.send(wire.encode_ping(wire.decode_ping(body), pong=True))
        elif kind == wire.CREDIT:
            sub, records = wire.decode_credit(body)
            state = self.readers.get(sub)
            if state is not None:
                state.credit += records
                self._push(state)
        elif kind == wire.SUBSCRIBE:
            self._subscribe(*wire.decode_subscribe(body))
        elif kind == wire.UNSUBSCRIBE:
            self._unsubscribe(wire.decode_unsubscribe(body))
        elif kind == wire.INFO:
            request, (stream, pid) = wire.decode_info(body)
            try:
                info = self.broker.partition(stream, pid, write=False).info()
            except BrokerError as error:
                self.send(wire.encode_failed(request, error))
            else:
                self.send(wire.encode_reply(request, wire.info_to_json(info)))
        elif kind == wire.STREAM:
            request, name = wire.decode_stream(body)
            try:
                config = self.broker.stream(name)
            except BrokerError as error:
                self.send(wire.encode_failed(request, error))
            else:
                self.send(wire.encode_reply(request, wire.config_to_json(config)))
        else:
            raise frames.CodecError(f"unexpected frame kind {kind} from gateway {self.gateway}")

    def _consumer(  # noqa: PLR0917 (the frame's fields, in order)
        self, request: int, key: frames.GroupKey, op: int, name: bytes, offset: int, member: int
    ) -> None:
        """A named consumer's operation at this leader (ADR 0012, 0013); the session keeps the
        links it attached (by group member number, 0 for a plain link), and lets go of them
        when it closes. A detach counts down only a link this session counted here; one that
        stores nothing needs no leadership (a gateway lets go at a node that stopped leading,
        its link now counted at the new leader: a count left here would refuse resets if this
        node led again)."""
        topic, pid = key
        attachment = (key, name)
        members = self.attached.get(attachment, [])
        counted = member in members
        if op == wire.CONSUMER_DETACH and offset == wire.NO_OFFSET:
            if counted:
                members.remove(member)
                self._release(attachment, member)
            self.send(wire.encode_reply(request, wire.consumer_to_json(None)))
            return
        try:
            partition = self.broker.partition(topic, pid, write=True)
            work: Awaitable[Any]
            stored = None if offset == wire.NO_OFFSET else offset
            if op == wire.CONSUMER_ATTACH:
                work = partition.consumer_attach(name)
            elif op == wire.CONSUMER_JOIN:  # the offset field carries the spread
                work = partition.consumer_attach(name, single_active=True, spread=stored)
            elif op == wire.CONSUMER_CLAIM:  # offset: the epoch; member: the generation
                work = partition.claim(name, stored, member or None)
            elif op == wire.CONSUMER_STORE or (op == wire.CONSUMER_DETACH and not counted):
                work = partition.store_offset(name, offset, member)
            elif op == wire.CONSUMER_DETACH:
                work = partition.consumer_detach(name, stored, member)
            elif op == wire.CONSUMER_WAIT:
                work = partition.until_active(name, member)
            elif op == wire.CONSUMER_DEPOSED:
                work = partition.until_deposed(name, member)
            elif op == wire.CONSUMER_STEP_DOWN:
                work = partition.step_down(name, member, stored)
            else:
                work = partition.reset_offset(name, offset)
        except BrokerError as error:
            if op == wire.CONSUMER_DETACH and counted:
                # not the leader (any more): the offset is not stored, but the link goes all
                # the same (the gateway lets go here only when it did not detach here; found
                # by spate.sim.groups, seed 966)
                members.remove(member)
                self._release(attachment, member)
            self.send(wire.encode_failed(request, error))
            return
        if op == wire.CONSUMER_DETACH and counted:
            members.remove(member)
        future = asyncio.ensure_future(work)
        future.add_done_callback(lambda f: self._consumer_answer(request, op, attachment, f))

    def _consumer_answer(
        self,
        request: int,
        op: int,
        attachment: tuple[frames.GroupKey, bytes],
        future: asyncio.Future[Any],
    ) -> None:
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            if not isinstance(error, BrokerError):
                error = Unavailable(f"the consumer request failed: {error!r}")
            self.send(wire.encode_failed(request, error))
            return
        result = future.result()
        if op in (wire.CONSUMER_ATTACH, wire.CONSUMER_JOIN, wire.CONSUMER_CLAIM):
            if self.closed:  # the gateway went away meanwhile: let go at once
                self._release(attachment, result.member)
            else:
                self.attached.setdefault(attachment, []).append(result.member)
        answers = (
            wire.CONSUMER_CLAIM,
            wire.CONSUMER_ATTACH,
            wire.CONSUMER_JOIN,
            wire.CONSUMER_WAIT,
            wire.CONSUMER_DEPOSED,
        )
        self.send(
            wire.encode_reply(request, wire.consumer_to_json(result if op in answers else None))
        )

    def _release(self, attachment: tuple[frames.GroupKey, bytes], member: int) -> None:
        """A link this session counted no longer counts here (nor holds a place in a group)."""
        (topic, pid), name = attachment
        try:
            partition = self.broker.partition(topic, pid, write=False)
        except BrokerError:
            return
        partition.attached[name] = partition.attached.get(name, 1) - 1
        if partition.attached[name] <= 0:
            del partition.attached[name]
        if member:
            partition.groups.leave(name, member)

    def _group(self, request: int, call: wire.GroupCall) -> None:
        """A member's call to the group coordinator (see the module docstring)."""
        key = (call.stream, call.group, call.member)
        try:
            work: Awaitable[Any]
            if call.op == "join":
                if call.settings is None:
                    raise InvalidArgument("a join carries the group's settings")
                if len(self.joined) >= GROUP_MEMBERS_MAX:
                    raise ResourceLimitExceeded(
                        f"a session may join {GROUP_MEMBERS_MAX} consumer-group members"
                    )
                coordinator = self.broker.group_coordinator(call.stream)
                work = coordinator.join(call.group, call.settings)
            elif call.op == "describe":  # an operator's question: no member needed
                coordinator = self.broker.group_coordinator(call.stream)
                work = coordinator.describe(call.group)
            elif call.op == "leave":
                found = self.joined.pop(key, None)
                if found is None:  # never joined here, or gone: nothing to do
                    self.send(wire.encode_reply(request, {}))
                    return
                coordinator = found
                work = coordinator.leave(call.group, call.member)
            else:
                found = self.joined.get(key)
                if found is None:
                    raise NotFound(
                        f"member {call.member} of consumer group {call.group!r} of "
                        f"{call.stream!r} did not join over this session (or left): join again"
                    )
                coordinator = found
                if call.op == "sync":
                    timeout_s = call.timeout_ms / 1000
                    work = coordinator.sync(call.group, call.member, call.known, timeout_s)
                else:
                    work = coordinator.released(
                        call.group, call.member, call.partitions, call.generation
                    )
        except BrokerError as error:
            self.send(wire.encode_failed(request, error))
            return
        future = asyncio.ensure_future(work)
        self.group_calls.add(future)
        future.add_done_callback(lambda f: self._group_answer(request, call, coordinator, f))

    def _group_answer(
        self,
        request: int,
        call: wire.GroupCall,
        coordinator: GroupCoordinator,
        future: asyncio.Future[Any],
    ) -> None:
        self.group_calls.discard(future)
        if future.cancelled():  # the session closed
            return
        error = future.exception()
        if error is not None:
            if not isinstance(error, BrokerError):
                log.error("a consumer-group call failed unexpectedly", exc_info=error)
                error = Unavailable(f"the consumer-group call failed: {error!r}")
            elif isinstance(error, NotFound | NotLeader):  # expired, or the home moved
                self.joined.pop((call.stream, call.group, call.member), None)
            self.send(wire.encode_failed(request, error))
            return
        result = future.result()
        if call.op == "join":
            member = MemberId(result)
            if self.closed:  # the gateway went away meanwhile: leave at once
                self._leave(coordinator, call.group, member)
                return
            self.joined[(call.stream, call.group, member)] = coordinator
            self.send(wire.encode_reply(request, {"member": member}))
        elif call.op == "sync":
            self.send(wire.encode_reply(request, wire.assignment_to_json(result)))
        elif call.op == "describe":
            self.send(wire.encode_reply(request, wire.group_view_to_json(result)))
        else:
            self.send(wire.encode_reply(request, {}))

    def _leave(self, coordinator: GroupCoordinator, group: str, member: MemberId) -> None:
        leaving = asyncio.ensure_future(coordinator.leave(group, member))
        leaving.add_done_callback(_log_failure)

    def _producer_answer(self, request: int, future: asyncio.Future[ProducerInfo | None]) -> None:
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            if not isinstance(error, BrokerError):
                error = Unavailable(f"the producer query failed: {error!r}")
            self.send(wire.encode_failed(request, error))
        else:
            self.send(wire.encode_reply(request, wire.producer_to_json(future.result())))

    def _append(
        self,
        request: int,
        key: frames.GroupKey,
        epoch: int,
        records: list[bytes],
        producer: PublishingIds | None,
    ) -> None:
        guard = None if producer is None else (key, producer.name)
        outcome = _Outcome(self, request)
        try:
            partition = self.broker.partition(key[0], key[1], write=True)
            if guard is not None and producer is not None:
                self._check_order(guard, producer, partition.leader_epoch)
            if epoch and partition.leader_epoch != epoch:
                raise NotLeader(
                    f"{key[0]}/{key[1]} is led in epoch {partition.leader_epoch}, not {epoch}",
                    leader_node=partition.leader,
                )
            # the outcome when the replica applies the entry, on that loop turn (ADR 0045)
            partition.propose(records, outcome.done, producer)
        except BrokerError as error:
            self._refused(request, guard, producer, error)
            return
        outcome.proposing = False
        if isinstance(outcome.early, BrokerError):  # refused at once: nothing was written
            self._refused(request, guard, producer, outcome.early)
        elif outcome.early is not None:  # every record a duplicate, confirmed already
            self._appended(request, outcome.early)

    def _check_order(
        self, guard: tuple[frames.GroupKey, bytes], producer: PublishingIds, epoch: int
    ) -> None:
        """A named producer's appends after one that was refused are refused too, until the
        gateway resends that one (or the partition changes leader): what is stored of a
        producer stays a prefix of what it sent, else the resend would be taken for a
        duplicate of a later, stored message (ADR 0011)."""
        found = self.refused_producers.get(guard)
        if found is None:
            return
        mark, marked_epoch = found
        if (producer.ids and producer.ids[0] <= mark) or marked_epoch != epoch:
            del self.refused_producers[guard]
            return
        raise Unavailable(
            f"publishing id {mark} of producer {producer.name.decode(errors='replace')!r} was "
            "refused; its later messages wait for it to be resent"
        )

    def _refused(
        self,
        request: int,
        guard: tuple[frames.GroupKey, bytes] | None,
        producer: PublishingIds | None,
        error: BrokerError,
    ) -> None:
        if guard is not None and producer is not None and producer.ids:
            found = self.refused_producers.get(guard)
            first = producer.ids[0] if found is None else min(found[0], producer.ids[0])
            try:
                partition = self.broker.partition(guard[0][0], guard[0][1], write=False)
                marked = int(partition.leader_epoch)
            except BrokerError:
                marked = -1
            self.refused_producers[guard] = (first, marked)
        self.send(wire.encode_failed(request, error, stored=False))

    def _appended(self, request: int, outcome: Offset | BrokerError) -> None:
        if isinstance(outcome, BrokerError):
            self.send(wire.encode_failed(request, outcome, stored=True))
        else:
            self.send(wire.encode_appended(request, outcome))

    def _subscribe(
        self,
        sub: int,
        key: frames.GroupKey,
        credit: int,
        specs: list[OffsetSpec],
        values: ValueFilter | None = None,
    ) -> None:
        try:
            if sub in self.readers:
                raise InvalidArgument(f"subscription {sub} exists")
            if len(self.readers) >= SUBSCRIPTIONS_MAX:
                raise InvalidArgument(f"a session may hold {SUBSCRIPTIONS_MAX} readers")
            if not specs:
                raise InvalidArgument("a subscription needs an offset specification")
            partition = self.broker.partition(key[0], key[1], write=False)
            start = max(partition.resolve(spec) for spec in specs)
        except BrokerError as error:
            self.send(wire.encode_ended(sub, error))
            return
        state = _Reader(sub, partition, int(start), credit, lambda: None)
        state.wake = lambda: self._push(state)
        if values is not None:
            state.where = values.chunk_may_match
        self.readers[sub] = state
        partition.add_listener(state.wake)
        self.send(wire.encode_started(sub, start))
        self._push(state)

    def _unsubscribe(self, sub: int) -> None:
        state = self.readers.pop(sub, None)
        if state is not None:
            state.partition.remove_listener(state.wake)

    def _push(self, state: _Reader) -> None:
        """Committed records from the reader's next offset, within its credit; with a value
        filter, chunks that hold none of its values are passed over (their span said with a
        RECORDS of no record), a bounded number of reads per loop turn."""
        partition = state.partition
        pending = state.pending
        state.resuming = False
        reads = 0
        while (
            state.credit > 0
            and not self.closed
            and (pending or state.next_offset < partition.end_offset())
        ):
            if not pending:
                if reads >= PUSH_READS_PER_TURN:
                    state.resuming = True
                    self.loop.call_soon(self._resume, state)
                    return
                reads += 1
                chunks = partition.read(
                    Offset(state.next_offset), RECORDS_FRAME_BYTES_MAX, state.where
                )
                if not chunks:
                    return
                pending.extend(chunks)
            while pending:
                chunk = pending.popleft()
                first = int(chunk.first_offset)
                records = chunk.records
                if not records:  # a skip mark
                    if first > state.next_offset:
                        self.send(wire.encode_records(state.sub, first, chunk.timestamp_ms, []))
                        state.next_offset = first
                    continue
                if isinstance(records, SubEntryRecords) and first == state.next_offset:
                    # whole and compressed, never unpacked here (ADR 0017); may overrun the
                    # credit by the sub-entry's size, as one record may overrun the frame bytes
                    self.send(
                        wire.encode_sub_entry(state.sub, first, chunk.timestamp_ms, records.blob)
                    )
                    state.next_offset = first + len(records)
                    state.credit -= len(records)
                    if state.credit <= 0:
                        return
                    continue
                if first < state.next_offset:
                    records = records[state.next_offset - first :]
                    first = state.next_offset
                if not records:
                    continue
                if len(records) > state.credit:
                    pending.appendleft(chunk)  # the rest for the next credit
                    records = records[: state.credit]
                self.send(wire.encode_records(state.sub, first, chunk.timestamp_ms, records))
                state.next_offset = first + len(records)
                state.credit -= len(records)
                if state.credit <= 0:
                    return

    def _resume(self, state: _Reader) -> None:
        if state.resuming and self.readers.get(state.sub) is state:
            self._push(state)

    def close(self) -> None:
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._on_close is not None:
            self._on_close(self)
        for sub in list(self.readers):
            self._unsubscribe(sub)
        for attachment, members in self.attached.items():
            for member in members:
                self._release(attachment, member)
        self.attached.clear()
        for call in list(self.group_calls):
            call.cancel()
        for (_stream, group, member), coordinator in self.joined.items():
            self._leave(coordinator, group, member)
        self.joined.clear()


class _Outcome:
    """An APPEND's outcome from `Replica.propose`: sent when the replica applies it, or kept
    in `early` when the replica answered inside `propose` (`_append` answers it then)."""

    __slots__ = ("answered", "early", "proposing", "request", "session")

    def __init__(self, session: WireSession, request: int) -> None:
        self.session = session
        self.request = request
        self.proposing = True
        self.early: Offset | BrokerError | None = None
        self.answered = False

    def done(self, outcome: Offset | BrokerError) -> None:
        if self.answered:
            return  # once, as a future would take it
        self.answered = True
        if self.proposing:
            self.early = outcome
        else:
            self.session._appended(self.request, outcome)


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("a member's leave failed", exc_info=future.exception())


class WireServer:
    """Serves gateway sessions over this node's partitions (hand `open` to the Transport as
    its `on_session`: it reads each session's frames and closes it when the connection ends)."""

    def __init__(self, broker: Partitions) -> None:
        self.broker = broker
        self.sessions: set[WireSession] = set()

    def open(self, gateway: str, writer: asyncio.StreamWriter, transport: Transport) -> WireSession:
        session = WireSession(self.broker, gateway, writer, transport, self._closed)
        self.sessions.add(session)
        log.info("gateway %s opened a session", gateway)
        return session

    def _closed(self, session: WireSession) -> None:
        self.sessions.discard(session)
        with contextlib.suppress(Exception):
            session.writer.close()
        log.info("gateway %s closed its session", session.gateway)
