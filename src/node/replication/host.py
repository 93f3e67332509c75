"""ReplicationHost: the asyncio shell around the ReplicationDriver (driver.py), one per node
process, driving every local partition replica.

Everything the shell decides lives in the driver, which the simulator runs unchanged; what is
left here is what cannot run in a simulation: the asyncio tasks (a ticker every `tick_ms`, the
driver loop), the TCP transport (transport.py), the fsync thread, and opening (on the opener
thread, in batches: ADR 0031) and closing replicas' files off the loop. The driver loop:

    wait until woken -> driver.begin_batch() -> driver.run_syncs(batch) in the fsync thread
    -> driver.finish_batch(batch, failures) -> go again while woken

Frames are written to the sockets on the same loop turn (`Transport.flush`), not by waking the
per-peer writer tasks, which costs several loop turns per hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from spate.core.errors import BrokerError, InvalidArgument, StorageFailure, Unavailable
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.node.log import LogConfig
from spate.node.replication import limits
from spate.node.replication.driver import Batch, LeaderListener, ReplicationDriver
from spate.node.replication.files import DirectoryFiles, fsync_path
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.raft import RaftConfig
from spate.node.replication.replica import monotonic_clock_ms, wall_clock_ms
from spate.node.replication.storage import RaftStore, SyncWork
from spate.node.replication.transport import Transport

log = logging.getLogger(__name__)

TICK_MS_DEFAULT = 50
"""Raft tick; with the default election timeout of 10 ticks a leader is replaced in 0.5-1 s."""


CLOCK_OFFSET_ENV = "SPATE_CLOCK_OFFSET_MS"
"""Fault injection (the chaos suite's clock faults): milliseconds added to this node's wall
clock, which stamps chunks (message timestamps) and drives time-based retention. Unset or 0 in
production."""


LIVENESS_TICKS_MAX_ENV = "SPATE_LIVENESS_TICKS_MAX"
"""Ticks of silence after which a peer node that was late lately is suspected, at most
(`limits.liveness_ticks_max`, liveness.py). Set to `limits.liveness_ticks` (10) to suspect every
peer after one election timeout whatever lateness it showed: the fastest failover of a stalled
or cut node, and the leaderships of a node whose loop stalls for a second lost (RESULTS §42)."""
LIVENESS_TICKS_MAX_LIMIT = 200
"""The most `$SPATE_LIVENESS_TICKS_MAX` may ask for (10 s at the default tick)."""


def liveness_ticks_max() -> int:
    """`limits.liveness_ticks_max`, or $SPATE_LIVENESS_TICKS_MAX when set."""
    raw = os.environ.get(LIVENESS_TICKS_MAX_ENV, "").strip()
    if not raw:
        return limits.liveness_ticks_max
    try:
        ticks = int(raw)
    except ValueError:
        ticks = 0
    if not limits.liveness_ticks <= ticks <= LIVENESS_TICKS_MAX_LIMIT:
        raise InvalidArgument(
            f"${LIVENESS_TICKS_MAX_ENV} must be an integer from {limits.liveness_ticks} to "
            f"{LIVENESS_TICKS_MAX_LIMIT}, got {raw!r}"
        )
    return ticks


def skewed_wall_clock() -> Callable[[], int]:
    """The node's wall clock, skewed by $SPATE_CLOCK_OFFSET_MS when set."""
    raw = os.environ.get(CLOCK_OFFSET_ENV, "").strip()
    try:
        offset_ms = int(raw or 0)
    except ValueError:
        raise InvalidArgument(f"${CLOCK_OFFSET_ENV} must be an integer, got {raw!r}") from None
    if not offset_ms:
        return wall_clock_ms
    log.warning("this node's wall clock is skewed by %d ms ($%s)", offset_ms, CLOCK_OFFSET_ENV)
    return lambda: wall_clock_ms() + offset_ms


OPEN_BATCH = 64
"""Replicas opened per job of the opener thread (ADR 0031): their new directories are made
durable with one fsync each at the end of the job, and the loop adds the batch to the driver
while the thread opens the next one."""


OPEN_AWAKE_MAX = 4 * OPEN_BATCH
"""Awake replicas above which the next batch waits (`ReplicationHost._pace`)."""
OPEN_PACE_MAX_S = 5.0
OPEN_PACE_POLL_S = 0.05
SYNC_THREADS = 8
"""Threads running syncs side by side (ADR 0031): those of a batch of replicas being opened,
and a driver batch's when it has at least `SIDE_BY_SIDE_SYNCS` (the kernel merges concurrent
flushes; one thread at a time, the first election of 5,000 new groups took tens of seconds per
driver batch, longer than an election timeout, so the groups timed out and voted again)."""
SIDE_BY_SIDE_SYNCS = 16
"""A driver batch with fewer syncs runs them one after the other on the fsync thread, as it
always did (a few busy partitions: no thread hand-offs on the latency path)."""


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """One replica to open: `replicas` (the voters, preferred leader first) and `learners`
    seed a new replica's Raft membership (ADR 0022)."""

    stream: StreamName
    partition: PartitionId
    replicas: tuple[NodeId, ...]
    config: LogConfig
    learners: tuple[NodeId, ...] = ()


def _open_stores(
    places: Sequence[tuple[Path, LogConfig]], syncers: Executor
) -> list[RaftStore | BaseException]:
    """On the opener thread: open or create one batch of replicas' stores with their syncs
    deferred, then run those syncs side by side on `syncers` (the kernel merges concurrent
    flushes: on this machine 1,000 directory fsyncs take 2.5 s one after the other and 0.46 s
    four at a time): each log's `finish_open` (its active segment if it has data, and its
    directory) and every other directory whose entries changed, once each (ADR 0031). A new
    replica's files are empty, so their names are all there is to make durable. Until every
    sync of the batch is done no store is returned, so none can vote or acknowledge anything."""
    stores: list[RaftStore | BaseException] = []
    directories: dict[Path, None] = {}
    for directory, config in places:
        try:
            files = DirectoryFiles(directory, defer_syncs=True)
            opened = RaftStore(files, config, defer_sync=True)
        except Exception as error:  # StorageFailure, OSError: this replica only
            stores.append(error)
            continue
        stores.append(opened)
        directories.update(dict.fromkeys(files.unsynced()))
    finishing = [
        (i, syncers.submit(store.log.finish_open))
        for i, store in enumerate(stores)
        if isinstance(store, RaftStore)
    ]
    parents = [syncers.submit(fsync_path, directory) for directory in directories]
    for i, future in finishing:
        try:
            future.result()
        except Exception as error:
            failed = stores[i]
            assert isinstance(failed, RaftStore)
            failed.close()
            stores[i] = error
    for future in parents:
        try:
            future.result()
        except OSError as error:  # a parent shared by the batch: none of it is durable
            failure = StorageFailure(f"the disk refused a directory fsync: {error}")
            for store in stores:
                if isinstance(store, RaftStore):
                    store.close()
            return [failure] * len(stores)
    return stores


def _close_stores(opening: asyncio.Future[list[RaftStore | BaseException]]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        return
    for store in opening.result():
        if isinstance(store, RaftStore):
            store.close()


class ReplicationHost:
    def __init__(
        self,
        node_id: NodeId,
        data_dir: Path,
        *,
        host: str,
        port: int,
        secret: str,
        peers: Callable[[NodeId], tuple[str, int] | None],
        ssl_server: ssl.SSLContext | None = None,
        ssl_client: ssl.SSLContext | None = None,
        tick_ms: int = TICK_MS_DEFAULT,
        rng_seed: int | None = None,
        raft_config: RaftConfig | None = None,
    ) -> None:
        assert tick_ms > 0
        self.node_id = node_id
        self.data_dir = data_dir
        self.tick_ms = tick_ms
        self.raft_config = raft_config or RaftConfig(quiesce=True)  # ADR 0026
        self._rng = random.Random(rng_seed)
        self._wake = asyncio.Event()
        self._syncing = False
        self._early_soon = False
        self._wall_ms = skewed_wall_clock()
        self.driver: ReplicationDriver[ReplicatedPartition] = ReplicationDriver(
            node_id,
            send=self._send,
            wake=self._woken,
            monotonic_ms=monotonic_clock_ms,
            wall_ms=self._wall_ms,
            request_id_base=random.SystemRandom().getrandbits(62) + 1,
            liveness_ticks_max=liveness_ticks_max(),
        )
        self.transport = Transport(
            node_id,
            secret=secret,
            host=host,
            port=port,
            peers=peers,
            on_frame=self.driver.receive,
            on_link_closed=self.driver.link_closed,
            ssl_server=ssl_server,
            ssl_client=ssl_client,
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"fsync-{node_id}")
        self._opener = ThreadPoolExecutor(1, thread_name_prefix=f"open-{node_id}")
        """Opens replicas' files (ADR 0031): not the fsync thread, whose batches (every vote of
        an election fsyncs a hard state) would queue each open behind them."""
        self._syncers = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix=f"opensync-{node_id}")
        self._stopped = False
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def batches(self) -> int:
        return self.driver.batches

    @property
    def fsyncs(self) -> int:
        return self.driver.fsyncs

    def _send(self, peer: NodeId, frame: bytes) -> bool:
        return self.transport.send(peer, frame)

    def _woken(self) -> None:
        """The driver has work. While a batch's fsyncs run, the leaders' Appends (entries
        proposed meanwhile, commit advances) leave at the end of this loop turn, not after the
        fsyncs (`ReplicationDriver.send_early`; issue 16, ADR 0033)."""
        self._wake.set()
        if self._syncing and not self._early_soon:
            self._early_soon = True
            asyncio.get_running_loop().call_soon(self._send_early)

    def _send_early(self) -> None:
        self._early_soon = False
        if self._syncing:
            self.driver.send_early()
            self.transport.flush()

    # -- lifecycle

    async def start(self) -> int:
        port = await self.transport.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._drive(), name=f"replication-drive-{self.node_id}"),
            loop.create_task(self._tick(), name=f"replication-tick-{self.node_id}"),
        ]
        return port

    async def stop(self) -> None:
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.transport.stop()
        # The fsync thread may still run a batch the cancelled driver loop started: let it
        # finish before the files are closed (one worker, so this job runs after it).
        await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)
        for stream, partition in list(self.driver.groups):
            self.driver.remove(stream, partition).close()
        self._executor.shutdown(wait=True)
        self._opener.shutdown(wait=True, cancel_futures=True)
        self._syncers.shutdown(wait=True)

    def add_leader_listener(self, callback: LeaderListener) -> None:
        self.driver.leader_listeners.append(callback)

    def partition_dir(self, stream: StreamName, partition: PartitionId) -> Path:
        return self.data_dir / "partitions" / stream / str(partition)

    async def open_partition(
        self,
        stream: StreamName,
        partition: PartitionId,
        replicas: Sequence[NodeId],
        config: LogConfig,
        *,
        learners: Sequence[NodeId] = (),
    ) -> ReplicatedPartition:
        """Open (or create) this node's replica. `replicas` (the voters, preferred leader
        first) and `learners` seed a new replica's Raft membership (ADR 0022); a replica with
        a log takes its membership from it."""
        request = OpenRequest(stream, partition, tuple(replicas), config, tuple(learners))
        async for batch in self.open_partitions([request]):
            for _request, outcome in batch:
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome
        raise AssertionError("open_partitions answers every request")

    async def open_partitions(
        self, requests: Sequence[OpenRequest]
    ) -> AsyncIterator[list[tuple[OpenRequest, ReplicatedPartition | BaseException]]]:
        """Open (or create) many replicas, `OPEN_BATCH` at a time on the opener thread (ADR
        0031), yielding each batch as it is added to the driver, so a node serves the replicas
        opened so far while the rest open. The files of a batch's new replicas are created
        without syncs and made durable by one fsync per directory whose entries changed,
        before any of them is handed to the driver. A request that cannot be opened yields its
        error; the others are opened all the same."""
        loop = asyncio.get_running_loop()
        pending: list[tuple[list[OpenRequest], asyncio.Future[list[RaftStore | BaseException]]]]
        pending = []
        batch: list[OpenRequest] = []
        refused: list[tuple[OpenRequest, ReplicatedPartition | BaseException]] = []
        for request in requests:
            error = self._refuse(request)
            if error is not None:
                refused.append((request, error))
            elif (request.stream, request.partition) not in self.driver.groups:
                batch.append(request)
                if len(batch) == OPEN_BATCH:
                    pending.append((batch, self._open_batch(loop, batch)))
                    batch = []
            else:
                refused.append((request, self.driver.groups[(request.stream, request.partition)]))
        if batch:
            pending.append((batch, self._open_batch(loop, batch)))
        if refused:
            yield refused
        try:
            while pending:
                batch, opening = pending.pop(0)
                stores = await opening
                await self._pace()
                yield [
                    (request, self._add(request, store))
                    for request, store in zip(batch, stores, strict=True)
                ]
        finally:
            for _batch, opening in pending:  # abandoned (stop, or the caller gave up)
                opening.add_done_callback(_close_stores)

    async def _pace(self) -> None:
        """Before the driver gets another batch: wait, up to `OPEN_PACE_MAX_S`, while more than
        `OPEN_AWAKE_MAX` replicas are awake (ADR 0031). New groups elect and then go quiet;
        thousands electing at once made every driver batch seconds long, longer than an
        election timeout, so they timed out and voted again. Bounded, so a group that cannot
        go quiet (a peer not up yet) slows the opening but never stops it."""
        deadline = time.monotonic() + OPEN_PACE_MAX_S
        while self.driver.awake > OPEN_AWAKE_MAX and time.monotonic() < deadline:
            await asyncio.sleep(OPEN_PACE_POLL_S)

    def _open_batch(
        self, loop: asyncio.AbstractEventLoop, batch: list[OpenRequest]
    ) -> asyncio.Future[list[RaftStore | BaseException]]:
        places = [(self.partition_dir(r.stream, r.partition), r.config) for r in batch]
        return loop.run_in_executor(self._opener, _open_stores, places, self._syncers)

    def _refuse(self, request: OpenRequest) -> BrokerError | None:
        stream, partition = request.stream, request.partition
        if self._stopped:
            return Unavailable(f"{self.node_id} is stopping")
        if self.node_id not in (*request.replicas, *request.learners):
            return InvalidArgument(f"{self.node_id} is not a replica of {stream}/{partition}")
        if not stream or "/" in stream or stream.startswith("."):
            return InvalidArgument(f"cannot store a stream named {stream!r}")
        return None

    def _add(
        self, request: OpenRequest, store: RaftStore | BaseException
    ) -> ReplicatedPartition | BaseException:
        """On the loop: hand an opened store to the driver."""
        key = (request.stream, request.partition)
        if isinstance(store, BaseException):
            return store
        if self._stopped:
            store.close()
            return Unavailable(f"{self.node_id} is stopping")
        if key in self.driver.groups:  # opened meanwhile
            store.close()
            return self.driver.groups[key]
        group = ReplicatedPartition(
            self.node_id,
            stream=request.stream,
            partition=request.partition,
            replicas=request.replicas,
            learners=request.learners,
            store=store,
            raft_config=self.raft_config,
            rng=random.Random(self._rng.getrandbits(64)),
            wake=self._wake.set,
            clock_ms=self._wall_ms,
        )
        self.driver.add(group)
        for peer in group.raft.peers:
            self.transport.dial(peer)
        return group

    async def close_partition(
        self, stream: StreamName, partition: PartitionId, *, delete: bool
    ) -> None:
        group = self.driver.remove(stream, partition)
        # Not while the fsync thread may hold its files: the executor runs one job at a time.
        await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)
        group.close()
        if delete:
            group.store.files.remove()

    def partition(self, stream: StreamName, partition: PartitionId) -> ReplicatedPartition:
        return self.driver.get(stream, partition)

    def partitions(self) -> list[ReplicatedPartition]:
        """Every replica open on this node."""
        return list(self.driver.groups.values())

    def apply_retention(self, group: ReplicatedPartition) -> int:
        return self.driver.apply_retention(group)

    # -- the ticker and the driver loop

    async def _tick(self) -> None:
        period = self.tick_ms / 1000
        next_at = last = time.monotonic()
        gaps = self.driver.tick_gap_seconds
        while True:
            next_at += period
            now = time.monotonic()
            if next_at < now - period:
                # The loop stalled: no burst of catch-up ticks. Ticks run back to back would
                # count peers' silence before their frames, waiting in the sockets, are read.
                next_at = now
            await asyncio.sleep(max(0.0, next_at - now))
            now = time.monotonic()
            gaps.observe(now - last)
            last = now
            self.driver.tick()

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        driver = self.driver
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = driver.begin_batch()
            if batch is None:
                continue
            self.transport.flush()
            failures: dict[ReplicatedPartition, str] = {}
            if batch.syncs:
                started = time.perf_counter()
                run = (
                    self._run_syncs_side_by_side
                    if len(batch.syncs) >= SIDE_BY_SIDE_SYNCS
                    else driver.run_syncs
                )
                self._syncing = True
                try:
                    failures = await loop.run_in_executor(self._executor, run, batch)
                finally:
                    self._syncing = False
                driver.fsync_seconds.observe(time.perf_counter() - started)
            driver.finish_batch(batch, failures)
            self.transport.flush()

    def _run_syncs_side_by_side(
        self, batch: Batch[ReplicatedPartition]
    ) -> dict[ReplicatedPartition, str]:
        """`ReplicationDriver.run_syncs` on `SYNC_THREADS` threads: each replica's syncs stay
        on one thread in their order, different replicas' files are synced side by side.
        Runs on the fsync thread, which waits for all of them (ADR 0031)."""
        works: dict[ReplicatedPartition, list[SyncWork]] = {}
        for group, work in batch.syncs:
            works.setdefault(group, []).append(work)
        groups = list(works)

        def lane(mine: list[ReplicatedPartition]) -> dict[ReplicatedPartition, str]:
            failures: dict[ReplicatedPartition, str] = {}
            for group in mine:
                for work in works[group]:
                    try:
                        group.store.run_sync(work)
                    except OSError as error:
                        failures[group] = f"fsync failed: {error}"
            return failures

        lanes = [self._syncers.submit(lane, groups[i::SYNC_THREADS]) for i in range(SYNC_THREADS)]
        failures: dict[ReplicatedPartition, str] = {}
        for future in lanes:
            failures.update(future.result())
        return failures
