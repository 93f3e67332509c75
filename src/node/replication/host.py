"""ReplicationHost: the asyncio shell around the ReplicationDriver (driver.py), one per node
process, driving every local partition replica.

Everything the shell decides lives in the driver, which the simulator runs unchanged; what is
left here is what cannot run in a simulation: the asyncio tasks (a ticker every `tick_ms`, the
driver loop), the TCP transport (transport.py), the fsync thread, and opening and closing
replicas' files off the loop. The driver loop:

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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spate.core.errors import InvalidArgument
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.node.log import LogConfig
from spate.node.replication.driver import LeaderListener, ReplicationDriver
from spate.node.replication.files import DirectoryFiles
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.raft import RaftConfig
from spate.node.replication.replica import monotonic_clock_ms, wall_clock_ms
from spate.node.replication.storage import RaftStore
from spate.node.replication.transport import Transport

log = logging.getLogger(__name__)

TICK_MS_DEFAULT = 50
"""Raft tick; with the default election timeout of 10 ticks a leader is replaced in 0.5-1 s."""


CLOCK_OFFSET_ENV = "SPATE_CLOCK_OFFSET_MS"
"""Fault injection (the chaos suite's clock faults): milliseconds added to this node's wall
clock, which stamps chunks (message timestamps) and drives time-based retention. Unset or 0 in
production."""


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
        )
        self.transport = Transport(
            node_id,
            secret=secret,
            host=host,
            port=port,
            peers=peers,
            on_frame=self.driver.receive,
            ssl_server=ssl_server,
            ssl_client=ssl_client,
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"fsync-{node_id}")
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
        key = (stream, partition)
        if key in self.driver.groups:
            return self.driver.groups[key]
        if self.node_id not in (*replicas, *learners):
            raise InvalidArgument(f"{self.node_id} is not a replica of {stream}/{partition}")
        if not stream or "/" in stream or stream.startswith("."):
            raise InvalidArgument(f"cannot store a stream named {stream!r}")
        loop = asyncio.get_running_loop()
        files = DirectoryFiles(self.partition_dir(stream, partition))
        store = await loop.run_in_executor(self._executor, RaftStore, files, config)
        if key in self.driver.groups:  # opened meanwhile
            store.close()
            return self.driver.groups[key]
        group = ReplicatedPartition(
            self.node_id,
            stream=stream,
            partition=partition,
            replicas=replicas,
            learners=learners,
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
        next_at = time.monotonic()
        while True:
            next_at += period
            now = time.monotonic()
            if next_at < now - period:
                # The loop stalled: no burst of catch-up ticks. Ticks run back to back would
                # count peers' silence before their frames, waiting in the sockets, are read.
                next_at = now
            await asyncio.sleep(max(0.0, next_at - now))
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
                self._syncing = True
                try:
                    failures = await loop.run_in_executor(self._executor, driver.run_syncs, batch)
                finally:
                    self._syncing = False
                driver.fsync_seconds.observe(time.perf_counter() - started)
            driver.finish_batch(batch, failures)
            self.transport.flush()
