"""One consumed message as the consumers return it."""

from __future__ import annotations

from typing import Any, NamedTuple

from spate.client.engine import Message, decode_message


class Standing(NamedTuple):
    """Where a consumer stands as the broker told it — single active consumer, super-stream
    partitions, group assignment — as of one attach reply or delivery. `seq` orders them: a
    consumer shows the newest standing among its attach replies and the events the
    application has taken, so an event still buffered does not change what it shows."""

    seq: int
    active: bool
    streams: frozenset[str]
    """A super-stream consumer's partition streams where it is active (ADR 0034)."""
    assignment: frozenset[int]
    """A group member's partitions, or a super-stream consumer's partition indexes."""


NO_STANDING = Standing(0, True, frozenset(), frozenset())


class Event:
    """A message read from a stream: its offset, its append time (ms since the epoch), the
    partition it came from (on an unbound link over several partitions; None otherwise), the
    partition stream (a super stream's consumer), and the message — kept as the bytes the
    broker sent (`raw`) and decoded on first use."""

    __slots__ = ("_message", "offset", "partition", "raw", "standing", "stream", "timestamp_ms")

    def __init__(
        self,
        offset: int,
        timestamp_ms: int,
        partition: str | None,
        raw: bytes,
        stream: str | None = None,
        *,
        standing: Standing = NO_STANDING,
    ) -> None:
        self.offset, self.timestamp_ms, self.partition = offset, timestamp_ms, partition
        self.raw = raw
        """The delivered AMQP message, delivery annotations included."""
        self.stream = stream
        """A super-stream consumer's event (ADR 0034): the partition stream it was read from
        (`partition` is its index in the super stream); None otherwise."""
        self.standing = standing
        """Where the consumer stood when this event arrived (`active`, `active_streams` and
        `assignment` show it once the application has taken the event)."""
        self._message: Message | None = None

    @property
    def message(self) -> Message:
        if self._message is None:
            self._message = decode_message(self.raw)
        return self._message

    @property
    def body(self) -> Any:
        body = self.message.body
        return bytes(body) if isinstance(body, memoryview) else body

    def __repr__(self) -> str:
        return f"Event(offset={self.offset}, timestamp_ms={self.timestamp_ms})"
