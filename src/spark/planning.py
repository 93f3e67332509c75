"""Offset planning, pure: what a query reads next, split into tasks. No Spark, no I/O.

An offset is the next message a query will read from a partition (Kafka's meaning). Spark
checkpoints them as Kafka's JSON: {"orders": {"0": 23, "1": 5}}. A task reads the half-open
range [start, end) of one partition.
"""

from __future__ import annotations

from dataclasses import dataclass

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
