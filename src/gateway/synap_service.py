"""The Synap command API's shell (ADR 0018): rooms, topics and consumer groups over a Broker.

`SynapService.handle(command, payload, connection)` answers one 003 command with 003's JSON
object, raising `SynapError` for refusals. Rooms: one `_Tail` per `spate.rooms` partition
reads it from its first retained record, then live, into a `RoomIndex` (spate.gateway.rooms)
and fans each event out to this gateway's subscribers of its room. `Connection` is one
WebSocket client's outbox (bounded; a subscriber that falls `subscriber_queue_events_max`
behind is dropped with BroadcastFailed). The HTTP/WebSocket adapter is synap_http.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from spate.core import limits
from spate.core.backend import Broker, OffsetSpec, Partition
from spate.core.coordinator import Assignment, GroupCoordinator, GroupSettings
from spate.core.errors import (
    AlreadyExists,
    BrokerError,
    InvalidArgument,
    MessageSizeExceeded,
    NotFound,
    NotImplementedFeature,
    Unavailable,
)
from spate.core.filtering import ValueFilter
from spate.core.groups import COMMITTED_PREFIX, GroupDefinition
from spate.core.ids import MemberId, Offset, PartitionId, StreamName
from spate.core.streams import Retention, StreamConfig
from spate.core.superstreams import hash_partition
from spate.gateway import codec, links, rooms, synap
from spate.gateway.codec import Described, Symbol, ULong
from spate.gateway.rooms import RoomIndex, RoomsConfig
from spate.gateway.synap import SynapError

log = logging.getLogger(__name__)

READ_BYTES_MAX = 1024 * 1024
"""Bytes one read of a partition hands over at most."""
APPLY_WAIT_S = 15.0
"""How long a publish waits for this gateway's tail to apply its durable record."""
READ_WAIT_S = 10.0
"""How long a history or consume read waits for records the index says exist."""
STREAM_READY_S = 20.0
"""How long the first use waits for a new internal stream to have leaders."""
RECENT_APPLIED_MAX = 65_536
"""Partition offset -> room offset kept per tail for publishes waiting on their answer."""
GROUP_KEY = Symbol("event-streams-group-key")


class Admin(Protocol):
    """What the service asks of the metadata service (the gateway process: gRPC)."""

    def create_stream(self, config: StreamConfig) -> Awaitable[None]:
        """Create it; AlreadyExists when it exists."""
        ...

    def create_group(self, definition: GroupDefinition) -> Awaitable[None]: ...

    def find_group(self, group: str) -> Awaitable[GroupDefinition | None]:
        """The definition of a group of that name on any stream."""
        ...

    def committed(self, stream: str, group: str) -> Awaitable[dict[int, int]]:
        """partition -> the group's stored offset (the last one done)."""
        ...

    def refresh(self) -> Awaitable[object]:
        """Read the routes now (a stream just created)."""
        ...


class Connection:
    """One WebSocket client: its pushes, in order, through one bounded outbox."""

    def __init__(self, send: Callable[[str], Awaitable[None]]) -> None:
        self._send = send
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue(limits.subscriber_queue_events_max)
        self.subscriptions: dict[str, _Subscriber] = {}
        self.closed = False
        self.overflowed = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name="synap-outbox")

    def push(self, text: str) -> bool:
        if self.closed:
            return False
        try:
            self.outbox.put_nowait(text)
        except asyncio.QueueFull:
            self.overflowed = True
            return False
        return True

    async def _run(self) -> None:
        while True:
            text = await self.outbox.get()
            if text is None:
                return
            try:
                await self._send(text)
            except (ConnectionError, RuntimeError):
                self.closed = True
                return

    async def close(self) -> None:
        self.closed = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@dataclass(eq=False)
class _Subscriber:
    connection: Connection
    room: str
    boundary: int
    """Events at partition offsets from here on come live; below it, from the replay."""
    replaying: bool = True
    held: list[str] = field(default_factory=list)


class _Tail:
    """One `spate.rooms` partition, read from its first retained record, then live."""

    def __init__(self, service: SynapService, partition: PartitionId) -> None:
        config = service.rooms
        self.service = service
        self.partition = partition
        self.index = RoomIndex(config.max_events, config.retention_ms, config.inactive_timeout_ms)
        self.subscribers: dict[str, set[_Subscriber]] = {}
        self.position = 0
        self.ready = asyncio.Event()
        self.advanced = asyncio.Event()
        self.recent: dict[int, int] = {}
        self._recent_order: deque[int] = deque()
        self.inflight: dict[str, int] = {}
        """Room -> its events appended here and not yet durable (their hints count them)."""
        self.writer: Partition | None = None
        self.queue: deque[tuple[list[bytes], asyncio.Future[int]]] = deque()
        """Publishes waiting for the next append (`append`)."""
        self.appends: set[asyncio.Future[Offset]] = set()
        """Appends in flight (at most `limits.room_appends_inflight_max`)."""
        self.readers: dict[str, int] = {}
        """Room -> AMQP links reading it here (cleanup keeps the room, as for subscribers)."""
        self.failure: BrokerError | None = None
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"rooms-{partition}")

    def append(self, records: list[bytes]) -> asyncio.Future[int]:
        """The partition offset of `records[0]` once they are durable. Group commit: at most
        `limits.room_appends_inflight_max` appends to the partition are in flight; the
        publishes that arrive meanwhile (Synap's and AMQP's, any room of the partition) go
        together into the next one, up to a chunk's limits, so a publish under load shares
        its majority fsync with the others (ADR 0018 "Publish"; benchmarks/RESULTS.md §17).
        Appends are issued in order on one writer (the log keeps their order)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.queue.append((records, future))
        self._issue()
        return future

    def _issue(self) -> None:
        service = self.service
        while self.queue and len(self.appends) < limits.room_appends_inflight_max:
            batch: list[bytes] = []
            waiting: list[tuple[int, asyncio.Future[int]]] = []
            size = 0
            while self.queue:
                records, future = self.queue[0]
                grown = size + sum(len(r) for r in records)
                if batch and (
                    len(batch) + len(records) > limits.chunk_records_max
                    or grown > limits.chunk_bytes_max
                ):
                    break
                self.queue.popleft()
                if not future.done():  # a cancelled publish is not stored
                    waiting.append((len(batch), future))
                    batch += records
                    size = grown
            if not batch:
                continue
            if self.writer is None:
                self.writer = service.broker.partition(
                    StreamName(service.rooms.stream), self.partition, write=True
                )
            try:
                appended = asyncio.ensure_future(self.writer.append(batch))
            except BrokerError as error:
                for _, future in waiting:
                    future.set_exception(error)
                continue
            self.appends.add(appended)
            appended.add_done_callback(functools.partial(self._appended, waiting))

    def _appended(
        self, waiting: list[tuple[int, asyncio.Future[int]]], appended: asyncio.Future[Offset]
    ) -> None:
        self.appends.discard(appended)
        error = None if appended.cancelled() else appended.exception()
        for at, future in waiting:
            if future.done():
                continue
            if appended.cancelled():
                future.cancel()
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(int(appended.result()) + at)
        if not appended.cancelled():
            self._issue()

    def done(self, room: str, count: int) -> None:
        """`count` of the room's appended events are durable (or failed): hints stop counting
        them."""
        left = self.inflight[room] - count
        if left:
            self.inflight[room] = left
        else:
            del self.inflight[room]

    async def _run(self) -> None:
        service = self.service
        stream = StreamName(service.rooms.stream)
        reader = service.broker.partition(stream, self.partition, write=False)
        wake = asyncio.Event()
        reader.add_listener(wake.set)
        try:
            start = await service.begin(reader, [OffsetSpec.first()])
            end = int((await reader.describe()).end_offset)
            self.position = start
            if start > 0:
                self.index.skip(start - 1)
            if self.position >= end:
                self.ready.set()
            while True:
                chunks = reader.read(Offset(self.position), READ_BYTES_MAX)
                if not chunks:
                    wake.clear()
                    if reader.end_offset() > self.position:
                        continue
                    await wake.wait()
                    continue
                for chunk in chunks:
                    self._apply(chunk.first_offset, chunk.timestamp_ms, chunk.records)
                if not self.ready.is_set() and self.position >= end:
                    self.ready.set()
                self.advanced.set()
                self.advanced = asyncio.Event()
        except BrokerError as error:
            log.warning("rooms tail of partition %s failed: %s", self.partition, error.message)
            self.failure = error
            self.ready.set()
        finally:
            reader.remove_listener(wake.set)
            reader.detach()

    def _apply(self, first: int, timestamp_ms: int, records: Any) -> None:
        if not records:  # a skip mark
            if first > self.position:
                self.index.skip(first - 1)
                self.position = first
            return
        for i, record in enumerate(records):
            offset = first + i
            if offset < self.position:
                continue
            self.position = offset + 1
            event = rooms.decode_event(record) if isinstance(record, bytes | memoryview) else None
            if event is None:
                self.index.skip(offset)
                continue
            room_offset = self.index.apply(event.room, offset, timestamp_ms, event.hint)
            self.recent[offset] = room_offset
            self._recent_order.append(offset)
            if len(self._recent_order) > RECENT_APPLIED_MAX:
                self.recent.pop(self._recent_order.popleft(), None)
            subscribers = self.subscribers.get(event.room)
            if subscribers:
                text = event_json(event, room_offset)
                for subscriber in list(subscribers):
                    if offset < subscriber.boundary:
                        continue
                    if subscriber.replaying:
                        subscriber.held.append(text)
                        if len(subscriber.held) > limits.subscriber_queue_events_max:
                            self.service.drop(subscriber, "fell behind during its replay")
                    elif not subscriber.connection.push(text):
                        self.service.drop(subscriber, "fell behind")

    async def room_offset_of(self, offset: int) -> int:
        deadline = time.monotonic() + APPLY_WAIT_S
        while self.position <= offset:
            if self.failure is not None:
                raise self.failure
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Unavailable(
                    f"the event is stored (partition offset {offset}) but this gateway has not "
                    "read it back yet; see stream.history"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.advanced.wait(), remaining)
        found = self.recent.get(offset)
        if found is None:
            raise Unavailable(f"the record at partition offset {offset} is no longer tracked")
        return found


class _CountedReader:
    """A room reader of an AMQP link (a Partition): the room counts it as a subscriber
    (cleanup keeps the room) until the link lets it go."""

    def __init__(self, reader: Partition, gone: Callable[[], None]) -> None:
        self._reader = reader
        self._gone: Callable[[], None] | None = gone

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def detach(self) -> None:
        if self._gone is not None:
            self._gone()
            self._gone = None
        self._reader.detach()


class _RoomTarget:
    """An AMQP sender's room (a Partition to the producer part): `append` takes the messages
    as sent and stores them as the room's events through the partition's group commit."""

    def __init__(self, service: SynapService, tail: _Tail, room: str) -> None:
        self.service = service
        self.tail = tail
        self.room = room
        self.stream = StreamName(service.rooms.stream)
        self.partition = tail.partition

    def append(self, records: Sequence[bytes], producer: Any = None) -> Awaitable[Offset]:
        assert producer is None  # named producers are refused on rooms (links)
        tail, room = self.tail, self.room
        hint = tail.index.hint(room, self.service.clock_ms()) + tail.inflight.get(room, 0)
        events = []
        for k, message in enumerate(records):
            try:
                event = rooms.amqp_event(
                    room, message, hint=hint + k, event_id="evt_" + uuid.uuid4().hex
                )
            except codec.DecodeError as error:
                raise InvalidArgument(f"a message to a room must have a body: {error}") from None
            if len(event) > limits.message_bytes_max:
                raise MessageSizeExceeded(
                    f"with the room's annotations a message is larger than "
                    f"{limits.message_bytes_max} bytes"
                )
            events.append(event)
        tail.inflight[room] = tail.inflight.get(room, 0) + len(events)
        return self._stored(events)

    async def _stored(self, events: list[bytes]) -> Offset:
        try:
            return Offset(await self.tail.append(events))
        finally:
            self.tail.done(self.room, len(events))

    def detach(self) -> None:
        pass  # the tail's writer is shared; it lives as long as the service

    async def describe(self) -> Any:
        raise NotImplementedFeature("a room has no partition to describe")


def event_json(event: rooms.RoomEvent, room_offset: int) -> str:
    """A pushed event (003 "Event Stream (WebSocket)"), plus the room it belongs to."""
    return json.dumps(
        {
            "event_id": event.event_id,
            "offset": room_offset,
            "type": event.event_type,
            "data": event.data,
            "room": event.room,
        },
        ensure_ascii=False,
    )


@dataclass
class _Member:
    stream: StreamName
    group: str
    member: MemberId
    assignment: Assignment | None = None


class SynapService:
    def __init__(
        self,
        broker: Broker,
        admin: Admin,
        rooms_config: RoomsConfig | None = None,
        *,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.broker = broker
        self.admin = admin
        self.rooms = rooms_config or RoomsConfig()
        self.rooms.check()
        self.clock_ms = clock_ms
        self.tails: dict[PartitionId, _Tail] = {}
        self._stream_ready: asyncio.Future[None] | None = None
        self._round_robin: dict[str, itertools.count[int]] = {}
        self.members: dict[str, _Member] = {}
        self._coordinators: dict[StreamName, GroupCoordinator] = {}
        self._cleanup: asyncio.Task[None] | None = None

    # -- life

    def start(self) -> None:
        self._cleanup = asyncio.get_running_loop().create_task(self._clean(), name="room-cleanup")

    async def close(self) -> None:
        tasks: list[asyncio.Future[Any]] = [t.task for t in self.tails.values()]
        for tail in self.tails.values():
            tasks += tail.appends
        if self._cleanup is not None:
            tasks.append(self._cleanup)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for tail in self.tails.values():
            if tail.writer is not None:
                tail.writer.detach()

    async def _clean(self) -> None:
        while True:
            await asyncio.sleep(self.rooms.cleanup_interval_ms / 1000)
            self.forget_idle_rooms()

    def forget_idle_rooms(self) -> int:
        """003 "Room Cleanup": rooms idle past the inactive timeout (and a margin for clocks)
        with no subscriber here leave the index."""
        margin_ms = min(60_000, self.rooms.inactive_timeout_ms)
        now = self.clock_ms()
        dropped = 0
        for tail in self.tails.values():
            dropped += tail.index.forget_idle(
                now,
                self.rooms.inactive_timeout_ms + margin_ms,
                set(tail.subscribers) | set(tail.readers),
            )
        return dropped

    def room_count(self) -> int:
        return sum(
            len(t.index) + sum(1 for r in {*t.subscribers, *t.readers} if not t.index.known(r))
            for t in self.tails.values()
        )

    # -- dispatch

    async def handle(
        self, command: str, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        try:
            if command in synap.WEBSOCKET_ONLY and connection is None:
                raise SynapError(
                    "SubscriptionFailed",
                    f"{command} needs a WebSocket connection (GET the same path with Upgrade)",
                    400,
                )
            handler = getattr(self, "_" + command.replace(".", "_"))
            answer: dict[str, Any] = await handler(payload, connection)
            return answer
        except BrokerError as error:
            raise synap.error_of(error) from None

    # -- rooms

    async def begin(
        self, reader: Partition, specs: list[OffsetSpec], values: ValueFilter | None = None
    ) -> int:
        """`reader.begin`, retried while the partition has no replica to read from yet (a
        stream just created, a leader change under way)."""
        deadline = time.monotonic() + STREAM_READY_S
        while True:
            try:
                return int(await reader.begin(specs, values))
            except Unavailable:
                if time.monotonic() > deadline:
                    raise
                await self.admin.refresh()
                await asyncio.sleep(0.1)

    async def _ensure_rooms_stream(self) -> None:
        if self._stream_ready is None or (
            self._stream_ready.done() and self._stream_ready.exception() is not None
        ):
            self._stream_ready = asyncio.ensure_future(self._create_rooms_stream())
        await asyncio.shield(self._stream_ready)

    async def _create_rooms_stream(self) -> None:
        config = self.rooms
        name = StreamName(config.stream)
        try:
            await self.broker.lookup(name)
            return
        except NotFound:
            pass
        retention = Retention(max_age_ms=config.retention_ms + 3600 * 1000)
        with contextlib.suppress(AlreadyExists):
            await self.admin.create_stream(
                StreamConfig(name, partitions=config.partitions, replicas=0, retention=retention)
            )
        await self._wait_stream(name)

    async def _wait_stream(self, name: StreamName) -> None:
        deadline = time.monotonic() + STREAM_READY_S
        while True:
            await self.admin.refresh()
            try:
                await self.broker.lookup(name)
                return
            except (NotFound, Unavailable):
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"stream {name!r} was created but is not served yet; retry"
                    ) from None
                await asyncio.sleep(0.1)

    async def _tail(self, room: str) -> _Tail:
        await self._ensure_rooms_stream()
        pid = PartitionId(rooms.room_partition(room, self.rooms.partitions))
        tail = self.tails.get(pid)
        if tail is None or (tail.failure is not None and tail.task.done()):
            tail = self.tails[pid] = _Tail(self, pid)
        await tail.ready.wait()
        if tail.failure is not None:
            raise tail.failure
        return tail

    def _check_room_limit(self, tail: _Tail, room: str) -> None:
        if tail.index.known(room) or room in tail.subscribers or room in tail.readers:
            return
        if self.room_count() >= self.rooms.max_rooms:
            raise rooms.RoomLimitExceeded(
                f"this gateway holds {self.rooms.max_rooms} rooms (max_rooms); a new room can "
                "be made once idle ones are cleaned up"
            )

    async def _stream_publish(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        room = self._room(payload)
        event_type = synap.name(payload, "event_type")
        data = synap.data(payload)
        metadata = synap.metadata(payload)
        tail = await self._tail(room)
        self._check_room_limit(tail, room)
        event_id = "evt_" + uuid.uuid4().hex
        inflight = tail.inflight.get(room, 0)
        hint = tail.index.hint(room, self.clock_ms()) + inflight
        try:
            record = rooms.encode_event(
                room,
                event_id=event_id,
                event_type=event_type,
                data=data,
                metadata=metadata,
                hint=hint,
            )
        except (TypeError, ValueError) as error:
            raise synap.invalid(f"'data' or 'metadata' cannot be stored as JSON: {error}") from None
        if len(record) > limits.message_bytes_max:
            raise SynapError(
                "MessageTooLarge", f"an event is at most {limits.message_bytes_max} bytes", 413
            )
        tail.inflight[room] = inflight + 1
        try:
            offset = await tail.append([record])
        finally:
            tail.done(room, 1)
        room_offset = await tail.room_offset_of(offset)
        return {
            "event_id": event_id,
            "offset": room_offset,
            # this gateway's WebSocket subscribers and AMQP readers of the room; other
            # gateways' are not counted (each fans out to its own; ADR 0018 "Known limits")
            "subscribers_notified": len(tail.subscribers.get(room, ())) + tail.readers.get(room, 0),
        }

    async def _stream_subscribe(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        assert connection is not None
        room = self._room(payload)
        from_offset = synap.integer(payload, "from_offset")
        replay = synap.boolean(payload, "replay")
        if room in connection.subscriptions:
            raise SynapError(
                "SubscriptionFailed", f"this connection is already subscribed to {room!r}", 409
            )
        tail = await self._tail(room)
        self._check_room_limit(tail, room)
        subscribers = tail.subscribers.setdefault(room, set())
        if len(subscribers) >= self.rooms.max_subscribers:
            raise SynapError(
                "SubscriptionFailed",
                f"room {room!r} has {self.rooms.max_subscribers} subscribers here "
                "(max_subscribers_per_room)",
                429,
                retryable=True,
            )
        window = tail.index.window(room, self.clock_ms())
        start = rooms.start_offset(window, from_offset, replay)
        positions = tail.index.positions(room, start, window.newest)
        subscriber = _Subscriber(connection, room, tail.position)
        subscribers.add(subscriber)
        connection.subscriptions[room] = subscriber
        if positions:
            asyncio.get_running_loop().create_task(self._replay(tail, subscriber, positions))
        else:
            subscriber.replaying = False
        return {
            "success": True,
            "room": room,
            "from_offset": start,
            "oldest_offset": window.oldest,
            "newest_offset": window.newest,
        }

    async def _replay(
        self, tail: _Tail, subscriber: _Subscriber, positions: list[tuple[int, int]]
    ) -> None:
        connection = subscriber.connection
        try:
            for event in await self._read_room(tail, subscriber.room, positions):
                pushed = {k: event[k] for k in ("event_id", "offset", "type", "data", "room")}
                if not connection.push(json.dumps(pushed, ensure_ascii=False)):
                    self.drop(subscriber, "fell behind during its replay")
                    return
        except BrokerError as error:
            self.drop(subscriber, f"replay failed: {error.message}")
            return
        for text in subscriber.held:
            if not connection.push(text):
                self.drop(subscriber, "fell behind")
                return
        subscriber.held.clear()
        subscriber.replaying = False

    def drop(self, subscriber: _Subscriber, why: str) -> None:
        """End a subscription the gateway cannot keep (003 BroadcastFailed)."""
        self._unsubscribe(subscriber)
        connection = subscriber.connection
        if connection.overflowed or connection.closed:
            connection.closed = True  # its socket is closed by the adapter
            return
        connection.push(
            json.dumps(
                SynapError(
                    "BroadcastFailed",
                    f"subscription to {subscriber.room!r} ended: {why}",
                    room=subscriber.room,
                ).answer()
            )
        )

    def _unsubscribe(self, subscriber: _Subscriber) -> bool:
        connection = subscriber.connection
        if connection.subscriptions.get(subscriber.room) is not subscriber:
            return False
        del connection.subscriptions[subscriber.room]
        pid = PartitionId(rooms.room_partition(subscriber.room, self.rooms.partitions))
        tail = self.tails.get(pid)
        if tail is not None:
            members = tail.subscribers.get(subscriber.room)
            if members is not None:
                members.discard(subscriber)
                if not members:
                    del tail.subscribers[subscriber.room]
        return True

    async def _stream_unsubscribe(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        assert connection is not None
        room = self._room(payload)
        subscriber = connection.subscriptions.get(room)
        return {"success": subscriber is not None and self._unsubscribe(subscriber)}

    def disconnected(self, connection: Connection) -> None:
        for subscriber in list(connection.subscriptions.values()):
            self._unsubscribe(subscriber)

    async def _stream_history(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        room = self._room(payload)
        from_offset = synap.integer(payload, "from_offset")
        to_offset = synap.integer(payload, "to_offset")
        limit = synap.integer(
            payload,
            "limit",
            default=limits.room_history_limit_default,
            low=1,
            high=limits.room_history_limit_max,
        )
        assert limit is not None
        tail = await self._tail(room)
        if not tail.index.known(room) and room not in tail.subscribers | tail.readers.keys():
            raise SynapError(
                "RoomNotFound", f"room {room!r} does not exist (no event, no subscriber)", 404
            )
        window = tail.index.window(room, self.clock_ms())
        first = window.oldest if from_offset is None else from_offset
        if first < 0:
            first = max(window.oldest, window.newest + 1 + first)
        if first > window.newest + 1:
            raise rooms.OffsetOutOfRange(first, window)
        last = window.newest if to_offset is None else min(to_offset, window.newest)
        if to_offset is not None and to_offset < first:
            raise synap.invalid(f"'to_offset' {to_offset} is below the start {first}")
        positions = tail.index.positions(room, max(first, window.oldest), last)[:limit]
        events = await self._read_room(tail, room, positions) if positions else []
        return {"events": events, "oldest_offset": window.oldest, "newest_offset": window.newest}

    async def _read_room(
        self, tail: _Tail, room: str, positions: list[tuple[int, int]]
    ) -> list[dict[str, Any]]:
        """The events at these (room offset, partition offset) positions, oldest first; a
        position the partition's retention removed is left out."""
        wanted = {p: r for r, p in positions}
        first_p = positions[0][1]
        last_p = positions[-1][1]
        reader = self.broker.partition(StreamName(self.rooms.stream), tail.partition, write=False)
        wake = asyncio.Event()
        reader.add_listener(wake.set)
        out: list[dict[str, Any]] = []
        try:
            position = await self.begin(
                reader, [OffsetSpec.offset(first_p)], ValueFilter(frozenset({room}), False)
            )
            deadline = time.monotonic() + READ_WAIT_S
            while position <= last_p:
                chunks = reader.read(Offset(position), READ_BYTES_MAX)
                if not chunks:
                    wake.clear()
                    if reader.end_offset() > position:
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise Unavailable(f"reading room {room!r} timed out; retry")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), remaining)
                    continue
                for chunk in chunks:
                    if not chunk.records:
                        position = max(position, int(chunk.first_offset))
                        continue
                    for i, record in enumerate(chunk.records):
                        offset = chunk.first_offset + i
                        if offset < position:
                            continue
                        position = offset + 1
                        room_offset = wanted.get(offset)
                        if room_offset is None or not isinstance(record, bytes | memoryview):
                            continue
                        event = rooms.decode_event(record)
                        if event is not None and event.room == room:
                            out.append(
                                {
                                    "event_id": event.event_id,
                                    "offset": room_offset,
                                    "type": event.event_type,
                                    "data": event.data,
                                    "room": room,
                                    "metadata": event.metadata,
                                    "timestamp": chunk.timestamp_ms,
                                }
                            )
        finally:
            reader.remove_listener(wake.set)
            reader.detach()
        return out

    # -- rooms over AMQP (`$rooms/<room>`, spate.gateway.links.Rooms)

    async def room_start(self, room: str, specs: tuple[OffsetSpec, ...]) -> links.RoomStart:
        tail = await self._tail(room)
        self._check_room_limit(tail, room)
        now = self.clock_ms()
        start = rooms.amqp_start(tail.index, room, specs, now)
        mine = RoomIndex(1, self.rooms.retention_ms, self.rooms.inactive_timeout_ms)
        window = tail.index.window(room, now)
        if start <= window.newest:  # from a kept event: number on from it
            partition_offset, timestamp_ms = tail.index.position(room, start)
            mine.seed(room, start, timestamp_ms, partition_offset)
        else:  # live: from where the tail stands, as the tail would number the next events
            partition_offset = tail.position
            state = tail.index.state(room)
            if state is not None:
                mine.seed(room, state[0], state[1], partition_offset)
            elif partition_offset > 0:
                mine.skip(partition_offset - 1)
        tail.readers[room] = tail.readers.get(room, 0) + 1
        reader = self.broker.partition(StreamName(self.rooms.stream), tail.partition, write=False)
        try:
            began = await self.begin(
                reader,
                [OffsetSpec.offset(partition_offset)],
                ValueFilter(frozenset({room}), False),
            )
        except BaseException:
            reader.detach()
            self._reader_gone(tail, room)
            raise
        assert began <= partition_offset, (began, partition_offset)
        counted = _CountedReader(reader, lambda: self._reader_gone(tail, room))
        return links.RoomStart(cast(Partition, counted), partition_offset, mine, start)

    def _reader_gone(self, tail: _Tail, room: str) -> None:
        left = tail.readers[room] - 1
        if left:
            tail.readers[room] = left
        else:
            del tail.readers[room]

    async def room_target(self, room: str) -> Partition:
        tail = await self._tail(room)
        self._check_room_limit(tail, room)
        return cast(Partition, _RoomTarget(self, tail, room))

    @staticmethod
    def _room(payload: dict[str, Any]) -> str:
        try:
            return rooms.validate_room(payload.get("room"))
        except InvalidArgument as error:
            raise synap.invalid(error.message) from None

    # -- topics (003 second half: Spate streams)

    async def _topic_create(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        topic = synap.name(payload, "topic")
        partitions = synap.integer(
            payload, "num_partitions", default=3, low=1, high=limits.partitions_max
        )
        replicas = synap.integer(
            payload, "replication_factor", default=0, low=0, high=limits.replicas_max
        )
        segment = synap.integer(payload, "segment_bytes", default=limits.segment_bytes_default)
        age_ms, max_bytes, max_messages = synap.retention(payload)
        assert partitions is not None and replicas is not None and segment is not None
        config = StreamConfig(
            StreamName(topic),
            partitions=partitions,
            replicas=replicas,
            retention=Retention(age_ms, max_bytes, max_messages),
            segment_bytes=segment,
        )
        await self.admin.create_stream(config)
        await self._wait_stream(StreamName(topic))
        stored = await self.broker.lookup(StreamName(topic))
        return {
            "success": True,
            "topic": topic,
            "num_partitions": stored.partitions,
            "replication_factor": stored.replicas,
        }

    async def _topic_config(self, topic: str) -> StreamConfig:
        try:
            return await self.broker.lookup(StreamName(topic))
        except NotFound:
            raise SynapError("TopicNotFound", f"topic {topic!r} does not exist", 404) from None

    async def _topic_publish(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        topic = synap.name(payload, "topic")
        event_type = synap.name(payload, "event_type")
        key = synap.string(payload, "key", required=False)
        data = synap.data(payload)
        config = await self._topic_config(topic)
        if key is not None:
            partition = hash_partition(key, config.partitions)
        else:
            counter = self._round_robin.setdefault(topic, itertools.count())
            partition = next(counter) % config.partitions
        annotations = {} if key is None else {GROUP_KEY: key}
        properties = {"event_type": event_type, "event_id": "evt_" + uuid.uuid4().hex}
        try:
            body = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as error:
            raise synap.invalid(f"'data' cannot be stored as JSON: {error}") from None
        record = b"".join(
            [codec.encode(Described(ULong(0x72), annotations))] * bool(annotations)
            + [
                codec.encode(Described(ULong(0x74), properties)),
                codec.encode(Described(ULong(0x75), body)),
            ]
        )
        if len(record) > limits.message_bytes_max:
            raise SynapError(
                "MessageTooLarge", f"an event is at most {limits.message_bytes_max} bytes", 413
            )
        writer = self.broker.partition(StreamName(topic), PartitionId(partition), write=True)
        try:
            offset = await writer.append([record])
        finally:
            writer.detach()
        return {"partition_id": partition, "offset": int(offset), "topic": topic}

    async def _topic_consume(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        topic = synap.name(payload, "topic")
        config = await self._topic_config(topic)
        partition = synap.integer(payload, "partition_id", low=0, high=config.partitions - 1)
        if partition is None:
            raise synap.invalid("'partition_id' is required")
        from_offset = synap.integer(payload, "from_offset", default=0, low=0)
        limit = synap.integer(
            payload, "limit", default=100, low=1, high=limits.topic_consume_limit_max
        )
        assert from_offset is not None and limit is not None
        reader = self.broker.partition(StreamName(topic), PartitionId(partition), write=False)
        wake = asyncio.Event()
        reader.add_listener(wake.set)
        events: list[dict[str, Any]] = []
        try:
            position = await self.begin(reader, [OffsetSpec.offset(from_offset)])
            end = int((await reader.describe()).end_offset)
            next_offset = max(position, from_offset) if from_offset <= end else end
            deadline = time.monotonic() + READ_WAIT_S
            while position < end and len(events) < limit:
                chunks = reader.read(Offset(position), READ_BYTES_MAX)
                if not chunks:
                    wake.clear()
                    if reader.end_offset() > position:
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), remaining)
                    continue
                for chunk in chunks:
                    for i, record in enumerate(chunk.records):
                        offset = chunk.first_offset + i
                        if offset < position or len(events) >= limit:
                            continue
                        position = offset + 1
                        if isinstance(record, bytes | memoryview):
                            events.append(
                                topic_event(topic, partition, offset, chunk.timestamp_ms, record)
                            )
                next_offset = position
        finally:
            reader.remove_listener(wake.set)
            reader.detach()
        return {
            "topic": topic,
            "partition_id": partition,
            "events": events,
            "next_offset": next_offset,
            "count": len(events),
        }

    async def _topic_stats(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        topic = synap.name(payload, "topic")
        config = await self._topic_config(topic)
        partitions = []
        for pid in range(config.partitions):
            part = self.broker.partition(StreamName(topic), PartitionId(pid), write=False)
            try:
                info = await part.describe()
            finally:
                part.detach()
            partitions.append(
                {
                    "partition_id": pid,
                    "topic": topic,
                    "message_count": info.messages,
                    "total_bytes": info.bytes,
                    "min_offset": info.first_offset,
                    "max_offset": info.last_offset,
                    "leader": info.leader,
                }
            )
        return {"topic": topic, "partitions": partitions}

    # -- consumer groups (Spate's coordinator, ADR 0015)

    async def _group_create(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        group = synap.name(payload, "group")
        topic = synap.name(payload, "topic")
        config = await self._topic_config(topic)
        count = synap.integer(payload, "partition_count")
        if count is not None and count != config.partitions:
            raise synap.invalid(f"topic {topic!r} has {config.partitions} partitions, not {count}")
        strategy = (synap.string(payload, "strategy", required=False) or "round_robin").replace(
            "_", "-"
        )
        from spate.core.groups import Strategy

        try:
            chosen = Strategy(strategy)
        except ValueError:
            raise synap.invalid("'strategy' must be round_robin, range or sticky") from None
        session_s = synap.integer(payload, "session_timeout_secs", default=30, low=1)
        delay_ms = synap.integer(
            payload, "rebalance_delay_ms", default=limits.group_rebalance_delay_ms_default, low=0
        )
        assert session_s is not None and delay_ms is not None
        await self.admin.create_group(
            GroupDefinition(StreamName(topic), group, chosen, session_s * 1000, delay_ms)
        )
        await self.admin.refresh()
        return {"success": True, "group_id": group, "topic": topic}

    def _coordinator(self, stream: StreamName) -> GroupCoordinator:
        """One per stream for the service's life: a remote one knows the session each of its
        members joined over."""
        coordinator = self._coordinators.get(stream)
        if coordinator is None:
            coordinator = self._coordinators[stream] = self.broker.group_coordinator(stream)
        return coordinator

    async def _definition(self, group: str) -> GroupDefinition:
        definition = await self.admin.find_group(group)
        if definition is None:
            raise SynapError(
                "GroupNotFound",
                f"consumer group {group!r} is not defined: group.create it with its topic",
                404,
            )
        return definition

    def _member(self, payload: dict[str, Any]) -> tuple[str, _Member]:
        member_id = synap.name(payload, "member_id")
        member = self.members.get(member_id)
        if member is None:
            raise SynapError(
                "MemberNotFound",
                f"member {member_id!r} is not in a group here (it left or expired): join again",
                404,
            )
        return member_id, member

    async def _group_join(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        group = synap.name(payload, "group")
        definition = await self._definition(group)
        session_s = synap.integer(payload, "session_timeout_secs", low=1)
        settings = GroupSettings.of(definition)
        if session_s is not None:
            settings = GroupSettings(
                settings.strategy,
                session_s * 1000,
                settings.rebalance_delay_ms,
                settings.pending_max,
            )
        if len(self.members) >= limits.synap_members_max:
            raise SynapError("ResourceLimitExceeded", "too many members on this gateway", 429)
        coordinator = self._coordinator(definition.stream)
        member = await coordinator.join(group, settings)
        member_id = str(uuid.uuid4())
        self.members[member_id] = _Member(definition.stream, group, member)
        return {"member_id": member_id, "group_id": group}

    async def _sync(self, member: _Member) -> Assignment:
        coordinator = self._coordinator(member.stream)
        try:
            assignment = await coordinator.sync(member.group, member.member, None, 0)
            if assignment.release:
                # a Synap member holds nothing in flight: what it must give up goes at once
                await coordinator.released(
                    member.group, member.member, assignment.release, assignment.generation
                )
                assignment = await coordinator.sync(member.group, member.member, None, 0)
        except NotFound:
            raise SynapError(
                "MemberNotFound", "the member left or its session expired: join again", 404
            ) from None
        member.assignment = assignment
        return assignment

    async def _group_assignment(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        member_id, member = self._member(payload)
        try:
            assignment = await self._sync(member)
        except SynapError:
            self.members.pop(member_id, None)
            raise
        return {
            "member_id": member_id,
            "group_id": member.group,
            "partitions": sorted(int(p) for p in assignment.partitions),
            "generation": int(assignment.generation),
        }

    async def _group_heartbeat(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        member_id, member = self._member(payload)
        try:
            await self._sync(member)
        except SynapError:
            self.members.pop(member_id, None)
            raise
        return {"success": True}

    async def _group_leave(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        member_id, member = self._member(payload)
        await self._coordinator(member.stream).leave(member.group, member.member)
        del self.members[member_id]
        return {"success": True, "member_id": member_id}

    async def _group_commit(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        """003 commit: `offset` is the next one to consume. Stored as Spate's group offset
        (the last one done, ADR 0015) by claiming the partition under the member's
        generation, so a member fenced by a newer rebalance cannot commit."""
        member_id, member = self._member(payload)
        config = await self._topic_config(member.stream)
        partition = synap.integer(payload, "partition_id", low=0, high=config.partitions - 1)
        offset = synap.integer(payload, "offset", low=0)
        if partition is None or offset is None:
            raise synap.invalid("'partition_id' and 'offset' are required")
        assignment = await self._sync(member)
        if PartitionId(partition) not in assignment.partitions:
            raise SynapError(
                "FailedPrecondition",
                f"partition {partition} is not assigned to member {member_id} (it has "
                f"{sorted(int(p) for p in assignment.partitions)}): fetch the assignment",
                409,
            )
        name = (COMMITTED_PREFIX + member.group).encode()
        owner = self.broker.partition(member.stream, PartitionId(partition), write=True)
        try:
            attached = await owner.claim(name, None, int(assignment.generation))
            try:
                if not attached.active:
                    attached = await owner.until_active(name, attached.member)
                await owner.store_offset(name, offset - 1, attached.member)
            finally:
                await owner.consumer_detach(name, None, attached.member)
        finally:
            owner.detach()
        return {"success": True, "partition_id": partition, "offset": offset}

    async def _group_offset(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        group = synap.name(payload, "group")
        partition = synap.integer(payload, "partition_id", low=0)
        if partition is None:
            raise synap.invalid("'partition_id' is required")
        definition = await self._definition(group)
        committed = await self.admin.committed(definition.stream, group)
        stored = committed.get(partition)
        return {
            "group_id": group,
            "partition_id": partition,
            "offset": None if stored is None else stored + 1,
        }

    async def _group_stats(
        self, payload: dict[str, Any], connection: Connection | None
    ) -> dict[str, Any]:
        group = synap.name(payload, "group")
        definition = await self._definition(group)
        config = await self._topic_config(definition.stream)
        view = await self._coordinator(definition.stream).describe(group)
        committed = await self.admin.committed(definition.stream, group)
        return {
            "group_id": group,
            "topic": definition.stream,
            "state": "Empty" if view is None else view.state.value,
            "member_count": 0 if view is None else len(view.members),
            "generation": 0 if view is None else int(view.generation),
            "partition_count": config.partitions,
            "committed_partitions": len(committed),
            "strategy": definition.strategy.value.replace("-", "_"),
        }


def topic_event(
    topic: str, partition: int, offset: int, timestamp_ms: int, record: bytes | memoryview
) -> dict[str, Any]:
    """003 "Direct Partition Consumption" event from a stored message (any AMQP client's)."""
    try:
        sections = rooms.decode_sections(record)
    except codec.DecodeError:
        sections = rooms.Sections({}, [], {}, bytes(record))
    app = sections.application
    key = sections.annotations.get(GROUP_KEY)
    return {
        "id": str(app.get("event_id", f"{topic}-{partition}-{offset}")),
        "partition_id": partition,
        "offset": offset,
        "topic": topic,
        "event_type": app.get("event_type"),
        "key": key if isinstance(key, str) else None,
        "data": rooms.body_json(sections.body),
        "timestamp": timestamp_ms // 1000,
        "size_bytes": len(record),
    }
