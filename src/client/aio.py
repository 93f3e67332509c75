"""asyncio-native producer and consumer: the shells around `core`'s state machines, on the
engine adapter (`spate.client.engine`: proton's engine in an asyncio Protocol, no reactor,
no thread).

    producer = await AsyncProducer.connect(["amqp://n1:5672", "amqp://n2:5672"], "orders")
    confirm = await producer.send(b"hello")       # waits for room in the window, not the confirm
    await confirm                                  # accepted: a majority has fsynced it
    producer.send_nowait(b"x", callback=on_done)   # or a callback per confirm
    await producer.flush()                         # every message sent so far is settled
    await producer.close()

    consumer = await AsyncConsumer.connect(url, "orders", start="first")
    async for event in consumer:                   # Event(offset, timestamp_ms, partition, raw)
        ...
    # or push: handler(offset, timestamp_ms, raw_bytes) called for each message
    consumer = await AsyncConsumer.connect(url, "orders", start=-100, handler=handler)

The shells only act: they feed `core` what the engine reports and carry out its effects
(transfer, settle a confirm, reconnect, grant credit). Reconnecting (`reconnect_timeout_s` >
0) follows `core.Connector`; the producer resends every unconfirmed message in order, the
consumer resumes after the last offset it handed out.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from spate.client import engine as eng
from spate.client.core import (
    Confirmed,
    Connector,
    ConsumerCore,
    Dial,
    Failed,
    GiveUp,
    Outcome,
    ProducerCore,
    ProducerEffect,
    Reconnect,
    Start,
    SubEntryBatch,
    credit_default,
    encode_data,
    window_default,
)
from spate.client.errors import AttachRefused, ConnectionLost, ConsumerClosed, LinkStolen
from spate.client.event import NO_STANDING, Event, Standing
from spate.client.messages import MessageParts
from spate.core import bulk
from spate.core import limits as core_limits
from spate.core.ids import offset_from_symbol
from spate.gateway import sections
from spate.gateway import subentry as sub_entries

__all__ = [
    "AsyncConsumer",
    "AsyncProducer",
    "AttachRefused",
    "encode_data",
    "runtime_information",
]

P_PARTITION = "event-streams-partition"
P_GROUP = "event-streams-consumer-group"
P_STRATEGY = "spate:group-strategy"
P_EPOCH = "event-streams-epoch"
P_PRODUCER_NAME = "spate:producer-name"
P_LAST_PUBLISHING_ID = "spate:last-publishing-id"
P_CONSUMER_NAME = "spate:consumer-name"
P_STORED_OFFSET = "spate:stored-offset"
P_SINGLE_ACTIVE = "spate:single-active-consumer"
P_ACTIVE = "spate:active"
P_ACTIVE_PARTITIONS = "spate:active-partitions"
P_PARTITION_STREAMS = "spate:partition-streams"
P_SUB_ENTRIES = sub_entries.AS_IS_PROPERTY
P_BULK = bulk.PROPERTY
SUB_ENTRY_MARKER = sub_entries.MARKER_BYTES
A_PUBLISHING_ID = "x-opt-publishing-id"
_MA_PUBLISHING_ID = b"\x00\x53\x72\xc1\x1f\x02\xa3\x13x-opt-publishing-id\x80"
"""Message annotations {x-opt-publishing-id: ulong}, up to the 8 bytes of the id."""
_DA_OFFSET = "event-streams-offset"
_DA_TIMESTAMP = "event-streams-timestamp"
_DA_SOURCE = "event-streams-source-partition"
_DA_ASSOCIATED = "event-streams-associated-partitions-changed"
_DA_ACTIVE = "spate:active"
_DA_STREAM = "spate:stream"

Body = bytes | bytearray | eng.Message | SubEntryBatch | MessageParts
"""A body (framed as one data section), a `proton.Message` (encoded by proton), a sub-entry
batch or `MessageParts` (encoded without proton)."""
Settle = Callable[[BaseException | None], None]
Token = asyncio.Future[None] | Settle
BatchHandler = Callable[[list[int], list[int], list[bytes]], None]
"""`batch_handler(offsets, timestamps_ms, messages)`: the messages of one burst (what one read
from the socket completed), as columns; messages as for `Handler`."""
BulkHandler = Callable[[list[bulk.Frame]], None]
"""`bulk_handler(frames)`: the messages of one burst as frames (`spate.core.bulk.Frame`: offsets,
timestamps and message ends as typed arrays over the received bytes; messages as stored, or as
delivered when the broker did not grant bulk deliveries)."""
Handler = Callable[[int, int, Any], None]
"""`handler(offset, timestamp_ms, message)`: the message is the delivered bytes (the AMQP
encoding, delivery annotations included), or a decoded `proton.Message` with `decode=True`."""


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def encode(body: Body) -> bytes:
    if isinstance(body, bytes | bytearray):
        return encode_data(bytes(body))
    if isinstance(body, SubEntryBatch | MessageParts):
        return body.envelope()
    return eng.encode_message(body)


def tls_context(connector: Connector, tls: ssl.SSLContext | None) -> ssl.SSLContext | None:
    """The context for the `amqps://` dials: `tls` (e.g. with a private CA or a client
    certificate), else the system's default (public CAs, host names checked). Raises
    ValueError for `tls` with no `amqps://` URL: it would silently go unused."""
    if tls is not None and not connector.tls:
        raise ValueError("tls= applies to amqps:// URLs, and none was given: use amqps://HOST:PORT")
    if tls is None and connector.tls:
        return ssl.create_default_context()
    return tls


async def _connect(
    connector: Connector,
    spec: Callable[[], eng.LinkSpec],
    timeout_s: float,
    user: str | None,
    password: str | None,
    *,
    tls: ssl.SSLContext | None = None,
) -> tuple[eng.Engine, Any]:
    """Dial and attach as `connector` decides (URLs in turn, redirects, backoff, give up).
    `tls`: the context for `amqps://` dials (`tls_context`). A certificate the context does
    not trust is raised at once: retrying cannot change it."""
    dial = connector.next_dial()
    while True:
        link_spec = spec()
        step: Dial | GiveUp | Any
        context = tls if dial.tls else None
        if dial.tls and context is None:
            context = ssl.create_default_context()
        try:
            attached = await asyncio.wait_for(
                eng.attach(dial.host, dial.port, link_spec, user, password, tls=context),
                timeout_s,
            )
        except AttachRefused as refused:
            step = connector.on_refused(dial, refused, _now_ms())
        except ssl.SSLCertVerificationError:
            raise
        except OSError as error:  # refused, reset, timed out (TimeoutError is an OSError)
            step = connector.on_failed(error, _now_ms())
        else:
            connector.on_attached()
            return attached
        if isinstance(step, Dial):
            dial = step
            continue
        if isinstance(step, GiveUp):
            raise step.error
        await asyncio.sleep(step.delay_ms / 1000)
        dial = connector.next_dial()


def _frames_of(handler: BulkHandler) -> BatchHandler:
    """A batch handler that hands a burst of messages delivered one by one (bulk deliveries
    not granted) to a bulk handler as frames."""

    def batch(offsets: list[int], stamps: list[int], messages: list[bytes]) -> None:
        step = core_limits.bulk_delivery_messages_max
        handler([
            bulk.parse(bulk.encode_rows(offsets[i : i + step], stamps[i : i + step],
                                        messages[i : i + step]), check=False)
            for i in range(0, len(offsets), step)
        ])  # fmt: skip

    return batch


def _ignore(*_: object) -> None:
    return None


class AsyncProducer:
    """Publishes with confirms. Create it with `await AsyncProducer.connect(...)`."""

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str],
        stream: str,
        *,
        partition: int | None = None,
        window: int = window_default,
        timeout_s: float = 30.0,
        reconnect_timeout_s: float = 0.0,
        user: str | None = None,
        password: str | None = None,
        name: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> AsyncProducer:
        """`url`: one node or gateway, or several tried in turn. `window`: unconfirmed
        messages `send` allows. `timeout_s` bounds each attempt to connect and attach (and
        the retries of a refusal marked retryable); `reconnect_timeout_s` > 0 turns on
        reconnecting, for that long after a failure. `name` turns on deduplication
        (`spate:producer-name`): each message gets a publishing id (the next after
        `last_publishing_id()`, or the one `send` is given), and what a reconnect resends is
        stored once. `amqps://` URLs connect over TLS: `tls` is the context to use (a private
        CA, a client certificate), the system's default when None."""
        self = cls(url, stream, partition, window, timeout_s, reconnect_timeout_s, user, password)
        self._tls = tls_context(self._connector, tls)
        if name is not None:
            self._spec.properties[P_PRODUCER_NAME] = name
            self._name = name
        engine, link = await _connect(
            self._connector,
            lambda: self._spec,
            timeout_s,
            self._user,
            self._password,
            tls=self._tls,
        )
        self._use(engine, link)
        return self

    def __init__(  # noqa: PLR0917 (private: use connect)
        self,
        url: str | Sequence[str],
        stream: str,
        partition: int | None,
        window: int,
        timeout_s: float,
        reconnect_timeout_s: float,
        user: str | None,
        password: str | None,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        self._core: ProducerCore[Token] = ProducerCore(window, reconnect_timeout_s > 0)
        self._connector = Connector(urls, int(reconnect_timeout_s * 1000), int(timeout_s * 1000))
        properties: dict[str, str | bool | int] = {}
        if partition is not None:
            properties[P_PARTITION] = str(partition)
        self._spec = eng.LinkSpec(f"spate-producer-{uuid.uuid4().hex[:12]}", stream, properties)
        self._timeout_s = timeout_s
        self._user, self._password = user, password
        self._tls: ssl.SSLContext | None = None
        self._loop = asyncio.get_running_loop()
        self._room = asyncio.Event()
        self._room.set()
        self._reconnecting: asyncio.Task[None] | None = None
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._last_sequence = 0
        self._name: str | None = None
        self._next_id: int | None = None
        """Named producers: the id the next automatic message gets (known after attach: the
        one after `spate:last-publishing-id`)."""
        self._last_given: int | None = None
        """Named producers: the last id this producer gave a message (explicit ids, which may
        restart below the broker's last, e.g. to resend everything, must stay above it)."""
        self._confirmed_id: int | None = None
        self._ids: dict[int, int] = {}
        """Named producers: sequence -> publishing id, while unconfirmed."""
        self._engine: eng.Engine
        self._link: eng.SenderLink
        self.reconnects = 0
        """Times the producer reattached after losing its link."""

    def _use(self, engine: eng.Engine, link: Any) -> None:
        if self._name is not None:
            last = eng.link_property(link, P_LAST_PUBLISHING_ID)
            if last is not None:
                self._confirmed_id = max(int(last), self._confirmed_id or 0)
            if self._next_id is None:
                self._next_id = 0 if last is None else int(last) + 1
        self._engine = engine
        self._link = eng.SenderLink(engine, link)
        self._link.on_outcome = self._on_outcome
        self._link.on_lost = self._on_lost
        for sequence, data in self._core.on_attached():
            self._link.transfer(sequence, data)
        engine.schedule_pump()

    # sending

    async def send(self, body: Body, publishing_id: int | None = None) -> asyncio.Future[None]:
        """Queue a message once the window has room; returns its confirm future, which
        resolves when the broker accepted it (a majority fsynced it) or fails with
        `PublishRefused` (the condition) or `ConnectionLost`. A named producer may give the
        publishing id (above every id it gave before); else it gets the next one."""
        while not self._core.has_room():
            self._room.clear()
            await self._room.wait()
        return self.send_nowait(body, publishing_id=publishing_id)

    def send_nowait(
        self, body: Body, callback: Settle | None = None, *, publishing_id: int | None = None
    ) -> asyncio.Future[None]:
        """Queue a message now, even past the window; `callback(None | error)` runs once on
        its outcome (from the loop, as a future callback)."""
        future: asyncio.Future[None] = self._loop.create_future()
        if callback is not None:
            future.add_done_callback(lambda f: callback(None if f.cancelled() else f.exception()))
        self._submit_body(body, future, publishing_id)
        return future

    def send_encoded_nowait(self, data: bytes, settle: Settle) -> None:
        """The bulk path (`spate perf`): `data` already encoded as a producer transfers it
        (`encode(body)`, or bytes built the same way; one object may be sent many times),
        queued now even past the window; `settle(None | error)` runs once on its outcome. No
        future per message. Unnamed producers only: a named one numbers each message."""
        if self._name is not None:
            raise ValueError("send_encoded_nowait is for unnamed producers (no name=...)")
        self._submit(data, settle)

    def _submit_body(self, body: Body, token: Token, publishing_id: int | None) -> None:
        """Encode (with the publishing id of a named producer) and submit."""
        if self._name is None:
            if publishing_id is not None:
                raise ValueError("publishing ids need a named producer (name=...)")
            self._submit(encode(body), token)
            return
        assert self._next_id is not None, "named producers know their next id once attached"
        given = self._last_given
        if publishing_id is None:
            publishing_id = self._next_id if given is None else max(self._next_id, given + 1)
        elif given is not None and publishing_id <= given:
            raise ValueError(
                f"publishing id {publishing_id} is not above {given}, the last one given "
                "(ids increase strictly)"
            )
        if not 0 <= publishing_id < 2**64:
            raise ValueError(f"a publishing id is a ulong, not {publishing_id}")
        self._next_id = self._last_given = publishing_id
        self._next_id += 1
        self._submit(_with_publishing_id(body, publishing_id), token, publishing_id)

    def last_publishing_id(self) -> int | None:
        """The highest publishing id the broker confirmed (or reported on attach, 004's
        `getLastPublishingId`); None when this name never stored a message."""
        return self._confirmed_id

    def _submit(self, data: bytes, token: Token, publishing_id: int | None = None) -> None:
        """The hot path: one message into the core, and onto the link unless reconnecting."""
        sequence, transfer = self._core.submit(data, token)
        if publishing_id is not None:
            self._ids[sequence] = publishing_id
        self._last_sequence = sequence
        if transfer:
            self._link.transfer(sequence, data)
            self._engine.schedule_pump()

    def has_room(self) -> bool:
        return self._core.has_room()

    async def flush(self) -> None:
        """Wait until every message sent before this call is settled (confirmed or failed:
        the outcome of each is on its future or callback; flush itself does not raise)."""
        target = self._last_sequence
        oldest = self._core.oldest_unconfirmed()
        if oldest is None or oldest > target:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._flush_waiters.append((target, waiter))
        await waiter

    confirm_all = flush

    @property
    def unconfirmed(self) -> int:
        return self._core.unconfirmed

    # outcomes

    def _on_outcome(self, sequence: int, outcome: Outcome) -> None:
        self._apply(self._core.on_outcome(sequence, outcome))

    def _on_lost(self, error: BaseException) -> None:
        self._apply(self._core.on_lost(error))

    def _apply(self, effects: list[ProducerEffect[Token]]) -> None:
        for effect in effects:
            if isinstance(effect, Confirmed):
                if self._ids:
                    publishing_id = self._ids.pop(effect.sequence, None)
                    if publishing_id is not None and (
                        self._confirmed_id is None or publishing_id > self._confirmed_id
                    ):
                        self._confirmed_id = publishing_id
                _settle(effect.token, None)
            elif isinstance(effect, Failed):
                self._ids.pop(effect.sequence, None)
                _settle(effect.token, effect.error)
            else:
                assert isinstance(effect, Reconnect)
                if self._reconnecting is None:
                    self._reconnecting = self._loop.create_task(self._reconnect())
        if self._core.has_room():
            self._room.set()
        if self._flush_waiters:
            oldest = self._core.oldest_unconfirmed()
            waiting = []
            for target, waiter in self._flush_waiters:
                if oldest is None or oldest > target:
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    waiting.append((target, waiter))
            self._flush_waiters = waiting

    async def _reconnect(self) -> None:
        self._link.on_outcome, self._link.on_lost = _ignore, _ignore
        self._engine.close()
        try:
            engine, link = await _connect(
                self._connector,
                lambda: self._spec,
                self._timeout_s,
                self._user,
                self._password,
                tls=self._tls,
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:  # every way of failing to reconnect fails the messages
            self._reconnecting = None
            self._apply(self._core.on_gave_up(error))
            return
        self._reconnecting = None
        if self._core.state == "closed":
            engine.close()
            return
        self.reconnects += 1
        self._use(engine, link)

    async def close(self) -> None:
        """Close now: messages still unconfirmed fail with `ConnectionLost` (flush first to
        wait for them)."""
        if self._core.state == "closed":
            return
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        self._apply(self._core.close())
        self._link.on_outcome, self._link.on_lost = _ignore, _ignore
        self._engine.close()


def _with_publishing_id(body: Body, publishing_id: int) -> bytes:
    """The message with its publishing id in the message annotations."""
    if isinstance(body, bytes | bytearray):
        return _MA_PUBLISHING_ID + publishing_id.to_bytes(8, "big") + encode_data(bytes(body))
    if isinstance(body, SubEntryBatch | MessageParts):
        return body.envelope(publishing_id)
    eng.annotate(body, A_PUBLISHING_ID, publishing_id)
    return eng.encode_message(body)


async def runtime_information(
    url: str | Sequence[str],
    stream: str,
    *,
    timeout_s: float = 30.0,
    user: str | None = None,
    password: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> dict[str, Any]:
    """One `STREAM/$info` message (000 §6, docs/amqp.md "Runtime information"): the map with
    `partitions`, a list of {partition, earliest-offset, latest-offset, end-offset, ...} (offset
    symbols, as the broker sends them). `url`: nodes or gateways tried in turn (`tls` as for
    AsyncProducer.connect). Raises
    `AttachRefused` (an unknown stream: `amqp:not-found`), `ConnectionLost` or `TimeoutError`."""
    urls = [url] if isinstance(url, str) else list(url)
    connector = Connector(urls, 0, int(timeout_s * 1000))
    spec = eng.LinkSpec(f"spate-info-{uuid.uuid4().hex[:12]}", f"{stream}/$info", start="next")
    engine, link = await _connect(
        connector, lambda: spec, timeout_s, user, password, tls=tls_context(connector, tls)
    )
    try:
        receiver = eng.ReceiverLink(engine, link)
        got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def on_message(raw: bytes) -> None:
            if not got.done():
                got.set_result(raw)

        def on_lost(error: BaseException) -> None:
            if not got.done():
                got.set_exception(ConnectionLost(f"{stream}/$info: {error}"))

        receiver.on_message = on_message
        receiver.on_lost = on_lost
        receiver.flow(1)
        raw = await asyncio.wait_for(got, timeout_s)
    finally:
        engine.close()
    body = eng.decode_message(raw).body
    if not isinstance(body, dict):
        raise ConnectionLost(f"{stream}/$info answered a {type(body).__name__}, not a map")
    return {str(k): v for k, v in body.items()}


def _settle(token: Token, error: BaseException | None) -> None:
    if isinstance(token, asyncio.Future):
        if token.done():
            return
        if error is None:
            token.set_result(None)
        else:
            token.set_exception(error)
    else:
        token(error)


class AsyncConsumer:
    """Reads a stream. Create it with `await AsyncConsumer.connect(...)`; pull events with
    `receive` / `async for`, or pass `handler` to have each message pushed to it."""

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str],
        stream: str,
        *,
        start: Start | None = None,
        partition: int | None = None,
        credit: int = credit_default,
        handler: Handler | None = None,
        batch_handler: BatchHandler | None = None,
        bulk_handler: BulkHandler | None = None,
        decode: bool = False,
        timeout_s: float = 30.0,
        reconnect_timeout_s: float = 0.0,
        user: str | None = None,
        password: str | None = None,
        name: str | None = None,
        commit: str = "auto",
        single_active: bool = False,
        group: str | None = None,
        epoch: int | None = None,
        strategy: str | None = None,
        on_assignment: Callable[[frozenset[int]], None] | None = None,
        sink: Callable[[Event | BaseException], None] | None = None,
        filter_values: Sequence[str] | None = None,
        match_unfiltered: bool = False,
        sql: str | None = None,
        sub_entries: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> AsyncConsumer:
        """`start`: first, last, next, stored, an offset, -N or a datetime (default: `stored`
        for a named consumer, else `next`). `credit`: messages in flight to this consumer plus
        those buffered for it (a handler's are taken at once).
        `handler(offset, timestamp_ms, raw_bytes)` (a `proton.Message` with `decode=True`)
        is called for each message on the loop; an exception it raises stops the consumer
        and comes out of `wait()`. `batch_handler(offsets, timestamps_ms, messages)` (unnamed
        consumers, raw bytes) is called instead once per burst, with columns: one call, not
        one per message, for bulk readers. `bulk_handler(frames)` (unnamed consumers of one
        partition) asks for bulk deliveries (`spate:bulk-delivery`, ADR 0029): many messages
        per transfer, handed over as `spate.core.bulk.Frame`s once per burst, for columnar
        readers (the Spark connector); `credit` still counts messages (the link's credit is
        `credit` / `limits.bulk_delivery_messages_max` deliveries, at least 4). A broker that
        does not grant them sends messages one by one, and they reach `bulk_handler` as frames
        too (their messages then with delivery annotations). `partition` binds the link
        (`event-streams-partition`).

        `name` makes it a named consumer (`spate:consumer-name`, ADR 0012): the broker stores
        the offset of what it has finished with, and a consumer attaching with that name and
        start `stored` resumes after it. `commit="auto"`: an event is finished when the
        application asks for the next one (or its handler returns, or at `close`), and the
        broker stores in batches; `commit="manual"`: only `commit()` stores, and returns once
        the offset is replicated. `single_active` (with a name) joins the name's single active
        consumer group (`spate:single-active-consumer`, ADR 0013): one member receives, the
        others wait attached, and the next takes over after the stored offset when it goes;
        `active` says which this one is. On a super stream's address (`stream="invoices"`,
        ADR 0034) a name and `single_active` make it a member of the name's group on every
        partition stream: it receives from those where it is the active member (spread over
        the links of that name), each event saying its partition stream (`Event.stream`);
        `active_streams` names them and `assignment` their indexes (as of the last event that
        said they changed). `group` makes it its consumer group's receiver of one
        partition (`event-streams-consumer-group`, ADR 0015: the one `partition` names, else
        one the broker binds, then in `partition`); it commits the group's offset like a
        named consumer (default start `stored`), and `epoch` (`event-streams-epoch`) takes
        the partition over from the group's current receiver when it is above the partition's
        epoch (granted: `epoch`).
        `filter_values` (`rabbitmq:stream-filter`, with `match_unfiltered` also messages without
        a value) and `sql` (an `event-streams-sql` expression) choose which messages it is
        sent (ADR 0016, docs/amqp.md "Filtering").
        `sink` is for the blocking layer: events (and the final error) go there instead.
        `sub_entries` (unnamed, group-less consumers) asks for stored sub-entries as they are
        (`spate:sub-entries`, ADR 0017): each arrives compressed in one delivery and is unpacked
        here into its messages' events (offset = the first's + index; `raw` is the message
        without delivery annotations); `credit` then counts deliveries, each up to 10,000
        messages. `tls`: as for AsyncProducer.connect."""
        filters = eng.selection_filters(filter_values, match_unfiltered, sql)
        if commit not in ("auto", "manual"):
            raise ValueError(f"commit must be 'auto' or 'manual', not {commit!r}")
        if group is not None and (name is not None or single_active):
            raise ValueError(
                "a group consumer commits the group's offsets: no name or single_active"
            )
        if epoch is not None and group is None:
            raise ValueError("epoch is a consumer group's (group=...)")
        if (
            group is None
            and name is None
            and (start == "stored" or commit != "auto" or single_active)
        ):
            raise ValueError(
                "start='stored', commit='manual' and single_active need a consumer name (name=...)"
            )
        if sub_entries and (name is not None or group is not None):
            raise ValueError("sub_entries is for unnamed consumers (offsets tracked per message)")
        if bulk_handler is not None:
            if batch_handler is not None or sub_entries:
                raise ValueError("bulk_handler takes the place of batch_handler and sub_entries")
            if partition is None:
                raise ValueError("a bulk_handler reads one partition: give partition=...")
            batch_handler = _frames_of(bulk_handler)
        if batch_handler is not None and (
            handler is not None
            or decode
            or sink is not None
            or name is not None
            or group is not None
        ):
            raise ValueError(
                "batch_handler is for unnamed consumers of raw messages: no handler, decode, "
                "sink, name or group"
            )
        if start is None:
            start = "next" if name is None and group is None else "stored"
        self = cls(url, stream, start, partition, credit, timeout_s, reconnect_timeout_s)
        self._user, self._password = user, password
        self._tls = tls_context(self._connector, tls)
        self._handler, self._decode, self._sink = handler, decode, sink
        self._batch_handler = batch_handler
        self._bulk_handler = bulk_handler
        self._credit = credit
        if bulk_handler is not None:
            self._properties[P_BULK] = True
        self._filters = filters
        if sub_entries:
            self._properties[P_SUB_ENTRIES] = True
            self._sub_entries = True
        if name is not None:
            self._properties[P_CONSUMER_NAME] = name
            self.name, self._manual = name, commit == "manual"
        if single_active:
            self._properties[P_SINGLE_ACTIVE] = True
        if group is not None:  # tracked like a named consumer: the group's offsets
            self._properties[P_GROUP] = group
            self.name, self.group, self._manual = group, group, commit == "manual"
            if epoch is not None:
                self._properties[P_EPOCH] = epoch
            if partition is None:  # a member of the group's coordinator (000 §4.5.1)
                self._core.group = True
                self._on_assignment = on_assignment
                if strategy is not None:
                    self._properties[P_STRATEGY] = strategy
        engine, link = await _connect(
            self._connector, self._spec, timeout_s, self._user, self._password, tls=self._tls
        )
        self._use(engine, link)
        return self

    def __init__(  # noqa: PLR0917 (private: use connect)
        self,
        url: str | Sequence[str],
        stream: str,
        start: Start,
        partition: int | None,
        credit: int,
        timeout_s: float,
        reconnect_timeout_s: float,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        self._core = ConsumerCore(start, credit)
        self._connector = Connector(urls, int(reconnect_timeout_s * 1000), int(timeout_s * 1000))
        self._stream = stream
        self._properties: dict[str, str | bool | int] = {}
        self._filters: dict[Any, Any] = {}
        if partition is not None:
            self._properties[P_PARTITION] = str(partition)
        self._name = f"spate-consumer-{uuid.uuid4().hex[:12]}"
        self._timeout_s, self._reconnecting_allowed = timeout_s, reconnect_timeout_s > 0
        self._user: str | None = None
        self._password: str | None = None
        self._tls: ssl.SSLContext | None = None
        self._handler: Handler | None = None
        self._batch_handler: BatchHandler | None = None
        self._bulk_handler: BulkHandler | None = None
        self._credit = credit
        self.bulk = False
        """Bulk deliveries asked for and granted (the broker's attach reply)."""
        self._batch: tuple[list[int], list[int], list[bytes]] | None = None
        self._runs = sections.DeliveryRuns()
        """While `_on_batch` runs: the columns `_hand_out` appends to."""
        self._decode = False
        self._sub_entries = False
        self._sink: Callable[[Event | BaseException], None] | None = None
        self._loop = asyncio.get_running_loop()
        self._events: collections.deque[Event | BaseException] = collections.deque()
        self._ready = asyncio.Event()
        self._done: asyncio.Future[None] = self._loop.create_future()
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False
        self._engine: eng.Engine
        self._link: eng.ReceiverLink
        self.reconnects = 0
        """Times the consumer reattached after losing its link."""
        self.name: str | None = None
        """The consumer name (`spate:consumer-name`), or the group (with `group`); None for an
        anonymous consumer."""
        self.group: str | None = None
        """The consumer group (`event-streams-consumer-group`), if any."""
        self.epoch: int | None = None
        """A group consumer's epoch as granted (`event-streams-epoch` on the attach reply)."""
        self._on_assignment: Callable[[frozenset[int]], None] | None = None
        self._standing = self._shown = NO_STANDING
        """Where the broker last said this consumer stands (attach reply or delivery), and
        where it stood as of the attach or the last event the application took — what
        `active`, `active_streams` and `assignment` show."""
        self.partition: int | None = partition
        """The bound partition (`event-streams-partition` on the attach reply, when bound)."""
        self._manual = False
        self._taken_unfinished = 0
        """Named consumers: events the application took and has not finished with."""
        self._to_commit = 0
        """Manual commits: finished deliveries on the current link not yet accepted."""
        self._accepted = 0
        self._confirmed = 0
        self._commits: collections.deque[tuple[int, int, asyncio.Future[int]]] = collections.deque()
        """Manual commits waiting for the broker: (deliveries accepted through, offset, future)."""
        self.stored_offset: int | None = None
        """Named consumers: the broker's stored offset when the link attached
        (`spate:stored-offset`), then the last offset a `commit()` confirmed."""
        self.super_stream = False
        """Attached to a super stream's address (ADR 0034): each event says its partition
        stream (`Event.stream`)."""
        self._partition_streams: list[str] = []
        """A super-stream consumer: its partition streams by index (`spate:partition-streams`)."""

    @property
    def active(self) -> bool:
        """Single active consumer: whether this member receives (`spate:active` on the attach
        reply; a standby turns True with the first event after it took over, once the
        application has taken that event). On a super stream: whether it receives from at
        least one partition stream."""
        return self._shown.active

    @property
    def active_streams(self) -> frozenset[str]:
        """A super-stream consumer: the partition streams it is active on, as the broker said
        — at attach (`spate:active-partitions`), then with the first event after they changed
        (`event-streams-associated-partitions-changed`: a partition taken over or handed
        over), once the application has taken that event."""
        return self._shown.streams

    @property
    def assignment(self) -> frozenset[int]:
        """A group member: the partitions the coordinator gave its link (from the
        `event-streams-associated-partitions-changed` annotation, 000 §4.6.5), as of the
        last event the application took that said so."""
        return self._shown.assignment

    def _stand(self, active: bool, streams: frozenset[str], assignment: frozenset[int]) -> None:
        """The broker said where this consumer stands now (attach reply or delivery)."""
        self._standing = Standing(self._standing.seq + 1, active, streams, assignment)

    def _show(self, standing: Standing) -> None:
        """The application reached `standing` (an attach, or an event it took)."""
        if standing.seq > self._shown.seq:
            self._shown = standing

    def _spec(self) -> eng.LinkSpec:
        return eng.LinkSpec(
            self._name,
            self._stream,
            self._properties,
            start=self._core.resume_start(),
            filters=self._filters,
            confirm_commits=self._manual,
            presettled=self.name is None,
        )

    @property
    def last_offset(self) -> int | None:
        """The offset of the last message handed to the application."""
        return self._core.last_offset

    def _use(self, engine: eng.Engine, link: Any) -> None:
        self._engine = engine
        self._link = eng.ReceiverLink(engine, link, hold=self.name is not None)
        if self.name is not None:
            stored = eng.link_property(link, P_STORED_OFFSET)
            if stored is not None:
                self.stored_offset = max(int(stored), self.stored_offset or -1)
            self._core.on_relinked()
            active = eng.link_property(link, P_ACTIVE)
            streams, assignment = self._standing.streams, self._standing.assignment
            said = eng.link_property(link, P_ACTIVE_PARTITIONS)
            if said is not None:  # a super stream's: every reattach starts after the
                self.super_stream = self._core.group = True  # groups' stored offsets
                streams = frozenset(str(s) for s in said)
                every = eng.link_property(link, P_PARTITION_STREAMS) or []
                self._partition_streams = [str(s) for s in every]
                assignment = frozenset(
                    i for i, s in enumerate(self._partition_streams) if s in streams
                )
            self._stand(True if active is None else bool(active), streams, assignment)
            self._show(self._standing)
            granted = eng.link_property(link, P_EPOCH)
            self.epoch = None if granted is None else int(granted)
        bound = eng.link_property(link, P_PARTITION)
        if bound is not None:
            self.partition = int(bound)
            self._to_commit = 0
            self._accepted = self._confirmed = 0
        self._link.on_message = self._on_message
        self.bulk = self._bulk_handler is not None and eng.link_property(link, P_BULK) is True
        if self.bulk:
            self._core.credit_window = max(
                4, -(-self._credit // core_limits.bulk_delivery_messages_max)
            )
            self._link.on_messages = self._on_bulk
        elif self._batch_handler is not None:
            self._core.credit_window = self._credit
            self._link.on_messages = self._on_batch
        self._link.on_drained = self._grant
        self._link.on_lost = self._on_lost
        self._link.on_committed = self._on_committed
        self._grant()

    def _grant(self) -> None:
        self._link.flow(self._core.credit_to_grant(self._link.credit))

    def _on_message(self, raw: bytes) -> int | None:
        """The hot path: offset and timestamp read at the fixed places the node writes them
        (`sections.read_spate_annotations`), the message left undecoded. Returns the offset
        handed to the application (None: dropped)."""
        if self._closed:
            return None
        fast = sections.read_spate_annotations(raw)
        stream = None
        if fast is not None:
            offset, stamp, source = fast
        else:
            parsed = _scan(raw)
            if parsed is None:
                return None  # not one of Spate's deliveries: no offset to resume from
            offset, stamp, source, active, associated, stream = parsed
            if active or associated is not None:
                self._stood(active, associated, stream)
        link = self._link
        link.partition = source
        if self._sub_entries and SUB_ENTRY_MARKER in raw:
            return self._on_sub_entry(raw, offset, stamp, source)
        if not self._core.on_message(offset, source):
            link.repeat = offset  # after resuming: already handed out (held, not accepted)
            return None
        return self._hand_out(offset, stamp, source, raw, stream)

    def _stood(self, active: bool, associated: list[str] | None, stream: str | None) -> None:
        """A delivery said the consumer's standing changed: `spate:active` (it took over, on
        `stream` for a super stream's) and/or the partitions it is associated with now."""
        now = self._standing
        is_active, streams, assignment = now.active, now.streams, now.assignment
        if active:
            is_active = True
            if stream is not None:
                streams = streams | {stream}
        if associated is not None:
            assignment = frozenset(int(p) for p in associated)
            if self.super_stream:  # where it is active now (ADR 0034)
                every = self._partition_streams
                streams = frozenset(every[p] for p in assignment if p < len(every))
                is_active = bool(assignment)
        self._stand(is_active, streams, assignment)
        if associated is not None and self._on_assignment is not None:
            self._on_assignment(assignment)

    def _on_batch(self, raws: list[bytes]) -> None:
        """A burst for the batch handler: runs of deliveries in the link's usual layout read
        in bulk (`sections.DeliveryRuns`, `ConsumerCore.on_messages`), any other delivery
        through `_on_message`; then one handler call."""
        if self._closed:
            return
        assert self._batch_handler is not None
        offsets: list[int] = []
        stamps: list[int] = []
        messages: list[bytes] = []
        self._batch = (offsets, stamps, messages)
        runs, core, i, n = self._runs, self._core, 0, len(raws)
        try:
            while i < n:
                run_offsets: list[int] = []
                run_stamps: list[int] = []
                j = i if self._sub_entries else runs.read_run(raws, i, run_offsets, run_stamps)
                if j > i:
                    keep = core.on_messages(run_offsets, runs.source)
                    offsets.extend(run_offsets[keep:] if keep else run_offsets)
                    stamps.extend(run_stamps[keep:] if keep else run_stamps)
                    messages.extend(raws[i + keep : j])
                if j < n:  # another layout: learn it, and take this one the usual way
                    runs.learn(raws[j])
                    self._on_message(raws[j])
                    if self._closed:
                        return
                    j += 1
                i = j
        finally:
            self._batch = None
        if not offsets:
            return
        try:
            self._batch_handler(offsets, stamps, messages)
        except Exception as error:  # the application's: stop and report it from wait()
            self._finish(error)
            return
        self._core.on_taken(len(offsets))

    def _on_bulk(self, raws: list[bytes]) -> None:
        """A burst of bulk deliveries (ADR 0029): each frame viewed in place, rows at or below
        the last handed out dropped (repeats after resuming), then one handler call."""
        if self._closed:
            return
        assert self._bulk_handler is not None
        frames: list[bulk.Frame] = []
        core = self._core
        for raw in raws:
            try:
                inner = bulk.unwrap(raw)
                if inner is None:
                    raise bulk.FrameError("a delivery without a bulk frame on a bulk link")
                frame = bulk.parse(inner, check=False)
            except bulk.FrameError as error:
                self._finish(ConnectionLost(f"a bulk delivery is damaged: {error}"))
                return
            fast = sections.read_spate_annotations(raw)
            source = None if fast is None else fast[2]
            keep = core.on_frame(frame.offsets, source)
            if keep < frame.stop:
                frames.append(frame.rows(keep, frame.stop) if keep else frame)
        if not frames:
            return
        try:
            self._bulk_handler(frames)
        except Exception as error:  # the application's: stop and report it from wait()
            self._finish(error)

    def _on_sub_entry(self, raw: bytes, first: int, stamp: int, source: str | None) -> int | None:
        """A stored sub-entry delivered as is: its messages, each handed out with its offset
        (those at or below the last handed out skipped, as repeats are)."""
        try:
            envelope = sub_entries.parse(sections.scan_incoming(raw).stored)
        except (sections.MalformedMessage, sub_entries.Refused) as error:
            self._finish(ConnectionLost(f"a sub-entry at offset {first} is damaged: {error}"))
            return None
        if envelope is None:  # the marker's bytes in a plain message
            if not self._core.on_message(first, source):
                self._link.repeat = first
                return None
            return self._hand_out(first, stamp, source, raw)
        handed = None
        for i, message in enumerate(envelope.messages):
            if self._closed:
                break
            if self._core.on_message(first + i, source):
                handed = self._hand_out(first + i, stamp, source, message)
        if handed is None and not self._closed:
            self._link.repeat = first + len(envelope.messages) - 1  # every message a repeat
        return handed

    def _hand_out(
        self, offset: int, stamp: int, source: str | None, raw: bytes, stream: str | None = None
    ) -> int | None:
        if self._batch is not None:  # taken when the batch handler returns
            self._show(self._standing)
            self._batch[0].append(offset)
            self._batch[1].append(stamp)
            self._batch[2].append(raw)
            return offset
        if self._handler is not None:
            self._show(self._standing)
            try:
                self._handler(offset, stamp, eng.decode_message(raw) if self._decode else raw)
            except Exception as error:  # the application's: stop and report it from wait()
                self._finish(error)
                return None
            self._core.on_taken()
            if self.name is not None:
                self._taken_unfinished += 1
                self._loop.call_soon(self._finish_taken, 0)  # after the link holds it
        elif self._sink is not None:
            self._sink(Event(offset, stamp, source, raw, stream, standing=self._standing))
        else:
            self._events.append(Event(offset, stamp, source, raw, stream, standing=self._standing))
            self._ready.set()
        return offset

    def _taken(self, count: int) -> None:
        """The application took `count` buffered events: room for more credit (and, for a
        named consumer with automatic commits, the events before the last one are finished)."""
        self._core.on_taken(count)
        if self.name is not None:
            self._taken_unfinished += count
            if not self._manual:
                self._finish_taken(1)
        if not self._closed and self._reconnecting is None:
            self._grant()

    def _finish_taken(self, keep: int) -> None:
        """The application finished with every event it took but the last `keep`: automatic
        commits accept them now; manual ones at the next `commit()`."""
        count = max(0, self._taken_unfinished - keep)
        if not count or self._closed:
            return
        self._taken_unfinished -= count
        current = self._core.on_finished(count)
        if self._manual:
            self._to_commit += current
        elif current:
            self._link.accept(current, settle=True)

    async def commit(self) -> int | None:
        """Manual commits: store the offset of the last event taken and wait until the broker
        has replicated it; returns that offset (the last confirmed one when nothing new was
        taken). Raises `ConnectionLost` when the link went away first (the offset may or may
        not be stored; what is not is delivered again to the next consumer with this name),
        also when everything taken since the last commit came over a link that was lost and
        replaced (nothing can store it: the stored offset stays where it was)."""
        if not self._manual:
            raise RuntimeError("commit() is for commit='manual' consumers; 'auto' stores by itself")
        if self._closed:
            raise ConsumerClosed("the consumer is closed")
        self._finish_taken(0)
        count, self._to_commit = self._to_commit, 0
        lost = self._core.on_commit(count)
        if lost and not self._commits:
            raise ConnectionLost(
                f"{lost} event(s) taken on a link that was lost were not committed (the "
                "consumer has reattached since and took nothing on the new link to commit "
                f"them with); the last confirmed offset is {self.stored_offset}, and what "
                "comes after it is delivered again to the next consumer with this name"
            )
        if count:
            offset = self._link.accept(count, settle=False)
            assert offset is not None
            self._accepted += count
            future: asyncio.Future[int] = self._loop.create_future()
            self._commits.append((self._accepted, offset, future))
        elif self._commits:
            future = self._commits[-1][2]
        else:
            return self.stored_offset
        return await asyncio.wait_for(asyncio.shield(future), self._timeout_s)

    def _on_committed(self, count: int) -> None:
        self._confirmed += count
        commits = self._commits
        while commits and commits[0][0] <= self._confirmed:
            _, offset, future = commits.popleft()
            self.stored_offset = offset
            if not future.done():
                future.set_result(offset)

    def _fail_commits(self, error: BaseException) -> None:
        while self._commits:
            future = self._commits.popleft()[2]
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a commit nobody awaits is not an error

    def _on_lost(self, error: BaseException) -> None:
        if self._closed or self._reconnecting is not None:
            return
        self._fail_commits(
            ConnectionLost(f"the link was lost before the broker confirmed the commit: {error}")
        )
        if isinstance(error, LinkStolen):  # re-attaching with our epoch would be refused
            self._finish(error)
            return
        if not self._reconnecting_allowed:
            self._finish(ConnectionLost(f"the consumer's connection was lost: {error}"))
            return
        self._reconnecting = self._loop.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        self._link.on_message, self._link.on_lost, self._link.on_drained = _ignore, _ignore, _ignore
        self._engine.close()
        try:
            engine, link = await _connect(
                self._connector,
                self._spec,
                self._timeout_s,
                self._user,
                self._password,
                tls=self._tls,
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:  # every way of failing to reconnect ends the consumer
            self._reconnecting = None
            self._finish(error)
            return
        self._reconnecting = None
        if self._closed:
            engine.close()
            return
        self.reconnects += 1
        self._use(engine, link)

    def _finish(self, error: BaseException | None) -> None:
        """Stop for good: `error` reaches the application after the events already buffered."""
        if self._closed:
            return
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        self._link.on_message, self._link.on_lost, self._link.on_drained = _ignore, _ignore, _ignore
        self._engine.close()
        self._fail_commits(ConsumerClosed("the consumer closed before the commit was confirmed"))
        final = error if error is not None else ConsumerClosed("the consumer is closed")
        if self._sink is not None:
            self._sink(final)
        else:
            self._events.append(final)
            self._ready.set()
        if not self._done.done():
            if error is None:
                self._done.set_result(None)
            else:
                self._done.set_exception(error)
                self._done.exception()  # retrieved here too: wait() is optional

    async def receive(self, timeout: float | None = None) -> Event:
        """The next event; `TimeoutError` after `timeout` seconds without one; the error that
        stopped the consumer (after every event received before it)."""
        while not self._events:
            self._ready.clear()
            await asyncio.wait_for(self._ready.wait(), timeout)
        item = self._events[0]
        if isinstance(item, BaseException):
            raise item  # stays queued: every later receive raises it too
        self._events.popleft()
        self._show(item.standing)
        self._taken(1)
        return item

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        return await self.receive()

    async def wait(self) -> None:
        """Until the consumer is closed; raises what stopped it (a handler's exception, a
        connection lost for good)."""
        await asyncio.shield(self._done)

    async def close(self) -> None:
        """Stop. A named consumer with automatic commits finishes what the application took,
        detaches and waits (up to `timeout_s`) for the broker's answer, which comes once the
        offset is stored; a manual one stores nothing more (uncommitted events are delivered
        again to the next consumer with this name)."""
        if self.name is not None and not self._closed and self._reconnecting is None:
            if not self._manual:
                self._finish_taken(0)
            self._link.on_lost = _ignore  # the detach below is not a loss to reconnect from
            self._link.detach()
            lost = asyncio.ensure_future(asyncio.shield(self._engine.lost))
            try:
                await asyncio.wait(
                    {self._link.detached, lost},
                    timeout=self._timeout_s,
                    return_when="FIRST_COMPLETED",
                )
            finally:
                lost.cancel()
        self._finish(None)


def _scan(
    raw: bytes,
) -> tuple[int, int, str | None, bool, list[str] | None, str | None] | None:
    """Offset, timestamp, source partition, whether it says `spate:active` (the first
    delivery after a single-active-consumer standby took over), the partitions of
    `event-streams-associated-partitions-changed` (a group member's, 000 §4.6.5) and the
    partition stream of `spate:stream` (a super-stream consumer's, ADR 0034), by the section
    scanner."""
    try:
        incoming = sections.scan_incoming(raw)
    except sections.MalformedMessage:
        return None
    if incoming.delivery_annotations is None:
        return None
    annotations = sections.delivery_annotations_map(incoming.delivery_annotations)
    offset = offset_from_symbol(str(annotations.get(_DA_OFFSET, "")))
    if offset is None:
        return None
    source = annotations.get(_DA_SOURCE)
    stamp = int(annotations.get(_DA_TIMESTAMP) or 0)
    associated = annotations.get(_DA_ASSOCIATED)
    stream = annotations.get(_DA_STREAM)
    return (
        offset,
        stamp,
        None if source is None else str(source),
        bool(annotations.get(_DA_ACTIVE)),
        None if associated is None else [str(p) for p in associated],
        None if stream is None else str(stream),
    )
