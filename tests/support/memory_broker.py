"""An in-memory spate.core.backend.Broker for gateway tests (a fake that must pass the same suite
as the node-backed broker).

Appends resolve after a short `call_later` (simulating group-commit fsync); concurrent appends to
one partition resolve in order and become readable (committed) together. Chunks are kept as
appended; reads return whole chunks from the one holding `start`. `resolve` handles every
OffsetSpec kind. Failure injection (`fail_appends`) and remote partitions (`set_remote`, raising
NotLeader) exist only here; tests that use them say so. A stream's consumer groups are
coordinated at its partition 0 (`group_coordinator`, ADR 0015); `lose_home` disbands them as
a leader change of that partition would, and `MemoryPartition.lose_leadership` does the same to
a partition's single-active-consumer groups (ADR 0013).
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from spate.core import claiming, filtering, groups, ownership, subentry, superstreams
from spate.core.active import ActiveGroups, Conflict
from spate.core.backend import (
    Attached,
    ChunkView,
    ConsumerOffset,
    LocalPartition,
    OffsetSpec,
    OffsetSpecKind,
    PartitionInfo,
    ProducerInfo,
    PublishingIds,
    check_reset,
)
from spate.core.coordination import Coordinators
from spate.core.errors import (
    BrokerError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotLeader,
)
from spate.core.groups import GroupDefinition, GroupKey
from spate.core.ids import NodeId, Offset, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream

FSYNC_DELAY_S = 0.002


@dataclass
class _Chunk:
    first_offset: int
    timestamp_ms: int
    records: Sequence[bytes]
    """The messages; a sub-entry's (ADR 0017) as a SubEntryRecords, unpacked when read."""
    producer: tuple[bytes, int] | None = None  # (name, last publishing id)


@dataclass
class MemoryPartition(LocalPartition):
    stream: StreamName
    partition: PartitionId
    node: NodeId
    clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    chunks: list[_Chunk] = field(default_factory=list)
    committed_end: int = 0
    assigned_end: int = 0
    listeners: list[Callable[[], None]] = field(default_factory=list)
    failures: list[BrokerError] = field(default_factory=list)
    commit_delay_s: float | None = FSYNC_DELAY_S
    """None: appends wait for `release()` (the pump rig decides when the 'fsync' is done)."""
    held: list[tuple[_Chunk, asyncio.Future[Offset]]] = field(default_factory=list)
    assigned_ids: dict[bytes, int] = field(default_factory=dict)
    """Producer name -> last publishing id appended (committed or not), for deduplication."""
    producers: dict[bytes, ProducerInfo] = field(default_factory=dict)
    """Producer name -> its committed state."""
    offsets: dict[bytes, ConsumerOffset] = field(default_factory=dict)
    """Consumer name -> its stored offset (ADR 0012), 'durable' after the fsync delay."""
    attached: dict[bytes, int] = field(default_factory=dict)

    groups: ActiveGroups = field(default_factory=ActiveGroups)
    """Single active consumer groups (ADR 0013)."""
    standbys: set[asyncio.Future[Attached]] = field(default_factory=set)
    """Members waiting for their turn or a step-down (failed by `lose_leadership`)."""

    async def consumer_attach(
        self, name: bytes, *, single_active: bool = False, spread: int | None = None
    ) -> Attached:
        try:
            member, active = self.groups.attach(
                name, self.attached.get(name, 0), single_active=single_active, spread=spread
            )
        except Conflict as conflict:
            raise FailedPrecondition(str(conflict)) from None
        self.attached[name] = self.attached.get(name, 0) + 1
        return Attached(self.offsets.get(name), member, active)

    def _standby(self) -> asyncio.Future[Attached]:
        future: asyncio.Future[Attached] = asyncio.get_running_loop().create_future()
        self.standbys.add(future)
        future.add_done_callback(self.standbys.discard)
        return future

    def lose_leadership(self) -> None:
        """What a node does when the partition's leadership moves (ADR 0013): the groups are
        disbanded and every member waiting here is told NotLeader; this object then plays the
        new leader, which knows no group and counts no link."""
        self.groups.disband()
        self.attached.clear()
        for future in list(self.standbys):
            if not future.done():
                future.set_exception(
                    NotLeader(f"{self.stream}/{self.partition} has a new leader: attach again")
                )

    def until_active(self, name: bytes, member: int) -> asyncio.Future[Attached]:
        future = self._standby()

        def told(active: bool) -> None:
            if not future.done():
                future.set_result(
                    Attached(self.offsets.get(name) if active else None, member, active)
                )

        self.groups.watch(name, member, told)
        return future

    def in_contact(self) -> bool:
        return True

    def until_deposed(self, name: bytes, member: int) -> asyncio.Future[Attached]:
        future = self._standby()

        def told(deposed: bool) -> None:
            if not future.done():
                future.set_result(Attached(None, member, active=not deposed))

        self.groups.watch_deposed(name, member, told)
        return future

    async def step_down(self, name: bytes, member: int, offset: int | None) -> None:
        if offset is not None:
            await self.store_offset(name, offset, member)
        self.groups.stepped_down(name, member)

    async def claim(
        self, name: bytes, epoch: int | None, generation: int | None = None
    ) -> Attached:
        return await claiming.claim(self, name, epoch, generation)

    def stored_offset(self, name: bytes) -> asyncio.Future[ConsumerOffset | None]:
        future: asyncio.Future[ConsumerOffset | None] = asyncio.get_running_loop().create_future()
        future.set_result(self.offsets.get(name))
        return future

    async def store_offset(
        self, name: bytes, offset: int, member: int = 0, *, fenced: bool = True
    ) -> None:
        if offset < -1:
            raise InvalidArgument(f"offset {offset} is below -1")
        if fenced:
            ownership.check_store(self.groups, f"{self.stream}/{self.partition}", name, member)
        self.offsets[name] = ConsumerOffset(name.decode(), offset, self.clock_ms())
        await asyncio.sleep(self.commit_delay_s or 0.0)  # the 'fsync'; later attaches see it

    async def consumer_detach(self, name: bytes, offset: int | None, member: int = 0) -> None:
        try:
            if offset is not None and not (
                ownership.is_group(name) and self.groups.active(name) != member
            ):
                await self.store_offset(name, offset, member)
        finally:
            self.attached[name] = self.attached.get(name, 1) - 1
            if self.attached[name] <= 0:
                del self.attached[name]
            if member:
                self.groups.leave(name, member)

    async def reset_offset(self, name: bytes, offset: int) -> None:
        check_reset(self.stream, self.partition, offset, self.committed_end)
        if self.attached.get(name):
            raise FailedPrecondition(f"consumer {name.decode()!r} has a link attached")
        await self.store_offset(name, offset, fenced=False)  # no link attached: no owner

    def append(
        self, records: Sequence[bytes], producer: PublishingIds | None = None
    ) -> Awaitable[Offset]:
        assert records, "an append carries at least one record"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Offset] = loop.create_future()
        if self.failures:
            error = self.failures.pop(0)
            loop.call_later(self.commit_delay_s or 0.0, future.set_exception, error)
            return future
        named = None
        if producer is not None:
            last = self.assigned_ids.get(producer.name, -1)
            kept = [(r, i) for r, i in zip(records, producer.ids, strict=True) if i > last]
            records = [r for r, _ in kept]
            if kept:
                named = (producer.name, kept[-1][1])
                self.assigned_ids[producer.name] = kept[-1][1]
        # a batch of duplicates is an empty chunk: it resolves after the appends before it
        first = self.assigned_end
        stored: Sequence[bytes] = [bytes(r) for r in records]
        if len(records) == 1 and isinstance(records[0], subentry.SubEntry):
            stored = subentry.SubEntryRecords(
                bytes(records[0]), subentry.parse_header(records[0]).count
            )
        self.assigned_end += len(stored)
        chunk = _Chunk(first, self.clock_ms(), stored, named)
        if self.commit_delay_s is None:
            self.held.append((chunk, future))
        else:
            loop.call_later(self.commit_delay_s, self._commit, chunk, future)
        return future

    def release(self) -> int:
        """Commit every held append, in order; returns how many."""
        held, self.held = self.held, []
        for chunk, future in held:
            self._commit(chunk, future)
        return len(held)

    def _commit(self, chunk: _Chunk, future: asyncio.Future[Offset]) -> None:
        assert chunk.first_offset == self.committed_end, "appends commit in order"
        if chunk.records:
            self.chunks.append(chunk)
            self.committed_end += len(chunk.records)
        if chunk.producer is not None:
            name, last_id = chunk.producer
            self.producers[name] = ProducerInfo(
                name.decode(), last_id, Offset(self.committed_end - 1), chunk.timestamp_ms
            )
        if not future.cancelled():
            future.set_result(Offset(chunk.first_offset))
        for callback in list(self.listeners):
            callback()

    async def last_publishing_id(self, name: bytes) -> ProducerInfo | None:
        while self.assigned_ids.get(name, -1) > (
            -1 if name not in self.producers else self.producers[name].last_publishing_id
        ):
            await asyncio.sleep(FSYNC_DELAY_S)  # an append of the name is on its way
        return self.producers.get(name)

    def read(self, start: Offset, max_bytes: int) -> list[ChunkView]:
        firsts = [c.first_offset for c in self.chunks]
        i = max(bisect.bisect_right(firsts, start) - 1, 0)
        out: list[ChunkView] = []
        size = 0
        for chunk in self.chunks[i:]:
            if chunk.first_offset + len(chunk.records) <= start:
                continue
            if out and size >= max_bytes:
                break
            section = (
                None
                if isinstance(chunk.records, subentry.SubEntryRecords)
                else filtering.section(chunk.records, filtering.SIZE_BYTES_DEFAULT)
            )  # the Bloom filter the node stores with each chunk (ADR 0016; none for sub-entries)
            chosen = None if section is None else filtering.decode(section, 0, len(section))[0]
            out.append(
                ChunkView(Offset(chunk.first_offset), chunk.timestamp_ms, chunk.records, chosen)
            )
            size += subentry.stored_bytes(chunk.records)
        return out

    def resolve(self, spec: OffsetSpec) -> Offset:
        end = self.committed_end
        if spec.kind is OffsetSpecKind.FIRST:
            return Offset(0)
        if spec.kind is OffsetSpecKind.NEXT:
            return Offset(end)
        if spec.kind is OffsetSpecKind.LAST:
            return Offset(self.chunks[-1].first_offset if self.chunks else end)
        if spec.kind is OffsetSpecKind.OFFSET:
            return Offset(min(max(spec.value, 0), end))
        if spec.kind is OffsetSpecKind.RELATIVE:
            return Offset(max(end - spec.value, 0))
        assert spec.kind is OffsetSpecKind.TIMESTAMP
        for chunk in self.chunks:
            if chunk.timestamp_ms >= spec.value:
                return Offset(chunk.first_offset)
        return Offset(end)

    def end_offset(self) -> Offset:
        return Offset(self.committed_end)

    def info(self) -> PartitionInfo:
        empty = not self.chunks
        return PartitionInfo(
            stream=self.stream,
            partition=self.partition,
            first_offset=None if empty else Offset(0),
            last_offset=None if empty else Offset(self.committed_end - 1),
            end_offset=Offset(self.committed_end),
            first_timestamp_ms=None if empty else self.chunks[0].timestamp_ms,
            last_timestamp_ms=None if empty else self.chunks[-1].timestamp_ms,
            messages=self.committed_end,
            bytes=sum(subentry.stored_bytes(c.records) for c in self.chunks),
            segments=1,
            leader=self.node,
        )

    def add_listener(self, callback: Callable[[], None]) -> None:
        self.listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        if callback in self.listeners:
            self.listeners.remove(callback)


@dataclass(frozen=True)
class RemoteLeader:
    node: str
    host: str
    port: int


class MemoryBroker:
    """Streams live in a dict; must be used from the event loop that runs the gateway."""

    def __init__(self, node: str = "n1", *, commit_delay_s: float | None = FSYNC_DELAY_S) -> None:
        self.node = NodeId(node)
        self.commit_delay_s = commit_delay_s
        self.configs: dict[StreamName, StreamConfig] = {}
        self.partitions: dict[tuple[StreamName, PartitionId], MemoryPartition] = {}
        self.remote: dict[tuple[StreamName, PartitionId], RemoteLeader] = {}
        self.super_streams: dict[StreamName, SuperStream] = {}
        self.groups: dict[GroupKey, GroupDefinition] = {}
        self.groups_required = False
        self.coordinators: dict[StreamName, Coordinators] = {}
        """Each stream's consumer-group coordinators, at its partition 0 (ADR 0015)."""

    def group_coordinator(self, stream: StreamName) -> Coordinators:
        home = self.partition(stream, PartitionId(0), write=True)  # NotFound, NotLeader
        found = self.coordinators.get(stream)
        if found is None:
            found = Coordinators(home, stream, self.stream(stream).partitions)
            self.coordinators[stream] = found
        return found

    def lose_home(self, name: str) -> None:
        """Partition 0 of `name` changed leader: its groups are disbanded (a waiting sync fails
        with NotLeader); the next `group_coordinator` starts over from the stored
        generations."""
        found = self.coordinators.pop(StreamName(name), None)
        if found is not None:
            found.disband()

    def define_group(self, group: GroupDefinition) -> None:
        """What `spate group create` does in a cluster (version: one more than the last)."""
        self.stream(group.stream)  # NotFound
        version = max((g.version for g in self.groups.values()), default=0) + 1
        self.groups[group.key] = dataclasses.replace(group, version=version)

    async def consumer_group(self, stream: StreamName, group: str) -> GroupDefinition | None:
        return groups.find(self.groups, stream, group)

    def create_stream(self, config: StreamConfig) -> None:
        config.validate()
        self.configs[config.name] = config
        for p in range(config.partitions):
            pid = PartitionId(p)
            self.partitions[(config.name, pid)] = MemoryPartition(
                config.name, pid, self.node, commit_delay_s=self.commit_delay_s
            )

    def create_super_stream(self, topology: SuperStream) -> None:
        for stream in topology.partitions:
            self.create_stream(StreamConfig(stream))
        self.super_streams[topology.name] = topology

    async def super_stream(self, name: StreamName) -> SuperStream:
        return superstreams.find(self.super_streams, name)

    def super_stream_version(self, name: StreamName) -> int | None:
        return superstreams.version_of(self.super_streams, name)

    async def super_stream_of(self, stream: StreamName) -> SuperStream | None:
        return superstreams.owner_of(self.super_streams, stream)

    def release(self) -> int:
        """Commit every held append of every partition (commit_delay_s=None)."""
        return sum(p.release() for p in self.partitions.values())

    def set_remote(self, name: str, partition: int, leader: RemoteLeader) -> None:
        """Pretend another node leads this partition (NotLeader with its address)."""
        self.remote[(StreamName(name), PartitionId(partition))] = leader

    def fail_appends(self, name: str, partition: int, *errors: BrokerError) -> None:
        """The next appends to this partition fail with these errors, in order."""
        self.partitions[(StreamName(name), PartitionId(partition))].failures.extend(errors)

    def lose_leadership(self, name: str, partition: int = 0) -> None:
        """This partition's leader changed: its single-active-consumer groups are disbanded
        (`MemoryPartition.lose_leadership`)."""
        self.partitions[(StreamName(name), PartitionId(partition))].lose_leadership()

    async def lookup(self, name: StreamName) -> StreamConfig:
        return self.stream(name)

    def stream(self, name: StreamName) -> StreamConfig:
        config = self.configs.get(name)
        if config is None:
            raise NotFound(f"stream {name!r} does not exist")
        return config

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool, relay: bool = False
    ) -> MemoryPartition:
        config = self.stream(name)
        if not 0 <= partition < config.partitions:
            raise NotFound(
                f"stream {name!r} has no partition {partition} "
                f"(it has {config.partitions}: 0-{config.partitions - 1})"
            )
        leader = self.remote.get((name, partition))
        if leader is not None:
            raise NotLeader(
                f"partition {partition} of {name!r} is led by {leader.node}",
                leader_host=leader.host,
                leader_port=leader.port,
                leader_node=leader.node,
            )
        return self.partitions[(name, partition)]
