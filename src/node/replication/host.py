"""ReplicationHost: the asyncio shell around the ReplicationDriver (driver.py), one per node
process, driving every local partition replica.

Everything the shell decides lives in the driver, which the simulator runs unchanged; what is
left here is what cannot run in a simulation: the asyncio tasks (a ticker every `tick_ms`, the
driver loop), the TCP transport (transport.py), the fsync thread, and opening (on the opener
thread, in batches: ADR 0031) and closing replicas' files off the loop. The driver loop:

    wait until woken -> driver.begin_batch() -> send its Appends -> driver.run_syncs(batch)
    -> driver.finish_batch(batch, failures) -> send its acks -> go again while woken

The syncs run on the node's sync thread (`SyncThread`, ADR 0040): one long-lived thread that
takes a batch from a queue and signals the loop through an eventfd when it is done; the loop's
reader callback finishes the batch (acks queued and flushed) on the turn that sees the sync
done. `$SPATE_SYNC_HANDOFF=executor` puts back the path before ADR 0040 (`run_in_executor`: a
`concurrent.futures` round trip and the driver task resumed a loop turn later), for A/B runs.

`run_syncs` runs on the loop thread itself (ADR 0036; on by default since RESULTS §50,
`$SPATE_SYNC_INLINE_BYTES_MAX=0` turns it off) when the batch is a follower's and small
(`INLINE_SYNCS_MAX` files, `INLINE_SYNC_BYTES_MAX` bytes written: an fdatasync of 0.06-0.3 ms
on a quiet disk, less than the two thread hand-offs around it), the node wrote little lately,
its syncs are fast (2 ms on average at most) and the loop is not busy (a leader's batch too
when it wrote at most $SPATE_SYNC_INLINE_LEADER_BYTES_MAX, 4 KiB by default), else in the
fsync thread, while the loop reads the next frames (W1's pipelining). Nothing changes in
what waits for what: acks and votes leave in `finish_batch`, after `run_syncs` returned, on
either path.

Frames are written to the sockets on the same loop turn (`Transport.flush`), not by waking the
per-peer writer tasks, which costs several loop turns per hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
from spate.core.frames import Frame
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.node.log import LogConfig
from spate.node.replication import limits
from spate.node.replication.driver import Batch, LeaderListener, ReplicationDriver
from spate.node.replication.files import DirectoryFiles, fsync_path
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.raft import RaftConfig, Role
from spate.node.replication.replica import monotonic_clock_ms, wall_clock_ms
from spate.node.replication.storage import RaftStore, SyncWork
from spate.node.replication.syncthread import SyncThread
from spate.node.replication.synctrace import (
    BEGIN,
    BEGUN,
    BUSY,
    BYTES,
    DUMP_TICKS,
    FINISHED,
    FLUSHED,
    INLINE,
    JOB_END,
    JOB_START,
    LEADERS,
    RESUMED,
    SENT,
    SYNCS,
    WOKEN,
    SyncTrace,
    now_ns,
)
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

INLINE_SYNCS_MAX = 4
"""A driver batch with at most this many syncs (files: one per replica in the batch) ...
(ADR 0036)"""
INLINE_SYNC_BYTES_MAX = 128 * 1024
"""... and at most this many entry bytes written (when inline syncs are on:
$SPATE_SYNC_INLINE_BYTES_MAX) runs its syncs on the loop thread: the loop
blocks for the fdatasync (0.06-0.33 ms on this machine's disk for a few KiB; ~0.1 ms more per
100 KiB at ~1 GB/s) instead of handing the batch to the fsync thread and back (0.5-1 ms p50,
2.5-5 ms p99 measured around it: a thread wake-up, the GIL, the loop's self-pipe)."""
INLINE_BYTES_ENV = "SPATE_SYNC_INLINE_BYTES_MAX"
"""The byte limit of inline syncs; unset: `INLINE_SYNC_BYTES_MAX` (on, the default since
RESULTS §50: eight A/B pairs on a quiet machine, §49 and §50, W3's p50 on a leader lower in
seven, W1 no different beyond its run-to-run spread); 0: off, every sync on the fsync thread
as before ADR 0036 (on a machine at load 8-24, RESULTS §40, inline syncs took longer than the
hand-offs they saved)."""
INLINE_SYNC_SLOW_S = 0.02
"""An inline sync that took longer than this (a disk that stalls: 20 ms is 40 times the
usual sync here, and under another engineer's load syncs took 4 ms at p90, RESULTS §40, when
inline was still better than the hand-offs) ..."""
INLINE_BACKOFF_S = 1.0
"""... sends the next batches' syncs to the fsync thread for this long: a slow disk stalls the
loop (reads, ticks, every client) at most once per `INLINE_BACKOFF_S`."""
INLINE_SYNC_TYPICAL_MAX_S = 0.002
"""Syncs run inline only while the node's small batches' syncs (inline or on the fsync thread)
took at most this long on average (`INLINE_SYNC_AVG_WEIGHT`): a disk whose every fdatasync
takes milliseconds (network block storage) would stall the loop at each one without ever
tripping `INLINE_SYNC_SLOW_S`; on such a disk the hand-offs an inline sync saves (~0.5 ms)
are the smaller cost. This machine's in place: 0.3-0.55 ms p50, 3-4 ms p99 (RESULTS §50)."""
INLINE_SYNC_AVG_WEIGHT = 0.1
"""The weight of each small batch's sync time in that average (an exponential moving one:
about the last ten batches; one slow sync moves it a tenth of the way)."""
INLINE_LOOP_BUSY_MAX = 0.5
"""Syncs run inline only while the loop thread's CPU time over the last tick was below this
share of the tick's wall time. A busy loop (W1: a leader parsing and proposing at full rate)
has work to do during a sync, so its syncs stay on the fsync thread, as the pipelining they
were there for; an idle one (a producer waiting for each confirm, W3's 5,000 msg/s) loses
nothing by waiting for the disk itself. An inline sync sleeps in the kernel: it does not count
as busy."""
INLINE_RECENT_BYTES_MAX = 256 * 1024
"""Syncs run inline only while the node wrote at most this many entry bytes in the current
tick and the one before (~37 KiB a tick at W3's 5,000 msg/s of 100 B; W1 writes that much in
~13 ms): a stream of writes keeps the fsync thread's pipelining from its first milliseconds,
where the loop-busy rule, which reads the last whole tick, saw it a tick late (RESULTS §49)."""
assert INLINE_SYNCS_MAX < SIDE_BY_SIDE_SYNCS and 0 < INLINE_LOOP_BUSY_MAX <= 1


INLINE_LEADER_BYTES_ENV = "SPATE_SYNC_INLINE_LEADER_BYTES_MAX"
"""With inline syncs on, a batch in which a replica leads may sync inline too when it wrote
at most this many bytes (`ReplicationHost._inline`); unset: `INLINE_LEADER_BYTES_DEFAULT`;
0: never (as before RESULTS §50)."""
INLINE_LEADER_BYTES_DEFAULT = 4096
"""W3's batches (1-2 KiB), not W1's (~12 KiB). RESULTS §49 (quiet machine): W3's p50 on the
leader ~14-19% lower, a follower's no different; before `INLINE_RECENT_BYTES_MAX` W1 lost
3-10%. §49's last round and §50 (eight pairs with the recent-bytes rule): W3's leader p50 lower
in seven (median of §50's five: 5.73 -> 5.25 ms), the gateway's in five, W1 no different
beyond its spread (better in four, worse in four)."""


HANDOFF_ENV = "SPATE_SYNC_HANDOFF"
"""How a batch's syncs reach the fsync thread and come back (ADR 0040): `thread` (the default,
`SyncThread`: a queue in, an eventfd out, the batch finished in the loop's reader callback) or
`executor` (`loop.run_in_executor`, the path before ADR 0040: kept for A/B runs)."""
HANDOFFS = ("thread", "executor")


def sync_handoff() -> str:
    """$SPATE_SYNC_HANDOFF, `thread` when unset."""
    raw = os.environ.get(HANDOFF_ENV, "").strip() or HANDOFFS[0]
    if raw not in HANDOFFS:
        raise InvalidArgument(f"${HANDOFF_ENV} must be one of {', '.join(HANDOFFS)}, got {raw!r}")
    return raw


def inline_sync_bytes_max(
    name: str = INLINE_BYTES_ENV, default: int = INLINE_SYNC_BYTES_MAX
) -> int:
    """$SPATE_SYNC_INLINE_BYTES_MAX (or the variable `name`); `default` when unset, 0: off."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgument(f"${name} must be a byte count >= 0, got {raw!r}")
    return value


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
        inline_sync_bytes: int | None = None,
        handoff: str | None = None,
        inline_leader_bytes: int | None = None,
    ) -> None:
        """`inline_sync_bytes`: batches that wrote at most this many bytes (and sync at most
        `INLINE_SYNCS_MAX` files) sync on the loop thread (ADR 0036); None:
        `inline_sync_bytes_max()`; 0: never (every sync on the fsync thread).
        `inline_leader_bytes`: the same for a batch in which a replica leads (at most this
        many bytes, and only with inline syncs on); None: $SPATE_SYNC_INLINE_LEADER_BYTES_MAX
        (`INLINE_LEADER_BYTES_DEFAULT` when unset); 0: never. `handoff`: how
        the others reach the fsync thread (`HANDOFFS`, ADR 0040); None: `sync_handoff()`."""
        assert tick_ms > 0
        self.node_id = node_id
        self.data_dir = data_dir
        self.tick_ms = tick_ms
        self.raft_config = raft_config or RaftConfig(quiesce=True)  # ADR 0026
        self._rng = random.Random(rng_seed)
        self._wake = asyncio.Event()
        self._syncing = False
        self._early_soon = False
        self.inline_sync_bytes = (
            inline_sync_bytes_max() if inline_sync_bytes is None else inline_sync_bytes
        )
        assert self.inline_sync_bytes >= 0
        self.inline_leader_bytes = (
            inline_sync_bytes_max(INLINE_LEADER_BYTES_ENV, INLINE_LEADER_BYTES_DEFAULT)
            if inline_leader_bytes is None
            else inline_leader_bytes
        )
        self.handoff = sync_handoff() if handoff is None else handoff
        assert self.handoff in HANDOFFS, self.handoff
        self._sync_thread: SyncThread | None = None
        """The fsync thread with `handoff == "thread"` (made in `start`: it needs the loop)."""
        self._inline_after = 0.0
        self._bytes_this_tick = 0
        self._bytes_last_tick = 0
        """Entry bytes written by this node's batches in the current and the last tick
        (`INLINE_RECENT_BYTES_MAX`)."""
        self.loop_busy = 0.0
        """The loop thread's CPU time over the last tick, as a share of the tick's wall time
        (measured by the ticker; `INLINE_LOOP_BUSY_MAX`)."""
        self.syncs_inline = 0
        """Batches whose syncs ran on the loop thread (ADR 0036)..."""
        self.syncs_threaded = 0
        """... and on the fsync thread (or side by side)."""
        self.inline_backoffs = 0
        """Inline syncs slower than `INLINE_SYNC_SLOW_S` (each sent the next
        `INLINE_BACKOFF_S` of batches to the fsync thread)."""
        self.sync_seconds_avg = 0.0
        """The average time of a small batch's syncs, wherever they ran
        (`INLINE_SYNC_TYPICAL_MAX_S`)."""
        self._thread_sync_s = 0.0
        """How long the fsync thread's last job ran (written on that thread, read once the
        loop is told the job is done)."""
        self._trace = SyncTrace.from_env(node_id)
        self._woken_ns = 0
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
        """The fsync thread with `handoff == "executor"` (no thread is started unless used)."""
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

    def _send(self, peer: NodeId, frame: Frame) -> bool:
        return self.transport.send(peer, frame)

    def _woken(self) -> None:
        """The driver has work. While a batch's fsyncs run, the leaders' Appends (entries
        proposed meanwhile, commit advances) leave at the end of this loop turn, not after the
        fsyncs (`ReplicationDriver.send_early`; issue 16, ADR 0033)."""
        self._wake.set()
        if self._trace is not None and not self._woken_ns:
            self._woken_ns = now_ns()
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
        if self.handoff == "thread":
            self._sync_thread = SyncThread(f"fsync-{self.node_id}", loop)
        self._tasks = [
            loop.create_task(self._drive(), name=f"replication-drive-{self.node_id}"),
            loop.create_task(self._tick(), name=f"replication-tick-{self.node_id}"),
        ]
        return port

    async def stop(self) -> None:
        if self._stopped:  # stopped already (or stopping)
            return
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.transport.stop()
        # The fsync thread may still run a batch the cancelled driver loop started: let it
        # finish before the files are closed (the batch itself is abandoned, as the driver
        # task that would have finished it).
        await self._syncs_done()
        if self._trace is not None:
            self._trace.dump()
        for stream, partition in list(self.driver.groups):
            self.driver.remove(stream, partition).close()
        if self._sync_thread is not None:
            self._sync_thread.close()
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
        # Not while the fsync thread may hold its files.
        await self._syncs_done()
        group.close()
        if delete:
            group.store.files.remove()

    async def _syncs_done(self) -> None:
        """Wait until the syncs handed to the fsync thread so far have returned."""
        if self._sync_thread is not None:
            await self._sync_thread.drain()
        else:  # one worker: this job runs after them
            await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)

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
        last_cpu = time.thread_time()  # the ticker runs on the loop thread
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
            cpu = time.thread_time()
            self.loop_busy = (cpu - last_cpu) / max(now - last, 1e-6)
            self._bytes_last_tick, self._bytes_this_tick = self._bytes_this_tick, 0
            last, last_cpu = now, cpu
            self.driver.tick()
            if self._trace is not None and self.driver.ticks % DUMP_TICKS == 0:
                self._trace.dump()

    async def _drive(self) -> None:
        driver = self.driver
        trace = self._trace
        while True:
            await self._wake.wait()
            self._wake.clear()
            row: list[int] | None = None
            if trace is not None:
                row = trace.row
                row[WOKEN], self._woken_ns = self._woken_ns, 0
                row[BEGIN] = now_ns()
            batch = driver.begin_batch()
            if batch is None:
                continue
            if row is not None:
                row[BEGUN] = now_ns()
            self.transport.flush()  # a leader's Appends: the followers write while we sync
            if row is not None:
                row[SENT] = now_ns()
            if not batch.syncs:
                self._finish(batch, {}, row, None)
            elif self._inline(batch):
                started = time.perf_counter()
                self._finish(batch, self._sync_inline(batch, row), row, started)
            elif self._sync_thread is not None:
                await self._sync_on_thread(self._sync_thread, batch, row)
            else:
                started = time.perf_counter()
                self._finish(batch, await self._sync_in_executor(batch, row), row, started)

    def _finish(
        self,
        batch: Batch[ReplicatedPartition],
        failures: dict[ReplicatedPartition, str],
        row: list[int] | None,
        started: float | None,
    ) -> None:
        """Step 3 of a batch, once its syncs returned (`started`: when they were handed off,
        None without syncs): acks and votes queued and flushed, the trace row closed."""
        driver = self.driver
        if started is not None:
            driver.fsync_seconds.observe(time.perf_counter() - started)
        driver.finish_batch(batch, failures)
        if row is not None:
            row[FINISHED] = now_ns()
        self.transport.flush()
        if row is not None:
            assert self._trace is not None
            row[FLUSHED] = now_ns()
            row[SYNCS] = len(batch.syncs)
            row[BYTES] = batch.bytes_written
            row[LEADERS] = sum(1 for g, _, _ in batch.items if g.raft.role is Role.LEADER)
            row[BUSY] = round(self.loop_busy * 1000)
            self._trace.end()

    def _inline(self, batch: Batch[ReplicatedPartition]) -> bool:
        """Run this batch's syncs on the loop thread (ADR 0036)? Not when a replica in it
        leads: a leader's own fsync is needed for a commit only when a follower is slower,
        and while its loop blocked in it, the followers' acks that commit without it would
        wait in the socket (RESULTS §40: with leaders inline, commits got slower) — unless
        `inline_leader_bytes` allows a small one (4 KiB by default: W3's batches; RESULTS
        §49-§50: W3's leader p50 lower in seven of eight pairs on a quiet machine)."""
        syncs = batch.syncs
        leader_bytes = self.inline_leader_bytes
        self._bytes_this_tick += batch.bytes_written
        return (
            self.inline_sync_bytes > 0
            and self._bytes_this_tick + self._bytes_last_tick <= INLINE_RECENT_BYTES_MAX
            and len(syncs) <= INLINE_SYNCS_MAX
            and batch.bytes_written <= self.inline_sync_bytes
            and self.loop_busy < INLINE_LOOP_BUSY_MAX
            and self.sync_seconds_avg <= INLINE_SYNC_TYPICAL_MAX_S
            and time.monotonic() >= self._inline_after
            and (
                not any(group.raft.role is Role.LEADER for group, _ in syncs)
                or (leader_bytes > 0 and batch.bytes_written <= leader_bytes)
            )
        )

    def _sync_inline(
        self, batch: Batch[ReplicatedPartition], row: list[int] | None
    ) -> dict[ReplicatedPartition, str]:
        """Step 2 of a small follower's batch on the loop thread (ADR 0036)."""
        self.syncs_inline += 1
        started = time.perf_counter()
        if row is not None:
            row[INLINE] = 1
            row[JOB_START] = now_ns()
        failures = self.driver.run_syncs(batch)
        if row is not None:
            row[JOB_END] = row[RESUMED] = now_ns()
        took = time.perf_counter() - started
        self._note_sync(batch, took)
        if took > INLINE_SYNC_SLOW_S:
            self.inline_backoffs += 1
            self._inline_after = time.monotonic() + INLINE_BACKOFF_S
        return failures

    def _note_sync(self, batch: Batch[ReplicatedPartition], seconds: float) -> None:
        """A batch's syncs took `seconds`: a small batch's count in `sync_seconds_avg`."""
        if len(batch.syncs) <= INLINE_SYNCS_MAX:
            self.sync_seconds_avg += (seconds - self.sync_seconds_avg) * INLINE_SYNC_AVG_WEIGHT

    def _timed(
        self,
        run: Callable[[Batch[ReplicatedPartition]], dict[ReplicatedPartition, str]],
        batch: Batch[ReplicatedPartition],
    ) -> dict[ReplicatedPartition, str]:
        """`run` on the fsync thread, timed (`_thread_sync_s`, noted by the loop after)."""
        started = time.perf_counter()
        try:
            return run(batch)
        finally:
            self._thread_sync_s = time.perf_counter() - started

    def _sync_job(
        self, batch: Batch[ReplicatedPartition], row: list[int] | None
    ) -> Callable[[Batch[ReplicatedPartition]], dict[ReplicatedPartition, str]]:
        """What the fsync thread runs for a batch: its syncs one after the other, or side by
        side for `SIDE_BY_SIDE_SYNCS` or more (ADR 0031), stamped when traced."""
        self.syncs_threaded += 1
        run: Callable[[Batch[ReplicatedPartition]], dict[ReplicatedPartition, str]] = (
            self._run_syncs_side_by_side
            if len(batch.syncs) >= SIDE_BY_SIDE_SYNCS
            else self.driver.run_syncs
        )
        if row is not None:
            run = functools.partial(_stamped, run, row)
        return functools.partial(self._timed, run)

    async def _sync_on_thread(
        self, thread: SyncThread, batch: Batch[ReplicatedPartition], row: list[int] | None
    ) -> None:
        """Steps 2 and 3 of a batch (ADR 0040): its syncs on the sync thread while the loop
        goes on reading and stepping frames (a leader's Appends leave meanwhile: `_woken`);
        `_synced` finishes the batch in the loop's reader callback for the thread's eventfd,
        and this returns once it has."""
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        self._syncing = True
        thread.submit(
            self._sync_job(batch, row),
            batch,
            functools.partial(self._synced, batch, row, started, finished),
        )
        try:
            await finished
        finally:
            self._syncing = False

    def _synced(
        self,
        batch: Batch[ReplicatedPartition],
        row: list[int] | None,
        started: float,
        finished: asyncio.Future[None],
        outcome: dict[ReplicatedPartition, str] | BaseException,
    ) -> None:
        """On the loop thread, as soon as the sync thread signals the batch's syncs done: step
        3 at once, not on the driver task's next turn. A batch whose driver task was cancelled
        meanwhile (the host stops) is abandoned, as before ADR 0040; an exception from the
        thread (a bug: `run_syncs` catches OSError per replica) is raised in the driver task."""
        self._syncing = False
        if finished.cancelled():
            return
        if isinstance(outcome, BaseException):
            finished.set_exception(outcome)
            return
        if row is not None:
            row[RESUMED] = now_ns()
        self._note_sync(batch, self._thread_sync_s)
        try:
            self._finish(batch, outcome, row, started)
        except Exception as error:  # a bug in step 3: the driver task raises it, as before
            finished.set_exception(error)
            return
        finished.set_result(None)

    async def _sync_in_executor(
        self, batch: Batch[ReplicatedPartition], row: list[int] | None
    ) -> dict[ReplicatedPartition, str]:
        """Step 2 through `run_in_executor` (`$SPATE_SYNC_HANDOFF=executor`: the path before
        ADR 0040, kept for A/B runs)."""
        run = self._sync_job(batch, row)
        self._syncing = True
        try:
            failures = await asyncio.get_running_loop().run_in_executor(self._executor, run, batch)
        finally:
            self._syncing = False
        self._note_sync(batch, self._thread_sync_s)
        if row is not None:
            row[RESUMED] = now_ns()
        return failures

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


def _stamped(
    run: Callable[[Batch[ReplicatedPartition]], dict[ReplicatedPartition, str]],
    row: list[int],
    batch: Batch[ReplicatedPartition],
) -> dict[ReplicatedPartition, str]:
    """`run` on the fsync thread, its start and end stamped into the trace row."""
    row[JOB_START] = now_ns()
    try:
        return run(batch)
    finally:
        row[JOB_END] = now_ns()
