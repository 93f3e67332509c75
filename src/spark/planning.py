"""Offset planning, pure: what a query reads next, split into tasks; which received rows make
one Arrow batch; which written rows share a sub-entry. No Spark, no I/O.

An offset is the next message a query will read from a partition (Kafka's meaning). Spark
checkpoints them as Kafka's JSON: {"orders": {"0": 23, "1": 5}}. A task reads the half-open
range [start, end) of one partition.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from spate.core.bulk import Frame
from spate.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError

Key = tuple[str, int]
"""(stream, partition)."""
Offsets = dict[Key, int]


@dataclass(frozen=True)
class PartitionState:
    """A partition's retained log as `$info` reported it."""

    first: int
    """The first retained offset (== end when empty)."""
    end: int
    """The offset the next message will get."""
    last_timestamp_ms: int | None


Metadata = dict[Key, PartitionState]


@dataclass(frozen=True)
class Range:
    """One task: the offsets [start, end) of one partition."""

    stream: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Columns:
    """Which columns a read produces, in order, and which sections that needs decoded."""

    names: tuple[str, ...]
    nullable: tuple[bool, ...]
    """As the schema Spark planned with says (Arrow batches must match it exactly)."""

    @property
    def decode(self) -> bool:
        return bool({"key", "value", "properties", "application_properties"} & set(self.names))


@dataclass(frozen=True)
class Loss:
    """Offsets [start, first) of a partition the query still needed and retention removed."""

    stream: str
    partition: int
    start: int
    first: int

    def describe(self) -> str:
        return (
            f"partition {self.partition} of stream {self.stream!r}: offsets "
            f"[{self.start}, {self.first}) were deleted by retention before the query read "
            f"them ({self.first - self.start} messages); the first retained offset is "
            f"{self.first}"
        )


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (stream, partition), offset in sorted(offsets.items()):
        out.setdefault(stream, {})[str(partition)] = offset
    return out


def from_json(given: dict[str, dict[str, int]]) -> Offsets:
    return {
        (stream, int(partition)): int(offset)
        for stream, partitions in given.items()
        for partition, offset in partitions.items()
    }


def resolve(spec: OffsetSpec, metadata: Metadata, *, name: str, default: int) -> Offsets:
    """Concrete offsets for every partition in `metadata`. In JSON, -2 is the partition's
    first retained offset and -1 its end; partitions the JSON leaves out get `default`
    (EARLIEST or LATEST). A JSON partition that does not exist is an error naming it."""
    if spec == "earliest":
        return {key: state.first for key, state in metadata.items()}
    if spec == "latest":
        return {key: state.end for key, state in metadata.items()}
    assert isinstance(spec, dict)
    given = from_json(spec)
    missing = sorted(set(given) - set(metadata))
    if missing:
        stream, partition = missing[0]
        raise OptionError(f"option {name}: stream {stream!r} has no partition {partition}")
    out: Offsets = {}
    for key, state in metadata.items():
        value = given.get(key, default)
        out[key] = state.first if value == EARLIEST else state.end if value == LATEST else value
    return out


def losses(start: Offsets, metadata: Metadata) -> list[Loss]:
    """Partitions whose next offset retention already removed."""
    return [
        Loss(key[0], key[1], offset, metadata[key].first)
        for key, offset in sorted(start.items())
        if key in metadata and offset < metadata[key].first
    ]


def with_new_partitions(start: Offsets, metadata: Metadata) -> Offsets:
    """A partition that appeared after the query started is read from its first offset
    (Kafka's rule for new partitions)."""
    return {**{key: state.first for key, state in metadata.items()}, **start}


def limit(start: Offsets, latest: Offsets, max_rows: int | None) -> Offsets:
    """The end of the next micro-batch: everything up to `latest`, or `max_rows` of it shared
    in proportion to each partition's backlog (Kafka's rateLimit), the remainder one by one to
    the largest backlogs; never behind `start`."""
    end = {key: max(latest.get(key, offset), offset) for key, offset in start.items()}
    for key, offset in latest.items():
        end.setdefault(key, offset)
    if max_rows is None:
        return end
    backlog = {key: end[key] - start.get(key, end[key]) for key in end}
    backlog = {key: n for key, n in backlog.items() if n > 0}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    take = {key: n * max_rows // total for key, n in backlog.items()}
    left = max_rows - sum(take.values())
    for key in sorted(backlog, key=lambda k: (-backlog[k], k)):
        if left <= 0:
            break
        if take[key] < backlog[key]:
            take[key] += 1
            left -= 1
    limited = dict(end)
    for key, n in take.items():
        limited[key] = start[key] + n
    return limited


def ranges(
    start: Offsets,
    end: Offsets,
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[Range]:
    """One range per partition with something to read, split so that no range holds more
    than `max_records_per_partition` messages and (Kafka's minPartitions) there are at least
    `min_partitions` ranges, the largest split first; a partition lagging far behind is thus
    read by several tasks at once."""
    whole = [
        Range(stream, partition, start.get((stream, partition), e), e)
        for (stream, partition), e in sorted(end.items())
        if e > start.get((stream, partition), e)
    ]
    pieces: list[tuple[Range, int]] = []
    for r in whole:
        parts = 1
        if max_records_per_partition is not None:
            parts = -(-r.count // max_records_per_partition)
        pieces.append((r, parts))
    if min_partitions is not None:
        total = sum(r.count for r in whole)
        have = sum(parts for _, parts in pieces)
        while have < min_partitions and total > 0:
            # split the range whose pieces are largest once more
            at = max(range(len(pieces)), key=lambda i: pieces[i][0].count / pieces[i][1])
            r, parts = pieces[at]
            if r.count <= parts:
                break  # one message per piece everywhere: nothing left to split
            pieces[at] = (r, parts + 1)
            have += 1
    out: list[Range] = []
    for r, parts in pieces:
        size, extra = divmod(r.count, parts)
        at = r.start
        for i in range(parts):
            step = size + (1 if i < extra else 0)
            out.append(Range(r.stream, r.partition, at, at + step))
            at += step
        assert at == r.end, (r, parts)
    return out


# ---------------------------------------------------------------------------------------------
# Reading: received rows into Arrow batches


def rows_that_fit(sizes: Iterable[int], rows_max: int, bytes_max: int) -> int:
    """How many of the front rows (message sizes in bytes, in order) make the next batch: at
    most `rows_max` rows and `bytes_max` bytes, at least one row (a larger row travels
    alone)."""
    total = n = 0
    for size in sizes:
        if n >= rows_max or (n and total + size > bytes_max):
            break
        total += size
        n += 1
    return n


class RowBuffer:
    """A reading task's rows received one by one (offsets, timestamps, messages) and not yet
    handed to Spark; `take` cuts the next batch by `rows_that_fit`."""

    def __init__(self, rows_max: int, bytes_max: int) -> None:
        assert rows_max > 0 and bytes_max > 0
        self.rows_max, self.bytes_max = rows_max, bytes_max
        self.offsets: list[int] = []
        self.stamps: list[int] = []
        self.raws: list[bytes] = []
        self.bytes = 0

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def full(self) -> bool:
        return self.rows >= self.rows_max or self.bytes >= self.bytes_max

    def add(self, offsets: list[int], stamps: list[int], raws: list[bytes]) -> None:
        self.offsets += offsets
        self.stamps += stamps
        self.raws += raws
        self.bytes += sum(map(len, raws))

    def take(self) -> tuple[list[int], list[int], list[bytes]]:
        n = rows_that_fit(map(len, self.raws), self.rows_max, self.bytes_max)
        taken = (self.offsets[:n], self.stamps[:n], self.raws[:n])
        del self.offsets[:n], self.stamps[:n], self.raws[:n]
        self.bytes -= sum(map(len, taken[2]))
        return taken


def frame_bytes(frame: Frame) -> int:
    """The message bytes of the rows in use."""
    return 0 if not len(frame) else frame.ends[frame.stop - 1] - frame.start(frame.first)


class FrameBuffer:
    """A reading task's rows received in bulk frames (ADR 0029) and not yet handed to Spark;
    `take` cuts the next batch: at most `rows_max` rows and `bytes_max` bytes of messages, at
    least one row (a larger message travels alone), cutting inside a frame where a limit falls
    (`Frame.rows`: a view, no copy). Rows of 16 KiB cut by rows alone made 128 MiB batches
    (benchmarks/RESULTS.md §30)."""

    def __init__(self, rows_max: int, bytes_max: int) -> None:
        assert rows_max > 0 and bytes_max > 0
        self.rows_max, self.bytes_max = rows_max, bytes_max
        self.frames: deque[Frame] = deque()
        self.rows = self.bytes = 0

    def full(self) -> bool:
        return self.rows >= self.rows_max or self.bytes >= self.bytes_max

    def add(self, frame: Frame) -> None:
        self.frames.append(frame)
        self.rows += len(frame)
        self.bytes += frame_bytes(frame)

    def take(self) -> list[Frame]:
        out: list[Frame] = []
        rows_left, bytes_left = self.rows_max, self.bytes_max
        while self.frames and rows_left > 0:
            frame = self.frames[0]
            begin = frame.start(frame.first)
            stop = min(frame.stop, frame.first + rows_left)
            fit = bisect.bisect_right(frame.ends, begin + bytes_left, frame.first, stop)
            if fit == frame.first:
                if out:
                    break  # not one more row fits
                fit = frame.first + 1  # a row larger than bytes_max: alone
            size = frame.ends[fit - 1] - begin
            if fit == frame.stop:
                self.frames.popleft()
                out.append(frame)
            else:
                out.append(frame.rows(frame.first, fit))
                self.frames[0] = frame.rows(fit, frame.stop)
            rows_left -= fit - frame.first
            bytes_left -= size
            self.rows -= fit - frame.first
            self.bytes -= size
            if fit < frame.stop:
                break  # a limit fell inside this frame
        assert out or not self.frames
        return out


# ---------------------------------------------------------------------------------------------
# Writing: rows into sub-entries


@dataclass(frozen=True)
class Chunk:
    """Consecutive rows of one writing task for one destination partition, sent as one
    sub-entry (ADR 0017) whose publishing id is its last row's: the broker stores it, or drops
    it as a repeat, as a whole."""

    partition: int
    publishing_id: int
    messages: list[bytes]


class Chunker:
    """Which rows travel together, decided from the rows alone so that a retried task cuts the
    same chunks (ADR 0019 addendum): row i of a task falls in grid cell i // `rows_per_chunk`,
    and a chunk holds one cell's rows for one partition, cut early only when its messages
    would pass `bytes_per_chunk` (each counted with its 4-byte length). Rows at or below a
    partition's `last_ids` entry (the name's last stored id, read on attach) are left out, so
    what a first attempt stored is never part of a retry's chunk.

    `add` returns the chunks it closed; `drain` closes the rest (end of the task, or a flush)."""

    def __init__(self, rows_per_chunk: int, bytes_per_chunk: int) -> None:
        assert rows_per_chunk > 0 and bytes_per_chunk > 0
        self.rows_per_chunk, self.bytes_per_chunk = rows_per_chunk, bytes_per_chunk
        self._open: dict[int, tuple[int, int, int, list[bytes]]] = {}
        """partition -> (grid cell, last publishing id, bytes, messages)."""

    def add(self, partition: int, row: int, publishing_id: int, message: bytes) -> Chunk | None:
        cell = row // self.rows_per_chunk
        size = 4 + len(message)
        out = None
        open_ = self._open.get(partition)
        if open_ is not None:
            open_cell, last_id, total, messages = open_
            assert publishing_id > last_id, "publishing ids increase"
            if open_cell == cell and total + size <= self.bytes_per_chunk:
                messages.append(message)
                self._open[partition] = (cell, publishing_id, total + size, messages)
                return None
            out = Chunk(partition, last_id, messages)
        self._open[partition] = (cell, publishing_id, size, [message])
        return out

    def drain(self) -> list[Chunk]:
        out = [Chunk(p, last_id, messages) for p, (_, last_id, _, messages) in self._open.items()]
        self._open.clear()
        return out
