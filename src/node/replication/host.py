"""ReplicationHost: the one shell per node process that drives every local partition replica.

One driver task runs the loop turn the Raft cores' contract asks for, across all partitions:

1. take a Ready from every replica that has one; write each (entries as chunks, hard state;
   page cache only, on the loop); send at once what `Ready.messages_before_sync` allows (a
   leader's Appends and Heartbeats, or everything when the Ready has nothing to sync) and
   apply the committed entries (resolving producers' appends: committed means a quorum has
   them on disk);
2. run ONE batch of fsyncs for every dirty file of every replica, in the fsync thread (group
   commit across partitions). Messages, ticks and proposals keep arriving meanwhile and are
   stepped into the cores (allowed between `ready` and `advance`): they make the next batch;
3. send `Ready.messages_after_sync` (acks and votes: only now, they promise what step 2
   synced), report leader changes, start catch-ups;
4. `advance` every Ready, and go again while any replica has work.

Frames are written to the sockets on the same loop turn (`Transport.flush`), not by waking the
per-peer writer tasks, which costs several loop turns per hop.

A ticker task ticks every core every `tick_ms`. The transport (transport.py) carries frames
between nodes; catch-up requests are served and made here (catchup.py does the file work).
Retention runs between batches, never while the fsync thread works on the files.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import shutil
import ssl
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spate.core.errors import BrokerError, InvalidArgument, NotFound, Unavailable
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.node.log import LogConfig
from spate.node.replication import catchup, codec, limits
from spate.node.replication.messages import Message, Ready, SnapshotRequest
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.raft import RaftConfig, Role
from spate.node.replication.storage import RaftStore, SyncWork
from spate.node.replication.transport import Transport

log = logging.getLogger(__name__)

TICK_MS_DEFAULT = 50
"""Raft tick; with the default election timeout of 10 ticks a leader is replaced in 0.5-1 s."""
RETENTION_INTERVAL_MS = 10_000
"""How often retention is applied to every replica (between batches)."""

LeaderListener = Callable[[StreamName, PartitionId, NodeId | None, LeaderEpoch], None]


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
        self.raft_config = raft_config or RaftConfig()
        self._rng = random.Random(rng_seed)
        self.transport = Transport(
            node_id,
            secret=secret,
            host=host,
            port=port,
            peers=peers,
            on_frame=self._on_frame,
            ssl_server=ssl_server,
            ssl_client=ssl_client,
        )
        self._groups: dict[codec.GroupKey, ReplicatedPartition] = {}
        self._leader_listeners: list[LeaderListener] = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"fsync-{node_id}")
        self._tasks: list[asyncio.Task[None]] = []
        self._catchups: set[asyncio.Task[None]] = set()
        self._requests: dict[int, asyncio.Future[tuple[int, memoryview]]] = {}
        self._request_ids = itertools.count(1)
        self._retention_due_ms = 0.0
        self._stopping = False
        self.batches = 0
        self.fsyncs = 0

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
        self._stopping = True
        for task in [*self._tasks, *self._catchups]:
            task.cancel()
        for task in [*self._tasks, *self._catchups]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.transport.stop()
        # The fsync thread may still run a batch the cancelled driver started: let it finish
        # before the files are closed (one worker, so this job runs after it).
        await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)
        for group in self._groups.values():
            group.close()
        self._groups.clear()
        self._executor.shutdown(wait=True)

    def add_leader_listener(self, callback: LeaderListener) -> None:
        self._leader_listeners.append(callback)

    def partition_dir(self, stream: StreamName, partition: PartitionId) -> Path:
        return self.data_dir / "partitions" / stream / str(partition)

    async def open_partition(
        self,
        stream: StreamName,
        partition: PartitionId,
        replicas: Sequence[NodeId],
        config: LogConfig,
    ) -> ReplicatedPartition:
        key = (stream, partition)
        if key in self._groups:
            return self._groups[key]
        if self.node_id not in replicas:
            raise InvalidArgument(f"{self.node_id} is not a replica of {stream}/{partition}")
        if not stream or "/" in stream or stream.startswith("."):
            raise InvalidArgument(f"cannot store a stream named {stream!r}")
        loop = asyncio.get_running_loop()
        directory = self.partition_dir(stream, partition)
        store = await loop.run_in_executor(self._executor, RaftStore, directory, config)
        group = ReplicatedPartition(
            self.node_id,
            stream=stream,
            partition=partition,
            replicas=replicas,
            store=store,
            raft_config=self.raft_config,
            rng=random.Random(self._rng.getrandbits(64)),
            wake=self._wake.set,
        )

        def report(leader: NodeId | None, epoch: LeaderEpoch) -> None:
            for listener in list(self._leader_listeners):
                listener(stream, partition, leader, epoch)

        group.leader_listeners.append(report)
        self._groups[key] = group
        if not group.raft.peers or (replicas[0] == self.node_id and group.raft.term == 0):
            # A single-voter group, or the preferred leader of a brand-new group, need not wait
            # an election timeout: a client can publish right after `stream create`.
            group.raft.campaign()
        for peer in group.raft.peers:
            self.transport.dial(peer)
        self._wake.set()
        return group

    async def close_partition(
        self, stream: StreamName, partition: PartitionId, *, delete: bool
    ) -> None:
        group = self._groups.pop((stream, partition), None)
        if group is None:
            raise NotFound(f"{stream}/{partition} is not open on {self.node_id}")
        # Not while the fsync thread may hold its files: the executor runs one job at a time.
        await asyncio.get_running_loop().run_in_executor(self._executor, lambda: None)
        group.close()
        if delete:
            shutil.rmtree(group.store.directory, ignore_errors=True)

    def partition(self, stream: StreamName, partition: PartitionId) -> ReplicatedPartition:
        group = self._groups.get((stream, partition))
        if group is None:
            raise NotFound(f"{stream}/{partition} is not open on {self.node_id}")
        return group

    def partitions(self) -> list[ReplicatedPartition]:
        """Every replica open on this node."""
        return list(self._groups.values())

    # -- the ticker and the driver

    async def _tick(self) -> None:
        period = self.tick_ms / 1000
        next_at = time.monotonic()
        while True:
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            for group in list(self._groups.values()):
                if group.failure is None:
                    group.tick()
            self._wake.set()

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._between_batches()
            batch: list[tuple[ReplicatedPartition, Ready, SyncWork | None]] = []
            for group in list(self._groups.values()):
                if group.failure is not None or not group.raft.has_ready():
                    continue
                ready = group.raft.ready()
                try:
                    work = group.persist(ready)
                except (BrokerError, OSError) as error:
                    self._fail(group, str(error))
                    continue
                batch.append((group, ready, work))
                # Before the sync: a leader's Appends and Heartbeats (its commit counts its own
                # *persisted* index, so a follower may hold an entry before the leader's disk
                # does), everything when there is nothing to sync, and the committed entries
                # (a quorum holds them on disk; this replica has written them).
                self._send(group, ready.messages_before_sync())
                group.apply_committed(ready)
            if not batch:
                continue
            self.transport.flush()
            syncs = [(group, work) for group, _, work in batch if work is not None]
            if syncs:
                failures = await loop.run_in_executor(self._executor, _run_syncs, syncs)
                self.fsyncs += len(syncs)
                for group, work in syncs:
                    if group in failures:
                        self._fail(group, failures[group])
                    else:
                        group.store.finish_sync(work)
            self.batches += 1
            for group, ready, _ in batch:
                if group.failure is not None or group.closed:
                    continue
                self._send(group, ready.messages_after_sync())
                group.report_leader(ready)
                if ready.snapshot_request is not None:
                    self._start_catchup(group, ready.snapshot_request)
                group.raft.advance(ready)
            self.transport.flush()
            self._wake.set()

    def _between_batches(self) -> None:
        """Work that must not overlap an fsync batch: installs and retention."""
        for group in list(self._groups.values()):
            if group.install is not None and group.failure is None:
                manifest, index, term = group.install
                group.install = None
                if group.raft.role is Role.LEADER or index <= group.raft.log.committed:
                    continue
                try:
                    catchup.install(group.store, manifest, index)
                except (BrokerError, OSError) as error:
                    self._fail(group, f"installing segments failed: {error}")
                    continue
                group.restored(index)
                group.raft.restore(index, term)
                log.info(
                    "%s: %s/%s caught up to Raft index %d by segment transfer",
                    self.node_id,
                    group.stream,
                    group.partition,
                    index,
                )
        now_ms = time.monotonic() * 1000
        if now_ms >= self._retention_due_ms:
            self._retention_due_ms = now_ms + RETENTION_INTERVAL_MS
            for group in list(self._groups.values()):
                self.apply_retention(group)

    def apply_retention(self, group: ReplicatedPartition) -> int:
        """Delete expired segments, keeping the chunk at the applied commit point (a restart
        starts at the later of the durable commit point and the first retained chunk)."""
        if group.failure is not None:
            return 0
        try:
            return group.store.log.apply_retention(
                int(time.time() * 1000), index_floor=group.raft.log.applied
            )
        except BrokerError as error:
            self._fail(group, str(error))
            return 0

    def _fail(self, group: ReplicatedPartition, reason: str) -> None:
        log.error(
            "%s: %s/%s stops: the disk failed: %s",
            self.node_id,
            group.stream,
            group.partition,
            reason,
        )
        group.fail(reason)

    def _send(self, group: ReplicatedPartition, messages: Sequence[Message]) -> None:
        if not messages:
            return
        key = (group.stream, group.partition)
        for message in messages:
            self.transport.send(message.target, codec.encode_raft(key, message))

    # -- receiving

    def _on_frame(self, peer: NodeId, kind: int, body: memoryview) -> None:
        try:
            if kind == codec.KIND_RAFT:
                key, message = codec.decode_raft(body)
                group = self._groups.get(key)
                if group is not None and message.source == peer and group.failure is None:
                    group.step(message)
                    # A commit learned while this group's Ready is in the fsync thread: apply
                    # it now (producers' confirms), not after that fsync.
                    committed = group.raft.take_committed()
                    if committed:
                        group.apply_entries(committed)
                    self._wake.set()
            elif kind == codec.KIND_FETCH_MANIFEST:
                key, request_id, raft_index = codec.decode_fetch_manifest(body)
                group = self._groups.get(key)
                if group is None or raft_index > group.raft.log.committed:
                    reply = codec.encode_fetch_error(request_id, "not committed here")
                else:
                    reply = catchup.manifest_reply(group.store, request_id, raft_index)
                self.transport.send(peer, reply)
            elif kind == codec.KIND_FETCH_PIECE:
                key, request_id, name, position, length = codec.decode_fetch_piece(body)
                group = self._groups.get(key)
                if group is None:
                    reply = codec.encode_fetch_error(request_id, "no such partition here")
                else:
                    reply = catchup.piece_reply(group.store, request_id, name, position, length)
                self.transport.send(peer, reply)
            elif kind in (codec.KIND_MANIFEST, codec.KIND_PIECE, codec.KIND_FETCH_ERROR):
                request_id = codec.Reader(body).u64()
                future = self._requests.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result((kind, body))
            else:
                raise codec.CodecError(f"unknown frame kind {kind}")
        except codec.CodecError as error:
            log.warning("replication: bad frame from %s: %s", peer, error)

    # -- catch-up

    def _start_catchup(self, group: ReplicatedPartition, request: SnapshotRequest) -> None:
        if group.catching_up or group.install is not None:
            return
        group.catching_up = True
        task = asyncio.get_running_loop().create_task(self._catch_up(group, request))
        self._catchups.add(task)
        task.add_done_callback(self._catchups.discard)

    async def _catch_up(self, group: ReplicatedPartition, request: SnapshotRequest) -> None:
        key = (group.stream, group.partition)
        index, term = request.snapshot.index, request.snapshot.term
        try:

            async def ask(build: Callable[[int], bytes]) -> tuple[int, memoryview]:
                request_id = next(self._request_ids)
                future: asyncio.Future[tuple[int, memoryview]] = (
                    asyncio.get_running_loop().create_future()
                )
                self._requests[request_id] = future
                try:
                    if not self.transport.send(request.leader, build(request_id)):
                        raise Unavailable(f"no link to {request.leader}")
                    return await asyncio.wait_for(future, limits.catchup_request_timeout_ms / 1000)
                except TimeoutError as error:
                    raise Unavailable(f"{request.leader} did not answer") from error
                finally:
                    self._requests.pop(request_id, None)

            manifest = await catchup.fetch(group.store, key, index, ask)
            if group.closed:
                return
            group.install = (manifest, index, term)
            self._wake.set()
        except (BrokerError, OSError) as error:
            log.info(
                "%s: catch-up of %s/%s from %s interrupted (will resume): %s",
                self.node_id,
                group.stream,
                group.partition,
                request.leader,
                error,
            )
            if not group.closed:
                group.raft.snapshot_failed(request.leader)  # no-op on a follower
        finally:
            group.catching_up = False


def _run_syncs(
    syncs: list[tuple[ReplicatedPartition, SyncWork]],
) -> dict[ReplicatedPartition, str]:
    """The fsync thread: every dirty file of the batch; failures per replica."""
    failures: dict[ReplicatedPartition, str] = {}
    for group, work in syncs:
        try:
            group.store.run_sync(work)
        except OSError as error:
            failures[group] = f"fsync failed: {error}"
    return failures
