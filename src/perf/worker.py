"""A `spate perf` worker process: producers only, or consumers only, on one asyncio loop.

The conductor (`spate.perf.run`) starts it with a `WorkerPlan` and a pipe, and talks to it
with small tuples:

    conductor -> worker        worker -> conductor
    ("start",)                   ("ready", None)      every client attached
    ("report",)                  ("failed", text)     could not attach, or a client failed
    ("expect", {consumer: n})    ("report", Report)   the answer to ("report",)
    ("stop",)                    ("done", Report)     producers: all published and settled;
                                                      consumers: all expected messages read
                                 ("final", Report)    after ("stop",), then it exits

Counters in a Report are cumulative; `latency` holds the buckets (`latency.fold`) of the
latencies measured since the previous report. `cpu_s` is this process's CPU since "start".

The hot paths are `_Producer.publish` (one encoded message object per batch, sent `batch`
times through `AsyncProducer.send_encoded_nowait`, settled by a bound method: no future per
message) and `_Consumer.on_message` (the publish time read from the body's first 8 bytes at
a fixed distance from the end of the delivered bytes; one `array.append` per latency).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
import ssl
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from spate.client.aio import AsyncConsumer, AsyncProducer
from spate.client.core import encode_data
from spate.client.messages import MessageParts
from spate.perf import latency
from spate.perf.plan import ConsumerPlan, ProducerPlan, Settings, WorkerPlan

_now_ns = time.monotonic_ns

RATE_TICK_S = 0.001
"""A rate-limited producer wakes at most this often and sends what fell due meanwhile (one
wake-up per message cost ~100 CPU-µs each under load; each message still carries the time it
was sent)."""
CLOSE_FLUSH_S = 5.0
"""Stopped early (Ctrl-C, --drain-timeout): how long producers wait for outstanding confirms."""


@dataclass
class Report:
    published: int = 0
    confirmed: int = 0
    failed: int = 0
    consumed: int = 0
    consumed_run: int = 0
    """Consumed messages published by this run (the rest were in the stream before)."""
    latency: list[tuple[int, int]] = field(default_factory=list)
    cpu_s: float = 0.0
    last_publish_ns: int = 0
    last_confirm_ns: int = 0
    last_consume_ns: int = 0
    published_by_target: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    at_ns: int = 0
    """When the worker took this report (monotonic: one clock for every process of a host)."""


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    if not settings.urls[0].startswith("amqps://"):
        return None
    return ssl.create_default_context(cafile=settings.ca_file)


class _Producer:
    def __init__(self, plan: ProducerPlan, settings: Settings, client: AsyncProducer) -> None:
        self.plan, self.settings, self.client = plan, settings, client
        self.sent = self.confirmed = self.failed = 0
        self.last_publish_ns = self.last_confirm_ns = 0
        self.error: str | None = None
        window = settings.confirm_window
        self.room_needed = min(settings.batch_size, max(1, window // 2))
        self.waiting = False
        self.room = asyncio.Event()
        size = settings.size
        if plan.routing_keys:
            self.prefixes = [
                MessageParts(bytes(size), group_key=key).envelope()[:-size]
                for key in plan.routing_keys
            ]
        else:
            self.prefixes = [encode_data(bytes(size))[:-size]]
        self.pad = bytes(size - 8)

    def on_settle(self, error: BaseException | None) -> None:
        if error is None:
            self.confirmed += 1
        else:
            self.failed += 1
            if self.error is None:
                self.error = f"producer {self.plan.index} ({self.plan.target}): {error}"
        if self.waiting and (
            self.settings.confirm_window - (self.sent - self.confirmed - self.failed)
            >= self.room_needed
        ):
            self.waiting = False
            self.room.set()

    async def publish(self, start_ns: int, deadline_ns: int | None) -> None:
        settings, plan = self.settings, self.plan
        send, settle = self.client.send_encoded_nowait, self.on_settle
        window, batch, rate = settings.confirm_window, settings.batch_size, settings.rate
        remaining = plan.count
        prefixes, pad = self.prefixes, self.pad
        single = prefixes[0] if len(prefixes) == 1 else None
        while remaining is None or remaining > 0:
            now = _now_ns()
            if deadline_ns is not None and now >= deadline_ns:
                break
            if self.failed:
                break
            n = batch if remaining is None else min(batch, remaining)
            room = window - (self.sent - self.confirmed - self.failed)
            if room < min(n, self.room_needed):
                self.waiting = True
                self.room.clear()
                await self.room.wait()
                continue
            n = min(n, room)
            if rate is not None:
                allowed = int(rate * (now - start_ns) / 1e9) + 1 - self.sent
                if allowed <= 0:
                    due_s = (self.sent + 1) / rate - (now - start_ns) / 1e9
                    await asyncio.sleep(max(RATE_TICK_S, due_s))
                    continue
                n = min(n, allowed)
            stamp = now.to_bytes(8, "big")
            if single is not None:
                data = single + stamp + pad
                for _ in range(n):
                    send(data, settle)
            else:
                datas = [prefix + stamp + pad for prefix in prefixes]
                k = len(datas)
                for i in range(self.sent, self.sent + n):
                    send(datas[i % k], settle)
            self.sent += n
            if remaining is not None:
                remaining -= n
            self.last_publish_ns = now
            await asyncio.sleep(0)  # the engine writes the batch at the end of this turn
        await self.client.flush()
        self.last_confirm_ns = _now_ns()


class _Consumer:
    def __init__(self, plan: ConsumerPlan, settings: Settings, start_ns: int, sink: Any) -> None:
        self.plan = plan
        self.size = settings.size
        self.start_ns = start_ns
        self.sink = sink  # array('q') of latencies, shared by the worker's consumers
        self.consumed = self.consumed_run = 0
        self.last_ns = 0
        self.expected: int | None = None
        self.done = asyncio.Event()
        self.clients: list[AsyncConsumer] = []

    def on_message(self, _offset: int, _timestamp_ms: int, raw: bytes) -> None:
        now = _now_ns()
        at = len(raw) - self.size
        sent = int.from_bytes(raw[at : at + 8], "big")
        self.consumed += 1
        self.last_ns = now
        if self.start_ns <= sent <= now:
            self.sink.append(now - sent)
            self.consumed_run += 1
            if self.expected is not None and self.consumed_run >= self.expected:
                self.done.set()

    async def wait(self) -> None:
        """Until every expected message arrived; raises, naming the consumer, when one of its
        links stopped first (a lost connection without --reconnect-timeout)."""
        done = asyncio.ensure_future(self.done.wait())
        links = [asyncio.ensure_future(client.wait()) for client in self.clients]
        try:
            finished, _ = await asyncio.wait([done, *links], return_when=asyncio.FIRST_COMPLETED)
            if done not in finished:
                stopped = next(iter(finished))
                error = stopped.exception()
                raise ConnectionError(
                    f"consumer {self.plan.index} ({self.plan.target}) stopped after "
                    f"{self.consumed_run:,} of this run's messages: "
                    + (_describe(error) if error is not None else "its link closed")
                )
        finally:
            for future in (done, *links):
                future.cancel()

    def expect(self, count: int) -> None:
        self.expected = count
        if self.consumed_run >= count:
            self.done.set()


class Worker:
    def __init__(
        self, plan: WorkerPlan, settings: Settings, conn: Connection, start_ns: int
    ) -> None:
        self.plan, self.settings, self.conn, self.start_ns = plan, settings, conn, start_ns
        self.producers: list[_Producer] = []
        self.consumers: list[_Consumer] = []
        self.latencies: array[int] = array("q")
        self.cpu_at_start = 0.0
        self.inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.error: str | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.watcher: asyncio.Task[None] | None = None

    def report(self) -> Report:
        latencies, self.latencies = self.latencies, array("q")
        for consumer in self.consumers:
            consumer.sink = self.latencies
        by_target: dict[str, int] = {}
        for p in self.producers:
            by_target[p.plan.target] = by_target.get(p.plan.target, 0) + p.sent
        errors = [p.error for p in self.producers if p.error] + ([self.error] if self.error else [])
        return Report(
            published=sum(p.sent for p in self.producers),
            confirmed=sum(p.confirmed for p in self.producers),
            failed=sum(p.failed for p in self.producers),
            consumed=sum(c.consumed for c in self.consumers),
            consumed_run=sum(c.consumed_run for c in self.consumers),
            latency=latency.fold(latencies),
            cpu_s=_cpu_s() - self.cpu_at_start,
            last_publish_ns=max((p.last_publish_ns for p in self.producers), default=0),
            last_confirm_ns=max((p.last_confirm_ns for p in self.producers), default=0),
            last_consume_ns=max((c.last_ns for c in self.consumers), default=0),
            published_by_target=by_target,
            error=errors[0] if errors else None,
            at_ns=_now_ns(),
        )

    async def attach(self) -> None:
        s = self.settings
        tls = tls_context(s)
        for p in self.plan.producers:
            client = await AsyncProducer.connect(
                list(p.urls),
                p.target,
                window=s.confirm_window,
                timeout_s=s.timeout_s,
                reconnect_timeout_s=s.reconnect_timeout_s,
                user=s.user,
                password=s.password,
                tls=tls,
            )
            self.producers.append(_Producer(p, s, client))
        for c in self.plan.consumers:
            consumer = _Consumer(c, s, self.start_ns, self.latencies)
            self.consumers.append(consumer)
            for stream in c.streams:
                consumer.clients.append(
                    await AsyncConsumer.connect(
                        list(c.urls),
                        stream,
                        start=s.offset,
                        credit=s.credit,
                        handler=consumer.on_message,
                        timeout_s=s.timeout_s,
                        reconnect_timeout_s=s.reconnect_timeout_s,
                        user=s.user,
                        password=s.password,
                        tls=tls,
                    )
                )

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for p in self.producers:
            # what was sent gets its outcome counted, not a close's failure
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.client.flush(), CLOSE_FLUSH_S)
            await p.client.close()
        for c in self.consumers:
            for client in c.clients:
                await client.close()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self._readable)
        try:
            await self.attach()
        except Exception as error:  # every way of failing to attach ends the run: say which
            self.conn.send(("failed", _describe(error)))
            await self.close()
            return
        self.conn.send(("ready", None))
        while True:
            message = await self.inbox.get()
            kind = message[0]
            if kind == "start":
                self._start()
            elif kind == "report":
                self.conn.send(("report", self.report()))
            elif kind == "expect":
                for consumer in self.consumers:
                    consumer.expect(message[1][consumer.plan.index])
            else:
                assert kind == "stop", message
                break
        await self.close()
        with contextlib.suppress(OSError):  # the conductor is gone: nobody to tell
            self.conn.send(("final", self.report()))

    def _readable(self) -> None:
        try:
            self.inbox.put_nowait(self.conn.recv())
        except (EOFError, OSError):  # the conductor is gone (killed): stop, do not spin
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
            self.inbox.put_nowait(("stop",))

    def _start(self) -> None:
        self.cpu_at_start = _cpu_s()
        start_ns = _now_ns()
        s = self.settings
        deadline = None if s.time_s is None else start_ns + int(s.time_s * 1e9)
        loop = asyncio.get_running_loop()
        if self.producers:
            self.tasks = [loop.create_task(p.publish(start_ns, deadline)) for p in self.producers]
            watched = self.tasks
        else:
            self.tasks = [loop.create_task(c.wait()) for c in self.consumers]
            watched = self.tasks
        self.watcher = loop.create_task(self._done_when(watched))

    async def _done_when(self, tasks: list[asyncio.Task[None]]) -> None:
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                self.error = _describe(result)
        self.conn.send(("done", self.report()))


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if not str(error) else text


def main(plan: WorkerPlan, settings: Settings, conn: Connection, start_ns: int) -> None:
    """The process's entry point (multiprocessing spawn target). Ctrl-C reaches the whole
    process group: the worker ignores it, and the conductor stops it and sums up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import uvloop  # the node's loop too; the client's engine runs on either

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.run
    try:
        runner(Worker(plan, settings, conn, start_ns).run())
    finally:
        conn.close()
