"""One consumed message as the consumers return it."""

from __future__ import annotations

from typing import Any

from spate.client.engine import Message, decode_message


class Event:
    """A message read from a stream: its offset, its append time (ms since the epoch), the
    partition it came from (on an unbound link over several partitions; None otherwise), the
    partition stream (a super stream's consumer), and the message — kept as the bytes the
    broker sent (`raw`) and decoded on first use."""

    __slots__ = ("_message", "offset", "partition", "raw", "stream", "timestamp_ms")

    def __init__(
        self,
        offset: int,
        timestamp_ms: int,
        partition: str | None,
        raw: bytes,
        stream: str | None = None,
    ) -> None:
        self.offset, self.timestamp_ms, self.partition = offset, timestamp_ms, partition
        self.raw = raw
        """The delivered AMQP message, delivery annotations included."""
        self.stream = stream
        """A super-stream consumer's event (ADR 0034): the partition stream it was read from
        (`partition` is its index in the super stream); None otherwise."""
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
