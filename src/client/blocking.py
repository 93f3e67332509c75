"""Blocking producer and consumer over proton's BlockingConnection."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from proton import Delivery, Message, symbol
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
    """Owns one connection; a context manager that closes it."""

    _connection: BlockingConnection

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class Producer(_Connected):
    """Publishes with confirms: every send returns only once the broker accepted the message."""

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        partition: int | None = None,
        timeout_s: float = 30.0,
        user: str | None = None,
        password: str | None = None,
        **connection_options: Any,
    ) -> None:
        if user is not None:
            connection_options.update(user=user, password=password, allowed_mechs="PLAIN")
        options: list[LinkOption] = (
            [_LinkProperties({P_PARTITION: str(partition)})] if partition is not None else []
        )
        self._connection, self._sender = _open_link(
            url,
            timeout_s,
            connection_options,
            lambda connection: connection.create_sender(stream, options=options),
        )
        self._timeout_s = timeout_s

    def send(self, body: bytes | Message) -> None:
        self.send_batch([body])

    def send_batch(self, bodies: Iterable[bytes | Message], window: int = 1000) -> int:
        """Send pipelined (at most `window` unconfirmed); returns the number confirmed."""
        link = self._sender.link
        pending: list[Delivery] = []
        confirmed = 0
        for body in bodies:
            pending.append(link.send(_message(body)))
            if len(pending) >= window:
                confirmed += self._settle(pending)
                pending = []
        return confirmed + self._settle(pending)

    def _settle(self, deliveries: Sequence[Delivery]) -> int:
        if not deliveries:
            return 0
        self._connection.wait(
            lambda: all(d.settled for d in deliveries),
            msg="waiting for confirms",
            timeout=self._timeout_s,
        )
        for d in deliveries:
            if d.remote_state != Delivery.ACCEPTED:
                condition = d.remote.condition
                raise PublishRefused(
                    str(d.remote_state),
                    condition.name if condition else None,
                    condition.description if condition else None,
                )
            d.settle()
        return len(deliveries)


@dataclass(frozen=True)
class Event:
    offset: int
    timestamp_ms: int
    partition: str | None
    message: Message

    @property
    def body(self) -> Any:
        body = self.message.body
        return bytes(body) if isinstance(body, memoryview) else body


class Consumer(_Connected):
    """Reads a stream from `start` (first, last, next, an offset, -N, or a datetime)."""

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        start: Start = "next",
        partition: int | None = None,
        credit: int = 1000,
        timeout_s: float = 30.0,
        user: str | None = None,
        password: str | None = None,
        **connection_options: Any,
    ) -> None:
        if user is not None:
            connection_options.update(user=user, password=password, allowed_mechs="PLAIN")
        options: list[LinkOption] = [Filter(offset_filter(start))]
        if partition is not None:
            options.append(_LinkProperties({P_PARTITION: str(partition)}))
        self._connection, self._receiver = _open_link(
            url,
            timeout_s,
            connection_options,
            lambda connection: connection.create_receiver(stream, credit=credit, options=options),
        )

    def receive(self, timeout: float | None = 30.0) -> Event:
        message = self._receiver.receive(timeout=timeout)
        self._receiver.accept()
        annotations = message.instructions or {}
        offset = offset_from_symbol(str(annotations.get(DA_OFFSET, "")))
        assert offset is not None, f"delivery without a Spate offset: {annotations}"
        stamp = annotations.get(DA_TIMESTAMP)
        stamp_ms = int(stamp.timestamp() * 1000) if isinstance(stamp, datetime) else int(stamp or 0)
        source = annotations.get(DA_SOURCE)
        return Event(offset, stamp_ms, None if source is None else str(source), message)
