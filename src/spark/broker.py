"""The connector's I/O: Spate through spate.client.aio, from blocking code (Spark's Python
workers call plain functions). Each call runs its own event loop and closes every connection
it opened: nothing here survives pickling, and nothing is opened before it is needed.

- `metadata`: each stream's partitions, first and end offsets (`STREAM/$info`).
- `offsets_at`: the first offset at or after a timestamp, per partition.
- `RangeReader`: a task's read of [start, end) of one partition, as Arrow record batches.
- `PartitionWriter`: a task's rows to a stream, each destination partition through a named
  producer (deduplication, ADR 0011), so a retried task stores nothing twice.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from spate.client.aio import AsyncConsumer, AsyncProducer, runtime_information
from spate.client.core import SubEntryBatch
from spate.client.errors import AttachRefused
from spate.client.messages import read_bodies, read_columns
from spate.core.bulk import Frame
from spate.core.ids import offset_from_symbol
from spate.core.superstreams import hash_partition
from spate.spark import limits
from spate.spark.options import Connection, OptionError
from spate.spark.planning import (
    Chunk,
    Chunker,
    Columns,
    FrameBuffer,
    Key,
    Loss,
    Metadata,
    Offsets,
    PartitionState,
    Range,
    RowBuffer,
)

log = logging.getLogger("spate.spark")
T = TypeVar("T")
superstream_partitions_max = 1024


class DataLoss(RuntimeError):
    """Retention removed offsets a query still needed (failOnDataLoss=true)."""


class ReadFailed(RuntimeError):
    """A task could not read its planned range (the message names partition and offsets)."""


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def _offset(symbol: Any) -> int | None:
    return None if symbol is None else offset_from_symbol(str(symbol))


def _state(entry: dict[str, Any]) -> PartitionState:
    first, end = _offset(entry.get("earliest-offset")), _offset(entry.get("end-offset"))
    if end is None:
        latest = _offset(entry.get("latest-offset"))
        end = 0 if latest is None else latest + 1
    stamp = entry.get("last-timestamp")
    return PartitionState(
        first=end if first is None else first,
        end=end,
        last_timestamp_ms=None if stamp is None else int(stamp),
    )


UNAVAILABLE_RETRY_S = 0.2


async def _metadata(connection: Connection, streams: tuple[str, ...]) -> Metadata:
    """Every partition's retained range; a partition without a live leader (an election, or a
    stream created a moment ago whose leader the gateway has not learnt yet) is asked again
    until `connection.timeout_s` has passed (found by CI: a write planned right after its
    stream was created failed at once)."""
    deadline = asyncio.get_running_loop().time() + connection.timeout_s
    while True:
        answers = await asyncio.gather(
            *(
                runtime_information(
                    list(connection.urls),
                    stream,
                    timeout_s=connection.timeout_s,
                    user=connection.user,
                    password=connection.password,
                    tls=connection.ssl_context(),
                )
                for stream in streams
            )
        )
        out: Metadata = {}
        missing: list[str] = []
        for stream, info in zip(streams, answers, strict=True):
            for entry in info["partitions"]:
                if entry.get("available") is False:
                    missing.append(
                        f"stream {stream!r} partition {entry['partition']} is not available at "
                        f"{info.get('node')} (leader {entry.get('leader')}); try again"
                    )
                    continue
                out[(stream, int(str(entry["partition"])))] = _state(entry)
        if not missing:
            return out
        if asyncio.get_running_loop().time() >= deadline:
            raise ReadFailed(f"after {connection.timeout_s:g} s: {missing[0]}")
        await asyncio.sleep(UNAVAILABLE_RETRY_S)


def metadata(connection: Connection, streams: tuple[str, ...]) -> Metadata:
    """Every partition of `streams` with its retained range. Unknown streams raise
    `OptionError` with the broker's reason."""
    try:
        return _run(_metadata(connection, streams))
    except AttachRefused as refused:
        raise OptionError(f"option stream: {refused}") from None


def super_stream_partitions(connection: Connection, name: str) -> tuple[str, ...]:
    """The partition streams of a super stream, in partition order, from its `$info` (made
    with a partition count, `NAME-0` ..; with binding keys, `NAME-<key>` ..)."""

    async def ask() -> tuple[str, ...]:
        try:
            info = await runtime_information(
                list(connection.urls), name, timeout_s=connection.timeout_s,
                user=connection.user, password=connection.password,
                tls=connection.ssl_context(),
            )  # fmt: skip
        except AttachRefused as refused:
            raise OptionError(f"option superStream: {refused}") from None
        streams = info.get("partition-streams")
        if streams is None:
            raise OptionError(f"option superStream: {name!r} is a stream; use option stream")
        return tuple(str(stream) for stream in streams)

    return _run(ask())


def offsets_at(connection: Connection, meta: Metadata, timestamp_ms: int) -> Offsets:
    """Per partition, the first offset whose append time is at or after `timestamp_ms`; the
    partition's end when every message is older (Kafka's startingTimestamp with the
    `latest` strategy)."""

    async def one(key: Key, state: PartitionState) -> int:
        if state.first == state.end or (state.last_timestamp_ms or 0) < timestamp_ms:
            return state.end
        consumer = await AsyncConsumer.connect(
            list(connection.urls),
            key[0],
            partition=key[1],
            start=datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC),
            credit=1,
            timeout_s=connection.timeout_s,
            user=connection.user,
            password=connection.password,
            tls=connection.ssl_context(),
        )
        try:
            event = await consumer.receive(timeout=connection.timeout_s)
        finally:
            await consumer.close()
        return event.offset

    async def every() -> Offsets:
        keys = sorted(meta)
        found = await asyncio.gather(*(one(key, meta[key]) for key in keys))
        return dict(zip(keys, found, strict=True))

    return _run(every())


# ---------------------------------------------------------------------------------------------
# Reading


def _test_mode(marker: str | None) -> str | None:
    """Tests only (option _testFailMarker): what the marker file says (`exit`, `hang`, or
    `raise` when empty), None when there is no marker file."""
    if marker is None:
        return None
    try:
        return Path(marker).read_text().strip() or "raise"
    except FileNotFoundError:
        return None


def _fail_once(marker: str | None) -> bool:
    """Tests only (option _testFailMarker): True the first time, if the marker file exists."""
    if marker is None:
        return False
    try:
        os.remove(marker)
    except FileNotFoundError:
        return False
    return True


class _ReadState:
    """A read in progress: the next offset wanted, whether the range is in, the rows received
    and not yet handed to Spark (`buffer`: a `planning.RowBuffer` or `FrameBuffer`)."""

    def __init__(self, start: int, done: bool, buffer: RowBuffer | FrameBuffer) -> None:
        self.next, self.done, self.buffer = start, done, buffer
        self.wake = asyncio.Event()

    def took(self, next_offset: int, end: int) -> None:
        self.next = next_offset
        if next_offset >= end:
            self.done = True
            self.wake.set()
        elif self.buffer.full():
            self.wake.set()


class RangeReader:
    """Reads [start, end) of one partition on an executor and yields Arrow record batches of
    `columns`. One consumer link, `credit` messages in flight; it follows the partition across
    a leader change (the client reconnects and resumes after the last offset it handed out).

    A batch holds at most `limits.rows_per_batch` rows and `batch_bytes` bytes of messages
    (at least one row). A first offset above `start` means retention removed [start, first):
    `DataLoss` when `fail_on_data_loss`, else a warning and the rest is read."""

    def __init__(
        self,
        connection: Connection,
        r: Range,
        columns: Columns,
        *,
        credit: int,
        fail_on_data_loss: bool,
        fail_marker: str | None = None,
        batch_bytes: int = limits.batch_bytes_default,
    ) -> None:
        assert batch_bytes > 0
        self.connection, self.range, self.columns = connection, r, columns
        self.batch_bytes = batch_bytes
        self.credit = max(1, min(credit, r.count))
        self.fail_on_data_loss = fail_on_data_loss
        self.fail_marker = fail_marker
        self.skipped: list[Loss] = []
        self.bulk = False
        """`frame_batches`: whether the broker granted bulk deliveries."""

    def batches(self, make: Callable[[dict[str, list[Any]]], Any]) -> Iterator[Any]:
        """`make(columns)` turns the column lists into one record batch (deliveries one by
        one, the per-row way)."""
        r = self.range
        buffer = RowBuffer(limits.rows_per_batch, self.batch_bytes)
        state = _ReadState(r.start, r.count == 0, buffer)

        def handler(got: list[int], got_stamps: list[int], got_raws: list[bytes]) -> None:
            """A burst: offsets increase; keep those in [next, end)."""
            if state.done:
                return
            first = bisect.bisect_left(got, state.next)
            last = bisect.bisect_left(got, r.end, first)
            if first == last:
                return
            if first == 0 and last == len(got):
                buffer.add(got, got_stamps, got_raws)
            else:
                buffer.add(got[first:last], got_stamps[first:last], got_raws[first:last])
            state.took(got[last - 1] + 1, r.end)

        def take() -> tuple[int, int, Any]:
            offsets, stamps, raws = buffer.take()
            return offsets[0], offsets[-1], lambda: make(self._columns(offsets, stamps, raws))

        yield from self._read(state, {"batch_handler": handler}, take)

    def frame_batches(self, make: Callable[[list[Frame]], Any]) -> Iterator[Any]:
        """`make(frames)` turns bulk frames (ADR 0029) into one record batch (`columns`). The
        link asks for bulk deliveries; a broker that does not grant them sends messages one by
        one, which the client hands over as frames all the same."""
        r = self.range
        buffer = FrameBuffer(limits.rows_per_batch, self.batch_bytes)
        state = _ReadState(r.start, r.count == 0, buffer)

        def handler(got: list[Frame]) -> None:
            """A burst of frames: offsets increase; keep the rows in [next, end)."""
            for frame in got:
                if state.done:
                    return
                offsets = frame.offsets
                first = bisect.bisect_left(offsets, state.next, frame.first, frame.stop)
                last = bisect.bisect_left(offsets, r.end, first, frame.stop)
                if first == last:
                    continue
                buffer.add(
                    frame
                    if first == frame.first and last == frame.stop
                    else frame.rows(first, last)
                )
                state.took(offsets[last - 1] + 1, r.end)

        def take() -> tuple[int, int, Any]:
            taken = buffer.take()
            last = taken[-1]
            first_offset = taken[0].offsets[taken[0].first]
            return first_offset, last.offsets[last.stop - 1], lambda: make(taken)

        yield from self._read(state, {"bulk_handler": handler}, take)

    def _read(
        self, state: _ReadState, handler: dict[str, Any], take: Callable[[], tuple[int, int, Any]]
    ) -> Iterator[Any]:
        """The read loop: one consumer link with `handler` (which fills `state.buffer`), a
        batch each time the buffer is full (rows or bytes) or the range's end is in; `take()`
        cuts the next batch off the buffer: (first offset, last offset, a function making
        it). Nothing is received while Spark holds a batch (the loop is not running), so the
        buffer stays near one batch."""
        r = self.range
        loop = asyncio.new_event_loop()
        consumer: AsyncConsumer | None = None
        try:
            consumer = loop.run_until_complete(
                AsyncConsumer.connect(
                    list(self.connection.urls),
                    r.stream,
                    partition=r.partition,
                    start=r.start,
                    credit=self.credit,
                    timeout_s=self.connection.timeout_s,
                    reconnect_timeout_s=limits.reconnect_timeout_s,
                    user=self.connection.user,
                    password=self.connection.password,
                    tls=self.connection.ssl_context(),
                    **handler,
                )
            )
            self.bulk = consumer.bulk
            expected = r.start
            while True:
                if not state.done and not state.buffer.full():
                    state.wake.clear()
                    waiter = loop.create_task(state.wake.wait())
                    done = loop.create_task(consumer.wait())
                    finished, _ = loop.run_until_complete(
                        asyncio.wait(
                            {waiter, done},
                            timeout=self.connection.timeout_s,
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                    )
                    waiter.cancel()
                    done.cancel()
                    if done in finished and not state.done:
                        raise ReadFailed(
                            f"stream {r.stream!r} partition {r.partition}: reading offsets "
                            f"[{state.next}, {r.end}) failed: {done.exception() or 'closed'}"
                        )
                    if not finished and not state.buffer.rows:
                        raise ReadFailed(
                            f"stream {r.stream!r} partition {r.partition}: no message at offset "
                            f"{state.next} within {self.connection.timeout_s:g} s (planned "
                            f"range [{r.start}, {r.end}))"
                        )
                if not state.buffer.rows:
                    if state.done:
                        break
                    continue
                first, last, batch = take()
                if first > expected:
                    self._lost(Loss(r.stream, r.partition, expected, first))
                expected = last + 1
                if _fail_once(self.fail_marker):
                    raise ReadFailed(f"injected read failure (test) at offset {first}")
                yield batch()
        finally:
            if consumer is not None:
                loop.run_until_complete(consumer.close())
            loop.close()

    def _lost(self, loss: Loss) -> None:
        if self.fail_on_data_loss:
            raise DataLoss(
                loss.describe() + ". Set failOnDataLoss=false to skip lost offsets with a warning."
            )
        log.warning("skipping lost offsets (failOnDataLoss=false): %s", loss.describe())
        self.skipped.append(loss)

    def _columns(
        self, offsets: list[int], stamps: list[int], raws: list[bytes]
    ) -> dict[str, list[Any]]:
        names = self.columns.names
        out: dict[str, list[Any]] = {}
        r = self.range
        if "offset" in names:
            out["offset"] = offsets
        if "timestamp" in names:
            out["timestamp"] = [stamp * 1000 for stamp in stamps]  # Arrow µs
        if "stream" in names:
            out["stream"] = [r.stream] * len(offsets)
        if "partition" in names:
            out["partition"] = [r.partition] * len(offsets)
        want_key = "key" in names
        want_props = "properties" in names
        want_app = "application_properties" in names
        if not (want_key or want_props or want_app):
            if "value" in names:
                out["value"] = read_bodies(raws)
            return out
        values, keys, props, apps = read_columns(
            raws, properties=want_props, application_properties=want_app
        )
        for name, column in (
            ("key", keys),
            ("value", values),
            ("properties", props),
            ("application_properties", apps),
        ):
            if name in names:
                out[name] = column
        return out


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass
class Written:
    """What one writing task did: rows sent and stored, rows the broker already had (a retried
    task's repeats), per destination partition."""

    rows: int = 0
    skipped: int = 0
    """Rows whose publishing id was at or below the name's last stored id (not sent again)."""


ID_EPOCH_SHIFT = 32
"""A streaming task's publishing ids are (epoch << 32) + row index + 1: increasing across the
micro-batches of one (query, Spark partition) producer name, equal for a retry."""
rows_per_task_max = 2**ID_EPOCH_SHIFT - 2
Row = tuple[int | None, str | None, bytes]
"""A row to write: (explicit partition, key, the encoded message)."""


class PartitionWriter:
    """One writing task: rows go to their partition (explicit, by key hash as the broker
    routes keys, else spread), each partition through a producer named `name`; row i has the
    publishing id `id_base` + i + 1, and rows travel in sub-entries cut by `planning.Chunker`
    (one transfer, one id — its last row's — per chunk)."""

    def __init__(
        self,
        connection: Connection,
        stream: str,
        partitions: int,
        *,
        name: str,
        id_base: int,
        spread_from: int,
        window: int,
        fail_marker: str | None = None,
        rows_per_chunk: int = limits.rows_per_sub_entry,
    ) -> None:
        assert partitions > 0 and window > 0 and id_base >= 0
        self.connection, self.stream, self.partitions = connection, stream, partitions
        self.name, self.id_base, self.spread_from, self.window = name, id_base, spread_from, window
        self.fail_marker = fail_marker
        self.loop = asyncio.new_event_loop()
        self.producers: dict[int, AsyncProducer] = {}
        self.last_ids: dict[int, int] = {}
        self.errors: list[BaseException] = []
        self.row = 0
        self.written = Written()
        self.chunker = Chunker(rows_per_chunk, limits.sub_entry_bytes)

    def _explicit(self, explicit: int) -> int:
        if not 0 <= explicit < self.partitions:
            raise ValueError(
                f"column partition: {explicit} is not a partition of stream "
                f"{self.stream!r} (0..{self.partitions - 1})"
            )
        return explicit

    async def _producer(self, partition: int) -> AsyncProducer:
        producer = self.producers.get(partition)
        if producer is None:
            producer = await AsyncProducer.connect(
                list(self.connection.urls),
                self.stream,
                partition=partition,
                window=max(2, self.window // self.chunker.rows_per_chunk),
                timeout_s=self.connection.timeout_s,
                reconnect_timeout_s=limits.reconnect_timeout_s,
                user=self.connection.user,
                password=self.connection.password,
                tls=self.connection.ssl_context(),
                name=self.name,
            )
            self.producers[partition] = producer
            last = producer.last_publishing_id()
            self.last_ids[partition] = -1 if last is None else last
        return producer

    def _failed(self, error: BaseException | None) -> None:
        if error is not None:
            self.errors.append(error)

    async def _ship(self, chunk: Chunk) -> None:
        producer = self.producers[chunk.partition]
        body = SubEntryBatch(chunk.messages)
        if producer.has_room():
            producer.send_nowait(body, self._failed, publishing_id=chunk.publishing_id)
        else:  # waits for room in the window
            future = await producer.send(body, chunk.publishing_id)
            future.add_done_callback(
                lambda f: self._failed(None if f.cancelled() else f.exception())
            )

    async def _send(self, rows: list[Row]) -> None:
        """Rows are (explicit partition, key, the encoded message: `encode_plain` or
        `MessageParts.envelope()`)."""
        if self.row + len(rows) > rows_per_task_max:
            raise ValueError(f"a writing task holds more than {rows_per_task_max} rows")
        add, row, partitions = self.chunker.add, self.row, self.partitions
        id_base, spread = self.id_base + 1, self.spread_from
        for explicit, key, message in rows:
            if explicit is not None:
                partition = self._explicit(explicit)
            elif key is not None:
                partition = hash_partition(key, partitions)
            else:
                partition = (spread + row) % partitions
            publishing_id = id_base + row
            row += 1
            if partition not in self.producers:
                await self._producer(partition)
            if publishing_id <= self.last_ids[partition]:
                self.written.skipped += 1
                continue
            chunk = add(partition, row - 1, publishing_id, message)
            self.written.rows += 1
            if chunk is not None:
                await self._ship(chunk)
        self.row = row
        if self.errors:
            raise self.errors[0]

    async def _drain(self) -> None:
        for chunk in self.chunker.drain():
            await self._ship(chunk)

    def send(self, rows: list[Row]) -> None:
        mode = _test_mode(self.fail_marker)
        if mode is None:
            self.loop.run_until_complete(self._send(rows))
            return
        # Tests only: store half of these rows for sure, then die or hang mid-task.
        half = max(1, len(rows) // 2)
        self.loop.run_until_complete(self._send(rows[:half]))
        self.flush()
        if _fail_once(self.fail_marker):
            assert self.fail_marker is not None
            if mode == "exit":
                log.warning("test: killing this Python worker after %d rows", self.row)
                os._exit(17)  # the worker dies mid-task, as on a killed executor
            Path(self.fail_marker + ".hung").touch()
            time.sleep(limits.test_hang_s)  # until the test stops the query
        self.loop.run_until_complete(self._send(rows[half:]))

    def flush(self) -> None:
        async def all_confirmed() -> None:
            await self._drain()
            await asyncio.gather(*(p.flush() for p in self.producers.values()))

        self.loop.run_until_complete(all_confirmed())
        if self.errors:
            raise self.errors[0]

    def close(self) -> Written:
        try:
            self.flush()
        finally:

            async def close_all() -> None:
                await asyncio.gather(*(p.close() for p in self.producers.values()))

            self.loop.run_until_complete(close_all())
            self.loop.close()
        return self.written
