"""The client's decisions as pure, synchronous state machines: no sockets, no asyncio, no proton.

The shells (`spate.client.aio`, and through it `spate.client.blocking`) feed these cores what
happened — a link attached or refused, a delivery's outcome, a connection lost, a message
arrived, the application took an event — and do what the returned effects say. The scenarios
in tests/client/test_core.py drive them without a socket.

- `Connector`: where to dial next. URLs in turn; `amqp:link:redirect` followed at most
  `redirect_hops_max` hops; a retryable refusal or a lost connection backs off (exponential,
  `backoff_min_ms`..`backoff_max_ms`) and tries the next URL, until `reconnect_timeout_ms`
  after the first failure (each URL is tried at least once); anything else gives up.
- `ProducerCore`: the window of unconfirmed messages, numbered by a sequence that never
  repeats. States and transitions:

      attached --lost / retryable refusal--> reconnecting --attached--> attached (resend all)
      attached --lost, reconnecting off--> broken (every unconfirmed message failed)
      reconnecting --gave up--> broken (every unconfirmed message failed)
      any --close--> closed

  Each message is settled exactly once: `Confirmed` (accepted: a majority fsynced it) or
  `Failed` (the condition); outcomes for a message not sent on the current link, or already
  settled, are ignored. After a reconnect every unconfirmed message is resent in sequence
  order — at-least-once: a message whose `accepted` was lost with the connection is stored
  twice unless the broker deduplicates (issue 8: the sequence is the publishing id to send).
- `ConsumerCore`: resume point and credit. Offsets delivered to the application strictly
  increase (a repeat after a resume is dropped); a resumed link starts at the last delivered
  offset + 1; credit is granted so that link credit + events buffered for the application
  never exceed `credit_window`, topped up when it falls to half. For a named consumer it also
  counts the events the application has not finished with, per link (`on_finished`): only
  those handed out on the current link have a delivery to accept.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

from spate.client.errors import (
    REDIRECT,
    AttachRefused,
    ConnectionLost,
    PublishRefused,
    is_retryable,
    is_retryable_outcome,
)
from spate.core import subentry
from spate.gateway import codec as amqp

# Limits (named once, with their unit).
redirect_hops_max = 5
"""Redirects followed from one dialled URL before counting the attempt as failed."""
backoff_min_ms = 50
"""First pause after a failed attempt; doubles per consecutive failure."""
backoff_max_ms = 1_000
"""Longest pause between attempts (failover target: publishing resumes within 2 s)."""
window_default = 10_000
"""Unconfirmed messages a producer keeps in flight (research/proton.md §5: ≥ 5000 matters)."""
window_max = 1_000_000
credit_default = 5_000
"""Consumer credit window: link credit + events buffered for the application."""
credit_max = 1_000_000
assert 0 < backoff_min_ms <= backoff_max_ms
assert 0 < window_default <= window_max and 0 < credit_default <= credit_max


# Where a consumer starts.

Start = str | int | datetime
"""`first`, `last`, `next`, an offset N >= 0, a relative -N (N back from the end), a datetime
(the first message appended at or after it), or `stored` (a named consumer: right after its
stored offset, `next` when it has none — the broker decides, so no filter is sent)."""


@dataclass(frozen=True)
class StartSpec:
    """A start position as the filter will say it: `kind` is `earliest`, `latest`, `last`,
    `after-offset` (offsets > value), `after-timestamp` (timestamps > value, ms), `relative`
    (value < 0) or `stored` (no filter: a named consumer resumes after its stored offset)."""

    kind: str
    value: int = 0


def start_spec(start: Start) -> StartSpec:
    """000 §5.2.1's map form where it can say it (strictly after X, so offset N is "after
    N-1"); `last` and -N use Spate's forms (src/gateway/README.md)."""
    if isinstance(start, datetime):
        return StartSpec("after-timestamp", int(start.timestamp() * 1000) - 1)
    if isinstance(start, bool):
        raise TypeError("start must be first/last/next, an int or a datetime")
    if isinstance(start, int):
        if start < 0:
            return StartSpec("relative", start)
        if start == 0:
            return StartSpec("earliest")
        return StartSpec("after-offset", start - 1)
    if start == "first":
        return StartSpec("earliest")
    if start == "next":
        return StartSpec("latest")
    if start == "last":
        return StartSpec("last")
    if start == "stored":
        return StartSpec("stored")
    raise ValueError(
        f"unknown start {start!r}: use first, last, next, stored, an offset, -N or a datetime"
    )


# Connecting.


@dataclass(frozen=True)
class Endpoint:
    """A configured URL: `amqp://host:port` (5672 by default), `amqps://host:port` (TLS, 5671
    by default), or `host:port` (plain)."""

    host: str
    port: int
    tls: bool = False


@dataclass(frozen=True)
class Dial:
    """Open a connection to host:port and attach the link."""

    host: str
    port: int
    hops: int
    """Redirects followed to get here from a configured URL."""
    tls: bool = False
    """Over TLS: the configured URL was `amqps://`, and a redirect keeps it (a cluster serves
    AMQP over TLS on every listener or on none)."""


@dataclass(frozen=True)
class Wait:
    """Pause, then ask `next_dial`."""

    delay_ms: int


@dataclass(frozen=True)
class GiveUp:
    error: BaseException


def parse_url(url: str) -> Endpoint:
    """Raises ValueError for a scheme other than amqp / amqps, or a malformed port."""
    parts = urlsplit(url if "://" in url else f"amqp://{url}")
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(f"{url!r}: the scheme must be amqp:// or amqps:// (TLS)")
    tls = parts.scheme == "amqps"
    try:
        port = parts.port
    except ValueError as error:
        raise ValueError(f"{url!r}: {error}") from None
    return Endpoint(parts.hostname or "127.0.0.1", port or (5671 if tls else 5672), tls)


class Connector:
    """Decides where to dial and when to stop. `next_dial` starts an attempt at the next
    configured URL; `on_refused` / `on_failed` answer with the next step of that attempt."""

    def __init__(
        self, urls: Sequence[str], reconnect_timeout_ms: int, attach_timeout_ms: int = 0
    ) -> None:
        assert urls, "at least one URL"
        assert reconnect_timeout_ms >= 0 and attach_timeout_ms >= 0
        self.urls = [parse_url(url) for url in urls]
        self.reconnect_timeout_ms = reconnect_timeout_ms
        self.retryable_timeout_ms = max(reconnect_timeout_ms, attach_timeout_ms)
        """A refusal the broker marked retryable (an election) is retried this long even
        when reconnecting is off: the broker said to come back."""
        self._turn = 0
        self._failures = 0
        self._first_failure_ms: int | None = None
        self._come_back = False
        """Some URL refused as retryable since the last attach: the broker is there and said to
        come back, so a dead URL tried meanwhile does not end the attempt early."""

    @property
    def tls(self) -> bool:
        """Some configured URL is `amqps://`."""
        return any(endpoint.tls for endpoint in self.urls)

    def next_dial(self) -> Dial:
        endpoint = self.urls[self._turn % len(self.urls)]
        self._turn += 1
        return Dial(endpoint.host, endpoint.port, 0, endpoint.tls)

    def on_attached(self) -> None:
        self._failures = 0
        self._first_failure_ms = None
        self._come_back = False

    def on_refused(self, dial: Dial, refused: AttachRefused, now_ms: int) -> Dial | Wait | GiveUp:
        if refused.condition == REDIRECT:
            host, port = refused.info.get("network-host"), refused.info.get("port")
            if dial.hops < redirect_hops_max and host is not None and port is not None:
                return Dial(str(host), int(port), dial.hops + 1, dial.tls)
            self._come_back = True
            return self._failed(refused, now_ms, self.retryable_timeout_ms)
        if is_retryable(refused.condition, refused.info):
            self._come_back = True
            return self._failed(refused, now_ms, self.retryable_timeout_ms)
        return GiveUp(refused)

    def on_failed(self, error: BaseException, now_ms: int) -> Wait | GiveUp:
        """The connection failed or was lost (while attaching or afterwards)."""
        budget = self.retryable_timeout_ms if self._come_back else self.reconnect_timeout_ms
        return self._failed(error, now_ms, budget)

    def _failed(self, error: BaseException, now_ms: int, budget_ms: int) -> Wait | GiveUp:
        if self._first_failure_ms is None:
            self._first_failure_ms = now_ms
        self._failures += 1
        tried_every_url = self._failures >= len(self.urls)
        if tried_every_url and now_ms - self._first_failure_ms >= budget_ms:
            return GiveUp(error)
        delay = min(backoff_min_ms << min(self._failures - 1, 16), backoff_max_ms)
        return Wait(delay)


# Producing.

T = TypeVar("T")


@dataclass(frozen=True)
class Confirmed(Generic[T]):
    sequence: int
    token: T


@dataclass(frozen=True)
class Failed(Generic[T]):
    sequence: int
    token: T
    error: BaseException


@dataclass(frozen=True)
class Reconnect:
    """Drop the link and connection; attach again (Connector), then `on_attached`."""


@dataclass(frozen=True)
class Outcome:
    """A delivery's terminal state as the broker sent it (`accepted`, `rejected`, `released`,
    `modified`) and its error condition, if any."""

    state: str
    condition: str | None = None
    description: str | None = None
    info: dict[str, Any] | None = None


ACCEPTED = Outcome("accepted")

ProducerEffect = Confirmed[T] | Failed[T] | Reconnect


class ProducerCore(Generic[T]):
    """See the module docstring. `T` is the shell's token per message (a future, a callback)."""

    def __init__(self, window: int, reconnecting: bool) -> None:
        assert 0 < window <= window_max
        self.window = window
        self.reconnecting_allowed = reconnecting
        self.state = "attached"
        self._next_sequence = 1
        self._unconfirmed: OrderedDict[int, tuple[bytes, T]] = OrderedDict()
        self._sent: set[int] = set()
        """Sequences transferred on the current link, not yet settled."""
        self.broken: BaseException | None = None

    @property
    def unconfirmed(self) -> int:
        return len(self._unconfirmed)

    def oldest_unconfirmed(self) -> int | None:
        """The lowest sequence not yet settled (they are kept in sequence order)."""
        return next(iter(self._unconfirmed), None)

    def has_room(self) -> bool:
        return len(self._unconfirmed) < self.window

    def submit(self, data: bytes, token: T) -> tuple[int, bool]:
        """Take a message (already encoded); returns its sequence and whether to transfer it
        now (not while reconnecting: `on_attached` will). Past the window is the caller's
        choice (`send_nowait`); `send` waits for `has_room` first."""
        if self.state == "closed":
            raise RuntimeError("the producer is closed")
        if self.broken is not None:
            raise ConnectionLost(f"the producer lost its connection for good: {self.broken}")
        sequence = self._next_sequence
        self._next_sequence += 1
        self._unconfirmed[sequence] = (data, token)
        transfer = self.state == "attached"
        if transfer:
            self._sent.add(sequence)
        return sequence, transfer

    def on_outcome(self, sequence: int, outcome: Outcome) -> list[ProducerEffect[T]]:
        if sequence not in self._sent:
            return []  # from a link already given up, or settled already
        self._sent.discard(sequence)
        entry = self._unconfirmed.get(sequence)
        assert entry is not None, "sent but not unconfirmed"
        if outcome.state == "accepted":
            del self._unconfirmed[sequence]
            return [Confirmed(sequence, entry[1])]
        info = outcome.info or {}
        if self.reconnecting_allowed and is_retryable_outcome(outcome.condition, info):
            return self._start_reconnect()  # it stays unconfirmed and is resent
        del self._unconfirmed[sequence]
        error = PublishRefused(outcome.state, outcome.condition, outcome.description, info)
        return [Failed(sequence, entry[1], error)]

    def on_lost(self, error: BaseException) -> list[ProducerEffect[T]]:
        """The connection or the link went away."""
        if self.state in ("closed", "broken", "reconnecting"):
            return []
        if not self.reconnecting_allowed:
            return self._break(ConnectionLost(f"connection lost before confirms: {error}"))
        return self._start_reconnect()

    def _start_reconnect(self) -> list[ProducerEffect[T]]:
        if self.state != "attached":
            return []
        self.state = "reconnecting"
        self._sent.clear()
        return [Reconnect()]

    def on_attached(self) -> list[tuple[int, bytes]]:
        """The link is (re)attached: transfer these, in this order (every unconfirmed message)."""
        if self.state == "closed":
            return []
        assert self.state in ("reconnecting", "attached"), self.state
        self.state = "attached"
        self._sent = set(self._unconfirmed)
        return [(sequence, data) for sequence, (data, _) in self._unconfirmed.items()]

    def on_gave_up(self, error: BaseException) -> list[ProducerEffect[T]]:
        """Reconnecting failed for good."""
        if self.state == "closed":
            return []
        return self._break(error)

    def _break(self, error: BaseException) -> list[ProducerEffect[T]]:
        self.state = "broken"
        self.broken = error
        self._sent.clear()
        failed: list[ProducerEffect[T]] = [
            Failed(sequence, token, error) for sequence, (_, token) in self._unconfirmed.items()
        ]
        self._unconfirmed.clear()
        return failed

    def close(self) -> list[ProducerEffect[T]]:
        """Fail whatever is still unconfirmed (the caller flushed first if it cared)."""
        effects = self._break(ConnectionLost("the producer was closed before these were confirmed"))
        self.state = "closed"
        return effects


# Consuming.


class ConsumerCore:
    """See the module docstring."""

    def __init__(self, start: Start, credit_window: int) -> None:
        assert 0 < credit_window <= credit_max
        self.start = start
        self.credit_window = credit_window
        self.last_offset: int | None = None
        self.last_offsets: dict[str | None, int] = {}
        """The last offset handed out per partition (offsets are per partition)."""
        self.group = False
        """A partition-agnostic group member: every (re)attached link asks for `start`; the
        group's committed offsets win where there are some (ADR 0015)."""
        self.buffered = 0
        """Events accepted for the application but not yet taken by it."""
        self.partitions_seen: set[str | None] = set()
        self.unfinished = 0
        """Named consumers: events handed out on the current link that the application has not
        finished with (their deliveries are held unsettled)."""
        self.stale = 0
        """Events handed out on links since lost and not yet finished: nothing to settle."""
        self.lost_finished = 0
        """Manual commits: events finished that were handed out on a lost link, since the last
        commit that accepted a delivery on the current link (whose offset covers them)."""

    def resume_start(self) -> Start:
        """Where a (re)attached link starts: the given start, then after the last delivered."""
        if self.group:
            return self.start
        if self.last_offset is None:
            return self.start
        if len(self.partitions_seen) > 1:
            raise ConnectionLost(
                "an unbound consumer that read several partitions cannot resume exactly; "
                "bind it to one partition (partition=...)"
            )
        return self.last_offset + 1

    def on_message(self, offset: int, partition: str | None) -> bool:
        """A delivery arrived: hand it to the application (True) or drop it as a repeat."""
        last = self.last_offsets.get(partition)
        if last is not None and offset <= last:
            return False
        self.last_offsets[partition] = self.last_offset = offset
        self.partitions_seen.add(partition)
        self.buffered += 1
        self.unfinished += 1
        return True

    def on_messages(self, offsets: list[int], partition: str | None) -> int:
        """`on_message` for a run of deliveries from one partition, offsets increasing: the
        index of the first to hand to the application (those before it are repeats)."""
        assert offsets[0] <= offsets[-1], "a partition's deliveries come in offset order"
        last = self.last_offsets.get(partition)
        keep = 0 if last is None else bisect.bisect_right(offsets, last)
        count = len(offsets) - keep
        if count:
            self.last_offsets[partition] = self.last_offset = offsets[-1]
            self.partitions_seen.add(partition)
            self.buffered += count
            self.unfinished += count
        return keep

    def on_frame(self, offsets: Sequence[int], partition: str | None) -> int:
        """A bulk frame's rows (offsets increasing) arrived, taken by the handler at once: the
        index of the first to hand out (those before it are repeats)."""
        last = self.last_offsets.get(partition)
        keep = 0 if last is None else bisect.bisect_right(offsets, last)
        if keep < len(offsets):
            self.last_offsets[partition] = self.last_offset = offsets[-1]
            self.partitions_seen.add(partition)
        return keep

    def on_relinked(self) -> None:
        """A new link replaced a lost one: the old link's unfinished events settle nothing."""
        self.stale += self.unfinished
        self.unfinished = 0

    def on_finished(self, count: int) -> int:
        """The application finished with its next `count` events (in the order handed out):
        how many of them are deliveries held on the current link, to accept now."""
        assert 0 <= count <= self.stale + self.unfinished, (count, self.stale, self.unfinished)
        old = min(self.stale, count)
        self.stale -= old
        self.lost_finished += old
        count -= old
        self.unfinished -= count
        return count

    def on_commit(self, accepted: int) -> int:
        """A manual commit accepts `accepted` deliveries on the current link: how many finished
        events from lost links it leaves uncommitted (0 when it accepts any, since its offset
        covers theirs; those events then have no delivery left to store them by)."""
        lost, self.lost_finished = (0 if accepted else self.lost_finished), 0
        return lost

    def on_taken(self, count: int = 1) -> None:
        assert 0 < count <= self.buffered, (count, self.buffered)
        self.buffered -= count

    def credit_to_grant(self, link_credit: int) -> int:
        """Credit to add now so that link credit + buffered stays within the window; nothing
        until that sum has fallen to half (one flow frame per half window)."""
        assert link_credit >= 0
        outstanding = link_credit + self.buffered
        if outstanding > self.credit_window // 2:
            return 0
        return self.credit_window - outstanding


# Encoding.

_DATA_SHORT = b"\x00\x53\x75\xa0"  # described data section, vbin8
_DATA_LONG = b"\x00\x53\x75\xb0"  # described data section, vbin32


def encode_data(body: bytes) -> bytes:
    """A bare message of one data section (002 §3.2.6), the bytes a proton client sends for
    `Message(body=b"...", inferred=True)`, without building a Message (0.3 vs ~20 µs)."""
    if len(body) < 256:
        return _DATA_SHORT + bytes((len(body),)) + body
    return _DATA_LONG + len(body).to_bytes(4, "big") + body


@dataclass(frozen=True, slots=True)
class SubEntryBatch:
    """Several messages sent as one sub-entry (ADR 0017, docs/amqp.md "Sub-entries"): the
    encoded AMQP messages, compressed together with `compression` (none, gzip, snappy, lz4,
    zstd). The broker stores it as one entry; each message keeps an offset of its own. A
    message's filter value is its own `x-stream-filter-value` annotation, as when sent singly
    (the broker builds the stored entry's Bloom filter from them)."""

    messages: Sequence[bytes]
    compression: str = "none"

    def envelope(self, publishing_id: int | None = None) -> bytes:
        """The message to transfer: message annotations {x-opt-spate-sub-entry: true,
        [x-opt-publishing-id: ulong]} and one data section holding the sub-entry."""
        blob = subentry.encode(self.messages, self.compression)
        annotations: dict[Any, Any] = {amqp.Symbol("x-opt-spate-sub-entry"): True}
        if publishing_id is not None:
            annotations[amqp.Symbol("x-opt-publishing-id")] = amqp.ULong(publishing_id)
        return amqp.encode(amqp.Described(amqp.ULong(0x72), annotations)) + amqp.encode(
            amqp.Described(amqp.ULong(0x75), bytes(blob))
        )
