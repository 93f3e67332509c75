"""Replica: one replica of one partition, without asyncio (the simulator runs it as it is).

It holds the replica's Raft core and RaftStore; the node's ReplicationDriver drives it (ticks,
messages, Readies, group commit). `spate.node.replication.partition.ReplicatedPartition` adds
the asyncio `append` of spate.core.backend.Partition on top. What it adds to the core:

- `propose(records, done)` on the leader encodes the chunk(s) (first offset = end offset of
  the previous entry, epoch = term, raft_index = the index the core will give it), proposes
  them and calls `done(first_offset)` once, when the last chunk's entry is applied *with the
  same index and term*; an entry at that index with another term, a truncation, or no outcome
  within `limits.append_commit_timeout_ms` calls `done(NotLeader | Unavailable)` (both
  retryable): never a false ack. On a follower: `done(NotLeader(leader_node))`.
- reads (`read`, `resolve`, `end_offset`, `info`) serve up to the replica's applied commit
  point, on any replica (consumers may read from followers; producers go to the leader).
- `leader`, `leader_epoch` (the term the leader was elected in), `role`, `is_leader`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spate.core.backend import ChunkView, LocalPartition, OffsetSpec, PartitionInfo
from spate.core.errors import (
    BrokerError,
    InvalidArgument,
    MessageSizeExceeded,
    NotLeader,
    ResourceLimitExceeded,
    StorageFailure,
    Unavailable,
)
from spate.core.ids import LeaderEpoch, NodeId, Offset, PartitionId, StreamName, Term
from spate.node.log import chunk as chunk_codec
from spate.node.replication import limits
from spate.node.replication.messages import (
    Entry,
    Message,
    Proposed,
    Ready,
    VoteRequest,
)
from spate.node.replication.raft import Raft, RaftConfig, Role
from spate.node.replication.storage import RaftStore, SyncWork

AppendDone = Callable[[Offset | BrokerError], None]
"""Called once with an append's outcome: the first record's offset, or why it failed."""


@dataclass(slots=True)
class _Pending:
    term: Term
    first_offset: Offset
    done: AppendDone
    deadline_ms: float


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_clock_ms() -> float:
    return time.monotonic() * 1000


class Replica(LocalPartition):
    def __init__(
        self,
        node: NodeId,
        *,
        stream: StreamName,
        partition: PartitionId,
        replicas: Sequence[NodeId],
        store: RaftStore,
        raft_config: RaftConfig,
        rng: random.Random,
        wake: Callable[[], None],
        clock_ms: Callable[[], int] = wall_clock_ms,
        monotonic_ms: Callable[[], float] = monotonic_clock_ms,
    ) -> None:
        self.node = node
        self._stream = stream
        self._partition = partition
        self.replicas = tuple(replicas)
        self.store = store
        self.raft_config = raft_config
        hard_state, snapshot, entries, committed_end = store.initial()
        self.raft = Raft(
            node,
            replicas,
            raft_config,
            rng,
            hard_state=hard_state,
            snapshot=snapshot,
            entries=entries,
        )
        self._committed_end = committed_end
        self._wake = wake
        self._clock_ms = clock_ms
        self._monotonic_ms = monotonic_ms
        self._pending: dict[int, _Pending] = {}
        self._listeners: list[Callable[[], None]] = []
        self.leader_listeners: list[Callable[[NodeId | None, LeaderEpoch], None]] = []
        self.fresh = store.fresh
        self._ticks = 0
        self._heard_leader = False
        self.failure: str | None = None
        self.catching_up = False
        self.install: tuple[list[tuple[str, int]], int, Term] | None = None
        self.closed = False

    # -- Partition protocol

    @property
    def stream(self) -> StreamName:
        return self._stream

    @property
    def partition(self) -> PartitionId:
        return self._partition

    @property
    def leader(self) -> NodeId | None:
        return self.raft.leader

    @property
    def leader_epoch(self) -> LeaderEpoch:
        return self.raft.leader_epoch

    @property
    def role(self) -> Role:
        return self.raft.role

    @property
    def is_leader(self) -> bool:
        return self.raft.role is Role.LEADER

    def propose(self, records: Sequence[bytes], done: AppendDone) -> int | None:
        """Propose an append; `done` gets its outcome (see the module docstring). Returns the
        Raft index of its last entry, or None when refused at once (`done` already called)."""
        try:
            last_index, term, first = self._propose(records)
        except BrokerError as error:
            done(error)
            return None
        deadline_ms = self._monotonic_ms() + limits.append_commit_timeout_ms
        stale = self._pending.pop(last_index, None)
        if stale is not None:
            stale.done(Unavailable("the entry was overwritten; retry"))
        self._pending[last_index] = _Pending(term, first, done, deadline_ms)
        self._wake()
        return last_index

    def _propose(self, records: Sequence[bytes]) -> tuple[int, Term, Offset]:
        if self.closed:
            raise Unavailable("the partition is closing")
        if self.failure is not None:
            raise StorageFailure(f"the replica refuses writes since: {self.failure}")
        if not self.is_leader:
            raise NotLeader(
                f"{self.node} does not lead {self._stream}/{self._partition}",
                leader_node=self.raft.leader,
            )
        if not records:
            raise InvalidArgument("an append needs at least one record")
        if len(self._pending) >= limits.pending_appends_max:
            raise ResourceLimitExceeded(
                f"{limits.pending_appends_max} appends already wait for their commit"
            )
        config = self.store.config
        for record in records:
            if len(record) > config.message_bytes_max:
                raise MessageSizeExceeded(
                    f"a message of {len(record)} bytes is over the limit of "
                    f"{config.message_bytes_max} bytes"
                )
        timestamp_ms = self._clock_ms()
        last_ts = self.store.log.last_timestamp_ms
        if last_ts is not None and timestamp_ms < last_ts:
            timestamp_ms = last_ts
        first = offset = self._next_offset()
        term = self.raft.term
        start = 0
        index = 0
        while start < len(records):
            end = start
            payload = 0
            while end < len(records) and end - start < config.chunk_records_max:
                size = len(records[end]) + chunk_codec.RECORD_PREFIX_BYTES
                if end > start and payload + size > config.chunk_bytes_max:
                    break
                payload += size
                end += 1
            index = self.raft.log.last_index + 1
            data = chunk_codec.encode_chunk(records[start:end], offset, timestamp_ms, term, index)
            result = self.raft.propose(data)
            if not isinstance(result, Proposed):
                raise result.error()
            assert (result.index, result.term) == (index, term), (result, index, term)
            offset = Offset(offset + end - start)
            start = end
        return index, term, first

    def _next_offset(self) -> Offset:
        """End offset of the last entry in the core's log (barriers move no offset)."""
        log = self.raft.log
        index = log.last_index
        while index > log.snapshot.index:
            payload = log.entry(index).payload
            if payload:
                return chunk_codec.decode_header(payload).end_offset
            index -= 1
        # Only barriers above the snapshot point: the end is the applied end.
        return self._committed_end

    def read(self, start: Offset, max_bytes: int) -> list[ChunkView]:
        return self.store.log.read(start, max_bytes, end=self._committed_end)

    def resolve(self, spec: OffsetSpec) -> Offset:
        return self.store.log.resolve(spec, end=self._committed_end)

    def end_offset(self) -> Offset:
        return self._committed_end

    def info(self) -> PartitionInfo:
        facts = self.store.log.info(end=self._committed_end)
        return PartitionInfo(
            stream=self._stream,
            partition=self._partition,
            first_offset=facts.first_offset if facts.messages else None,
            last_offset=Offset(facts.end_offset - 1) if facts.messages else None,
            end_offset=facts.end_offset,
            first_timestamp_ms=facts.first_timestamp_ms,
            last_timestamp_ms=facts.last_timestamp_ms,
            messages=facts.messages,
            bytes=facts.bytes,
            segments=facts.segments,
            leader=self.raft.leader,
            leader_epoch=self.leader_epoch,
        )

    def set_wake(self, wake: Callable[[], None]) -> None:
        """Who to tell that this replica has work (the driver marks it for the next batch)."""
        self._wake = wake

    @property
    def heard_leader(self) -> bool:
        """A leader has been reported since this replica opened (ends a new directory's vote
        embargo)."""
        return self._heard_leader

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

    # -- driven by the host

    def tick(self) -> None:
        self._ticks += 1
        self.raft.tick()
        if self._pending:
            now_ms = self._monotonic_ms()
            while self._pending:
                index, pending = next(iter(self._pending.items()))
                if pending.deadline_ms > now_ms:
                    break
                del self._pending[index]
                pending.done(
                    Unavailable("no commit within the time limit; retry (maybe duplicated)")
                )

    def step(self, message: Message) -> None:
        if message.target != self.node or message.source not in self.raft.peers:
            return  # not for this replica (a stale or confused peer): drop it
        if (
            isinstance(message, VoteRequest)
            and not message.pre_vote
            and self.fresh
            and not self._heard_leader
            and self._ticks < limits.vote_embargo_ticks
        ):
            return  # a new directory may be a wiped one that forgot its vote (ADR 0005)
        self.raft.step(message)

    def persist(self, ready: Ready) -> SyncWork | None:
        if ready.entries and self._pending and not self.is_leader:
            self._fail_overwritten(ready.entries)
        return self.store.persist(ready)

    def _fail_overwritten(self, entries: Sequence[Entry]) -> None:
        """Fail appends whose index now holds another term's entry, or is past the log."""
        last = self.raft.log.last_index
        for entry in entries:
            pending = self._pending.get(entry.index)
            if pending is not None and pending.term != entry.term:
                self._fail_one(entry.index, "the append was lost in a leader change; retry")
        for key in [k for k in self._pending if k > last]:
            self._fail_one(key, "the append was lost in a leader change; retry")

    def _fail_one(self, index: int, reason: str) -> None:
        pending = self._pending.pop(index)
        pending.done(NotLeader(reason, leader_node=self.raft.leader))

    def apply(self, ready: Ready) -> None:
        """Apply the committed entries, then report a leader change (a whole Ready at once)."""
        self.apply_committed(ready)
        self.report_leader(ready)

    def apply_committed(self, ready: Ready) -> None:
        """Step 2 of a Ready: resolve the appends its committed entries carry and wake readers.
        Runs before the Ready's own sync: a committed entry is on a quorum's disks already,
        and it was written here (page cache) by this or an earlier Ready."""
        self.apply_entries(ready.committed)

    def apply_entries(self, committed: Sequence[Entry]) -> None:
        """Apply committed entries in order (from a Ready or `Raft.take_committed`)."""
        moved = False
        for entry in committed:
            self._apply(entry)
            moved = moved or bool(entry.payload)
        if committed:
            applied = committed[-1].index
            while self._pending:
                index = next(iter(self._pending))
                if index > applied:
                    break
                pending = self._pending.pop(index)
                pending.done(Unavailable("the entry's outcome is unknown after a catch-up; retry"))
        if moved:
            for callback in list(self._listeners):
                callback()

    def report_leader(self, ready: Ready) -> None:
        """Step 4 of a Ready (after its sync: a new term is on disk before it is announced)."""
        if ready.leader_change is not None:
            change = ready.leader_change
            if change.leader is not None:
                self._heard_leader = True
            for listener in list(self.leader_listeners):
                listener(change.leader, change.epoch)

    def _apply(self, entry: Entry) -> None:
        if entry.payload:
            header = chunk_codec.decode_header(entry.payload)
            self._committed_end = max(self._committed_end, header.end_offset)
        pending = self._pending.pop(entry.index, None)
        if pending is None:
            return
        if pending.term == entry.term:
            pending.done(pending.first_offset)
        else:
            pending.done(
                NotLeader(
                    "the append was lost in a leader change; retry", leader_node=self.raft.leader
                )
            )

    def restored(self, raft_index: int) -> None:
        """The catch-up installed the leader's segments up to `raft_index`."""
        header = self.store.log.header_at_index(raft_index)
        assert header is not None
        self._committed_end = header.end_offset
        for callback in list(self._listeners):
            callback()

    def fail(self, reason: str) -> None:
        """The disk failed: refuse everything from now on."""
        if self.failure is None:
            self.failure = reason
        pending, self._pending = list(self._pending.values()), {}
        for one in pending:
            one.done(StorageFailure(f"the disk failed: {reason}"))

    def close(self) -> None:
        self.closed = True
        pending, self._pending = list(self._pending.values()), {}
        for one in pending:
            one.done(Unavailable("the partition was closed; retry"))
        self.store.close()
