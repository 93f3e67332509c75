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
- deduplication (ADR 0011): `propose(records, done, producer)` on the leader drops the records
  whose publishing id is not above the name's last *stored* one (the log's producer table, or
  a proposal not yet written: `_proposed`) and stores the rest with a producer section. A
  batch of duplicates only resolves once the entry that stored its name's last id is applied
  with the same term (`_waiting`): a duplicate is never acknowledged before its original is.
  It resolves to the end offset, read once a quorum confirmed this replica still leads (the
  leadership check below, ADR 0041): a cut-off leader never answers one.
  `query_publishing_id(name, done)` answers the same way: the last id, once committed.
- offset tracking (ADR 0012): `propose_offsets(entries, done)` on the leader proposes one
  tracking chunk (consumer names' offsets, no records) and calls `done` once it is applied
  with the same term; `query_offset(name, done)` answers a name's stored offset once the entry
  that stored it is committed (a proposal not yet written counts: `_proposed_offsets`).
- reads of the log's state on the leader (`query_offset`, `query_publishing_id`, a batch of
  duplicates' end offset) read it only once a quorum has confirmed, in this term, that this
  replica still leads (`_when_confirmed`, `Raft.confirm_leadership`): a stale leader (cut
  off, or left behind by a transfer) would answer from a log missing a newer leader's
  acknowledged writes.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spate.core import filtering, subentry
from spate.core.backend import (
    ChunkView,
    ConsumerOffset,
    LocalPartition,
    OffsetSpec,
    PartitionInfo,
    ProducerInfo,
    PublishingIds,
)
from spate.core.errors import (
    BrokerError,
    FailedPrecondition,
    InvalidArgument,
    NotLeader,
    ResourceLimitExceeded,
    StorageFailure,
    Unavailable,
)
from spate.core.filtering import ChunkFilter
from spate.core.histogram import Histogram
from spate.core.ids import LeaderEpoch, NodeId, Offset, PartitionId, StreamName, Term
from spate.node.log import chunk as chunk_codec
from spate.node.log import producers as producer_codec
from spate.node.log.producers import ProducerState
from spate.node.log.tracking import ENTRIES_PER_CHUNK_MAX, NAME_BYTES_MAX, TrackedOffset
from spate.node.replication import limits
from spate.node.replication.messages import (
    Entry,
    Membership,
    Message,
    Proposed,
    Ready,
    Refusal,
    RefusalReason,
    VoteRequest,
    is_membership,
)
from spate.node.replication.raft import Raft, RaftConfig, Role
from spate.node.replication.storage import RaftStore, SyncWork

AppendDone = Callable[[Offset | BrokerError], None]
"""Called once with an append's outcome: the first record's offset, or why it failed."""
ProducerDone = Callable[[ProducerInfo | BrokerError | None], None]
"""Called once with a producer name's committed state (None: never stored), or why not."""
OffsetDone = Callable[[ConsumerOffset | BrokerError | None], None]
"""Called once with a consumer name's committed stored offset (None: never stored), or why not."""


@dataclass(slots=True)
class _Waiting:
    """A decision that holds once the entry (index, term) is applied: `done(True)`; or never
    (another term's entry at that index, a catch-up past it, a timeout): `done(error)`."""

    term: int
    done: Callable[[BrokerError | None], None]
    deadline_ms: float


@dataclass(slots=True)
class _Confirming:
    """A read waiting for this leader's leadership check `round` (`Raft.confirm_leadership`)
    in `term`: `done(None)` once a quorum has answered it, `done(error)` if it never will."""

    round: int
    term: Term
    done: Callable[[BrokerError | None], None]
    deadline_ms: float


@dataclass(slots=True)
class _Pending:
    term: Term
    first_offset: Offset
    done: AppendDone
    deadline_ms: float
    proposed_ms: float


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
        learners: Sequence[NodeId] = (),
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
            Membership.of(replicas, learners),
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
        self._waiting: dict[int, list[_Waiting]] = {}
        self._confirming: list[_Confirming] = []
        """Reads waiting for a leadership check, in round order."""
        self._applied_index = snapshot.index
        self._proposed: dict[bytes, ProducerState] = {}
        """Producer states of this leader's proposals not yet written to the log."""
        self._proposed_offsets: dict[bytes, TrackedOffset] = {}
        """Consumer offsets of this leader's tracking proposals not yet written to the log."""
        self._listeners: list[Callable[[], None]] = []
        self.leader_listeners: list[Callable[[NodeId | None, LeaderEpoch], None]] = []
        self.fresh = store.fresh
        self._ticks = 0
        self._quiet_from: int | None = None
        """The driver's tick count when it stopped ticking this quiet group (ADR 0026)."""
        self._driver_ticks: Callable[[], int] = lambda: 0
        self._heard_leader = False
        self.failure: str | None = None
        self.catching_up = False
        self.install: tuple[list[tuple[str, int]], int, Term] | None = None
        self.install_membership: Membership | None = None
        """The membership the leader's SnapshotNeeded named for the transfer under way."""
        self.install_asked = 0
        """The Raft index that SnapshotNeeded asked for (an install may go past it)."""
        self.closed = False
        # Counters for /metrics (ADR 0023), read at scrape time; updated once per append and
        # per read, never per message.
        self.messages_in = 0
        """Messages this replica proposed as leader (appends accepted for replication)."""
        self.bytes_in = 0
        """Bytes of the chunks it proposed (headers included)."""
        self.messages_out = 0
        """Messages handed to readers (consumer links and gateway sessions), skips excluded."""
        self.bytes_out = 0
        """Bytes of those messages as stored (a sub-entry counts its compressed size)."""
        self.leader_changes = 0
        """Leader changes this replica reported (an election won or a new leader heard)."""
        self.append_seconds: Histogram | None = None
        """Proposed-to-committed time of this leader's appends; the driver shares one per node."""

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

    # -- replica-set changes (ADR 0022)

    def transfer_leadership(self, target: NodeId) -> BrokerError | None:
        """On the leader: hand leadership to voter `target` (Raft's TimeoutNow); None when
        started (or `target` leads already). FailedPrecondition naming the leader elsewhere,
        InvalidArgument when `target` is not a voter."""
        refusal = self.raft.transfer_leadership(target)
        if refusal is None:
            self._wake()
            return None
        return self._membership_error(refusal, f"{target} is not a voter of this partition")

    def propose_membership(
        self, voters: Sequence[NodeId], learners: Sequence[NodeId]
    ) -> BrokerError | int:
        """On the leader: append a membership entry; its Raft index, or why not
        (FailedPrecondition: not the leader; Unavailable: the previous change is not committed
        yet, retry; InvalidArgument: more than one voter changes, or it drops the leader)."""
        if not voters or set(voters) & set(learners):
            return InvalidArgument("voters: need at least one, none of them also a learner")
        if len(voters) > limits.peers_max or len(voters) + len(learners) > limits.members_max:
            return InvalidArgument(
                f"voters: at most {limits.peers_max}, and {limits.members_max} members in all"
            )
        result = self.raft.propose_membership(Membership.of(voters, learners))
        if isinstance(result, Proposed):
            self._wake()
            return result.index
        return self._membership_error(
            result,
            "a membership change may add or remove one voter at a time and must keep the "
            f"leader ({self.node}) a voter: transfer leadership first to remove it",
        )

    def _membership_error(self, refusal: Refusal, invalid: str) -> BrokerError:
        match refusal.reason:
            case RefusalReason.NOT_LEADER:
                leader = refusal.leader or "unknown"
                return FailedPrecondition(
                    f"{self.node} does not lead {self._stream}/{self._partition} (leader: {leader})"
                )
            case RefusalReason.MEMBERSHIP_INVALID:
                return InvalidArgument(invalid)
            case _:
                return refusal.error()

    def propose(
        self, records: Sequence[bytes], done: AppendDone, producer: PublishingIds | None = None
    ) -> int | None:
        """Propose an append; `done` gets its outcome (see the module docstring). Returns the
        Raft index of its last entry, or None when refused at once or when every record was a
        duplicate (`done` called already, or once the originals are committed)."""
        try:
            if producer is not None:
                records, section_ids = self._deduplicate(records, producer, done)
                if not records:
                    return None
                last_index, term, first = self._propose(records, producer.name, section_ids)
            else:
                last_index, term, first = self._propose(records)
        except BrokerError as error:
            done(error)
            return None
        now_ms = self._monotonic_ms()
        deadline_ms = now_ms + limits.append_commit_timeout_ms
        stale = self._pending.pop(last_index, None)
        if stale is not None:
            stale.done(Unavailable("the entry was overwritten; retry"))
        self._pending[last_index] = _Pending(term, first, done, deadline_ms, now_ms)
        self._wake()
        return last_index

    def _producer_state(self, name: bytes) -> ProducerState | None:
        """The name's last stored state on this leader: proposed, else written to the log."""
        proposed = self._proposed.get(name)
        if proposed is not None and proposed.epoch == self.raft.term:
            return proposed
        return self.store.log.producers.get(name)

    def _deduplicate(
        self, records: Sequence[bytes], producer: PublishingIds, done: AppendDone
    ) -> tuple[Sequence[bytes], list[int]]:
        """The records to store and their ids; with none left, `done` is called once the
        entry that stored the name's last id is known committed."""
        self._check_leader()
        if len(producer.ids) != len(records):
            raise InvalidArgument("one publishing id per record")
        state = self._producer_state(producer.name)
        ids = list(producer.ids)
        kept = producer_codec.keep_new(ids, None if state is None else state.last_id)
        if len(kept.keep) == len(records):
            return records, ids
        if kept.keep:
            return [records[i] for i in kept.keep], [ids[i] for i in kept.keep]
        assert state is not None

        def confirmed(error: BrokerError | None) -> None:
            # The batch's answer is the end offset as this leader knows it: read once a quorum
            # has confirmed it still leads (ADR 0041), so never older than an append
            # acknowledged before the batch came, wherever that append was led.
            if error is not None:
                done(error)
                return
            end = self._next_offset()
            self._when_applied(
                state.raft_index, state.epoch, lambda error: done(end if error is None else error)
            )

        self._when_confirmed(confirmed)
        return [], []

    def _when_confirmed(self, done: Callable[[BrokerError | None], None]) -> None:
        """`done(None)` once a quorum of voters has answered a leadership check begun now
        (`Raft.confirm_leadership`, Raft thesis §6.4), still in this term; `done(NotLeader)`
        if the term ends first, `done(Unavailable)` past `append_commit_timeout_ms`. A read of
        the log's state from then on (answered once the entry it read is committed) is never
        older than a write acknowledged before this call, wherever that write was led. Without
        it a leader cut off from its quorum, or left behind by a leadership transfer whose new
        term it has not heard yet, answered from a log missing what the new leader had
        committed and acknowledged (issue 16, ADR 0035 addendum: the shell simulator's seed
        208, `offset-durable`). Costs one heartbeat round trip per read, none on a single
        voter."""
        round_ = self.raft.confirm_leadership()
        if self.raft.leadership_confirmed >= round_:
            done(None)  # a single voter: nobody else can lead
            return
        deadline_ms = self._monotonic_ms() + limits.append_commit_timeout_ms
        self._confirming.append(_Confirming(round_, self.raft.term, done, deadline_ms))
        self._wake()

    def _settle_confirming(self) -> None:
        """Answer the reads whose leadership check a quorum confirmed; fail them all once this
        replica no longer leads in their term."""
        raft = self.raft
        leading = raft.role is Role.LEADER
        confirmed = raft.leadership_confirmed
        settled: list[tuple[_Confirming, BrokerError | None]] = []
        waiting: list[_Confirming] = []
        for one in self._confirming:
            if not leading or one.term != raft.term:
                lost = NotLeader("leadership lost before the read; retry", leader_node=raft.leader)
                settled.append((one, lost))
            elif one.round <= confirmed:
                settled.append((one, None))
            else:
                waiting.append(one)
        self._confirming = waiting
        for one, error in settled:  # after the list is consistent: `done` may read again
            one.done(error)

    def _when_applied(
        self, index: int, term: int, done: Callable[[BrokerError | None], None]
    ) -> None:
        """`done(None)` once the entry (index, term) is applied here (at once if it is), or
        `done(error)` when it never will be."""
        if index <= self._applied_index:
            done(None)  # applied entries are committed; the table only holds written ones
            return
        deadline_ms = self._monotonic_ms() + limits.append_commit_timeout_ms
        self._waiting.setdefault(index, []).append(_Waiting(term, done, deadline_ms))
        self._wake()

    def query_publishing_id(self, name: bytes, done: ProducerDone) -> None:
        """The name's last stored publishing id, answered once it is committed (004's
        `getLastPublishingId`): what a restarted producer may resume after. Leader only."""
        try:
            self._check_leader()
        except BrokerError as error:
            done(error)
            return

        def confirmed(error: BrokerError | None) -> None:
            if error is not None:
                done(error)
                return
            state = self._producer_state(name)
            if state is None:
                done(None)
                return
            info = ProducerInfo(
                name.decode(errors="replace"),
                state.last_id,
                Offset(state.last_offset),
                state.timestamp_ms,
            )
            self._when_applied(
                state.raft_index, state.epoch, lambda error: done(info if error is None else error)
            )

        self._when_confirmed(confirmed)

    def producers(self) -> list[ProducerInfo]:
        """Every producer name this replica has stored, most recently written last (the table
        over its written log: on a follower, possibly ahead of the commit point)."""
        return [
            ProducerInfo(
                name.decode(errors="replace"), s.last_id, Offset(s.last_offset), s.timestamp_ms
            )
            for name, s in self.store.log.producers
        ]

    def propose_offsets(self, entries: Sequence[tuple[bytes, int]], done: AppendDone) -> None:
        """Store consumer offsets (name, offset) as one tracking chunk; `done(end offset)` once
        its entry is applied with the same term, else `done(NotLeader | Unavailable)`."""
        try:
            self._check_leader()
            if not 0 < len(entries) <= ENTRIES_PER_CHUNK_MAX:
                raise InvalidArgument(f"1..{ENTRIES_PER_CHUNK_MAX} offsets per store")
            for name, offset in entries:
                if not 0 < len(name) <= NAME_BYTES_MAX:
                    raise InvalidArgument(f"a consumer name is 1..{NAME_BYTES_MAX} bytes")
                if offset < -1:
                    raise InvalidArgument(f"offset {offset} is below -1")
            if len(self._pending) >= limits.pending_appends_max:
                raise ResourceLimitExceeded(
                    f"{limits.pending_appends_max} appends already wait for their commit"
                )
            timestamp_ms = max(self._clock_ms(), self.store.log.last_timestamp_ms or 0)
            end = self._next_offset()
            term = self.raft.term
            index = self.raft.log.last_index + 1
            result = self.raft.propose(
                chunk_codec.encode_tracking(entries, end, timestamp_ms, term, index)
            )
            if not isinstance(result, Proposed):
                raise result.error()
        except BrokerError as error:
            done(error)
            return
        for name, offset in entries:
            self._proposed_offsets[name] = TrackedOffset(offset, index, term, timestamp_ms)
        now_ms = self._monotonic_ms()
        deadline_ms = now_ms + limits.append_commit_timeout_ms
        stale = self._pending.pop(index, None)
        if stale is not None:
            stale.done(Unavailable("the entry was overwritten; retry"))
        self._pending[index] = _Pending(term, end, done, deadline_ms, now_ms)
        self._wake()

    def _tracked(self, name: bytes) -> TrackedOffset | None:
        """The name's last stored offset on this leader: proposed, else written to the log."""
        proposed = self._proposed_offsets.get(name)
        if proposed is not None and proposed.epoch == self.raft.term:
            return proposed
        return self.store.log.offsets.get(name)

    def query_offset(self, name: bytes, done: OffsetDone) -> None:
        """The name's stored offset, read once a quorum has confirmed this replica still leads
        (`_when_confirmed`) and answered once the entry that stored it is committed. Leader
        only."""
        try:
            self._check_leader()
        except BrokerError as error:
            done(error)
            return

        def confirmed(error: BrokerError | None) -> None:
            if error is not None:
                done(error)
                return
            state = self._tracked(name)
            if state is None:
                done(None)
                return
            answer = ConsumerOffset(name.decode(errors="replace"), state.offset, state.timestamp_ms)
            self._when_applied(
                state.raft_index,
                state.epoch,
                lambda error: done(answer if error is None else error),
            )

        self._when_confirmed(confirmed)

    def offsets(self) -> list[ConsumerOffset]:
        """Every consumer name this replica has stored an offset for, most recent last (the
        table over its written log: on a follower, possibly ahead of the commit point)."""
        return [
            ConsumerOffset(name.decode(errors="replace"), s.offset, s.timestamp_ms)
            for name, s in self.store.log.offsets
        ]

    def _check_leader(self) -> None:
        if self.closed:
            raise Unavailable("the partition is closing")
        if self.failure is not None:
            raise StorageFailure(f"the replica refuses writes since: {self.failure}")
        if not self.is_leader:
            raise NotLeader(
                f"{self.node} does not lead {self._stream}/{self._partition}",
                leader_node=self.raft.leader,
            )

    def _propose(
        self,
        records: Sequence[bytes],
        producer: bytes | None = None,
        ids: Sequence[int] | None = None,
    ) -> tuple[int, Term, Offset]:
        self._check_leader()
        if not records:
            raise InvalidArgument("an append needs at least one record")
        if len(self._pending) >= limits.pending_appends_max:
            raise ResourceLimitExceeded(
                f"{limits.pending_appends_max} appends already wait for their commit"
            )
        config = self.store.config
        lengths = chunk_codec.record_lengths(records, config.message_bytes_max)
        timestamp_ms = self._clock_ms()
        last_ts = self.store.log.last_timestamp_ms
        if last_ts is not None and timestamp_ms < last_ts:
            timestamp_ms = last_ts
        first = offset = self._next_offset()
        term = self.raft.term
        if len(records) == 1 and isinstance(records[0], subentry.SubEntry):
            return self._propose_sub_entry(records[0], timestamp_ms, first, producer, ids)
        index = 0
        bounds = chunk_codec.chunk_ranges(lengths, config.chunk_records_max, config.chunk_bytes_max)
        for start, end in bounds:
            part = records if len(bounds) == 1 else records[start:end]
            index = self.raft.log.last_index + 1
            section = None
            if producer is not None:
                assert ids is not None
                section = producer_codec.encode_section(producer, ids[end - 1])
            buffer, _ = chunk_codec.encode_chunk_buffer(
                part,
                offset,
                timestamp_ms,
                term,
                index,
                producer=section,
                filter_section=self._filter_section(part),
            )
            # The entry is a read-only view of the one buffer the chunk was built in, never
            # copied: to the log, and to every follower (ADR 0037). Nothing writes the buffer
            # after this.
            data = memoryview(buffer).toreadonly()
            last_id = None if ids is None else ids[end - 1]
            self._propose_chunk(data, index, producer, last_id, timestamp_ms, offset + end - start)
            self.messages_in += end - start
            offset = Offset(offset + end - start)
        return index, term, first

    def _filter_section(self, records: Sequence[bytes]) -> bytes | None:
        """The chunk's Bloom filter of filter values (ADR 0016); None when no record has one
        (one substring search of the chunk on streams nobody filters; `filtering.section`)."""
        return filtering.section(records, self.store.config.filter_size_bytes)

    def _sub_entry_filter(self, blob: subentry.SubEntry) -> bytes | None:
        """A sub-entry chunk's filter section, from the values the gateway read (None: unknown,
        and the chunk gets none)."""
        if blob.filter_values is None:
            return None
        return filtering.sub_entry_section(blob.filter_values, self.store.config.filter_size_bytes)

    def _propose_sub_entry(
        self,
        blob: subentry.SubEntry,
        timestamp_ms: int,
        first: Offset,
        producer: bytes | None,
        ids: Sequence[int] | None,
    ) -> tuple[int, Term, Offset]:
        """One sub-entry as one sub-entry chunk (ADR 0017): its header is checked, its data
        stored as it came."""
        term = self.raft.term
        index = self.raft.log.last_index + 1
        section = None
        if producer is not None:
            assert ids is not None and len(ids) == 1
            section = producer_codec.encode_section(producer, ids[0])
        try:
            data, header = chunk_codec.encode_sub_entry_chunk(
                blob,
                first,
                timestamp_ms,
                term,
                index,
                producer=section,
                filter_section=self._sub_entry_filter(blob),
            )
        except subentry.SubEntryError as error:
            raise InvalidArgument(f"not a sub-entry: {error}") from error
        last_id = None if ids is None else ids[0]
        self._propose_chunk(data, index, producer, last_id, timestamp_ms, header.end_offset)
        self.messages_in += header.end_offset - first
        return index, term, first

    def _propose_chunk(  # noqa: PLR0917 (the chunk and what a named producer's state needs)
        self,
        data: bytes | memoryview,
        index: int,
        producer: bytes | None,
        last_id: int | None,
        timestamp_ms: int,
        end: int,
    ) -> None:
        """Propose one encoded chunk as Raft entry `index`; a named producer's state (its last
        id, the chunk's end offset) is remembered as proposed."""
        term = self.raft.term
        result = self.raft.propose(data)
        if not isinstance(result, Proposed):
            raise result.error()
        assert (result.index, result.term) == (index, term), (result, index, term)
        self.bytes_in += len(data)
        if producer is not None:
            assert last_id is not None
            self._proposed[producer] = ProducerState(last_id, index, term, timestamp_ms, end - 1)

    def _next_offset(self) -> Offset:
        """End offset of the last entry in the core's log (barriers move no offset)."""
        log = self.raft.log
        index = log.last_index
        while index > log.snapshot.index:
            payload = log.entry(index).payload
            if payload and not is_membership(payload):
                return chunk_codec.decode_header(payload).end_offset
            index -= 1
        # Only barriers (and membership entries) above the snapshot point: the end is the
        # applied end.
        return self._committed_end

    def read(
        self,
        start: Offset,
        max_bytes: int,
        where: Callable[[ChunkFilter | None], bool] | None = None,
    ) -> list[ChunkView]:
        """Committed chunks (PartitionLog.read; `where`: a consumer's filter, ADR 0016)."""
        views = self.store.log.read(start, max_bytes, end=self._committed_end, where=where)
        for view in views:  # per chunk, not per message (stored_bytes never unpacks)
            self.messages_out += len(view.records)
            self.bytes_out += subentry.stored_bytes(view.records)
        return views

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
        """`callback` is called when the committed end moves (a consumer waiting for data). A
        follower with listeners asks the leader for commit updates (ADR 0044)."""
        self._listeners.append(callback)
        self.raft.readers = True

    def remove_listener(self, callback: Callable[[], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)
        self.raft.readers = bool(self._listeners)

    # -- driven by the host

    @property
    def ticks(self) -> int:
        """Ticks since this replica opened, counting those the driver skipped while the group
        was quiet (it does not visit quiet groups; ADR 0026, issue 16)."""
        if self._quiet_from is None:
            return self._ticks
        return self._ticks + self._driver_ticks() - self._quiet_from

    def sleep(self, driver_ticks: Callable[[], int], since: int) -> None:
        """The driver stops ticking this quiet group after its tick `since`; `ticks` keeps
        counting the driver's."""
        if self._quiet_from is None:
            self._driver_ticks = driver_ticks
            self._quiet_from = since

    def resume(self) -> None:
        """The driver ticks this group again (it woke)."""
        if self._quiet_from is not None:
            self._ticks = self.ticks
            self._quiet_from = None

    @property
    def asleep(self) -> bool:
        return self._quiet_from is not None

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
        if self._waiting:
            now_ms = self._monotonic_ms()
            for index in [i for i, ws in self._waiting.items() if ws[0].deadline_ms <= now_ms]:
                for waiting in self._waiting.pop(index):
                    waiting.done(Unavailable("the original's commit is late; retry"))
        if self._confirming:
            self._settle_confirming()
        if self._confirming:
            now_ms = self._monotonic_ms()
            while self._confirming and self._confirming[0].deadline_ms <= now_ms:
                self._confirming.pop(0).done(
                    Unavailable("no quorum confirmed the leader in time; retry")
                )

    def step(self, message: Message) -> None:
        if message.target != self.node or message.source == self.node:
            return  # not for this replica (a confused peer): drop it
        # Any authenticated node of the cluster may be a member this replica has not heard of
        # yet (a new voter, a new leader; ADR 0022): the core decides what to do with it.
        if (
            isinstance(message, VoteRequest)
            and not message.pre_vote
            and self.fresh
            and not self._heard_leader
            and self.ticks < limits.vote_embargo_ticks
        ):
            return  # a new directory may be a wiped one that forgot its vote (ADR 0005)
        self.raft.step(message)
        if self._confirming:
            self._settle_confirming()

    def persist(self, ready: Ready) -> SyncWork | None:
        if ready.entries and self._pending and not self.is_leader:
            self._fail_overwritten(ready.entries)
        work = self.store.persist(ready)
        if self._proposed or self._proposed_offsets:
            written = self.store.log.last_raft_index
            for name in [n for n, s in self._proposed.items() if s.raft_index <= written]:
                del self._proposed[name]
            proposed = self._proposed_offsets
            for name in [n for n, s in proposed.items() if s.raft_index <= written]:
                del proposed[name]
        return work

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
        waiting = self._waiting
        for entry in committed:
            self._apply(entry)
            moved = moved or bool(entry.payload)
            if waiting:
                for one in waiting.pop(entry.index, ()):
                    one.done(
                        None
                        if one.term == entry.term
                        else NotLeader(
                            "the original was lost in a leader change; retry",
                            leader_node=self.raft.leader,
                        )
                    )
        if committed:
            applied = self._applied_index = committed[-1].index
            if waiting:
                self._fail_waiting(applied, "the original's outcome is unknown; retry")
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
            self.leader_changes += 1
            if change.leader is not None:
                self._heard_leader = True
            for listener in list(self.leader_listeners):
                listener(change.leader, change.epoch)

    def _apply(self, entry: Entry) -> None:
        if entry.payload and not is_membership(entry.payload):
            header = chunk_codec.decode_header(entry.payload)
            self._committed_end = max(self._committed_end, header.end_offset)
        pending = self._pending.pop(entry.index, None)
        if pending is None:
            return
        if pending.term == entry.term:
            if self.append_seconds is not None:
                self.append_seconds.observe((self._monotonic_ms() - pending.proposed_ms) / 1000)
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
        self._applied_index = raft_index
        self._proposed.clear()
        self._proposed_offsets.clear()
        self._fail_waiting(raft_index, "the original's outcome is unknown after a catch-up; retry")
        for callback in list(self._listeners):
            callback()

    def fail(self, reason: str) -> None:
        """The disk failed: refuse everything from now on."""
        if self.failure is None:
            self.failure = reason
        pending, self._pending = list(self._pending.values()), {}
        for one in pending:
            one.done(StorageFailure(f"the disk failed: {reason}"))
        self._fail_waiting(None, f"the disk failed: {reason}")
        self._fail_confirming(StorageFailure(f"the disk failed: {reason}"))

    def close(self) -> None:
        self.closed = True
        pending, self._pending = list(self._pending.values()), {}
        for one in pending:
            one.done(Unavailable("the partition was closed; retry"))
        self._fail_waiting(None, "the partition was closed; retry")
        self._fail_confirming(Unavailable("the partition was closed; retry"))
        state = self.raft.commit_state() if self.failure is None else None
        if state is not None:
            # The commit point reached, which a Ready would have written within a tick
            # (ADR 0043): a clean restart starts from it. No sync (as any commit-only write).
            with contextlib.suppress(OSError):
                self.store.write_commit_only(state)
        self.store.close()

    def _fail_confirming(self, error: BrokerError) -> None:
        confirming, self._confirming = self._confirming, []
        for one in confirming:
            one.done(error)

    def _fail_waiting(self, up_to: int | None, reason: str) -> None:
        """Fail the waits on entries at or below `up_to` (all with None)."""
        for index in [i for i in self._waiting if up_to is None or i <= up_to]:
            for waiting in self._waiting.pop(index):
                waiting.done(Unavailable(reason))
