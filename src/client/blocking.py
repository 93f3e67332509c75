"""Blocking producer and consumer: the asyncio clients run on one private event loop in a
background thread (`spate-client`), shared by every blocking client of the process.

Same semantics as `spate.client.aio` (same cores, same engine, same fast path); the caller's
thread only encodes, queues and waits:
- `Producer.send_async` encodes the message, takes a slot of the window (a semaphore: blocks
  while `window` messages are unconfirmed, at most `timeout_s`), appends it to an inbox and
  wakes the loop once per batch (not once per message); the loop submits the whole inbox in
  one turn, so a burst leaves in one socket write. Confirms resolve `concurrent.futures`
  futures; their callbacks run on the loop thread and must not block.
- `Consumer.receive` takes events from a thread-safe queue the loop fills; credit is returned
  to the loop in batches as events are taken, so at most `credit` messages are in flight or
  buffered.
Blocking calls are bounded (`timeout_s`, `reconnect_timeout_s`) and must not be made from
the loop thread itself (a callback or handler): that would wait for itself.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import queue
import ssl
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

from spate.client.aio import AsyncConsumer, AsyncProducer, Body, Handler, encode
from spate.client.core import SubEntryBatch, credit_default, redirect_hops_max, window_default
from spate.client.errors import ConnectionLost, ConsumerClosed
from spate.client.event import NO_STANDING, Event, Standing

R = TypeVar("R")


class _LoopThread:
    """The event loop every blocking client of this process runs on."""

    _instance: ClassVar[_LoopThread | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get(cls) -> _LoopThread:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="spate-client", daemon=True
        )
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, R], timeout_s: float | None) -> R:
        """Run on the loop and wait, at most `timeout_s` (then cancel it: `TimeoutError`)."""
        assert threading.current_thread() is not self.thread, "a blocking call on the loop"
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise


def _connect_bound_s(urls: int, timeout_s: float, reconnect_timeout_s: float) -> float:
    """The longest connecting can take: every attempt bounded by `timeout_s`, every hop of
    every URL, plus the retry budget and its last pause."""
    return timeout_s * (redirect_hops_max + 1) * urls + max(reconnect_timeout_s, timeout_s) + 5


class Producer:
    """Publishes with confirms. `send` returns once the broker accepted the message (a
    majority fsynced it); `send_async` returns a future at once; `send_batch` pipelines a
    batch and waits for all of it.

    `url` is one node or gateway, or several tried in turn when (re)connecting. With
    `reconnect_timeout_s` > 0 a lost connection or a leader change reconnects and resends
    every unconfirmed message in order (at-least-once: see docs/client.md)."""

    def __init__(
        self,
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
    ) -> None:
        """`name` turns on deduplication; `amqps://` URLs connect over TLS with `tls` (the
        system's default context when None) — see AsyncProducer.connect."""
        urls = [url] if isinstance(url, str) else list(url)
        assert urls, "a producer needs at least one URL"
        self._named = name is not None
        self._thread = _LoopThread.get()
        self._timeout_s = timeout_s
        self._confirm_timeout_s = timeout_s + reconnect_timeout_s
        self._slots = threading.BoundedSemaphore(window)
        self._inbox: collections.deque[tuple[Any, concurrent.futures.Future[None]]] = (
            collections.deque()
        )
        self._inbox_lock = threading.Lock()
        self._wake_pending = False
        self._aio = self._thread.run(
            AsyncProducer.connect(
                urls,
                stream,
                partition=partition,
                window=window,
                timeout_s=timeout_s,
                reconnect_timeout_s=reconnect_timeout_s,
                user=user,
                password=password,
                name=name,
                tls=tls,
            ),
            _connect_bound_s(len(urls), timeout_s, reconnect_timeout_s),
        )

    def last_publishing_id(self) -> int | None:
        """A named producer's highest confirmed publishing id (004 `getLastPublishingId`)."""
        return self._aio.last_publishing_id()

    def send_async(
        self,
        body: Body,
        callback: Callable[[BaseException | None], None] | None = None,
        *,
        publishing_id: int | None = None,
    ) -> concurrent.futures.Future[None]:
        """Queue a message (waiting for room in the window, at most `timeout_s`); the future
        resolves on `accepted` or fails with `PublishRefused` / `ConnectionLost`.
        `callback(None | error)` runs on the client's loop thread. A named producer may give
        the publishing id; else it gets the next one."""
        data: Any = (body, publishing_id) if self._named else encode(body)
        self._take_slot(blocking=True)
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if callback is not None:
            future.add_done_callback(lambda f: callback(f.exception()))
        self._enqueue([(data, future)])
        return future

    def _take_slot(self, *, blocking: bool) -> bool:
        if not blocking:
            return self._slots.acquire(blocking=False)
        if not self._slots.acquire(timeout=self._timeout_s):
            raise TimeoutError(f"the producer's window stayed full for {self._timeout_s} s")
        return True

    def _enqueue(self, items: list[tuple[Any, concurrent.futures.Future[None]]]) -> None:
        """Hand messages to the loop; it is woken once however many are queued meanwhile."""
        if not items:
            return
        with self._inbox_lock:
            self._inbox.extend(items)
            wake = not self._wake_pending
            self._wake_pending = True
        if wake:
            self._thread.loop.call_soon_threadsafe(self._drain_inbox)

    def _drain_inbox(self) -> None:
        """On the loop: submit every queued message in this turn."""
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._wake_pending = False
        for data, future in items:
            settle = self._settler(future)
            try:
                if self._named:
                    self._aio._submit_body(data[0], settle, data[1])
                else:
                    self._aio._submit(data, settle)
            except (ConnectionLost, RuntimeError, ValueError) as error:  # refused now
                settle(error)

    def _settler(
        self, future: concurrent.futures.Future[None]
    ) -> Callable[[BaseException | None], None]:
        release = self._slots.release

        def settle(error: BaseException | None) -> None:
            release()
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        return settle

    def send(self, body: Body, publishing_id: int | None = None) -> None:
        """Send one message and wait for its confirm (raises its failure)."""
        self.send_async(body, publishing_id=publishing_id).result(self._confirm_timeout_s)

    def send_batch(
        self,
        bodies: Iterable[Body],
        window: int | None = None,
        *,
        sub_entry_size: int = 1,
        compression: str = "none",
    ) -> int:
        """Send pipelined and wait for every confirm; returns how many were confirmed, or
        raises the first failure once all are settled. The batch is handed to the loop in as
        few turns as the window allows (one, when it fits), so it leaves in few writes and
        the node appends it as few chunks. `window` (optional) caps how many of these are
        unconfirmed at once, below the producer's own window.

        `sub_entry_size` > 1 sends the messages `sub_entry_size` at a time as sub-entries
        (ADR 0017), compressed with `compression` (none, gzip, snappy, lz4, zstd): each is one
        transfer, one publishing id and one stored entry, and its messages keep an offset
        each; the count returned is still of messages."""
        if sub_entry_size > 1:
            encoded = [encode(b) for b in bodies]
            batches: list[Body] = [
                SubEntryBatch(encoded[i : i + sub_entry_size], compression)
                for i in range(0, len(encoded), sub_entry_size)
            ]
            self.send_batch(batches, window)
            return len(encoded)
        datas: list[Any] = [(b, None) if self._named else encode(b) for b in bodies]
        futures: list[concurrent.futures.Future[None]] = []
        pending: list[tuple[Any, concurrent.futures.Future[None]]] = []
        for data in datas:
            if window is not None and len(futures) >= window:
                self._enqueue(pending)
                pending = []
                futures[-window].exception(self._confirm_timeout_s)
            if not self._take_slot(blocking=False):
                self._enqueue(pending)  # the window is full: let those go, then wait
                pending = []
                self._take_slot(blocking=True)
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            futures.append(future)
            pending.append((data, future))
        self._enqueue(pending)
        errors = [future.exception(self._confirm_timeout_s) for future in futures]
        first = next((error for error in errors if error is not None), None)
        if first is not None:
            raise first
        return len(futures)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent before this call is settled (the outcome of each is
        on its future; flush itself does not raise failures)."""
        bound = self._confirm_timeout_s if timeout_s is None else timeout_s
        self._thread.run(self._aio.flush(), bound)

    confirm_all = flush

    @property
    def unconfirmed(self) -> int:
        return self._aio.unconfirmed + len(self._inbox)

    @property
    def reconnects(self) -> int:
        return self._aio.reconnects

    def close(self) -> None:
        """Close now; unconfirmed messages fail with `ConnectionLost` (flush first)."""
        self._thread.run(_after_inbox(self._aio.close()), self._timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


async def _after_inbox(coroutine: Coroutine[Any, Any, R]) -> R:
    """Run after the callbacks already queued on the loop (an inbox drain among them)."""
    await asyncio.sleep(0)
    return await coroutine


class Consumer:
    """Reads a stream from `start` (first, last, next, stored, an offset, -N, or a datetime):
    `receive()` returns the next `Event`; iterating yields events until the consumer stops.
    With `handler` the messages are pushed to `handler(offset, timestamp_ms, raw)` on the
    client's loop thread instead (see `wait`).

    With `reconnect_timeout_s` > 0 a lost connection is reopened (URLs in turn, redirects
    followed) and reading resumes at the offset after the last event handed out: no gap, no
    repeat (for a partition-bound consumer or a one-partition stream).

    With `name` the broker tracks the consumer's offset (`spate:consumer-name`, ADR 0012;
    the default start is then `stored`: right after it). `commit="auto"`: an event is
    finished when the next `receive()` is called (or the handler returns, or at `close()`,
    which waits until the offset is stored); `commit="manual"`: `commit()` stores the offset
    of the last event received and returns once the broker has replicated it.

    With `single_active=True` (and a name) the consumer joins the name's single active consumer
    group (ADR 0013): one member receives, the others wait attached; when the active one goes
    the next takes over after the stored offset. `active` says whether this one receives.
    On a super stream's address (`Consumer(url, "invoices", name="billing",
    single_active=True)`, ADR 0034) it is a member on every partition stream, receives from
    those where it is active (the broker spreads them over the consumers of that name), and
    each `Event.stream` names its partition stream (`active_streams`: where it is active, as
    of the last event that said so).

    With `group="billing"` it is its consumer group's receiver of one partition (ADR 0015;
    `partition=` names it, else the broker binds a free one): it starts after the group's
    committed offset and commits like a named consumer; `epoch=` takes the partition over from
    the group's current receiver (`epoch` and `partition` say what was granted).

    `filter_values=["emea"]` (+ `match_unfiltered=True`) and `sql="a.amount > 100"` choose
    which messages the broker sends it (ADR 0016, docs/amqp.md "Filtering")."""

    def __init__(
        self,
        url: str | Sequence[str],
        stream: str,
        *,
        start: Any = None,
        partition: int | None = None,
        credit: int = credit_default,
        handler: Handler | None = None,
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
        filter_values: Sequence[str] | None = None,
        match_unfiltered: bool = False,
        sql: str | None = None,
        sub_entries: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """As AsyncConsumer.connect; `sub_entries` receives stored sub-entries compressed, one
        delivery each, and unpacks them here (ADR 0017); `tls` is the context for `amqps://`
        URLs."""
        urls = [url] if isinstance(url, str) else list(url)
        assert urls, "a consumer needs at least one URL"
        self._thread = _LoopThread.get()
        self._timeout_s = timeout_s
        self._queue: queue.SimpleQueue[Event | BaseException] = queue.SimpleQueue()
        self._taken = 0
        self._report_every = max(1, credit // 4)
        self._standing = NO_STANDING
        """Where the consumer stood as of the last event `receive()` returned."""
        self._aio = self._thread.run(
            AsyncConsumer.connect(
                urls,
                stream,
                start=start,
                partition=partition,
                credit=credit,
                handler=handler,
                decode=decode,
                timeout_s=timeout_s,
                reconnect_timeout_s=reconnect_timeout_s,
                user=user,
                password=password,
                name=name,
                commit=commit,
                single_active=single_active,
                group=group,
                epoch=epoch,
                strategy=strategy,
                on_assignment=on_assignment,
                sink=None if handler is not None else self._queue.put,
                filter_values=filter_values,
                match_unfiltered=match_unfiltered,
                sql=sql,
                sub_entries=sub_entries,
                tls=tls,
            ),
            _connect_bound_s(len(urls), timeout_s, reconnect_timeout_s),
        )

    def receive(self, timeout: float | None = 30.0) -> Event:
        """The next event; `TimeoutError` after `timeout` seconds without one; the error that
        stopped the consumer, after every event received before it."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message within {timeout} s") from None
        if isinstance(item, BaseException):
            self._queue.put(item)  # nothing follows it: every later receive raises it too
            raise item
        self._taken += 1
        if item.standing.seq > self._standing.seq:
            self._standing = item.standing
        if self._taken >= self._report_every or self._queue.empty():
            self._report()
        return item

    def _report(self) -> None:
        """Tell the loop how many events the application took since the last report."""
        if self._taken:
            taken, self._taken = self._taken, 0
            self._thread.loop.call_soon_threadsafe(self._aio._taken, taken)

    def commit(self) -> int | None:
        """Manual commits: store the offset of the last event received and return it once the
        broker has replicated it (`AsyncConsumer.commit`)."""
        self._report()
        return self._thread.run(_after_inbox(self._aio.commit()), self._timeout_s)

    @property
    def stored_offset(self) -> int | None:
        """The broker's stored offset when the link attached, then the last one `commit()`
        confirmed (named consumers)."""
        return self._aio.stored_offset

    @property
    def active(self) -> bool:
        """Single active consumer: whether this member receives now (a standby turns True
        with the first event after it took over, once `receive()` returned that event)."""
        return self._shown().active

    @property
    def active_streams(self) -> frozenset[str]:
        """A super-stream consumer (ADR 0034): the partition streams this link is active on,
        as of the attach or the last event `receive()` returned that said they changed."""
        return self._shown().streams

    @property
    def assignment(self) -> frozenset[int]:
        """A group member: the partitions its link is associated with (as of the last event
        `receive()` returned that said so)."""
        return self._shown().assignment

    def _shown(self) -> Standing:
        """Where the consumer stands as of its attach or the last event `receive()` returned,
        whichever the broker said last (with a handler: the last event handed to it)."""
        attached, taken = self._aio._shown, self._standing
        return taken if taken.seq > attached.seq else attached

    @property
    def epoch(self) -> int | None:
        """A group consumer's epoch, as the broker granted it."""
        return self._aio.epoch

    @property
    def partition(self) -> int | None:
        """The partition the link is bound to (asked for, or bound by the broker)."""
        return self._aio.partition

    def __iter__(self) -> Iterator[Event]:
        while True:
            try:
                yield self.receive(timeout=None)
            except ConsumerClosed:
                return

    def wait(self, timeout_s: float | None = None) -> None:
        """With a handler: until the consumer is closed or stopped (raises why it stopped)."""
        self._thread.run(self._aio.wait(), timeout_s)

    @property
    def last_offset(self) -> int | None:
        return self._aio.last_offset

    @property
    def reconnects(self) -> int:
        return self._aio.reconnects

    def close(self) -> None:
        self._report()
        self._thread.run(_after_inbox(self._aio.close()), self._timeout_s + 1)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class GroupConsumer(Consumer):
    """A member of a consumer group (ADR 0015; 003 "Consumer Groups"): the group's
    coordinator gives it some of the stream's partitions (by the group's strategy:
    round-robin, range or sticky — `strategy` for a group not defined with `spate group
    create`) and moves them as members join and leave; it receives from whatever it holds,
    commits what the application finished like a named consumer (the group's committed
    offsets: the next holder of a partition starts after them), and rides rebalances without
    reattaching (`commit="manual"`: only `commit()` commits, and returns once every partition's
    offset is stored). `on_assignment(partitions)` is called (on the client's loop thread) when its
    partitions change, with the first event after the change; `assignment` says them.
    Leader changes end its link; it attaches again within `reconnect_timeout_s`."""

    def __init__(
        self,
        url: str | Sequence[str],
        stream: str,
        group: str,
        *,
        strategy: str | None = None,
        on_assignment: Callable[[frozenset[int]], None] | None = None,
        start: Any = None,
        credit: int = credit_default,
        commit: str = "auto",
        timeout_s: float = 30.0,
        reconnect_timeout_s: float = 30.0,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        super().__init__(
            url,
            stream,
            start=start,
            credit=credit,
            commit=commit,
            timeout_s=timeout_s,
            reconnect_timeout_s=reconnect_timeout_s,
            user=user,
            password=password,
            group=group,
            strategy=strategy,
            on_assignment=on_assignment,
        )
