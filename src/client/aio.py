"""asyncio-native producer and consumer on proton's engine API (no reactor, no threads).

    producer = await AsyncProducer.connect(["amqp://n1:5672", "amqp://n2:5672"], "orders")
    confirm = await producer.send(b"hello")       # waits for room in the window, not the confirm
    await confirm                                  # accepted: a majority has fsynced it
    producer.send_nowait(b"x", callback=on_done)   # or a callback per confirm
    await producer.flush()                         # every message sent so far is confirmed
    await producer.close()

    consumer = await AsyncConsumer.connect(url, "orders", start="first")
    async for event in consumer:                   # Event(offset, timestamp_ms, partition, message)
        ...

One proton `Connection`/`Transport`/`Collector` per client inside an `asyncio.Protocol`, as the
node's listener drives its side (research/proton.md §1b). Sends made in one loop turn leave in
one socket write. A producer keeps every unconfirmed message: when its connection drops, or a
message is refused as retryable (a leader change: `amqp:link:redirect`, `spate:retryable`), it
reconnects (URLs in turn, attach redirects followed) and resends them in order, if
`reconnect_timeout_s` allows; a confirm future resolves exactly once. At-least-once: a message
whose confirm was lost with the connection may be stored twice until producer deduplication
(issue 8). A consumer resumes after the last offset it returned.

The hot path is proton's C API through cffi, as in the node's listener (research/proton.md
§1): a send is `pn_delivery` + `pn_link_send` + `pn_link_advance` with a reused 8-byte tag, an
outcome is read with `pn_delivery_remote_state`, a consumed message is read with
`pn_link_recv` and its offset and timestamp found without decoding it (`Event.message` is
decoded on first use). proton's Python wrappers are used for the control path only (attach,
refusals). Bodies given as bytes are framed as one AMQP `data` section by hand; a
`proton.Message` is encoded by proton. Client CPU: benchmarks/RESULTS.md §8.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

from cproton_ffi import ffi, lib
from proton import (
    Collector,
    Connection,
    Delivery,
    Event,
    Link,
    Message,
    Receiver,
    Transport,
    symbol,
)
from proton.reactor import Filter
from spate.client.blocking import (
    DA_OFFSET,
    DA_SOURCE,
    DA_TIMESTAMP,
    P_PARTITION,
    REDIRECT,
    RETRYABLE,
    PublishRefused,
    reconnect_backoff_s,
    redirect_hops_max,
)
from spate.client.blocking import Event as StreamEvent
from spate.client.offsets import Start, offset_filter
from spate.core.ids import offset_from_symbol
from spate.gateway import sections

window_default = 10_000
"""Unconfirmed messages a producer keeps in flight."""
credit_default = 1_000
"""Link credit of a consumer, topped up at half."""
read_slice_bytes = 16 * 1024
"""Input pushed into proton per loop turn."""

_DATA_SHORT = b"\x00\x53\x75\xa0"  # described data section, vbin8
_DATA_LONG = b"\x00\x53\x75\xb0"  # described data section, vbin32
_U32 = struct.Struct(">I")
_TAG = struct.Struct("<Q")
_DA_OFFSET = str(DA_OFFSET)
_DA_TIMESTAMP = str(DA_TIMESTAMP)
_DA_SOURCE = str(DA_SOURCE)


def encode_data(body: bytes) -> bytes:
    """A bare message of one data section (002 §3.2.6), the way a proton client encodes
    `Message(body=b"...", inferred=True)`, without building a Message."""
    if len(body) < 256:
        return _DATA_SHORT + bytes((len(body),)) + body
    return _DATA_LONG + _U32.pack(len(body)) + body


class AttachRefused(Exception):
    """The broker refused the link; `condition` and `info` say why."""

    def __init__(self, condition: str | None, description: str | None, info: dict[Any, Any]):
        super().__init__(f"attach refused: {condition}: {description}")
        self.condition, self.description, self.info = condition, description, info


class _Engine(asyncio.Protocol):
    """One AMQP connection: proton's engine in client mode, driven by asyncio."""

    def __init__(self, hostname: str, user: str | None, password: str | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport = Transport()
        self.transport.sasl().allowed_mechs("PLAIN" if user is not None else "ANONYMOUS")
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
        self.on_delivery: Callable[[Any], None] | None = None
        """Delivery events on the fast path: called with the C delivery (cffi pointer)."""
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sock = transport  # type: ignore[assignment]
        self.connection.open()
        self.pump()

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            capacity = self.transport.capacity()
            if capacity <= 0:
                break
            self.transport.push(bytes(view[:capacity]))
            view = view[capacity:]
            self.pump()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if self._timer is not None:
            self._timer.cancel()

    def schedule_pump(self) -> None:
        if not self._scheduled and not self.lost.done():
            self._scheduled = True
            self.loop.call_soon(self.pump)

    def pump(self) -> None:
        self._scheduled = False
        collector = self.collector._impl
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        while True:
            ev = peek(collector)
            if ev == ffi.NULL:
                break
            on_delivery = self.on_delivery
            if on_delivery is not None and event_type(ev) == lib.PN_DELIVERY:
                on_delivery(lib.pn_event_delivery(ev))
            else:
                self.on_event(_wrap_event(ev))
            pop(collector)
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
        self.connection.close()
        self.pump()
        if self.sock is not None:
            self.sock.close()


def _wrap_event(ev: Any) -> Event:
    """proton's Event wrapper for a control event (the hot path never builds one)."""
    event: Event = cast(Any, Event).wrap(ev)
    return event


async def _attach(  # noqa: PLR0917
    urls: Sequence[str],
    timeout_s: float,
    reconnect_timeout_s: float,
    user: str | None,
    password: str | None,
    make_link: Callable[[Any], Link],
) -> tuple[_Engine, Link]:
    """Connect and attach, following redirects and retrying retryable refusals and lost
    connections until `reconnect_timeout_s` (at least one attempt per URL)."""
    deadline = time.monotonic() + max(reconnect_timeout_s, 0.0)
    loop = asyncio.get_running_loop()
    attempt = 0
    last_error: BaseException | None = None
    while True:
        url = urls[attempt % len(urls)]
        attempt += 1
        for _ in range(redirect_hops_max + 1):
            parts = urlsplit(url if "://" in url else f"amqp://{url}")
            host, port = parts.hostname or "127.0.0.1", parts.port or 5672
            try:
                engine, link = await asyncio.wait_for(
                    _open(loop, host, port, user, password, make_link), timeout_s
                )
                return engine, link
            except AttachRefused as refused:
                last_error = refused
                if refused.condition == REDIRECT:
                    info = refused.info
                    url = f"amqp://{info[symbol('network-host')]}:{int(info[symbol('port')])}"
                    continue
                if not refused.info.get(RETRYABLE):
                    raise
                break
            except (OSError, TimeoutError, ConnectionError) as error:
                last_error = error
                break
        if time.monotonic() >= deadline and attempt >= len(urls):
            assert last_error is not None
            raise last_error
        await asyncio.sleep(reconnect_backoff_s)


async def _open(  # noqa: PLR0917
    loop: asyncio.AbstractEventLoop,
    host: str,
    port: int,
    user: str | None,
    password: str | None,
    make_link: Callable[[Any], Link],
) -> tuple[_Engine, Link]:
    engine: _Engine | None = None

    def factory() -> _Engine:
        nonlocal engine
        engine = _Engine(host, user, password)
        return engine

    await loop.create_connection(factory, host, port)
    assert engine is not None
    session = engine.connection.session()
    session.open()
    link = make_link(session)
    link.open()
    opened: asyncio.Future[None] = loop.create_future()

    def on_event(event: Event) -> None:
        if opened.done():
            return
        if event.type == Event.LINK_REMOTE_CLOSE and event.link == link:
            condition = link.remote_condition
            raw: Any = condition.info if condition is not None else None
            opened.set_exception(
                AttachRefused(
                    condition.name if condition else None,
                    condition.description if condition else None,
                    dict(raw) if isinstance(raw, dict) else {},
                )
            )
        elif event.type == Event.LINK_REMOTE_OPEN and event.link == link:
            # A refusal is an attach with a null terminus followed by a detach: wait a turn.
            if (link.remote_target if link.is_sender else link.remote_source).address is None:
                return
            opened.set_result(None)
        elif event.type in (Event.TRANSPORT_CLOSED, Event.CONNECTION_REMOTE_CLOSE):
            opened.set_exception(ConnectionError("the connection closed while attaching"))

    engine.on_event = on_event
    engine.pump()
    lost = asyncio.ensure_future(asyncio.shield(engine.lost))
    try:
        done, _ = await asyncio.wait({opened, lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
    if opened not in done:
        raise ConnectionError(f"connection to {host}:{port} lost while attaching")
    try:
        opened.result()
    except BaseException:
        engine.close()
        raise
    return engine, link


class _LinkClient:
    """What a producer and a consumer share: one link on one engine, (re)attached with
    redirects followed, and the link's events routed to `_on_delivery` / `_on_lost`."""

    _engine: _Engine
    _link: Link
    _lp: Any
    _urls: list[str]
    _timeout_s: float
    _reconnect_timeout_s: float
    _user: str | None
    _password: str | None
    _tasks: set[asyncio.Future[Any]]
    reconnects: int

    def _make_link(self, session: Any) -> Link:
        raise NotImplementedError

    def _on_delivery(self, delivery: Any) -> None:
        raise NotImplementedError

    def _on_lost(self, _: object) -> None:
        raise NotImplementedError

    async def _attach_link(self) -> None:
        self._engine, self._link = await _attach(
            self._urls,
            self._timeout_s,
            self._reconnect_timeout_s,
            self._user,
            self._password,
            self._make_link,
        )
        self._engine.on_event = self._on_event
        self._engine.on_delivery = self._on_delivery
        self._engine.lost.add_done_callback(self._on_lost)
        self._lp = self._link._impl

    def _on_event(self, event: Event) -> None:
        if event.type == Event.LINK_REMOTE_CLOSE and event.link == self._link:
            self._on_lost(None)

    def _own(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class AsyncProducer(_LinkClient):
    """See the module docstring; create it with `await AsyncProducer.connect(...)`."""

    _engine: _Engine
    _link: Link

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
    ) -> AsyncProducer:
        self = cls(url, stream, partition, window, timeout_s, reconnect_timeout_s, user, password)
        await self._attach()
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
        self._urls = [url] if isinstance(url, str) else list(url)
        assert self._urls and window > 0
        self._stream, self._partition, self._window = stream, partition, window
        self._timeout_s, self._reconnect_timeout_s = timeout_s, reconnect_timeout_s
        self._user, self._password = user, password
        self._tags = itertools.count(1)
        self._unconfirmed: OrderedDict[int, tuple[bytes, asyncio.Future[None]]] = OrderedDict()
        self._in_flight: dict[Any, int] = {}  # C delivery -> message sequence
        self._tag_buffer = ffi.new("char[]", _TAG.size)
        self._tag_view = ffi.buffer(self._tag_buffer)
        self._tag = ffi.new("pn_delivery_tag_t *", (_TAG.size, self._tag_buffer))[0]
        self._has_room = asyncio.Event()
        self._closed = False
        self._reconnecting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self._broken: BaseException | None = None
        self.reconnects = 0

    def _make_link(self, session: Any) -> Link:
        link: Link = session.sender(f"spate-producer-{id(self):x}")
        link.target.address = self._stream
        if self._partition is not None:
            link.properties = {P_PARTITION: str(self._partition)}
        return link

    async def _attach(self) -> None:
        await self._attach_link()
        self._in_flight.clear()
        for sequence, (data, _) in self._unconfirmed.items():
            self._transfer(sequence, data)

    # sending

    async def send(self, body: bytes | Message) -> asyncio.Future[None]:
        """Queue a message once the window has room; the future resolves on `accepted`."""
        while len(self._unconfirmed) >= self._window:
            self._has_room.clear()
            await self._has_room.wait()
        return self.send_nowait(body)

    def send_nowait(
        self, body: bytes | Message, callback: Callable[[BaseException | None], None] | None = None
    ) -> asyncio.Future[None]:
        """Queue a message now, even past the window; `callback(None | error)` on its outcome."""
        if self._closed:
            raise RuntimeError("the producer is closed")
        if self._broken is not None:
            raise ConnectionError(f"the producer lost its connection for good: {self._broken}")
        data = encode_data(body) if isinstance(body, bytes | bytearray) else body.encode()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if callback is not None:
            future.add_done_callback(lambda f: callback(None if f.cancelled() else f.exception()))
        sequence = next(self._tags)
        self._unconfirmed[sequence] = (bytes(data), future)
        if self._reconnecting is None:
            self._transfer(sequence, bytes(data))
            self._engine.schedule_pump()
        return future

    def _transfer(self, sequence: int, data: bytes) -> None:
        """The fast path: proton's C calls through cffi, no Python wrapper per message."""
        _TAG.pack_into(self._tag_view, 0, sequence)
        delivery = lib.pn_delivery(self._lp, self._tag)
        lib.pn_link_send(self._lp, data, len(data))
        lib.pn_link_advance(self._lp)
        self._in_flight[delivery] = sequence

    async def flush(self) -> None:
        """Wait until every message sent so far is confirmed (raises the first refusal)."""
        futures = [future for _, future in self._unconfirmed.values()]
        if futures:
            await asyncio.gather(*futures)

    @property
    def unconfirmed(self) -> int:
        return len(self._unconfirmed)

    # outcomes

    def _on_delivery(self, delivery: Any) -> None:
        sequence = self._in_flight.get(delivery)
        state = lib.pn_delivery_remote_state(delivery)
        if sequence is None or not state:
            return
        del self._in_flight[delivery]
        if state == lib.PN_ACCEPTED:
            lib.pn_delivery_settle(delivery)
            if sequence in self._unconfirmed:
                self._confirmed(sequence, None)
            return
        wrapped = cast(Any, Delivery).wrap(delivery)  # the rare path: read the condition
        condition = wrapped.remote.condition
        lib.pn_delivery_settle(delivery)
        if sequence not in self._unconfirmed:
            return
        raw: Any = condition.info if condition is not None else None
        info = dict(raw) if isinstance(raw, dict) else {}
        retryable = condition is not None and (
            condition.name == REDIRECT or bool(info.get(RETRYABLE))
        )
        if retryable and self._reconnect_timeout_s > 0:
            self._start_reconnect()  # it stays unconfirmed and is resent
            return
        self._confirmed(
            sequence,
            PublishRefused(
                str(wrapped.remote_state),
                condition.name if condition else None,
                condition.description if condition else None,
            ),
        )

    def _confirmed(self, sequence: int, error: BaseException | None) -> None:
        _, future = self._unconfirmed.pop(sequence)
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
        if len(self._unconfirmed) < self._window:
            self._has_room.set()

    def _on_lost(self, _: object) -> None:
        if self._closed:
            return
        if self._reconnect_timeout_s <= 0:
            error = ConnectionError("the connection was lost before these were confirmed")
            self._broken = error
            for sequence in list(self._unconfirmed):
                self._confirmed(sequence, error)
            return
        self._start_reconnect()

    def _start_reconnect(self) -> None:
        if self._reconnecting is not None or self._closed:
            return
        self._reconnecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        try:
            old = self._engine
            old.on_event = lambda event: None
            with contextlib.suppress(Exception):
                old.close()
            await self._attach()
            self.reconnects += 1
            self._engine.pump()
        except BaseException as error:
            self._broken = error
            for sequence in list(self._unconfirmed):
                self._confirmed(sequence, error)
        finally:
            self._reconnecting = None

    async def close(self) -> None:
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        self._engine.close()


class AsyncConsumer(_LinkClient):
    """See the module docstring; create it with `await AsyncConsumer.connect(...)`."""

    _engine: _Engine
    _link: Link

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str],
        stream: str,
        *,
        start: Start = "next",
        partition: int | None = None,
        credit: int = credit_default,
        timeout_s: float = 30.0,
        reconnect_timeout_s: float = 0.0,
        user: str | None = None,
        password: str | None = None,
    ) -> AsyncConsumer:
        self = cls(url, stream, start, partition, credit, timeout_s, reconnect_timeout_s)
        self._user, self._password = user, password
        await self._attach()
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
        self._urls = [url] if isinstance(url, str) else list(url)
        self._stream, self._partition, self._credit = stream, partition, credit
        self._start: Start = start
        self._timeout_s, self._reconnect_timeout_s = timeout_s, reconnect_timeout_s
        self._user: str | None = None
        self._password: str | None = None
        self._events: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()
        self._buffer = ffi.new("char[]", 64 * 1024)
        self._last_offset: int | None = None
        self._closed = False
        self._tasks: set[asyncio.Future[Any]] = set()
        self.reconnects = 0

    def _make_link(self, session: Any) -> Link:
        link: Receiver = session.receiver(f"spate-consumer-{id(self):x}")
        link.source.address = self._stream
        start = self._start if self._last_offset is None else self._last_offset + 1
        Filter(offset_filter(start)).apply(link)
        if self._partition is not None:
            link.properties = {P_PARTITION: str(self._partition)}
        return link

    async def _attach(self) -> None:
        await self._attach_link()
        self._link.flow(self._credit)
        self._engine.pump()

    def _on_delivery(self, delivery: Any) -> None:
        """The fast path: proton's C calls through cffi, no Python wrapper per message."""
        lp = self._lp
        if lib.pn_delivery_link(delivery) != lp:
            return
        if not lib.pn_delivery_readable(delivery) or lib.pn_delivery_partial(delivery):
            return
        size = lib.pn_delivery_pending(delivery)
        if size > len(self._buffer):
            self._buffer = ffi.new("char[]", size)
        got = lib.pn_link_recv(lp, self._buffer, size)
        data = ffi.unpack(self._buffer, max(got, 0))
        lib.pn_link_advance(lp)
        lib.pn_delivery_update(delivery, lib.PN_ACCEPTED)
        lib.pn_delivery_settle(delivery)
        credit = lib.pn_link_credit(lp)
        if credit < self._credit // 2:
            lib.pn_link_flow(lp, self._credit - credit)
        # Offset and timestamp are read without decoding the message (proton.Message costs
        # ~45 µs): at their fixed places when the node wrote them, else by the scanner.
        fast = sections.read_spate_annotations(data)
        if fast is not None:
            offset, stamp, source = fast
        else:
            try:
                incoming = sections.scan_incoming(data)
            except sections.MalformedMessage:
                return  # not one of Spate's deliveries
            annotations = (
                sections.delivery_annotations_map(incoming.delivery_annotations)
                if incoming.delivery_annotations is not None
                else {}
            )
            parsed = offset_from_symbol(str(annotations.get(_DA_OFFSET, "")))
            if parsed is None:
                return
            offset, stamp = parsed, int(annotations.get(_DA_TIMESTAMP) or 0)
            found = annotations.get(_DA_SOURCE)
            source = None if found is None else str(found)
        if self._last_offset is not None and offset <= self._last_offset:
            return  # a repeat after resuming: already returned
        self._last_offset = offset
        self._events.put_nowait(StreamEvent(offset, stamp, source, raw=data))

    def _on_lost(self, _: object) -> None:
        if self._closed:
            return
        if self._reconnect_timeout_s <= 0:
            self._events.put_nowait(ConnectionError("the consumer's connection was lost"))
            return
        self._own(asyncio.ensure_future(self._reconnect()))

    async def _reconnect(self) -> None:
        try:
            self._engine.on_event = lambda event: None
            await self._attach()
            self.reconnects += 1
        except BaseException as error:
            self._events.put_nowait(error)

    async def receive(self, timeout: float | None = None) -> StreamEvent:
        item: StreamEvent | BaseException
        if not self._events.empty():
            item = self._events.get_nowait()  # the common case: no task, no timer
        else:
            item = await asyncio.wait_for(self._events.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self

    async def __anext__(self) -> StreamEvent:
        return await self.receive()

    async def close(self) -> None:
        self._closed = True
        self._engine.close()


__all__ = ["AsyncConsumer", "AsyncProducer", "AttachRefused", "encode_data"]
