"""Blocking producer and consumer over proton's BlockingConnection.

Both follow `amqp:link:redirect` when they attach and retry attaches refused as retryable (a
leader election). With `reconnect_timeout_s` > 0 they also survive losing their node: the
producer reconnects (to the given URLs in turn, then wherever redirects lead) and resends, in
order, every message after the last one the broker accepted — at-least-once: a message whose
confirm was lost with the connection may be stored twice (producer deduplication, issue 8,
removes those); the consumer reconnects and resumes at the offset after the last one it
returned, so its caller sees no gap and no repeat.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from proton import Delivery, Message, ProtonException, Timeout, symbol
from proton.reactor import Filter, LinkOption
from proton.utils import BlockingConnection, LinkDetached
from spate.client.offsets import Start, offset_filter
from spate.core.ids import offset_from_symbol

P_PARTITION = symbol("event-streams-partition")
DA_OFFSET = symbol("event-streams-offset")
DA_TIMESTAMP = symbol("event-streams-timestamp")
DA_SOURCE = symbol("event-streams-source-partition")


class PublishRefused(Exception):
    """The broker did not accept a message (rejected or released); `condition` says why."""

    def __init__(self, state: str, condition: str | None, description: str | None) -> None:
        super().__init__(f"message {state}: {condition or '-'}: {description or ''}".rstrip(": "))
        self.state, self.condition, self.description = state, condition, description


class _LinkProperties(LinkOption):
    def __init__(self, properties: dict[symbol, Any]) -> None:
        self.properties = properties

    def apply(self, link: Any) -> None:
        link.properties = self.properties


REDIRECT = "amqp:link:redirect"
RETRYABLE = symbol("spate:retryable")
redirect_hops_max = 5
attach_backoff_s = 0.1
reconnect_backoff_s = 0.1
"""Pause between reconnection attempts (the URLs are tried in turn)."""


def _open_link(
    url: str,
    timeout_s: float,
    connection_options: dict[str, Any],
    make_link: Callable[[BlockingConnection], Any],
) -> tuple[BlockingConnection, Any]:
    """Connect and attach, following `amqp:link:redirect` (to the partition's leader) and
    retrying refusals the broker marks retryable (e.g. a leader election) until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    hops = 0
    while True:
        connection = BlockingConnection(url, timeout=timeout_s, **connection_options)
        try:
            return connection, make_link(connection)
        except LinkDetached as detached:
            condition = detached.link.remote_condition  # read before close() frees the link
            name = condition.name if condition is not None else None
            raw_info: Any = condition.info if condition is not None else None
            info: dict[Any, Any] = dict(raw_info) if isinstance(raw_info, dict) else {}
            connection.close()
            if name == REDIRECT and hops < redirect_hops_max:
                hops += 1
                scheme = url.split("://", 1)[0] if "://" in url else "amqp"
                host, port = str(info[symbol("network-host")]), int(info[symbol("port")])
                url = f"{scheme}://{host}:{port}"
                continue
            if info.get(RETRYABLE) and time.monotonic() < deadline:
                time.sleep(attach_backoff_s)
                continue
            raise


def _message(body: bytes | Message) -> Message:
    if isinstance(body, Message):
        return body
    return Message(body=body, inferred=True)  # a data section, not amqp-value(binary)


class _Connected:
    """Owns one connection (reopened after a failure when reconnecting is on); a context
    manager that closes it."""

    _connection: BlockingConnection
    _urls: list[str]
    _timeout_s: float
    _reconnect_timeout_s: float
    _connection_options: dict[str, Any]
    reconnects = 0
    """Times this client reopened its connection after a failure."""

    def _connect(
        self, make_link: Callable[[BlockingConnection], Any], *, after_failure: bool
    ) -> Any:
        """Open a connection and the link, trying the URLs in turn (redirects followed) until
        `reconnect_timeout_s` after the first failure; returns the link."""
        deadline = time.monotonic() + self._reconnect_timeout_s
        attempt = 0
        while True:
            url = self._urls[attempt % len(self._urls)]
            attempt += 1
            try:
                self._connection, link = _open_link(
                    url, self._timeout_s, self._connection_options, make_link
                )
            except (ProtonException, OSError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(reconnect_backoff_s)
                continue
            if after_failure:
                self.reconnects += 1
            return link

    def _drop(self) -> None:
        # The connection is already broken (that is why it is dropped): closing may fail.
        with contextlib.suppress(ProtonException, OSError):
            self._connection.close()

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class Producer(_Connected):
    """Publishes with confirms: every send returns only once the broker accepted the message.

    `url` is one node or gateway, or a list of them to try in turn when (re)connecting."""

    def __init__(
        self,
        url: str | Sequence[str],
        stream: str,
        *,
        partition: int | None = None,
        timeout_s: float = 30.0,
        reconnect_timeout_s: float = 0.0,
        user: str | None = None,
        password: str | None = None,
        **connection_options: Any,
    ) -> None:
        if user is not None:
            connection_options.update(user=user, password=password, allowed_mechs="PLAIN")
        options: list[LinkOption] = (
            [_LinkProperties({P_PARTITION: str(partition)})] if partition is not None else []
        )
        self._urls = [url] if isinstance(url, str) else list(url)
        assert self._urls, "a producer needs at least one URL"
        self._timeout_s = timeout_s
        self._reconnect_timeout_s = reconnect_timeout_s
        self._connection_options = connection_options
        self._make_link = lambda connection: connection.create_sender(stream, options=options)
        self._sender = self._connect(self._make_link, after_failure=False)

    def send(self, body: bytes | Message) -> None:
        self.send_batch([body])

    def send_batch(self, bodies: Iterable[bytes | Message], window: int = 1000) -> int:
        """Send pipelined (at most `window` unconfirmed); returns the number confirmed. With
        reconnecting on, a lost connection or a retryable refusal (a leader change) reconnects
        and resends, in order, every message not known accepted."""
        pending = [_message(body) for body in bodies]
        confirmed = 0
        while pending:
            window_messages, pending = pending[:window], pending[window:]
            unconfirmed = self._send_window(window_messages)
            confirmed += len(window_messages) - len(unconfirmed)
            if unconfirmed:  # cut off: reconnect, then these go first
                pending = unconfirmed + pending
                self._drop()
                self._sender = self._connect(self._make_link, after_failure=True)
        return confirmed

    def _send_window(self, messages: Sequence[Message]) -> list[Message]:
        """Send and wait for every confirm; returns the messages not known accepted (only when
        reconnecting is on: otherwise a failure raises). A refusal that is not retryable
        raises PublishRefused."""
        reconnecting = self._reconnect_timeout_s > 0
        deliveries: list[Delivery] = []
        try:
            link = self._sender.link
            deliveries = [link.send(message) for message in messages]
            self._connection.wait(
                lambda: all(d.settled for d in deliveries),
                msg="waiting for confirms",
                timeout=self._timeout_s,
            )
        except (ProtonException, OSError):
            if not reconnecting:
                raise
        unconfirmed: list[Message] = []
        for i, message in enumerate(messages):
            d = deliveries[i] if i < len(deliveries) else None
            if d is not None and d.remote_state == Delivery.ACCEPTED:
                d.settle()
                continue
            condition = d.remote.condition if d is not None and d.settled else None
            if d is not None and d.settled and condition is not None:
                raw: Any = condition.info
                info: dict[Any, Any] = dict(raw) if isinstance(raw, dict) else {}
                retryable = condition.name == REDIRECT or bool(info.get(RETRYABLE))
                if not (reconnecting and retryable):
                    raise PublishRefused(str(d.remote_state), condition.name, condition.description)
            elif d is not None and d.settled and not reconnecting:
                raise PublishRefused(str(d.remote_state), None, None)
            unconfirmed.append(message)
        return unconfirmed


class Event:
    """One consumed message: its offset and append time, the partition it came from (on an
    unbound link over several partitions), and the message — decoded on first use when the
    client kept only its bytes (the asyncio consumer's fast path)."""

    __slots__ = ("_message", "_raw", "offset", "partition", "timestamp_ms")

    def __init__(
        self,
        offset: int,
        timestamp_ms: int,
        partition: str | None,
        message: Message | None = None,
        raw: bytes | None = None,
    ) -> None:
        assert (message is None) != (raw is None), "a message or its bytes"
        self.offset, self.timestamp_ms, self.partition = offset, timestamp_ms, partition
        self._message, self._raw = message, raw

    @property
    def message(self) -> Message:
        if self._message is None:
            assert self._raw is not None
            message = Message()
            message.decode(self._raw)
            self._message = message
        return self._message

    @property
    def body(self) -> Any:
        body = self.message.body
        return bytes(body) if isinstance(body, memoryview) else body

    def __repr__(self) -> str:
        return f"Event(offset={self.offset}, timestamp_ms={self.timestamp_ms})"


class Consumer(_Connected):
    """Reads a stream from `start` (first, last, next, an offset, -N, or a datetime).

    With `reconnect_timeout_s` > 0 a lost connection is reopened (URLs in turn, redirects
    followed) and reading resumes at the offset after the last event returned: exact for a
    partition-bound consumer or a one-partition stream (a consumer that has read from several
    partitions of an unbound link cannot say where each resumes, and raises instead)."""

    def __init__(
        self,
        url: str | Sequence[str],
        stream: str,
        *,
        start: Start = "next",
        partition: int | None = None,
        credit: int = 1000,
        timeout_s: float = 30.0,
        reconnect_timeout_s: float = 0.0,
        user: str | None = None,
        password: str | None = None,
        **connection_options: Any,
    ) -> None:
        if user is not None:
            connection_options.update(user=user, password=password, allowed_mechs="PLAIN")
        self._urls = [url] if isinstance(url, str) else list(url)
        assert self._urls, "a consumer needs at least one URL"
        self._timeout_s = timeout_s
        self._reconnect_timeout_s = reconnect_timeout_s
        self._connection_options = connection_options
        self._stream, self._partition, self._credit = stream, partition, credit
        self._start: Start = start
        self._last_offset: int | None = None
        self._partitions_seen: set[str | None] = set()
        self._receiver = self._connect(self._make_link, after_failure=False)

    def _make_link(self, connection: BlockingConnection) -> Any:
        start = self._start if self._last_offset is None else self._last_offset + 1
        options: list[LinkOption] = [Filter(offset_filter(start))]
        if self._partition is not None:
            options.append(_LinkProperties({P_PARTITION: str(self._partition)}))
        return connection.create_receiver(self._stream, credit=self._credit, options=options)

    def receive(self, timeout: float | None = 30.0) -> Event:
        while True:
            try:
                message = self._receiver.receive(timeout=timeout)
                self._receiver.accept()
                break
            except Timeout:
                raise  # nothing arrived in time: not a failure of the connection
            except (ProtonException, OSError):
                if self._reconnect_timeout_s <= 0:
                    raise
                if len(self._partitions_seen) > 1:
                    raise
                self._drop()
                self._receiver = self._connect(self._make_link, after_failure=True)
        annotations = message.instructions or {}
        offset = offset_from_symbol(str(annotations.get(DA_OFFSET, "")))
        assert offset is not None, f"delivery without a Spate offset: {annotations}"
        stamp = annotations.get(DA_TIMESTAMP)
        stamp_ms = int(stamp.timestamp() * 1000) if isinstance(stamp, datetime) else int(stamp or 0)
        source = annotations.get(DA_SOURCE)
        partition = None if source is None else str(source)
        self._last_offset = offset
        self._partitions_seen.add(partition)
        return Event(offset, stamp_ms, partition, message)
