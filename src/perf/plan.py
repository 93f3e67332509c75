"""Who does what in a `spate perf` run (pure: no I/O).

`Settings` is the validated command line. `stream_names` expands `--stream` / `--stream-count`
as RabbitMQ's stream-perf-test does; `assign` places producers and consumers on streams and
processes; `routing_keys` finds one key per super-stream partition.

A *target* is what a producer publishes to and a consumer reads: a stream, or the super
stream (whose consumers read every partition stream). A consumer expects every message the
producers of its target published in this run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from spate.core.errors import InvalidArgument
from spate.core.superstreams import hash_partition

Start = str | int | datetime

PROCESSES_MAX = 64
CLIENTS_MAX = 1_000
"""Producers, and consumers, at most (each is a connection)."""
SIZE_MIN = 8
"""A body carries the publish time in its first 8 bytes (as in stream-perf-test)."""
SIZE_MAX = 16 * 1024 * 1024
BATCH_MAX = 10_000
WINDOW_MAX = 1_000_000
CREDIT_MAX = 100_000
STREAM_COUNT_MAX = 10_000
ROUTING_KEY_TRIES_MAX = 1_000_000
"""Candidate keys tried to find one per hash-routed partition (a few per partition expected)."""


@dataclass(frozen=True)
class ProducerPlan:
    index: int
    target: str
    """The stream or super stream the producer publishes to."""
    urls: tuple[str, ...]
    count: int | None
    """Messages to publish; None: until the run's time is up."""
    routing_keys: tuple[str, ...] = ()
    """Super streams: the group keys to rotate over (one per partition)."""


@dataclass(frozen=True)
class ConsumerPlan:
    index: int
    target: str
    streams: tuple[str, ...]
    """The streams it reads (a super stream's partition streams; else the target)."""
    urls: tuple[str, ...]


@dataclass(frozen=True)
class WorkerPlan:
    """One worker process: only producers, or only consumers (their CPU is told apart)."""

    role: str
    """"producers" or "consumers"."""
    producers: tuple[ProducerPlan, ...] = ()
    consumers: tuple[ConsumerPlan, ...] = ()


@dataclass(frozen=True)
class Settings:
    urls: tuple[str, ...]
    producers: int = 1
    consumers: int = 1
    size: int = 100
    count: int | None = None
    time_s: float | None = None
    rate: float | None = None
    """Messages per second per producer (stream-perf-test's --rate); None: as fast as it can."""
    batch_size: int = 100
    confirm_window: int = 10_000
    credit: int = 10_000
    streams: tuple[str, ...] = ("perf",)
    super_stream: str | None = None
    offset: Start = "next"
    processes: int = 1
    user: str | None = None
    password: str | None = None
    ca_file: str | None = None
    timeout_s: float = 30.0
    drain_timeout_s: float = 30.0
    reconnect_timeout_s: float = 0.0
    """> 0: clients reconnect (over the URLs in turn) for that long after a failure; producers
    resend what was unconfirmed (at least once: a message may then be stored twice)."""

    def validate(self) -> None:
        """Raise InvalidArgument naming the flag for a value that cannot work."""
        if not self.urls:
            raise InvalidArgument("--url: give at least one amqp:// or amqps:// URL")
        for url in self.urls:
            if not re.match(r"^amqps?://[^\s/]+(:\d+)?/?$", url):
                raise InvalidArgument(
                    f"--url: expected amqp://HOST:PORT or amqps://HOST:PORT, got {url!r}"
                )
        schemes = {url.split("://", 1)[0] for url in self.urls}
        if len(schemes) > 1:
            raise InvalidArgument("--url: mix of amqp:// and amqps:// URLs; use one scheme")
        if self.ca_file is not None and schemes != {"amqps"}:
            raise InvalidArgument("--ca-file applies to amqps:// URLs; none was given")
        _within("--producers", self.producers, 0, CLIENTS_MAX)
        _within("--consumers", self.consumers, 0, CLIENTS_MAX)
        if self.producers == 0 and self.consumers == 0:
            raise InvalidArgument("--producers and --consumers are both 0: nothing to measure")
        _within("--size", self.size, SIZE_MIN, SIZE_MAX)
        _within("--batch-size", self.batch_size, 1, BATCH_MAX)
        _within("--confirm-window", self.confirm_window, 1, WINDOW_MAX)
        _within("--credit", self.credit, 1, CREDIT_MAX)
        _within("--processes", self.processes, 1, PROCESSES_MAX)
        if self.count is None and self.time_s is None:
            raise InvalidArgument("give --count N (messages in all) or --time SECONDS")
        if self.count is not None:
            _within("--count", self.count, 1, 2**62)
            if self.producers and self.count < self.producers:
                raise InvalidArgument(
                    f"--count {self.count} is below --producers {self.producers}: "
                    "each producer publishes at least one message"
                )
        if self.time_s is not None and not self.time_s > 0:
            raise InvalidArgument(f"--time must be positive, got {self.time_s:g}")
        if self.producers == 0 and self.time_s is None:
            raise InvalidArgument("with --producers 0, give --time SECONDS (how long to consume)")
        if self.rate is not None and not self.rate > 0:
            raise InvalidArgument(f"--rate must be positive, got {self.rate:g}")
        if not self.drain_timeout_s > 0:
            raise InvalidArgument(f"--drain-timeout must be positive, got {self.drain_timeout_s:g}")
        if self.reconnect_timeout_s < 0:
            raise InvalidArgument(
                f"--reconnect-timeout must be 0 (off) or more, got {self.reconnect_timeout_s:g}"
            )
        if not self.timeout_s > 0:
            raise InvalidArgument(f"--timeout must be positive, got {self.timeout_s:g}")
        if (self.user is None) != (self.password is None):
            raise InvalidArgument("--user and --password go together")


def _within(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{flag} must be {low}..{high}, got {value}")


def stream_names(names: str, count: str | None) -> tuple[str, ...]:
    """stream-perf-test's --streams / --stream-count: `a,b,c` as they are; with a count N
    (or a range A-B) and one name, the name is a printf pattern (`s-%d`, `s-%02d`) or, without
    `%`, the prefix of `NAME-%0Wd` (W the digits of the largest number)."""
    listed = tuple(n.strip() for n in names.split(",") if n.strip())
    if not listed:
        raise InvalidArgument("--stream: give a stream name")
    if count is None:
        if any("%" in n for n in listed):
            raise InvalidArgument("--stream: a % pattern needs --stream-count")
        return listed
    if len(listed) != 1:
        raise InvalidArgument("--stream-count takes one --stream name or pattern, not a list")
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", count.strip())
    if match is None:
        raise InvalidArgument(f"--stream-count: expected N or A-B, got {count!r}")
    first, last = (
        (1, int(match.group(1)))
        if match.group(2) is None
        else (
            int(match.group(1)),
            int(match.group(2)),
        )
    )
    if not 1 <= first <= last or last - first + 1 > STREAM_COUNT_MAX:
        raise InvalidArgument(
            f"--stream-count: expected 1 <= A <= B with at most {STREAM_COUNT_MAX} streams, "
            f"got {count!r}"
        )
    pattern = listed[0]
    if "%" not in pattern:
        pattern = f"{pattern}-%0{len(str(last))}d"
    try:
        return tuple(pattern % i for i in range(first, last + 1))
    except (TypeError, ValueError) as error:
        raise InvalidArgument(f"--stream: bad pattern {listed[0]!r} ({error})") from None


def parse_offset(text: str) -> Start:
    """--offset: first, last, next, an offset N, or an ISO 8601 timestamp."""
    if text in ("first", "last", "next"):
        return text
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(
            f"--offset: expected first, last, next, an offset or an ISO 8601 timestamp "
            f"(2026-11-26T07:45:54Z), got {text!r}"
        ) from None
    if moment.tzinfo is None:
        raise InvalidArgument(f"--offset: give the timestamp's zone (Z or +HH:MM): {text!r}")
    return moment


def routing_keys(partitions: int, routing: str, binding_keys: tuple[str, ...]) -> tuple[str, ...]:
    """One group key per partition, in partition order: the binding keys for key routing;
    for hash routing the first `key-N` that MurmurHash3 sends to each partition."""
    if routing == "key":
        return binding_keys
    found: dict[int, str] = {}
    for n in range(ROUTING_KEY_TRIES_MAX):
        key = f"key-{n}"
        found.setdefault(hash_partition(key, partitions), key)
        if len(found) == partitions:
            return tuple(found[p] for p in range(partitions))
    raise AssertionError(f"no key routes to some of {partitions} partitions")


def split(total: int, parts: int) -> list[int]:
    """`total` as `parts` near-equal counts, larger first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def assign(
    settings: Settings,
    targets: tuple[str, ...],
    partitions_of: dict[str, tuple[str, ...]],
    keys_of: dict[str, tuple[str, ...]],
) -> list[WorkerPlan]:
    """Producers and consumers round-robin over the targets, each client's URL list rotated
    so that they start at different endpoints; producers over `processes` worker processes,
    consumers over as many others."""
    urls = settings.urls
    counts = (
        split(settings.count, settings.producers)
        if settings.count is not None and settings.producers
        else [None] * settings.producers
    )
    producers = [
        ProducerPlan(
            index=i,
            target=targets[i % len(targets)],
            urls=_rotated(urls, i),
            count=counts[i],
            routing_keys=keys_of.get(targets[i % len(targets)], ()),
        )
        for i in range(settings.producers)
    ]
    consumers = [
        ConsumerPlan(
            index=j,
            target=targets[j % len(targets)],
            streams=partitions_of.get(targets[j % len(targets)], (targets[j % len(targets)],)),
            urls=_rotated(urls, settings.producers + j),
        )
        for j in range(settings.consumers)
    ]
    workers: list[WorkerPlan] = []
    for p in range(min(settings.processes, len(producers))):
        workers.append(WorkerPlan("producers", producers=tuple(producers[p :: settings.processes])))
    for p in range(min(settings.processes, len(consumers))):
        workers.append(WorkerPlan("consumers", consumers=tuple(consumers[p :: settings.processes])))
    return workers


def _rotated(urls: tuple[str, ...], i: int) -> tuple[str, ...]:
    k = i % len(urls)
    return urls[k:] + urls[:k]
