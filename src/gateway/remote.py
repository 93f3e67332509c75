"""Proxy mode of the gateway tier: spate.core.backend over the gateway wire (ADR 0008).

`RemoteBroker` implements the Broker contract the listener runs over, so a gateway serves
every link itself and unmodified AMQP clients work: producers' records go to the partition's
leader, consumers read from a replica, `$info` asks the nodes.

- One `NodeSession` per node: a TCP connection to the node's replication port, the cluster
  secret handshake (spate.core.frames, SESSION), then spate.core.wire frames, read by a
  `spate.core.receiver.FrameReceiver` and handled as the loop reads them (ADR 0045); frames
  queued in one loop turn go out in one write.
- `RemoteWriter` (a producer link's partition) pipelines APPENDs to the leader the routing
  table names, fenced by its leader epoch. An append the node refused with nothing written
  (`stored=0`: not the leader, an election) is sent again, in order, once the table names a
  new leader (within `reroute_timeout_s`); later appends wait behind it, so a link's records
  keep their order. While it waits it asks for the routes (`RemoteBroker.ask_routes`, ADR
  0046), so a stream's first leader or a new one is used as soon as the metadata has it. An
  append whose outcome is unknown (the leader failed after proposing it, or its connection
  broke) is refused to the client as retryable: it may be stored, and resending it without
  producer deduplication may store it twice. Acknowledged records are never resent, so never
  duplicated.
- `RemoteReader` (a consumer link's partition) subscribes at a replica (the leader when it is
  alive) from the offset `begin` resolves, buffers the records the node pushes, grants credit
  back as the listener reads past them, and after a broken connection or an ended
  subscription subscribes again from its next offset elsewhere: nothing skipped, nothing twice.
  A reader at another replica while the table names a live leader (it subscribed before the
  table knew one, as after creating a stream, or its replica stopped leading) moves to the
  leader, the same way, once its session there is open (ADR 0045): records are readable at
  the leader first, and a follower without readers is sent no commit updates (ADR 0044).
- Named consumers (ADR 0012): offset operations go to the leader the table names, and a link
  stays counted there (an operator's reset is refused meanwhile) across a leader change or a
  broken session (`_PartitionBase._keep_counted`).
- Consumer groups (ADR 0015): `RemoteCoordinator` carries a member's calls to its stream's
  group coordinator, at the leader of the stream's partition 0, as GROUP requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import os
import ssl
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from spate.core import frames, limits, subentry, wire
from spate.core.backend import (
    Attached,
    ChunkView,
    OffsetSpec,
    PartitionInfo,
    ProducerInfo,
    PublishingIds,
)
from spate.core.coordinator import Assignment, GroupSettings, GroupView
from spate.core.errors import BrokerError, NotFound, NotLeader, Unavailable
from spate.core.filtering import ValueFilter
from spate.core.groups import GroupDefinition
from spate.core.ids import LeaderEpoch, MemberId, NodeId, Offset, PartitionId, StreamName
from spate.core.receiver import FrameReceiver
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream
from spate.gateway.routes import Route, RoutingTable

log = logging.getLogger(__name__)

READ_CREDIT_RECORDS = 4096
"""Records a node may push ahead of what a consumer link has read (per link and partition)."""
REROUTE_TIMEOUT_S = 15.0
"""How long appends refused by a former leader wait for the table to name a new one."""
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 10.0
RESUBSCRIBE_DELAY_S = 0.2
LEADER_WAIT_S = 5.0
"""How long an operation at a partition's leader waits for the table to name a live one."""
RETRY_SAME_ROUTE_S = 1.0
"""A refusal with nothing stored under an unchanged route is retried after this long."""
ROUTES_ASK_FIRST_S = 0.05
"""A link waiting for its route (no live leader in the table, or a leader that refused the
epoch it names) asks for the routes at once, then again after pauses doubling from this
(ADR 0046): the table is read every `refresh_ms` (1 s) otherwise, and a stream's first
leader, or a new one, reaches the metadata service well within that."""
ROUTES_ASK_MAX_S = 1.0
"""The longest pause between a waiting link's asks (the gateway's default refresh_ms)."""
ROUTES_ASK_SPACING = 5
"""Reads asked by links start at least this many times the last one's duration apart (and
`ROUTES_ASK_FIRST_S`), however many links wait: at most about a fifth of the gateway's time
goes to them, even with thousands of partitions in the routes."""
COUNT_CHECK_S = 30.0
"""A named consumer link checks this often that its leader counts it (ADR 0012), besides at
every table change and broken session: a safety net, one wake-up per link."""
FRAME_BYTES_MAX = 64 * 1024 * 1024


class _Pending:
    """An APPEND in flight; answered by its session."""

    __slots__ = ("future", "producer", "records", "seq", "session", "writer")

    def __init__(
        self,
        writer: RemoteWriter,
        seq: int,
        records: Sequence[bytes],
        future: asyncio.Future[Offset],
        producer: PublishingIds | None,
    ) -> None:
        self.writer = writer
        self.seq = seq
        self.records = records
        self.future = future
        self.producer = producer
        self.session: NodeSession | None = None


class NodeSession:
    """The gateway's connection to one node."""

    def __init__(self, sessions: Sessions, node: NodeId, address: tuple[str, int]) -> None:
        self.sessions = sessions
        self.node = node
        self.address = address
        self.loop = asyncio.get_running_loop()
        self.ready = False
        self.closed = False
        self.opened: asyncio.Future[None] = self.loop.create_future()
        self.appends: dict[int, _Pending] = {}
        self.requests: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.readers: dict[int, RemoteReader] = {}
        self._ids = itertools.count(1)
        self._out: list[bytes] = []
        self._writer: asyncio.StreamWriter | None = None
        self.heard = self.loop.time()
        """When the node last sent a frame (loop time)."""
        self.silenced = 0
        """1 when this session was given up for silence."""
        self._keepalive: asyncio.TimerHandle | None = None
        self._ping_due = 0.0
        self.task = self.loop.create_task(self._run(), name=f"wire-{node}")

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, data: bytes) -> None:
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        writer = self._writer
        if self._out and writer is not None and not writer.transport.is_closing():
            writer.write(b"".join(self._out))
        self._out.clear()

    async def request(
        self, data: bytes, request: int, timeout_s: float | None = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        """Send a request and wait for its answer (`timeout_s` None: as long as the session
        lives — a request the node answers when something happens)."""
        future: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self.requests[request] = future
        self.send(data)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise Unavailable(f"node {self.node} did not answer in time; retry") from None
        finally:
            self.requests.pop(request, None)

    async def _run(self) -> None:
        host, port = self.address
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=self.sessions.ssl_client),
                CONNECT_TIMEOUT_S,
            )
            self._writer = writer
            await asyncio.wait_for(self._handshake(reader, writer), CONNECT_TIMEOUT_S)
            # From here the frames go to `_on_frame` as the loop reads them (ADR 0045). The
            # node sends nothing before it is asked, so the reader holds no frame now.
            receiver = FrameReceiver(writer.transport, self._heard_frame, bytes_max=FRAME_BYTES_MAX)
            writer.transport.set_protocol(receiver)
            reader.feed_eof()
            if not reader.at_eof():
                raise frames.CodecError("the node sent frames before it was asked anything")
            self.ready = True
            self.opened.set_result(None)
            self.heard = self.loop.time()
            self._schedule_ping()
            reason = await receiver.closed
            if receiver.error is not None:
                raise receiver.error
            raise reason if reason is not None else OSError("the node closed the session")
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as error:
            log.info(
                "session with node %s at %s:%s ended: %s",
                self.node,
                host,
                port,
                error or type(error).__name__,
            )
        except frames.CodecError as error:
            log.warning("session with node %s broken: %s", self.node, error)
        finally:
            if self._keepalive is not None:
                self._keepalive.cancel()
            self._lost()

    def _ping(self) -> None:
        """Every KEEPALIVE_S: ping the node (it answers at once), and give the session up when
        the node sent nothing for GATEWAY_SILENCE_S — dead, paused (SIGSTOP) or cut off; its
        readers then move to another replica and its group partitions are dropped (ADR 0008
        "Liveness")."""
        writer = self._writer
        if self.closed or writer is None:
            return
        now = self.loop.time()
        silent_s = now - self.heard
        late = now - self._ping_due > wire.KEEPALIVE_S  # this loop stalled: frames may wait
        if silent_s > wire.GATEWAY_SILENCE_S and not late:
            log.warning(
                "node %s sent nothing for %.1f s: giving its session up", self.node, silent_s
            )
            self.silenced += 1
            writer.transport.abort()
            return
        self.send(wire.encode_ping(next(self._ids)))
        self._schedule_ping()

    def _schedule_ping(self) -> None:
        self._ping_due = self.loop.time() + wire.KEEPALIVE_S
        self._keepalive = self.loop.call_at(self._ping_due, self._ping)

    def fresh(self) -> bool:
        """The node was heard from within GATEWAY_SILENCE_S (a session given up is not)."""
        return not self.closed and self.loop.time() - self.heard <= wire.GATEWAY_SILENCE_S

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        secret, me = self.sessions.secret, self.sessions.gateway_id

        async def frame_of(kind: int) -> memoryview:
            head = await reader.readexactly(frames.FRAME_HEAD_BYTES)
            length, got = frames.FRAME_HEAD.unpack(head)
            if got != kind or not 1 <= length <= 4096:
                raise frames.CodecError(f"handshake: expected frame kind {kind}, got {got}")
            return memoryview(await reader.readexactly(length - 1))

        server, nonce_s = frames.decode_challenge(await frame_of(frames.KIND_CHALLENGE))
        nonce_c = os.urandom(frames.NONCE_BYTES)
        mac = frames.mac(secret, b"c", nonce_s, me, server)
        writer.write(frames.encode_hello(me, nonce_c, mac, kind=frames.KIND_SESSION))
        await writer.drain()
        want = frames.mac(secret, b"s", nonce_c, server, me)
        if not hmac.compare_digest(
            frames.decode_welcome(await frame_of(frames.KIND_WELCOME)), want
        ):
            raise frames.CodecError(f"node {server} failed authentication (cluster secret)")

    def _heard_frame(self, kind: int, body: memoryview) -> None:
        self.heard = self.loop.time()
        self._on_frame(kind, body)

    def _on_frame(self, kind: int, body: memoryview) -> None:
        if kind == wire.APPENDED:
            request, first = wire.decode_appended(body)
            pending = self.appends.pop(request, None)
            if pending is not None:
                pending.writer.appended(pending, Offset(first))
        elif kind == wire.RECORDS:
            sub, first, timestamp_ms, records = wire.decode_records(body)
            reader = self.readers.get(sub)
            if reader is not None:
                reader.pushed(first, timestamp_ms, records)
        elif kind == wire.SUB_ENTRY:  # a stored sub-entry, still compressed (ADR 0017)
            sub, first, timestamp_ms, entry = wire.decode_sub_entry(body)
            reader = self.readers.get(sub)
            if reader is not None:
                reader.pushed(first, timestamp_ms, entry)
        elif kind == wire.FAILED:
            request, error, stored = wire.decode_failed(body)
            pending = self.appends.pop(request, None)
            if pending is not None:
                pending.writer.failed(pending, error, stored=stored)
            future = self.requests.get(request)
            if future is not None and not future.done():
                future.set_exception(error)
        elif kind == wire.REPLY:
            request, value = wire.decode_reply(body)
            future = self.requests.get(request)
            if future is not None and not future.done():
                future.set_result(value)
        elif kind == wire.STARTED:
            sub, start = wire.decode_started(body)
            reader = self.readers.get(sub)
            if reader is not None:
                reader.started(sub, start)
        elif kind == wire.ENDED:
            sub, error = wire.decode_ended(body)
            reader = self.readers.pop(sub, None)
            if reader is not None:
                reader.ended(sub, error)
        elif kind != wire.PONG:  # a pong only refreshes `heard`, done for every frame
            raise frames.CodecError(f"unexpected frame kind {kind}")

    def _lost(self) -> None:
        self.ready = False
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        if not self.opened.done():
            self.opened.set_exception(Unavailable(f"node {self.node} cannot be reached; retry"))
            self.opened.exception()  # retrieved: waiters see it through `connected`
        self.sessions.forget(self)
        for callback in list(self.sessions.on_lost):
            callback()
        appends, self.appends = self.appends, {}
        for pending in appends.values():
            pending.writer.failed(
                pending,
                Unavailable(f"the connection to node {self.node} broke with this append in flight"),
                stored=True,
            )
        for future in self.requests.values():
            if not future.done():
                future.set_exception(Unavailable(f"the connection to node {self.node} broke"))
        readers, self.readers = self.readers, {}
        for sub, reader in readers.items():
            reader.ended(sub, Unavailable(f"the connection to node {self.node} broke"))

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class Sessions:
    """One session per node, opened on first use, reopened after a failure."""

    def __init__(
        self,
        gateway_id: str,
        secret: str,
        table: RoutingTable,
        ssl_client: ssl.SSLContext | None = None,
    ) -> None:
        self.gateway_id = gateway_id
        self.secret = secret.encode()
        self.table = table
        self.ssl_client = ssl_client
        self.by_node: dict[NodeId, NodeSession] = {}
        self.on_lost: list[Callable[[], None]] = []
        """Called when a session breaks (the node lets go of what it counted for it)."""

    def get(self, node: NodeId) -> NodeSession:
        session = self.by_node.get(node)
        if session is None:
            address = self.table.routes.replication.get(node)
            if address is None:
                raise Unavailable(f"node {node} has no known address yet; retry")
            session = self.by_node[node] = NodeSession(self, node, address)
        return session

    async def connected(self, node: NodeId) -> NodeSession:
        session = self.get(node)
        if not session.ready:
            await asyncio.shield(session.opened)
        return session

    def forget(self, session: NodeSession) -> None:
        if self.by_node.get(session.node) is session:
            del self.by_node[session.node]

    async def close(self) -> None:
        for session in list(self.by_node.values()):
            await session.close()
        self.by_node.clear()


class RemoteBroker:
    """spate.core.backend.Broker for a gateway in proxy mode (see the module docstring)."""

    def __init__(
        self,
        table: RoutingTable,
        sessions: Sessions,
        refresh: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.table = table
        self.sessions = sessions
        self.refresh = refresh
        """Reads the routes now (a gateway's metadata refresh), for names they do not hold."""
        self.configs: dict[StreamName, StreamConfig] = {}
        """Streams asked of a node since the table last had them."""
        self.changed = asyncio.Event()
        self.recount = asyncio.Event()
        """Set (then replaced) when the table changes or a session breaks: named consumer
        links check that the leader counts them (`_PartitionBase._keep_counted`)."""
        self.readers: weakref.WeakSet[RemoteReader] = weakref.WeakSet()
        """Consumer links' partitions, told of every table change (`RemoteReader.route_changed`)."""
        self.routes_asked = 0
        """Route reads asked for by waiting links (`ask_routes`)."""
        self._asking: asyncio.Task[None] | None = None
        self._asked_at = float("-inf")
        self._ask_spacing_s = ROUTES_ASK_FIRST_S
        table.listeners.append(self._table_changed)
        sessions.on_lost.append(self._wake_recount)

    def _table_changed(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()
        self._wake_recount()
        for reader in list(self.readers):
            reader.route_changed()

    def _wake_recount(self) -> None:
        self.recount.set()
        self.recount = asyncio.Event()

    async def wait_recount(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.recount.wait(), timeout_s)

    async def wait_change(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout_s)

    def ask_routes(self) -> None:
        """The table is behind for a link (no live leader for its partition, or a leader that
        refused the epoch it names): read the routes now, unless a read asked for is under way
        or started less than the spacing ago (`ROUTES_ASK_SPACING`). The answer, changed or
        not, wakes `wait_change`'s waiters."""
        if self.refresh is None or (self._asking is not None and not self._asking.done()):
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._asked_at < self._ask_spacing_s:
            return
        self._asked_at = loop.time()
        self.routes_asked += 1
        self._asking = loop.create_task(self._ask(), name="routes asked")

    async def _ask(self) -> None:
        assert self.refresh is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await self.refresh()
        except Exception as error:  # the periodic read goes on; links keep waiting
            log.info("routes read asked for by waiting links failed: %s", error)
        finally:
            took = loop.time() - started
            self._ask_spacing_s = max(ROUTES_ASK_FIRST_S, ROUTES_ASK_SPACING * took)

    async def wait_route(self, pause_s: float) -> float:
        """Ask for the routes (`ask_routes`) and wait up to `pause_s` for the table to change;
        the next pause (doubled, at most `ROUTES_ASK_MAX_S`)."""
        self.ask_routes()
        await self.wait_change(pause_s)
        return min(2 * pause_s, ROUTES_ASK_MAX_S)

    def route(self, key: tuple[StreamName, PartitionId]) -> Route | None:
        return self.table.routes.partitions.get(key)

    async def lookup(self, name: StreamName) -> StreamConfig:
        config = self.table.routes.streams.get(name)
        if config is not None:
            return config
        nodes = sorted(self.table.routes.replication)
        if not nodes:
            raise Unavailable("the gateway has not reached the metadata service yet; retry")
        error: BrokerError = Unavailable("no node answered; retry")
        for node in nodes:  # created since the last refresh, or not at all: a node knows
            try:
                session = await self.sessions.connected(node)
                request = session.next_id()
                value = await session.request(wire.encode_stream(request, name), request)
            except NotFound:
                raise
            except BrokerError as failure:
                error = failure
                continue
            config = wire.config_from_json(value)
            self.configs[name] = config
            return config
        raise error

    async def super_stream(self, name: StreamName) -> SuperStream:
        """From the routes; a name they do not hold (a super stream created since the last
        refresh, or none) is looked for again after reading the routes now."""
        if name not in self.table.routes.super_streams and self.refresh is not None:
            await self.refresh()
        routes = self.table.routes
        if routes.version < 0:
            raise Unavailable("the gateway has not reached the metadata service yet; retry")
        return routes.super_stream(name)

    def super_stream_version(self, name: StreamName) -> int | None:
        return self.table.routes.super_stream_version(name)

    groups_required = False
    """`--require-defined-groups` (ADR 0015); the gateway process sets it."""

    async def consumer_group(self, stream: StreamName, group: str) -> GroupDefinition | None:
        """From the routes; when definitions are required and the routes do not hold it (a
        group defined since the last refresh, or none), after reading the routes now. Without
        the requirement an undefined group is the common case: no read for it."""
        found = self.table.routes.consumer_group(stream, group)
        if found is None and self.groups_required and self.refresh is not None:
            await self.refresh()
            found = self.table.routes.consumer_group(stream, group)
        return found

    async def super_stream_of(self, stream: StreamName) -> SuperStream | None:
        """From the routes, read again first when they do not hold the stream yet."""
        if stream not in self.table.routes.streams and self.refresh is not None:
            await self.refresh()
        return self.table.routes.super_stream_of(stream)

    def _config(self, name: StreamName) -> StreamConfig:
        config = self.table.routes.streams.get(name) or self.configs.get(name)
        if config is None:
            raise NotFound(f"stream {name!r} does not exist")
        return config

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool, relay: bool = False
    ) -> RemoteWriter | RemoteReader:
        config = self._config(name)
        if not 0 <= partition < config.partitions:
            raise NotFound(
                f"stream {name!r} has partitions 0..{config.partitions - 1}; "
                f"there is no partition {partition}"
            )
        key = (name, PartitionId(partition))
        return RemoteWriter(self, key) if write else RemoteReader(self, key)

    async def describe(self, key: tuple[StreamName, PartitionId]) -> PartitionInfo:
        route = self.route(key)
        nodes = [] if route is None else list(route.replicas)
        if route is not None and route.leader is not None and route.leader_alive:
            nodes = [route.leader] + [n for n in nodes if n != route.leader]
        error: BrokerError = Unavailable(f"no replica of {key[0]}/{key[1]} answered; retry")
        for node in nodes:
            try:
                session = await self.sessions.connected(node)
                request = session.next_id()
                value = await session.request(wire.encode_info(request, key), request)
                return wire.info_from_json(value)
            except (NotLeader, Unavailable, NotFound) as failure:
                error = failure
        raise error

    def group_coordinator(self, stream: StreamName) -> RemoteCoordinator:
        """The coordinator of `stream`'s consumer groups at its partition 0's leader, over the
        wire (ADR 0015; `RemoteCoordinator`)."""
        return RemoteCoordinator(self, stream)


class _PartitionBase:
    def __init__(self, broker: RemoteBroker, key: tuple[StreamName, PartitionId]) -> None:
        self.broker = broker
        self.key = key
        self.loop = asyncio.get_running_loop()
        self._consumer_name: bytes | None = None
        """A named consumer link's name while it is attached (ADR 0012)."""
        self._claimed = False
        """The name is a consumer group's, claimed at `_counted_at` (ADR 0015)."""
        self._counted_at: NodeSession | None = None
        """The session over which the leader counts that link."""
        self._counting_lock = asyncio.Lock()
        self._counting: asyncio.Task[None] | None = None
        self._member = 0
        """Single active consumer: the link's member number in its group (0: a plain link)."""

    @property
    def stream(self) -> StreamName:
        return self.key[0]

    @property
    def partition(self) -> PartitionId:
        return self.key[1]

    async def describe(self) -> PartitionInfo:
        return await self.broker.describe(self.key)

    # named consumers (ADR 0012): at the leader the routing table names, wherever reads come from.
    # The leader counts an attached link per gateway session (an operator's reset is refused
    # while the count is not zero) and lets go of a session's counts when it closes. The link
    # outlives a leader change or a broken session here, so it is counted again over the
    # session to the new leader: at once when the table or the session changes
    # (`_keep_counted`), and before any other operation of the link is sent there.

    async def _leader_session(self) -> NodeSession:
        """The session to the leader the table names; a partition between leaders for a
        moment (an election, a late heartbeat in the metadata) is waited for, up to
        LEADER_WAIT_S, before the operation is refused (retryable)."""
        deadline = self.loop.time() + LEADER_WAIT_S
        pause = ROUTES_ASK_FIRST_S
        while True:
            route = self.broker.route(self.key)
            if route is not None and route.leader is not None and route.leader_alive:
                return await self.broker.sessions.connected(route.leader)
            left = deadline - self.loop.time()
            if left <= 0:
                raise Unavailable(
                    f"partition {self.key[1]} of {self.key[0]!r} has no leader; retry"
                )
            pause = await self.broker.wait_route(min(pause, left))

    async def _request(
        self, session: NodeSession, op: int, name: bytes, offset: int, member: int = 0
    ) -> Attached:
        """One CONSUMER request; a WAIT or DEPOSED has no time limit (it is answered when the
        member's turn comes or goes, or fails when the session to that node closes)."""
        request = session.next_id()
        frame = wire.encode_consumer(request, self.key, op, name, offset, member)
        waits = op in (wire.CONSUMER_WAIT, wire.CONSUMER_DEPOSED)
        timeout_s = None if waits else REQUEST_TIMEOUT_S
        return wire.consumer_from_json(await session.request(frame, request, timeout_s))

    async def _count_at(self, session: NodeSession) -> None:
        """The attached link is counted over `session` (the leader's), and no longer over the
        one before it if that is still open (a node that stopped leading: its count would
        refuse resets if it led again). A single-active-consumer member is not moved: its
        group stayed with the old leader (ADR 0013), so its link ends and attaches again."""
        name = self._consumer_name
        async with self._counting_lock:
            before = self._counted_at
            if name is None or before is session:
                return
            if self._member:
                raise Unavailable(
                    f"partition {self.key[1]} of {self.key[0]!r} has a new leader: attach "
                    "again to rejoin the single-active-consumer group"
                )
            await self._request(session, wire.CONSUMER_ATTACH, name, wire.NO_OFFSET)
            self._counted_at = session
        if before is not None and not before.closed:
            with contextlib.suppress(BrokerError):  # it lets go when the session closes
                await self._request(before, wire.CONSUMER_DETACH, name, wire.NO_OFFSET)

    async def _keep_counted(self) -> None:
        while self._consumer_name is not None:
            await self.broker.wait_recount(COUNT_CHECK_S)
            counted, route = self._counted_at, self.broker.route(self.key)
            if route is None or route.leader is None or not route.leader_alive:
                continue  # no leader to be counted at yet
            if counted is not None and not counted.closed and counted.node == route.leader:
                continue  # counted at the leader
            with contextlib.suppress(BrokerError):  # unreachable yet: try at the next change
                await self._count_at(await self._leader_session())

    async def consumer_attach(
        self, name: bytes, *, single_active: bool = False, spread: int | None = None
    ) -> Attached:
        assert self._consumer_name is None, "one named consumer per link"
        session = await self._leader_session()
        if single_active:
            spread_field = wire.NO_OFFSET if spread is None else spread
            attached = await self._request(session, wire.CONSUMER_JOIN, name, spread_field)
        else:
            attached = await self._request(session, wire.CONSUMER_ATTACH, name, wire.NO_OFFSET)
        self._consumer_name, self._counted_at = name, session
        self._member = attached.member
        if not single_active:  # a member's link ends at a leader change instead (_count_at)
            self._counting = self.loop.create_task(self._keep_counted())
        return attached

    async def claim(
        self, name: bytes, epoch: int | None, generation: int | None = None
    ) -> Attached:
        """A consumer group's link claims the partition at its leader (ADR 0015); like a
        single-active-consumer member, its link ends when the leader changes."""
        assert self._consumer_name is None, "one named consumer per link"
        session = await self._leader_session()
        requested = wire.NO_OFFSET if epoch is None else epoch
        attached = await self._request(
            session, wire.CONSUMER_CLAIM, name, requested, generation or 0
        )
        self._consumer_name, self._counted_at = name, session
        self._member = attached.member
        self._claimed = True
        return attached

    def in_contact(self) -> bool:
        """A claim's leader was heard from lately (see NodeSession.fresh)."""
        counted = self._counted_at
        return not self._claimed or (counted is not None and counted.fresh())

    async def until_active(self, name: bytes, member: int) -> Attached:
        """Answered by the leader when the member becomes active (the request waits there)."""
        session = await self._member_session()
        return await self._request(session, wire.CONSUMER_WAIT, name, wire.NO_OFFSET, member)

    async def until_deposed(self, name: bytes, member: int) -> Attached:
        """Answered by the leader when the active member must step down (the request waits
        there)."""
        session = await self._member_session()
        return await self._request(session, wire.CONSUMER_DEPOSED, name, wire.NO_OFFSET, member)

    async def step_down(self, name: bytes, member: int, offset: int | None) -> None:
        session = await self._member_session()
        stored = wire.NO_OFFSET if offset is None else offset
        await self._request(session, wire.CONSUMER_STEP_DOWN, name, stored, member)

    async def _member_session(self) -> NodeSession:
        """The session the member joined its group over, while it is open and leads."""
        session = await self._leader_session()
        await self._count_at(session)  # Unavailable when the leader changed
        return session

    async def store_offset(self, name: bytes, offset: int, member: int = 0) -> None:
        session = await self._leader_session()
        await self._count_at(session)
        await self._request(session, wire.CONSUMER_STORE, name, offset, member)

    async def consumer_detach(self, name: bytes, offset: int | None, member: int = 0) -> None:
        """Where the link is counted (and its member in a group): store `offset`, count down
        and leave, in one request. After a leader change the link did not follow (a group
        member's, ADR 0013): store at the new leader as a plain link (a consumer group's
        former owner is fenced there), and let go at the old one."""
        self._stop_counting()
        counted_at = self._counted_at
        self._consumer_name = self._counted_at = None
        self._claimed = False
        stored = wire.NO_OFFSET if offset is None else offset
        done_at: NodeSession | None = None
        try:
            session = await self._leader_session()
            if session is counted_at or offset is not None:
                done_at = session  # not counted there: the node only stores
                if session is not counted_at and member:
                    # without the member number: it is the old leader's, and the new one
                    # numbers its members from 1 too, so it may be another link's there, whose
                    # ownership it would pass for (a fenced owner's commit, ADR 0015) or, that
                    # link counted over this session, whose place it would give up (found by
                    # spate.sim.groups, seed 209)
                    await self._request(session, wire.CONSUMER_STORE, name, stored, 0)
                else:
                    await self._request(session, wire.CONSUMER_DETACH, name, stored, member)
        finally:
            if counted_at is not None and counted_at is not done_at and not counted_at.closed:
                with contextlib.suppress(BrokerError):  # it lets go when the session closes
                    await self._request(
                        counted_at, wire.CONSUMER_DETACH, name, wire.NO_OFFSET, member
                    )

    async def reset_offset(self, name: bytes, offset: int) -> None:
        await self._request(await self._leader_session(), wire.CONSUMER_RESET, name, offset)

    def _stop_counting(self) -> None:
        if self._counting is not None:
            self._counting.cancel()
            self._counting = None


class RemoteWriter(_PartitionBase):
    """A producer link's partition, appended to at its leader (see the module docstring)."""

    def __init__(self, broker: RemoteBroker, key: tuple[StreamName, PartitionId]) -> None:
        super().__init__(broker, key)
        self.queue: deque[_Pending] = deque()
        self.inflight: dict[int, _Pending] = {}
        self.refused: list[_Pending] = []
        self.stalled = False
        self.detached = False
        self._seq = itertools.count()
        self._reroute: asyncio.Task[None] | None = None
        self._route: tuple[NodeId | None, LeaderEpoch | None] | None = None
        """(leader, epoch) the last appends went to."""
        self._refused_by: tuple[NodeId | None, LeaderEpoch | None] | None = None

    def append(
        self, records: Sequence[bytes], producer: PublishingIds | None = None
    ) -> asyncio.Future[Offset]:
        future: asyncio.Future[Offset] = self.loop.create_future()
        self.queue.append(_Pending(self, next(self._seq), records, future, producer))
        self._send()
        return future

    async def last_publishing_id(self, name: bytes) -> ProducerInfo | None:
        """Asked of the leader the routing table names (NotLeader or Unavailable otherwise:
        the attach that asks is refused, retryable)."""
        route = self.broker.route(self.key)
        if route is None or route.leader is None or not route.leader_alive:
            raise Unavailable(f"partition {self.key[1]} of {self.key[0]!r} has no leader; retry")
        session = await self.broker.sessions.connected(route.leader)
        request = session.next_id()
        value = await session.request(wire.encode_producer(request, self.key, name), request)
        return wire.producer_from_json(value)

    def _send(self) -> None:
        if self.stalled or not self.queue:
            return
        route = self.broker.route(self.key)
        session = None
        if route is not None and route.leader is not None and route.leader_alive:
            try:
                session = self.broker.sessions.get(route.leader)
            except Unavailable:
                session = None
        if (
            route is None
            or session is None
            or not session.ready
            or any(p.session is not session for p in self.inflight.values())
        ):
            # (appends still in flight at another leader: the new one waits for their
            # outcome, so that a link's messages are stored in the order they were sent)
            self._stall()
            return
        epoch = int(route.epoch or 0)
        self._route = (route.leader, route.epoch)
        while self.queue:
            pending = self.queue.popleft()
            request = session.next_id()
            pending.session = session
            session.appends[request] = pending
            self.inflight[pending.seq] = pending
            session.send(
                wire.encode_append(request, self.key, epoch, pending.records, pending.producer)
            )

    def appended(self, pending: _Pending, first: Offset) -> None:
        self.inflight.pop(pending.seq, None)
        if not pending.future.done():
            pending.future.set_result(first)

    def failed(self, pending: _Pending, error: BrokerError, *, stored: bool) -> None:
        self.inflight.pop(pending.seq, None)
        if not stored and error.retryable and not self.detached:
            self.refused.append(pending)  # nothing was written: send it to the next leader
            self._refused_by = self._route
            self._stall()
            return
        if not pending.future.done():
            if isinstance(error, NotLeader) or stored:
                twice = (
                    "it may then be stored twice"
                    if pending.producer is None
                    else "a named producer's resend is not stored twice"
                )
                what = (
                    f"the leader of {self.key[0]}/{self.key[1]} changed while this message was "
                    "in flight"
                    if isinstance(error, NotLeader)
                    else f"its append to {self.key[0]}/{self.key[1]} ended without an outcome"
                )  # (e.g. no commit within the leader's time limit, or the connection broke)
                error = Unavailable(
                    f"{what}, so whether it was stored is unknown ({error.message}); resend "
                    f"it if it must be stored ({twice})"
                )
            pending.future.set_exception(error)

    def _stall(self) -> None:
        self.stalled = True
        if self._reroute is None:
            self._reroute = self.loop.create_task(self._wait_for_leader())

    async def _wait_for_leader(self) -> None:
        """Hold appends until those in flight are answered and a leader is reachable, then
        send the refused ones first, in their original order. A leader that refused them is
        asked again only once the table names another leader or epoch, or after
        `RETRY_SAME_ROUTE_S` (a refusal that was not about leadership). Meanwhile the routes
        are asked for (`RemoteBroker.wait_route`): the table names a new stream's first
        leader, or a new one, as soon as the metadata service has it, not at the next
        periodic read."""
        started = self.loop.time()
        deadline = started + REROUTE_TIMEOUT_S
        pause = ROUTES_ASK_FIRST_S
        try:
            while self.loop.time() < deadline and not self.detached:
                if self.inflight:
                    await asyncio.sleep(0.01)
                    continue
                route = self.broker.route(self.key)
                if route is None or route.leader is None or not route.leader_alive:
                    pause = await self.broker.wait_route(
                        min(pause, max(0.0, deadline - self.loop.time()))
                    )
                    continue
                if self.refused and (route.leader, route.epoch) == self._refused_by:
                    waited = self.loop.time() - started
                    if waited < RETRY_SAME_ROUTE_S:
                        pause = await self.broker.wait_route(
                            min(pause, RETRY_SAME_ROUTE_S - waited)
                        )
                        continue
                    self._refused_by = None  # once more after a pause
                try:
                    await asyncio.wait_for(
                        self.broker.sessions.connected(route.leader),
                        max(0.0, deadline - self.loop.time()),
                    )
                except (BrokerError, TimeoutError):
                    await self.broker.wait_change(0.2)
                    continue
                self._resume()
                return
            self._give_up()
        finally:
            self._reroute = None

    def _resume(self) -> None:
        self.refused.sort(key=lambda p: p.seq)
        self.queue.extendleft(reversed(self.refused))
        self.refused.clear()
        self.stalled = False
        self._send()

    def _give_up(self) -> None:
        self.refused.sort(key=lambda p: p.seq)
        waiting = self.refused + list(self.queue)
        self.refused.clear()
        self.queue.clear()
        self.stalled = False
        error = Unavailable(
            f"partition {self.key[1]} of {self.key[0]!r} has no reachable leader; retry"
        )
        for pending in waiting:
            if not pending.future.done():
                pending.future.set_exception(error)

    # a producer's partition is not read through the gateway
    async def begin(self, specs: Sequence[OffsetSpec], values: ValueFilter | None = None) -> Offset:
        raise AssertionError("a producer link does not read")

    def read(self, start: Offset, max_bytes: int) -> list[ChunkView]:
        return []

    def end_offset(self) -> Offset:
        return Offset(0)

    def add_listener(self, callback: Callable[[], None]) -> None:
        pass

    def remove_listener(self, callback: Callable[[], None]) -> None:
        pass

    def detach(self) -> None:
        self.detached = True


@dataclass
class _Buffered:
    first: int
    timestamp_ms: int
    records: Sequence[bytes]
    """Pushed records, or a SubEntryRecords (unpacked only if a reader slices it)."""


@dataclass
class _Subscription:
    session: NodeSession
    sub: int
    started: asyncio.Future[int]
    credit_owed: int = 0


class RemoteReader(_PartitionBase):
    """A consumer link's partition, streamed from a replica (see the module docstring)."""

    def __init__(self, broker: RemoteBroker, key: tuple[StreamName, PartitionId]) -> None:
        super().__init__(broker, key)
        self.buffer: deque[_Buffered] = deque()
        self.end = 0
        """The offset after the last record received: where a new subscription starts."""
        self.listeners: list[Callable[[], None]] = []
        self.subscription: _Subscription | None = None
        self.detached = False
        self.resubscribes = 0
        self.values: ValueFilter | None = None
        """The link's filter values: the node skips chunks that hold none (ADR 0016)."""
        self._task: asyncio.Task[None] | None = None
        """The task subscribing again (after an ended subscription) or moving to the leader."""
        self._buffered_records = 0
        self.moves = 0
        """Subscriptions moved to the partition's leader (`route_changed`)."""
        broker.readers.add(self)

    async def last_publishing_id(self, name: bytes) -> ProducerInfo | None:
        raise AssertionError("a consumer link does not publish")

    async def begin(self, specs: Sequence[OffsetSpec], values: ValueFilter | None = None) -> Offset:
        self.end = -1  # set by the node's STARTED, before any record it pushes
        self.values = values
        return Offset(await self._subscribe(specs))

    def _nodes(self) -> list[NodeId]:
        """The replicas to subscribe at, the live leader first. Without one in the table (a
        new stream, an election) the routes are asked for: the reader subscribes at another
        replica now and moves to the leader once the table names it (`route_changed`)."""
        route = self.broker.route(self.key)
        if route is None or route.leader is None or not route.leader_alive:
            self.broker.ask_routes()
        if route is None:
            return []
        nodes = list(route.replicas)
        if route.leader is not None and route.leader_alive:
            nodes = [route.leader] + [n for n in nodes if n != route.leader]
        return nodes

    async def _subscribe(self, specs: Sequence[OffsetSpec]) -> int:
        error: BrokerError = Unavailable(
            f"no replica of {self.key[0]}/{self.key[1]} can be reached; retry"
        )
        for node in self._nodes():
            try:
                session = await self.broker.sessions.connected(node)
            except BrokerError as failure:
                error = failure
                continue
            sub = session.next_id()
            state = _Subscription(session, sub, self.loop.create_future())
            self.subscription = state
            session.readers[sub] = self
            credit = max(READ_CREDIT_RECORDS - self._buffered_records, 1)
            session.send(wire.encode_subscribe(sub, self.key, credit, specs, self.values))
            try:
                return await asyncio.wait_for(asyncio.shield(state.started), REQUEST_TIMEOUT_S)
            except (BrokerError, TimeoutError) as failure:
                session.readers.pop(sub, None)
                self.subscription = None
                if isinstance(failure, NotFound):
                    raise
                error = failure if isinstance(failure, BrokerError) else error
        raise error

    def started(self, sub: int, start: int) -> None:
        state = self.subscription
        if state is not None and state.sub == sub and not state.started.done():
            # records may follow in the same read, before the subscriber resumes
            self.end = start if self.end < 0 else max(self.end, start)
            state.started.set_result(start)

    def ended(self, sub: int, error: BrokerError) -> None:
        state = self.subscription
        if state is None or state.sub != sub:
            return
        if not state.started.done():
            state.started.set_exception(error)
            return
        self.subscription = None
        if not self.detached and self._task is None:
            log.info("reader of %s/%s moves: %s", self.key[0], self.key[1], error.message)
            self._task = self.loop.create_task(self._resubscribe())

    async def _resubscribe(self) -> None:
        try:
            while not self.detached:
                try:
                    await self._subscribe([OffsetSpec.offset(self.end)])
                    self.resubscribes += 1
                    return
                except BrokerError:
                    await self.broker.wait_change(RESUBSCRIBE_DELAY_S)
        finally:
            self._task = None

    def route_changed(self) -> None:
        """The table changed: a reader subscribed at a replica other than the live leader it
        names moves there (`_move`). Records become readable at the leader a commit update
        sooner than at a follower, and a follower with no reader is sent no commit updates of
        its own (ADR 0044); a reader that subscribed while the table named no leader (a new
        stream, an election) would otherwise stay at whichever replica it found."""
        state = self.subscription
        if self.detached or self._task is not None or state is None:
            return
        route = self.broker.route(self.key)
        if route is None or route.leader is None or not route.leader_alive:
            return
        if state.session.node != route.leader and state.started.done():
            self._task = self.loop.create_task(self._move(route.leader))

    async def _move(self, leader: NodeId) -> None:
        """Subscribe at `leader` from the next offset and let the old subscription go, once
        a session to the leader is open (until then the old one keeps serving; a leader that
        cannot be reached is tried again at the next table change). Nothing is skipped or
        read twice: frames of the old subscription still on their way are dropped, and the
        new one starts at the offset after the last record buffered."""
        try:
            try:
                session: NodeSession | None = await self.broker.sessions.connected(leader)
            except BrokerError:
                session = None
            state = self.subscription
            route = self.broker.route(self.key)
            if state is not None:
                if (
                    session is None
                    or state.session is session
                    or route is None
                    or route.leader != leader
                    or not route.leader_alive
                ):
                    return  # unreachable, at the leader already, or the table moved on
                log.info(
                    "reader of %s/%s moves from %s to the leader, %s, at offset %d",
                    self.key[0],
                    self.key[1],
                    state.session.node,
                    leader,
                    self.end,
                )
                self.subscription = None
                state.session.readers.pop(state.sub, None)
                if not state.session.closed:
                    state.session.send(wire.encode_unsubscribe(state.sub))
                self.moves += 1
            # (no subscription: it ended while the session opened, and `ended` left the
            # subscribing again to this task)
            while not self.detached:
                try:
                    await self._subscribe([OffsetSpec.offset(self.end)])
                    return
                except BrokerError:
                    await self.broker.wait_change(RESUBSCRIBE_DELAY_S)
        finally:
            self._task = None

    def pushed(self, first: int, timestamp_ms: int, records: Sequence[bytes]) -> None:
        if not records:  # a skip mark: the node passed over chunks the filter rules out
            if first > self.end:
                self.buffer.append(_Buffered(first, timestamp_ms, []))
                self.end = first
                for callback in list(self.listeners):
                    callback()
            return
        if first < self.end:  # already have these (cannot happen on one subscription)
            records = records[self.end - first :]
            first = self.end
        if not records:
            return
        self.buffer.append(_Buffered(first, timestamp_ms, records))
        self._buffered_records += len(records)
        self.end = first + len(records)
        for callback in list(self.listeners):
            callback()

    def read(self, start: Offset, max_bytes: int) -> list[ChunkView]:
        """Hands each buffered record out once (the listener's cursor keeps what it reads),
        from `start` on, and grants the node credit for them."""
        buffer = self.buffer
        out: list[ChunkView] = []
        handed = size = 0
        while buffer and size < max_bytes:
            item = buffer.popleft()
            handed += len(item.records)
            if item.first + len(item.records) <= start and item.records:
                continue  # below the reader: let go
            out.append(ChunkView(Offset(item.first), item.timestamp_ms, item.records))
            size += subentry.stored_bytes(item.records)
        if handed:
            self._buffered_records -= handed
            state = self.subscription
            if state is not None:
                state.credit_owed += handed
                if state.credit_owed >= READ_CREDIT_RECORDS // 4:
                    state.session.send(wire.encode_credit(state.sub, state.credit_owed))
                    state.credit_owed = 0
        return out

    def end_offset(self) -> Offset:
        return Offset(self.end)

    def add_listener(self, callback: Callable[[], None]) -> None:
        self.listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self.listeners.remove(callback)

    def append(
        self, records: Sequence[bytes], producer: PublishingIds | None = None
    ) -> asyncio.Future[Offset]:
        raise AssertionError("a consumer link does not append")

    def detach(self) -> None:
        self.detached = True
        state, self.subscription = self.subscription, None
        if state is not None and not state.session.closed:
            state.session.readers.pop(state.sub, None)
            state.session.send(wire.encode_unsubscribe(state.sub))
        if self._task is not None:
            self._task.cancel()
        self._stop_counting()  # the link's detach (consumer_detach) lets go at the leader


class RemoteCoordinator:
    """spate.core.coordination.GroupCoordinator over the gateway wire (ADR 0015): GROUP
    requests to the node that leads the stream's partition 0 (the groups' home), as the
    routing table names it. A member is joined over one session and its later calls go over
    that one: when it closes, the node has let the member go, so a waiting sync fails (and
    later calls) with Unavailable and the member's link ends; a node that no longer leads
    answers NotLeader. A member joined through another coordinator is unknown here."""

    def __init__(self, broker: RemoteBroker, stream: StreamName) -> None:
        self.broker = broker
        self.stream = stream
        self.members: dict[tuple[str, MemberId], NodeSession] = {}
        """(group, member) -> the session it joined over."""

    async def _home_session(self) -> NodeSession:
        await self.broker.lookup(self.stream)  # NotFound for a stream that does not exist
        route = self.broker.route((self.stream, PartitionId(0)))
        if route is None or route.leader is None or not route.leader_alive:
            raise Unavailable(
                f"partition 0 of {self.stream!r}, the home of its consumer groups, has no "
                "leader; retry"
            )
        return await self.broker.sessions.connected(route.leader)

    def _session_of(self, group: str, member: MemberId) -> NodeSession:
        session = self.members.get((group, member))
        if session is None:
            raise NotFound(
                f"member {member} of consumer group {group!r} of {self.stream!r} did not join "
                "through this coordinator (or left): join again"
            )
        if session.closed:
            del self.members[(group, member)]
            raise Unavailable(
                f"the connection to node {session.node}, the home of consumer group {group!r} "
                f"of {self.stream!r}, broke: join again"
            )
        return session

    @staticmethod
    async def _call(
        session: NodeSession, call: wire.GroupCall, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        request = session.next_id()
        return await session.request(wire.encode_group(request, call), request, timeout_s)

    async def join(self, group: str, settings: GroupSettings) -> MemberId:
        session = await self._home_session()
        call = wire.GroupCall("join", self.stream, group, settings=settings)
        value = await self._call(session, call)
        member = wire.member_from_json(value)
        if session.closed:  # the node let it go with the session
            raise Unavailable(f"the connection to node {session.node} broke; retry")
        self.members[(group, member)] = session
        return member

    async def sync(
        self, group: str, member: MemberId, known: Assignment | None, timeout_s: float
    ) -> Assignment:
        """Waits at the node up to `timeout_s` (at most `limits.group_sync_wait_ms_max`:
        answered sooner, as it is then); the request waits that long plus REQUEST_TIMEOUT_S."""
        session = self._session_of(group, member)
        timeout_ms = max(0, min(int(timeout_s * 1000), limits.group_sync_wait_ms_max))
        call = wire.GroupCall(
            "sync", self.stream, group, member, known=known, timeout_ms=timeout_ms
        )
        try:
            value = await self._call(session, call, timeout_ms / 1000 + REQUEST_TIMEOUT_S)
        except (NotFound, NotLeader):
            self.members.pop((group, member), None)  # gone there: a new join is a new member
            raise
        return wire.assignment_from_json(value)

    async def released(
        self, group: str, member: MemberId, partitions: Iterable[PartitionId], generation: int
    ) -> None:
        session = self._session_of(group, member)
        call = wire.GroupCall(
            "released",
            self.stream,
            group,
            member,
            partitions=frozenset(partitions),
            generation=generation,
        )
        await self._call(session, call)

    async def describe(self, group: str) -> GroupView | None:
        """Over any session to the home's leader (no member needed)."""
        session = await self._home_session()
        value = await self._call(session, wire.GroupCall("describe", self.stream, group))
        return wire.group_view_from_json(value)

    async def leave(self, group: str, member: MemberId) -> None:
        session = self.members.pop((group, member), None)
        if session is None or session.closed:
            return  # never joined here, or the node let it go with the session
        with contextlib.suppress(BrokerError):  # unanswered: its session timeout removes it
            await self._call(session, wire.GroupCall("leave", self.stream, group, member))
