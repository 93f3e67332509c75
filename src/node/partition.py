"""PartitionShell: the asyncio shell around one PartitionLog (spate.core.backend.Partition).

The log core is synchronous; this shell gives it a loop-friendly face:

- `append(records)` writes the chunk at once (page cache, on the loop) and returns a future that
  resolves to the first offset once an fsync covering it has completed;
- fsync runs on a dedicated one-thread executor, one at a time. Appends that arrive while an
  fsync runs wait for the next one, which then covers all of them: group commit. `fsyncs`
  counts the group fsyncs run;
- after every completed fsync the listeners are called (scheduled on the loop);
- consumers only ever see durable data: read/resolve/end_offset/info use the durable end;
- a retention task applies the stream's retention every `retention_interval_ms`, between
  fsyncs (never while the fsync thread works on the log's files);
- if an fsync (or a write) fails, every waiting append fails with StorageFailure and every later
  append is refused with the reason: the page cache may have dropped the data, so no later fsync
  could be trusted to cover it (see "fsyncgate");
- at most `PENDING_APPENDS_MAX` appends may wait for durability at a time; one more fails at once
  with ResourceLimitExceeded (retryable) rather than queueing without bound. The gateway stops
  granting credit well before that (limits.producer_unconfirmed_max per connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spate.core import limits
from spate.core.backend import (
    ChunkView,
    LocalPartition,
    OffsetSpec,
    PartitionInfo,
    ProducerInfo,
    PublishingIds,
)
from spate.core.errors import BrokerError, ResourceLimitExceeded, StorageFailure, Unavailable
from spate.core.ids import NodeId, Offset, PartitionId, StreamName
from spate.node.log import FileStorage, LogConfig, PartitionLog, Storage
from spate.node.log.producers import keep_new

log = logging.getLogger(__name__)

PENDING_APPENDS_MAX = limits.partition_pending_appends_max
"""Appends waiting for their fsync, per partition. (To move to spate.core.limits as
`partition_pending_appends_max`.)"""
RETENTION_INTERVAL_MS_DEFAULT = 60_000
"""How often the retention task looks for segments to delete."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class PartitionShell(LocalPartition):
    """One partition served from a local PartitionLog on FileStorage (see module docstring)."""

    def __init__(
        self,
        stream: StreamName,
        partition: PartitionId,
        directory: Path,
        config: LogConfig,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        leader: NodeId | None = None,
        retention_interval_ms: int = RETENTION_INTERVAL_MS_DEFAULT,
        pending_appends_max: int = PENDING_APPENDS_MAX,
        storage: Storage | None = None,
    ) -> None:
        """`storage` replaces the FileStorage on `directory` (tests pass a SimDisk)."""
        assert retention_interval_ms > 0 and 0 < pending_appends_max <= PENDING_APPENDS_MAX
        self._stream = stream
        self._partition = partition
        self._directory = directory
        self._config = config
        self._clock_ms = clock_ms
        self._leader = leader
        self._retention_interval_ms = retention_interval_ms
        self._storage = storage
        self._pending_appends_max = pending_appends_max
        self._log: PartitionLog | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: deque[tuple[Offset, Offset, asyncio.Future[Offset]]] = deque()
        self._listeners: list[Callable[[], None]] = []
        self._sync_task: asyncio.Task[None] | None = None
        self._retention_task: asyncio.Task[None] | None = None
        self._closing = False
        self._retention_due = False
        self.fsyncs = 0
        """Group fsyncs completed (each covers every append written before it started)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open (recover) the log off the loop and start the retention task."""
        assert self._log is None, "started twice"
        loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"fsync-{self._stream}-{self._partition}"
        )
        storage = self._storage if self._storage is not None else FileStorage(self._directory)
        self._log = await loop.run_in_executor(
            self._executor, PartitionLog.open, storage, self._config
        )
        report = self._log.recovery
        if report.truncated_bytes or report.rebuilt_indexes or report.deleted_files:
            log.warning(
                "recovered %s/%d: cut %d torn bytes, rebuilt indexes of %s, removed %s",
                self._stream,
                self._partition,
                report.truncated_bytes,
                report.rebuilt_indexes,
                report.deleted_files,
            )
        self._retention_task = asyncio.create_task(
            self._retention_loop(), name=f"retention-{self._stream}-{self._partition}"
        )

    async def close(self) -> None:
        """Refuse new appends, sync the ones written (they resolve normally), stop the tasks."""
        if self._closing:
            return
        self._closing = True
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention_task
        if self._log is not None:
            while self._sync_task is not None:
                await self._sync_task
            if self._pending:  # a last group the finished task did not pick up
                self._kick()
                while self._sync_task is not None:
                    await self._sync_task
            self._log.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    @property
    def log_core(self) -> PartitionLog:
        assert self._log is not None, "PartitionShell used before start()"
        return self._log

    # ------------------------------------------------------------------ Partition protocol

    @property
    def stream(self) -> StreamName:
        return self._stream

    @property
    def partition(self) -> PartitionId:
        return self._partition

    def append(
        self, records: Sequence[bytes], producer: PublishingIds | None = None
    ) -> asyncio.Future[Offset]:
        """Write now; the future resolves to the first offset once fsynced (see module doc).
        With `producer`, duplicates of what was written are dropped; a batch of duplicates
        resolves with the fsync that covers everything written so far."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Offset] = loop.create_future()
        core = self.log_core
        if self._closing:
            future.set_exception(
                Unavailable(f"partition {self._partition} of stream {self._stream!r} is closing")
            )
            return future
        if len(self._pending) >= self._pending_appends_max:
            future.set_exception(
                ResourceLimitExceeded(
                    f"partition {self._partition} of stream {self._stream!r} already has "
                    f"{self._pending_appends_max} appends waiting for the disk; retry later"
                )
            )
            return future
        try:
            named = None
            if producer is not None:
                state = core.producers.get(producer.name)
                ids = list(producer.ids)
                kept = keep_new(ids, None if state is None else state.last_id)
                if len(kept.keep) < len(records):
                    records = [records[i] for i in kept.keep]
                    ids = [ids[i] for i in kept.keep]
                named = (producer.name, ids) if records else None
            if records:
                first = core.append(records, self._clock_ms(), producer=named)
            else:
                first = core.end_offset
        except BrokerError as error:
            future.set_exception(error)
            return future
        self._pending.append((core.end_offset, first, future))
        self._kick()
        return future

    async def last_publishing_id(self, name: bytes) -> ProducerInfo | None:
        core = self.log_core
        state = core.producers.get(name)
        if state is None:
            return None
        while core.durable_end <= state.last_offset and core.failure is None:
            future: asyncio.Future[Offset] = asyncio.get_running_loop().create_future()
            self._pending.append((core.end_offset, core.end_offset, future))
            self._kick()
            await future
        return ProducerInfo(
            name.decode(), state.last_id, Offset(state.last_offset), state.timestamp_ms
        )

    def producers(self) -> list[ProducerInfo]:
        return [
            ProducerInfo(name.decode(), s.last_id, Offset(s.last_offset), s.timestamp_ms)
            for name, s in self.log_core.producers
        ]

    def read(self, start: Offset, max_bytes: int) -> list[ChunkView]:
        return self.log_core.read(start, max_bytes)

    def resolve(self, spec: OffsetSpec) -> Offset:
        return self.log_core.resolve(spec)

    def end_offset(self) -> Offset:
        return self.log_core.durable_end

    def info(self) -> PartitionInfo:
        facts = self.log_core.info()
        empty = facts.messages == 0
        return PartitionInfo(
            stream=self._stream,
            partition=self._partition,
            first_offset=None if empty else facts.first_offset,
            last_offset=None if empty else Offset(facts.end_offset - 1),
            end_offset=facts.end_offset,
            first_timestamp_ms=facts.first_timestamp_ms,
            last_timestamp_ms=facts.last_timestamp_ms,
            messages=facts.messages,
            bytes=facts.bytes,
            segments=facts.segments,
            leader=self._leader,
        )

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    # ------------------------------------------------------------------ group commit

    def _kick(self) -> None:
        if self._sync_task is None:
            self._sync_task = asyncio.create_task(
                self._sync_loop(), name=f"fsync-{self._stream}-{self._partition}"
            )

    async def _sync_loop(self) -> None:
        """Run one fsync at a time while appends wait; each covers all written before it."""
        core = self.log_core
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                if core.failure is not None:
                    self._fail_pending(core.failure)
                    return
                plan = core.begin_sync()
                if plan is not None:
                    try:
                        await loop.run_in_executor(self._executor, core.run_sync, plan)
                    except OSError as error:
                        core.fail(f"fsync failed: {error}")
                        log.error(
                            "partition %s/%d: fsync failed, refusing appends: %s",
                            self._stream,
                            self._partition,
                            error,
                        )
                        self._fail_pending(f"fsync failed: {error}")
                        return
                    self.fsyncs += 1
                    core.finish_sync(plan)
                self._resolve_durable(core.durable_end)
                if self._retention_due:
                    self._retention_due = False
                    self._apply_retention()
        finally:
            self._sync_task = None

    def _resolve_durable(self, durable_end: Offset) -> None:
        resolved = False
        while self._pending and self._pending[0][0] <= durable_end:
            _, first, future = self._pending.popleft()
            if not future.done():
                future.set_result(first)
            resolved = True
        if resolved:
            loop = asyncio.get_running_loop()
            for callback in list(self._listeners):
                loop.call_soon(callback)

    def _fail_pending(self, reason: str) -> None:
        while self._pending:
            _, _, future = self._pending.popleft()
            if not future.done():
                future.set_exception(
                    StorageFailure(
                        f"partition {self._partition} of stream {self._stream!r} could not make "
                        f"the write durable ({reason}); it refuses appends until restarted"
                    )
                )

    # ------------------------------------------------------------------ retention

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self._retention_interval_ms / 1000)
            self.request_retention()

    def request_retention(self) -> None:
        """Apply retention now, or between the next two fsyncs if one is in flight (the
        fsync thread must never see a file deleted under it)."""
        if self._sync_task is None:
            self._apply_retention()
        else:
            self._retention_due = True

    def _apply_retention(self) -> None:
        core = self.log_core
        if core.failure is not None:
            return
        try:
            deleted = core.apply_retention(self._clock_ms())
        except StorageFailure as error:
            log.error(
                "partition %s/%d: retention failed: %s",
                self._stream,
                self._partition,
                error.message,
            )
            return
        if deleted:
            log.info(
                "partition %s/%d: retention deleted %d segments",
                self._stream,
                self._partition,
                deleted,
            )
