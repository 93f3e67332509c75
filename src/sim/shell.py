"""The production replication shell under simulation: ReplicationDriver, Replica, RaftStore,
PartitionLog and the catch-up, all unchanged, on simulated disks and a simulated network.

Each simulated node is what a node process runs minus asyncio: one `ReplicationDriver` holding
one `Replica` per partition, each over a `RaftStore` on `SimReplicaFiles` (three SimDisks). The
simulator plays the asyncio shell's part (host.py): it ticks the driver every `tick_ms`, hands
it every frame the network delivers (`driver.receive`), and runs its batches (`begin_batch`,
then `run_syncs` + `finish_batch` once the simulated disk latency has passed). Frames are the
production codec's bytes. A client proposes records through `Replica.propose`, as the AMQP
listener's producers do, and learns each outcome from the same callback.

Faults (the mix drawn per seed, as in cluster.py): message loss, duplication, delay and so
reordering, symmetric and one-way partitions, crashes (unsynced writes lost, last write torn),
restarts, a replica's disk wiped (the node comes back with an empty directory and must be
rebuilt by segment transfer), and fsyncs failing on a node until it is restarted. Retention
runs concurrently with small segments, so transfers and restarts meet deleted prefixes.

Invariants: the Raft ones of checker.py after every event, plus, for the shell:

- `acknowledged-durable`: after every crash, each acknowledged entry is on the synced log of a
  majority (or below the first retained index there);
- `acknowledged-readable`: after every restart and at the end, every acknowledged record reads
  back through `Replica.read` at its offset, byte for byte, on every replica whose committed
  end passed it;
- `logs-identical`: after every restart and at the end, every replica's chunks up to its
  commit index are byte-identical to the committed history (barriers: same term, no records);
- `retention-floor`: retention never deletes a chunk above the replica's applied index;
- `log-cache` (ADR 0049): after every event, a replica's applied, durable entries in memory
  are within its config's limit, a quiet follower keeps none and a quiet leader none that every
  peer acknowledged; `log-cache-budget`: after each sweep of a driver, its replicas' caches
  together fit the node's budget (drawn per seed, some far below the caches);
- deduplication (ADR 0011): the client is a named producer per group that sends increasing
  publishing ids and resends earlier ones a quarter of the time. `dedup-once`: no publishing id
  is committed twice (the ids of the committed records of a name increase strictly);
  `dedup-acknowledged`: every acknowledged id, duplicates included, is at or below a committed
  one (a duplicate is never acknowledged ahead of its original); `dedup-table`: each replica's
  producer table (snapshots, retention and catch-up included) names the last id its log holds;
- stored offsets (ADR 0012; spate.sim.offsets): the client is also a named consumer per group
  that accepts a prefix of what a replica has committed and stores accepted offsets through
  `Replica.propose_offsets` (mostly the highest, sometimes an older one or a repeat: the last
  store in log order wins), or asks the leader with `Replica.query_offset`. After every event:
  `offset-not-ahead`: every offset in a replica's table or the committed history is one the
  consumer asked to store, at or below what it accepted; `offset-durable`: a replica whose log
  is committed past an acknowledged store holds that store or a later one, and a leader's
  answer is a store committed at or after the last one acknowledged before the query;
  `offset-table`: each replica's table entry is the last store its log holds (the committed
  history, then its own uncommitted chunks);
- filtering (ADR 0016): on even seeds most records carry an `x-stream-filter-value`, so
  chunks carry Bloom filters; on seeds divisible by 4 every third publishing id is a
  compressed sub-entry of 2-4 records (ADR 0017: one chunk, one id, an offset per record, its
  filter values beside it); `filter-complete`: after every restart and at the end, a read
  that passes over chunks by filter value (skip marks included) misses no record holding that
  value, on every replica;
- `liveness`: after healing, every group acknowledges a new append and every replica (wiped
  ones too) applies it.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from spate.core import filtering, frames, subentry
from spate.core.backend import ConsumerOffset, OffsetSpec, PublishingIds
from spate.core.errors import BrokerError, NotLeader
from spate.core.ids import NodeId, Offset, PartitionId, StreamName, Term
from spate.core.streams import Retention
from spate.node.log import LogConfig, PartitionLog
from spate.node.log import chunk as chunk_codec
from spate.node.log.producers import ProducerState
from spate.node.log.tracking import OffsetTable
from spate.node.replication.driver import Batch, ReplicationDriver
from spate.node.replication.messages import (
    Entry,
    Membership,
    Message,
    Ready,
    SnapshotRequest,
    is_membership,
)
from spate.node.replication.raft import Raft, RaftConfig, Role
from spate.node.replication.replica import AppendDone, OffsetDone, Replica
from spate.node.replication.storage import RaftStore, core_payload
from spate.sim.checker import InvariantViolation
from spate.sim.files import SimReplicaFiles
from spate.sim.loop import SimLoop
from spate.sim.offsets import Store, TrackingChecker

tick_ms = 10
"""Simulated milliseconds per Raft tick."""
READERS_CHANCE = 0.5
"""A replica opened with a consumer waiting on it (ADR 0044)."""
READERS_TOGGLE_CHANCE = 0.02
"""Per replica and tick: its consumer comes or goes."""
IDLE_PAUSE_CHANCE = 0.03
IDLE_PAUSE_MS = (100, 700)
"""With quiet groups (ADR 0026), a proposal is sometimes followed by an idle stretch this long
(10 to 70 ticks: groups quiesce after a few heartbeat rounds, node suspicion takes 10)."""
liveness_ms_max = 20_000
"""Simulated time the healed cluster gets to elect leaders and acknowledge an append."""
events_max = 400_000
"""Events one run may process in all (a livelocked run fails instead of spinning)."""
batches_per_wake_max = 1000
"""Batches one wake-up may run back to back without a sync (a spinning driver is a bug)."""
catchup_request_timeout_ms = 300
"""A lost catch-up request is retried after this long (a node waits 5 s: simulated networks
lose far more requests, and the liveness phase would spend most of its events waiting)."""
wall_clock_base_ms = 1_700_000_000_000
"""Simulated wall clock at time 0 (chunk timestamps)."""
STREAM = StreamName("sim")


def _reader() -> None:
    """A consumer waiting on a replica (`Replica.add_listener`): it only makes the replica ask
    for commit updates (ADR 0044); the checker reads what was committed itself."""


@dataclass(frozen=True, slots=True)
class ShellBugs:
    """Deliberate shell bugs, planted in the production driver through its seams."""

    ack_before_fsync: bool = False
    """Every message of a Ready leaves at write time: followers ack before their fsync."""
    early_sends_all: bool = False
    """Between batches (`ReplicationDriver.send_early`, a message received) every message the
    core has queued leaves, not only a leader's Appends (ADR 0033): acks before the fsync."""
    skip_fsync: bool = False
    """The batch marks writes synced without fsyncing them (PartitionLog acks from the page
    cache)."""
    catchup_uncommitted: bool = False
    """A catch-up fetches the leader's log up to its last *written* entry and installs it as
    committed (the leader's own check that a transfer covers durable data only, an assertion
    in PartitionLog.transfer_manifest, is what usually stops it)."""
    retention_without_floor: bool = False
    """Retention ignores the applied index and may delete entries not yet applied."""
    dedup_forgets_proposals: bool = False
    """The leader deduplicates against its written log only, not its proposals in flight."""
    catchup_forgets_offsets: bool = False
    """A catch-up installs the leader's segments and producer table but leaves the replica's
    offset table empty (as if the partition-state snapshot had no offset trailer)."""
    offset_query_uncommitted: bool = False
    """The leader answers a stored-offset query from its written log and proposals at once,
    without waiting for the entry that stored it to commit."""
    read_unconfirmed: bool = False
    """The leader reads its log for a stored-offset query without first confirming that it
    still leads (`Replica._when_confirmed`, the code before issue 16's fix): a stale leader
    answers from a log missing a newer leader's acknowledged store."""
    store_committed_end: bool = False
    """A store records the last committed offset, not the one the consumer asked for (what a
    listener that tracked deliveries instead of settlements would store)."""
    filter_misses_last: bool = False
    """The leader builds a chunk's Bloom filter without its last record's value (an
    off-by-one in the builder): filtered reads pass over chunks holding that value."""
    sub_entry_first_value: bool = False
    """The gateway sends a sub-entry's first message's filter value only, not every message's
    (ADR 0017): the chunk's Bloom filter lacks the others."""
    batch_removed_replica: bool = False
    """A replica removed from its driver (its partition closing) is still taken into batches:
    a batch that finishes re-marks it, a wake marks it, so the batch begun next writes and
    syncs files the host closes meanwhile (the driver before 2026-11-27)."""
    cache_budget_ignored: bool = False
    """The driver's sweep never lowers the replicas' Raft log caches (ADR 0049): a node keeps
    every group's cache whatever their total."""


NO_BUGS = ShellBugs()


@dataclass(frozen=True, slots=True)
class ShellOptions:
    nodes: int
    groups: int
    loss: float
    duplication: float
    delay_ms_max: int
    disk_ms_max: int
    nemesis_ms: int
    crash_weight: int
    partition_weight: int
    wipe_weight: int
    disk_fail_weight: int
    propose_ms: int
    consume_ms: int
    log_cache_bytes: int
    segment_bytes: int
    retention_messages: int | None
    steps: int
    bugs: ShellBugs = NO_BUGS
    filter_values: bool = True
    """Records carry `x-stream-filter-value` (ADR 0016): on even seeds. Not drawn from the
    seed's generator, so odd seeds keep the histories they had before filtering existed (the
    seeds pinned by tests/sim/test_shell_sim.py among them)."""
    membership_weight: int = 0
    """Weight of the replica-set nemesis (ADR 0022): demote a voter to learner, promote it
    back, transfer leadership, through `Replica.propose_membership`/`transfer_leadership`.
    Drawn from a generator of its own, so seeds without it keep their histories."""
    sub_entries: bool = False
    """Every third publishing id is a compressed sub-entry of 2-4 records (ADR 0017) with their
    filter values beside it, as the gateway sends them: on seeds divisible by 4 (not drawn
    from the generator either)."""
    reopen_weight: int = 0
    """Weight of the close-and-reopen nemesis: a node closes one replica as
    `ReplicationHost.close_partition` does (removed from the driver at once, its files closed
    once the syncs in flight have returned) and opens it again later from the same files, as
    a partition moved away and back does. Last in the draw, and drawn from a generator of its
    own, so seeds without it keep their histories."""
    follower_log_cache_bytes: int = 100_000
    """Applied entry bytes a replica that does not lead keeps (at most `log_cache_bytes`;
    ADR 0049). Drawn from a generator of its own."""
    log_cache_budget_bytes: int = 1 << 30
    """The node-wide budget of the replicas' Raft log caches (ADR 0049): small values make
    the driver's sweep lower them. Drawn from a generator of its own."""

    @staticmethod
    def draw(
        seed: int, *, nodes: int | None = None, groups: int | None = None, steps: int = 2000
    ) -> ShellOptions:
        rng = random.Random(f"shell-options/{seed}")
        return ShellOptions(
            nodes=nodes if nodes is not None else rng.choice((3, 3, 3, 5)),
            groups=groups if groups is not None else rng.randint(1, 3),
            loss=rng.choice((0.0, 0.01, 0.05, 0.2)),
            duplication=rng.choice((0.0, 0.01, 0.05)),
            delay_ms_max=rng.choice((2, 10, 30)),
            disk_ms_max=rng.choice((0, 3, 15)),
            nemesis_ms=rng.choice((50, 200, 600)),
            crash_weight=rng.choice((0, 1, 3)),
            partition_weight=rng.choice((0, 1, 3)),
            wipe_weight=rng.choice((0, 1, 3)),
            disk_fail_weight=rng.choice((0, 0, 1)),
            propose_ms=rng.choice((5, 20, 60)),
            log_cache_bytes=rng.choice((0, 200, 100_000)),
            segment_bytes=rng.choice((1024, 4096, 65536)),
            retention_messages=rng.choice((None, 20, 100)),
            consume_ms=rng.choice((20, 60, 200)),
            steps=steps,
            filter_values=seed % 2 == 0,
            sub_entries=seed % 4 == 0,
            membership_weight=random.Random(f"shell-membership/{seed}").choice((0, 0, 4, 8)),
            reopen_weight=random.Random(f"shell-reopen/{seed}").choice((0, 0, 2, 6)),
            follower_log_cache_bytes=random.Random(f"shell-cache/{seed}").choice((0, 100, 100_000)),
            log_cache_budget_bytes=random.Random(f"shell-budget/{seed}").choice(
                (1 << 30, 300, 2000)
            ),
        )

    def log_config(self) -> LogConfig:
        return LogConfig(
            segment_bytes=self.segment_bytes,
            retention=Retention(max_messages=self.retention_messages),
            index_interval_bytes=512,
        )


class _Kind(Enum):
    TICK = "tick"
    DELIVER = "deliver"
    DISK = "disk"
    PROPOSE = "propose"
    CONSUME = "consume"
    NEMESIS = "nemesis"
    RESTART = "restart"
    HEAL = "heal"
    REOPEN = "reopen"


@dataclass(slots=True)
class _Event:
    kind: _Kind
    node: NodeId
    group: int = 0
    frame: bytes = b""
    source: NodeId | None = None
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class _Ack:
    """One acknowledged append (one record, one chunk)."""

    index: int
    term: Term
    payload: bytes
    offset: Offset
    record: bytes


class _SimReplica(Replica):
    """The production Replica; applied entries are reported to the checker first."""

    sim: ShellCluster
    group_number: int

    def _apply(self, entry: Entry) -> None:
        self.sim.checker.committed(self.node, self.group_number, entry, "applied")
        super()._apply(entry)

    def _filter_section(self, records: Sequence[bytes]) -> bytes | None:
        if self.sim.options.bugs.filter_misses_last:
            records = records[:-1]
        return super()._filter_section(records)

    def _sub_entry_filter(self, blob: subentry.SubEntry) -> bytes | None:
        if self.sim.options.bugs.filter_misses_last and blob.filter_values:
            blob = subentry.SubEntry.with_values(blob, blob.filter_values[:-1])
        return super()._sub_entry_filter(blob)

    def _producer_state(self, name: bytes) -> ProducerState | None:
        if self.sim.options.bugs.dedup_forgets_proposals:
            return self.store.log.producers.get(name)
        return super()._producer_state(name)

    def restored(self, raft_index: int) -> None:
        self.sim.snapshots += 1
        super().restored(raft_index)
        if self.sim.options.bugs.catchup_forgets_offsets:
            self.store.log.offsets = OffsetTable(self.store.config.consumer_names_max)

    def propose_offsets(self, entries: Sequence[tuple[bytes, int]], done: AppendDone) -> None:
        if self.sim.options.bugs.store_committed_end:
            entries = [(name, self.end_offset() - 1) for name, _ in entries]
        super().propose_offsets(entries, done)

    def _when_confirmed(self, done: Callable[[BrokerError | None], None]) -> None:
        if self.sim.options.bugs.read_unconfirmed:
            done(None)
            return
        super()._when_confirmed(done)

    def query_offset(self, name: bytes, done: OffsetDone) -> None:
        if self.sim.options.bugs.offset_query_uncommitted and self.is_leader:
            state = self._tracked(name)
            done(None if state is None else ConsumerOffset("", state.offset, state.timestamp_ms))
            return
        super().query_offset(name, done)


class _SimDriver(ReplicationDriver[_SimReplica]):
    """The production driver with the simulator's checker hooks and the planted bugs."""

    sim: ShellCluster

    def _observe_ready(self, group: _SimReplica, ready: Ready) -> None:
        if ready.entries:
            prev_term = group.raft.log.term(ready.entries[0].index - 1)
            assert prev_term is not None
            self.sim.checker.appended(self.node_id, group.group_number, ready.entries, prev_term)

    def _early_messages(self, ready: Ready) -> Sequence[Message]:
        if self.sim.options.bugs.ack_before_fsync:
            return ready.messages
        return super()._early_messages(ready)

    def _late_messages(self, ready: Ready) -> Sequence[Message]:
        if self.sim.options.bugs.ack_before_fsync:
            return ()
        return super()._late_messages(ready)

    def _open(self, key: frames.GroupKey, group: _SimReplica) -> bool:
        if self.sim.options.bugs.batch_removed_replica:
            return True  # the planted bug: a removed replica is batched as before
        return super()._open(key, group)

    def _early_leader_messages(self, group: _SimReplica) -> Sequence[Message]:
        if self.sim.options.bugs.early_sends_all:
            raft = group.raft
            taken, raft._outbox = tuple(raft._outbox), []  # the planted bug
            return taken
        return super()._early_leader_messages(group)

    def run_syncs(self, batch: Batch[_SimReplica]) -> dict[_SimReplica, str]:
        if self.sim.options.bugs.skip_fsync:
            return {}
        return super().run_syncs(batch)

    def _serves_catchup(self, group: _SimReplica, raft_index: int) -> bool:
        if self.sim.options.bugs.catchup_uncommitted:
            return raft_index <= group.raft.log.last_index
        return super()._serves_catchup(group, raft_index)

    def _start_transfer(self, group: _SimReplica, request: SnapshotRequest) -> None:
        if self.sim.options.bugs.catchup_uncommitted:
            leader = self.sim.nodes[request.leader]
            source = (
                leader.driver.groups.get((group.stream, group.partition)) if leader.up else None
            )
            if source is not None and source.raft.log.last_index > request.snapshot.index:
                index = source.store.log.last_raft_index
                header = source.store.log.header_at_index(index)
                if header is not None:
                    request = replace(
                        request,
                        snapshot=replace(request.snapshot, index=index, term=Term(header.epoch)),
                    )
        super()._start_transfer(group, request)

    def _bound_caches(self) -> None:
        if not self.sim.options.bugs.cache_budget_ignored:
            super()._bound_caches()
        held = sum(_cache_droppable(g.raft) for g in self.groups.values())
        if held > self.log_cache_budget_bytes:
            raise InvariantViolation(
                "log-cache-budget",
                f"{self.node_id}: the replicas' Raft log caches hold {held} bytes that could go "
                f"after a sweep, over the node's budget of {self.log_cache_budget_bytes}",
            )

    def _retention_floor(self, group: _SimReplica) -> int | None:
        if self.sim.options.bugs.retention_without_floor:
            return None
        return super()._retention_floor(group)

    def apply_retention(self, group: _SimReplica) -> int:
        deleted = super().apply_retention(group)
        if deleted:
            self.sim.retention_deletes += deleted
            first = group.store.log.first_raft_index()
            floor = group.raft.log.applied
            if first is not None and first > max(floor, 1):
                raise InvariantViolation(
                    "retention-floor",
                    f"{self.node_id} g{group.group_number}: retention left Raft index {first} "
                    f"first, above the applied index {floor}",
                )
        return deleted


@dataclass(frozen=True, slots=True)
class _SyncedLog:
    first_index: int  # 0: holds nothing
    chunks: dict[int, tuple[Term, bytes]]

    def holds(self, index: int, term: Term, payload: bytes) -> bool:
        if 0 < index < self.first_index:
            return True  # applied, then deleted by retention
        known = self.chunks.get(index)
        if known is None:
            return False
        if payload:
            return known == (term, payload)
        return known[0] == term  # a barrier, encoded by each replica


@dataclass
class _Node:
    id: NodeId
    files: list[SimReplicaFiles]
    driver: _SimDriver
    up: bool = True
    incarnation: int = 0
    woken: bool = False
    batch: Batch[_SimReplica] | None = None  # the batch whose syncs are in flight
    disk_failing: bool = False
    closing: list[_SimReplica] = field(default_factory=list)
    """Removed from the driver, closed once the batch in flight has synced (`close_partition`
    waits for the syncs handed out so far)."""


@dataclass(frozen=True, slots=True)
class ShellResult:
    seed: int
    options: ShellOptions
    failure: str | None
    steps: int
    time_ms: int
    trace_digest: str
    acknowledged: int
    elections: int
    crashes: int
    snapshots: int
    wipes: int
    retention_deletes: int
    offsets_acknowledged: int
    offset_queries: int
    membership_changes: int = 0
    reopens: int = 0

    @property
    def ok(self) -> bool:
        return self.failure is None


class ShellCluster(SimLoop[_Event]):
    def __init__(self, seed: int, options: ShellOptions, *, keep_trace: bool = False) -> None:
        super().__init__(
            seed, keep_trace=keep_trace, liveness_ms_max=liveness_ms_max, events_max=events_max
        )
        self.options = options
        self.rng = random.Random(f"shell/{seed}")
        self.readers_rng = random.Random(f"readers/{seed}")
        """Which replicas have a consumer waiting (`Replica.add_listener`), apart from `rng` so
        that drawing them leaves the other draws of a seed where they were."""
        self.ids = [NodeId(f"n{i}") for i in range(1, options.nodes + 1)]
        self.replicas = self.ids[:3] if options.nodes > 3 else list(self.ids)
        self._replica_set = frozenset(self.replicas)
        self.config = RaftConfig(
            election_timeout_ticks=10,
            heartbeat_interval_ticks=2,
            inflight_appends_max=8,
            append_bytes_max=1024,
            log_cache_bytes=options.log_cache_bytes,
            follower_log_cache_bytes=min(options.follower_log_cache_bytes, options.log_cache_bytes),
            quiesce=seed % 3 != 0,  # quiet idle groups and node liveness (ADR 0026)
        )
        self.log_config = options.log_config()
        self.checker = TrackingChecker(options.groups)
        self.crashes = 0
        self.wipes = 0
        self.membership_changes = 0
        self.reopens = 0
        self.retention_deletes = 0
        self._rebuilding: set[tuple[NodeId, int]] = set()
        self.snapshots = 0
        self._client_seq = 0
        self._next_id = [0] * options.groups
        self.acked_ids: list[list[int]] = [[] for _ in range(options.groups)]
        self._leader_hint: list[NodeId | None] = [None] * options.groups
        self.acked: list[list[_Ack]] = [[] for _ in range(options.groups)]
        self._acked_after: list[int | None] = [None] * options.groups
        self.store_acked: list[list[_Ack]] = [[] for _ in range(options.groups)]
        """Acknowledged offset stores (tracking chunks), for `acknowledged-durable`."""
        self.offset_queries = 0
        self.nodes: dict[NodeId, _Node] = {}
        for node in self.ids:
            files = [
                SimReplicaFiles(f"{node}/g{g}", random.Random(f"disk/{seed}/{node}/{g}/0"))
                for g in range(options.groups)
            ]
            self.nodes[node] = _Node(node, files, self._new_driver(node))
            self._start(self.nodes[node])
            self._schedule(self.rng.randrange(tick_ms), _Kind.TICK, node)
        for group in range(options.groups):
            self._schedule(
                self.rng.randrange(1, 2 * options.propose_ms),
                _Kind.PROPOSE,
                self.ids[0],
                group=group,
            )
            self._schedule(
                self.rng.randrange(1, 2 * options.consume_ms),
                _Kind.CONSUME,
                self.ids[0],
                group=group,
            )
        self._schedule(options.nemesis_ms, _Kind.NEMESIS, self.ids[0])

    # -- running

    def run(self) -> ShellResult:
        failure = self.run_phases(self.options.steps)
        return ShellResult(
            seed=self.seed,
            options=self.options,
            failure=failure,
            steps=self.steps,
            time_ms=self.now_ms,
            trace_digest=self.trace_digest,
            acknowledged=sum(len(a) for a in self.acked),
            elections=len(self.checker.leaders),
            crashes=self.crashes,
            snapshots=self.snapshots,
            wipes=self.wipes,
            retention_deletes=self.retention_deletes,
            offsets_acknowledged=sum(len(a) for a in self.store_acked),
            offset_queries=self.offset_queries,
            membership_changes=self.membership_changes,
            reopens=self.reopens,
        )

    def liveness_failure(self) -> str:
        return (
            "not every group acknowledged an append that every replica then applied "
            f"(acknowledged at {self._acked_after})"
        )

    def final_checks(self) -> None:
        for node in self.ids:
            self._check_storage(self.nodes[node])
            self._check_offsets(node)
        for group in range(self.options.groups):
            self._check_dedup(group)

    def _check_dedup(self, group: int) -> None:
        """The deduplication invariants (module docstring) over the committed history."""
        history = self.checker.history[group]
        name = _producer_name(group)
        committed: list[int] = []
        last_by_index: dict[int, int] = {}
        for index in sorted(history):
            _, payload = history[index]
            if not payload or is_membership(payload):
                continue  # a barrier, a membership entry (ADR 0022)
            header, records = chunk_codec.decode_chunk(payload)
            if header.flags & chunk_codec.FLAG_TRACKING:
                continue  # a consumer's stored offset (checked by _check_offsets)
            # "g<group>p<id>" or, inside a sub-entry (one id for all), "g<group>p<id>.<i>"
            ids = list(
                dict.fromkeys(int(bytes(r).rsplit(b"p", 1)[1].split(b".")[0]) for r in records)
            )
            if header.flags & chunk_codec.FLAG_PRODUCER:
                assert chunk_codec.producer_section(payload, 0, header)[:2] == (name, ids[-1])
            for publishing_id in ids:
                if committed and publishing_id <= committed[-1]:
                    raise InvariantViolation(
                        "dedup-once",
                        f"g{group} committed publishing id {publishing_id} at index {index} "
                        f"after {committed[-1]}",
                    )
                committed.append(publishing_id)
            last_by_index[index] = ids[-1]
        top = committed[-1] if committed else -1
        for publishing_id in self.acked_ids[group]:
            if publishing_id > top:
                raise InvariantViolation(
                    "dedup-acknowledged",
                    f"g{group} acknowledged publishing id {publishing_id}; the highest "
                    f"committed is {top}",
                )
        for node in self.replicas:
            state = self.nodes[node]
            replica = state.driver.groups.get((STREAM, PartitionId(group)))
            if not state.up or replica is None or replica.failure is not None:
                continue
            written = replica.store.log.last_raft_index
            if written > max(history, default=0):
                continue  # an uncommitted tail the history cannot speak for
            expected = max(
                (i for index, i in last_by_index.items() if index <= written), default=None
            )
            got = replica.store.log.producers.get(name)
            if expected is not None and (got is None or got.last_id != expected):
                raise InvariantViolation(
                    "dedup-table",
                    f"{node} g{group} has last publishing id "
                    f"{None if got is None else got.last_id}; its log holds {expected}",
                )

    def live(self) -> bool:
        if self.faults:
            return False
        for group, index in enumerate(self._acked_after):
            if index is None:
                return False
            for node in self.replicas:
                state = self.nodes[node]
                replica = state.driver.groups.get((STREAM, PartitionId(group)))
                if not state.up or replica is None or replica.raft.log.applied < index:
                    return False
        return True

    def step(self) -> None:
        event = self.pop()
        self._dispatch(event)
        # Only the event's node changed, except for client and nemesis events.
        if event.kind in (_Kind.PROPOSE, _Kind.CONSUME, _Kind.NEMESIS):
            self._check(self.replicas)
        elif event.node in self._replica_set:
            self._check((event.node,))

    def _schedule(
        self,
        delay_ms: int,
        kind: _Kind,
        node: NodeId,
        *,
        group: int = 0,
        frame: bytes = b"",
        source: NodeId | None = None,
        incarnation: int = 0,
    ) -> None:
        self.push(delay_ms, _Event(kind, node, group, frame, source, incarnation))

    def _check(self, nodes: Sequence[NodeId]) -> None:
        checker = self.checker
        for node in nodes:
            state = self.nodes[node]
            if state.up:
                for replica in state.driver.groups.values():
                    checker.observe(node, replica.group_number, replica.raft)
                    _check_cache(node, replica)
        for node in nodes:
            self._check_offsets(node)

    def _check_offsets(self, node: NodeId) -> None:
        """`offset-not-ahead`, `offset-durable` and `offset-table` on each replica of `node`
        whose log or table changed since its last check (spate.sim.offsets)."""
        state = self.nodes[node]
        if not state.up:
            return
        for replica in state.driver.groups.values():
            if replica.failure is not None:
                continue
            model = self.checker.consumers[replica.group_number]
            log = replica.store.log
            written = log.last_raft_index
            core = replica.raft.log
            # The log equals the committed history up to here: committed, written, and not
            # truncated in the core since it was handed to the disk (a follower may learn a
            # commit over a divergent tail its disk still holds, until its next batch).
            base = min(core.committed, written, core.persist_from - 1)
            got = log.offsets.get(model.name)
            key = (state.incarnation, id(log), log.counters.chunks_appended, written, base, got)
            model.check_replica(node, key, got, base, functools.partial(_tail, replica, base))

    # -- a node: the asyncio shell's part

    def _new_driver(self, node: NodeId) -> _SimDriver:
        request_id_base = self.rng.getrandbits(62) + 1
        driver = _SimDriver(
            node,
            send=lambda peer, frame: self._send(node, peer, frame),
            wake=lambda: self._wake(node),
            monotonic_ms=lambda: float(self.now_ms),
            wall_ms=lambda: wall_clock_base_ms + self.now_ms,
            retention_interval_ms=100,
            catchup_request_timeout_ms=catchup_request_timeout_ms,
            request_id_base=request_id_base,
            log_cache_budget_bytes=self.options.log_cache_budget_bytes,
        )
        driver.sim = self
        driver.leader_listeners.append(self._on_leader)
        return driver

    def _on_leader(
        self, stream: StreamName, partition: PartitionId, leader: NodeId | None, epoch: int
    ) -> None:
        self._record(f"g{partition} leader {leader} epoch {epoch}")
        if leader is not None:
            self._leader_hint[partition] = leader

    def _start(self, node: _Node) -> None:
        if node.id not in self.replicas:
            return
        for group in range(len(node.files)):
            self._open_replica(node, group)

    def _open_replica(self, node: _Node, group: int, reopened: int = 0) -> None:
        store = RaftStore(node.files[group], self.log_config)
        suffix = f"/{reopened}" if reopened else ""  # a reopened replica: a generator of its own
        replica = _SimReplica(
            node.id,
            stream=STREAM,
            partition=PartitionId(group),
            replicas=self.replicas,
            store=store,
            raft_config=self.config,
            rng=random.Random(f"raft/{self.seed}/{node.id}/{group}/{node.incarnation}{suffix}"),
            wake=functools.partial(self._wake, node.id),
            clock_ms=lambda: wall_clock_base_ms + self.now_ms,
            monotonic_ms=lambda: float(self.now_ms),
        )
        replica.sim = self
        replica.group_number = group
        if self.readers_rng.random() < READERS_CHANCE:
            # a consumer waiting on this replica (ADR 0044: the leader sends it commit updates)
            replica.add_listener(_reader)
        self.checker.restarted(node.id, group, replica.raft.log.committed)
        node.driver.add(replica)

    def _wake(self, node_id: NodeId) -> None:
        self.nodes[node_id].woken = True

    def _drive(self, node: _Node) -> None:
        """What host.py's driver loop does when woken, with the sync as a disk event."""
        if node.up and node.batch is not None and node.woken:
            node.driver.send_early()  # host.py: woken while the fsyncs run
        runs = 0
        while node.up and node.batch is None and node.woken:
            node.woken = False
            runs += 1
            assert runs <= batches_per_wake_max, "the driver keeps producing batches"
            batch = node.driver.begin_batch()
            if batch is None:
                continue
            if batch.syncs:
                node.batch = batch
                latency = self.rng.randint(0, self.options.disk_ms_max)
                self._schedule(latency, _Kind.DISK, node.id, incarnation=node.incarnation)
                return
            node.driver.finish_batch(batch, {})

    # -- events

    def _dispatch(self, event: _Event) -> None:
        node = self.nodes[event.node]
        match event.kind:
            case _Kind.TICK:
                self._schedule(tick_ms, _Kind.TICK, event.node)
                if node.up:
                    for replica in node.driver.groups.values():
                        if self.readers_rng.random() < READERS_TOGGLE_CHANCE:
                            if replica.raft.readers:
                                replica.remove_listener(_reader)
                            else:
                                replica.add_listener(_reader)
                    node.driver.tick()
                    self._drive(node)
            case _Kind.DELIVER:
                self._deliver(node, event)
            case _Kind.DISK:
                if node.up and node.incarnation == event.incarnation and node.batch is not None:
                    batch, node.batch = node.batch, None
                    failures = node.driver.run_syncs(batch)
                    self._record(f"{node.id} synced{' FAILED' if failures else ''}")
                    node.driver.finish_batch(batch, failures)
                    self._drive(node)
                    # close_partition resumes once these syncs returned: after the driver
                    # loop has begun its next batch (the order that exposes a batch touching
                    # a closed replica)
                    self._close_pending(node)
            case _Kind.PROPOSE:
                pause = self.rng.randrange(1, 2 * self.options.propose_ms)
                if self.config.quiesce and self.rng.random() < IDLE_PAUSE_CHANCE:
                    # idle stretches, so that groups go quiet and faults meet quiet groups
                    pause += self.rng.randrange(*IDLE_PAUSE_MS)
                self._schedule(
                    pause,
                    _Kind.PROPOSE,
                    event.node,
                    group=event.group,
                )
                self._propose(event.group)
            case _Kind.CONSUME:
                self._schedule(
                    self.rng.randrange(1, 2 * self.options.consume_ms),
                    _Kind.CONSUME,
                    event.node,
                    group=event.group,
                )
                self._consume(event.group)
            case _Kind.NEMESIS:
                if self.faults:
                    self._nemesis()
                    self._schedule(
                        self.rng.randrange(1, 2 * self.options.nemesis_ms),
                        _Kind.NEMESIS,
                        event.node,
                    )
            case _Kind.RESTART:
                if not node.up or node.disk_failing:
                    self._restart(node)
            case _Kind.HEAL:
                self.heal()
            case _Kind.REOPEN:
                self._reopen(node, event)

    def _send(self, source: NodeId, target: NodeId, data: frames.Frame) -> bool:
        if target not in self.nodes:
            return False
        frame = frames.frame_bytes(data)
        if self.faults:
            if (source, target) in self.blocked or self.rng.random() < self.options.loss:
                self._record(f"{source}>{target} dropped")
                return True  # lost on the wire, as far as the sender can tell
            copies = 2 if self.rng.random() < self.options.duplication else 1
        else:
            copies = 1
        incarnation = self.nodes[target].incarnation
        for _ in range(copies):
            self._schedule(
                self.rng.randint(1, self.options.delay_ms_max),
                _Kind.DELIVER,
                target,
                frame=frame,
                source=source,
                incarnation=incarnation,
            )
        return True

    def _deliver(self, node: _Node, event: _Event) -> None:
        assert event.source is not None
        if (
            not node.up
            or node.incarnation != event.incarnation
            or (event.source, node.id) in self.blocked
        ):
            return
        length, kind = frames.FRAME_HEAD.unpack_from(event.frame)
        assert length == len(event.frame) - 4
        body = memoryview(event.frame)[frames.FRAME_HEAD.size :]
        self._record(f"{event.source}>{node.id} kind {kind} {len(event.frame)} bytes")
        node.driver.receive(event.source, kind, body)
        self._drive(node)

    # -- client

    def _propose(self, group: int) -> None:
        hint = self._leader_hint[group]
        target = hint if hint is not None else self.replicas[self.rng.randrange(len(self.replicas))]
        node = self.nodes[target]
        replica = node.driver.groups.get((STREAM, PartitionId(group))) if node.up else None
        if replica is None:
            self._leader_hint[group] = None
            return
        self._client_seq += 1
        if self._next_id[group] and self.rng.random() < 0.25:
            publishing_id = self.rng.randrange(self._next_id[group])  # a resend
        else:
            publishing_id = self._next_id[group]
            self._next_id[group] += 1
        inner = _records(group, publishing_id, self.options)
        record = inner[0]
        term = replica.raft.term
        proposal: dict[str, int | bytes] = {}

        def done(outcome: Offset | BrokerError) -> None:
            if isinstance(outcome, BrokerError):
                if isinstance(outcome, NotLeader):
                    leader = outcome.leader_node
                    self._leader_hint[group] = (
                        NodeId(leader) if leader and leader != target else None
                    )
                self._record(f"append g{group} {record!r} failed: {outcome.code.value}")
                return
            self.acked_ids[group].append(publishing_id)
            if "index" not in proposal:
                self._record(f"ack g{group} {record!r}: a duplicate")
                return
            index, payload = proposal["index"], proposal["payload"]
            assert isinstance(index, int) and isinstance(payload, bytes)
            self._record(f"ack g{group} {record!r} at offset {outcome} index {index}")
            self.checker.acknowledged(group, index, term, payload)
            for i, each in enumerate(inner):  # a sub-entry's records have an offset each
                self.acked[group].append(_Ack(index, term, payload, Offset(outcome + i), each))
            if not self.faults and self._acked_after[group] is None:
                self._acked_after[group] = index

        records: list[bytes] = inner
        if len(inner) > 1:
            blob = subentry.encode(inner, subentry.CODEC_NAMES[publishing_id % 5])
            values = tuple({filtering.filter_value(r) for r in inner})
            if self.options.bugs.sub_entry_first_value:
                values = (filtering.filter_value(inner[0]),)
            records = [subentry.SubEntry.with_values(bytes(blob), values)]
        index = replica.propose(
            records, done, PublishingIds(_producer_name(group), [publishing_id])
        )
        if index is not None:
            proposal["index"] = index
            proposal["payload"] = bytes(replica.raft.log.entry(index).payload)
            self._record(f"propose g{group} {record!r} at {target} -> {term}/{index}")
        self._drive(node)

    def _consume(self, group: int) -> None:
        """The group's named consumer (ADR 0012): reads from any replica up to its committed
        end and accepts a prefix of what it read; then stores an offset it accepted through
        the leader it believes in (`Replica.propose_offsets`, what the node's listener calls
        for a named consumer's settled deliveries) -- the latest mostly, sometimes an older
        one (a re-attach with an explicit start filter, or an operator's reset) or the same
        one again -- or asks that leader for its stored offset (`Replica.query_offset`, what
        an attach without a start filter does)."""
        model = self.checker.consumers[group]
        reader = self._replica_of(self.replicas[self.rng.randrange(len(self.replicas))], group)
        if reader is not None:
            end = reader.end_offset()
            if end - 1 > model.accepted:
                model.accept(self.rng.randint(model.accepted + 1, end - 1))
        hint = self._leader_hint[group]
        choice = self.rng.random()
        if hint is None or choice < 0.05:
            # No leader known, or a consumer sent to a node by stale metadata: any replica
            # (one that still believes it leads answers as a leader).
            target = self.replicas[self.rng.randrange(len(self.replicas))]
        else:
            target = hint
        replica = self._replica_of(target, group)
        if replica is None:
            self._leader_hint[group] = None
            return
        if choice < 0.2:
            floor = model.floor

            def answered(outcome: ConsumerOffset | BrokerError | None) -> None:
                if isinstance(outcome, BrokerError):
                    self._refused(group, target, outcome)
                    return
                self.offset_queries += 1
                self._record(
                    f"g{group} stored offset at {target}: "
                    f"{None if outcome is None else outcome.offset}"
                )
                model.check_answer(target, outcome, floor)

            replica.query_offset(model.name, answered)
        elif model.accepted >= 0:
            if choice < 0.7:
                offset = model.accepted
            elif choice < 0.85:
                offset = self.rng.randint(-1, model.accepted)
            else:
                offset = self.rng.choice(sorted(model.requested)) if model.requested else -1
            model.request(offset)
            before = replica.raft.log.last_index
            store: list[_Ack] = []

            def stored(outcome: Offset | BrokerError) -> None:
                if isinstance(outcome, BrokerError):
                    self._refused(group, target, outcome)
                    return
                (ack,) = store
                self._record(f"ack g{group} offset {offset} stored at index {ack.index}")
                self.checker.acknowledged(group, ack.index, ack.term, ack.payload)
                model.acknowledged(Store(ack.index, ack.term, offset))
                self.store_acked[group].append(ack)

            replica.propose_offsets([(model.name, offset)], stored)
            if replica.raft.log.last_index == before + 1:
                index = before + 1
                payload = bytes(replica.raft.log.entry(index).payload)
                term = replica.raft.log.entry(index).term
                store.append(_Ack(index, term, payload, Offset(offset), b"store %d" % offset))
                self._record(f"store g{group} offset {offset} at {target} -> {term}/{index}")
        self._drive(self.nodes[target])

    def _replica_of(self, node: NodeId, group: int) -> _SimReplica | None:
        state = self.nodes[node]
        return state.driver.groups.get((STREAM, PartitionId(group))) if state.up else None

    def _refused(self, group: int, target: NodeId, error: BrokerError) -> None:
        if isinstance(error, NotLeader):
            leader = error.leader_node
            self._leader_hint[group] = NodeId(leader) if leader and leader != target else None
        self._record(f"offset request g{group} at {target} failed: {error.code.value}")

    # -- faults

    def _nemesis(self) -> None:
        options = self.options
        weights = [
            options.crash_weight,
            options.crash_weight,
            options.partition_weight,
            options.partition_weight,
            options.wipe_weight,
            options.disk_fail_weight,
            1,
            # last: a zero weight at the end leaves the other draws as they were
            options.membership_weight,
            options.reopen_weight,
        ]
        actions = [
            "crash",
            "restart",
            "partition",
            "one-way",
            "wipe",
            "disk-fail",
            "heal",
            "membership",
            "reopen",
        ]
        action = self.rng.choices(actions, weights)[0]
        up = [n for n in self.replicas if self.nodes[n].up]
        self._rebuilding = {
            (node, group)
            for node, group in self._rebuilding
            if not ((replica := self._replica_of(node, group)) is not None and replica.heard_leader)
        }
        if action in ("crash", "wipe", "disk-fail") and self._rebuilding:
            # The operator's procedure for a replaced disk (ADR 0005): no other failure until
            # the new replica has heard its leader. A wiped replica has forgotten its vote;
            # a vote embargo only narrows that window (a known limitation).
            self._record(f"{action} held: {sorted(self._rebuilding)} rebuilding")
        elif action in ("crash", "wipe", "disk-fail") and up:
            node = self.nodes[up[self.rng.randrange(len(up))]]
            if action == "disk-fail":
                self._record(f"disk fails {node.id}")
                node.disk_failing = True
                for files in node.files:
                    files.set_fail_fsync(True)
                self._schedule(self.rng.randrange(50, 1000), _Kind.RESTART, node.id)
            else:
                group = self.rng.randrange(options.groups)
                wipe = action == "wipe" and self._may_wipe(node.id, group)
                self._crash(node)
                if wipe:
                    self._rebuilding.add((node.id, group))
                    self._record(f"wipe {node.id} g{group}")
                    self.wipes += 1
                    node.files[group] = SimReplicaFiles(
                        f"{node.id}/g{group}",
                        random.Random(f"disk/{self.seed}/{node.id}/{group}/{node.incarnation}"),
                    )
        elif action == "restart":
            down = [n for n in self.replicas if not self.nodes[n].up]
            if down:
                self._restart(self.nodes[down[self.rng.randrange(len(down))]])
        elif action == "partition":
            self._schedule(self.partition(self.ids, self.rng), _Kind.HEAL, self.ids[0])
        elif action == "one-way":
            self._schedule(self.one_way(self.ids, self.rng), _Kind.HEAL, self.ids[0])
        elif action == "heal":
            self.blocked.clear()
            self._record("heal")
        elif action == "membership":
            self._change_membership(self.rng.randrange(options.groups))
        elif action == "reopen" and up and not self._rebuilding:
            node = self.nodes[up[self.rng.randrange(len(up))]]
            group = self.rng.randrange(options.groups)
            if not node.disk_failing and self._replica_of(node.id, group) is not None:
                self._close_replica(node, group)

    def _close_replica(self, node: _Node, group: int) -> None:
        """`ReplicationHost.close_partition` without the delete: removed from the driver now,
        closed once the batch in flight (if any) has synced, opened again later."""
        replica = node.driver.remove(STREAM, PartitionId(group))
        self.reopens += 1
        if node.batch is not None:
            node.closing.append(replica)
            self._record(f"close {node.id} g{group} (after the batch in flight)")
        else:
            replica.close()
            self._record(f"close {node.id} g{group}")
        self._schedule(
            self.rng.randrange(10, 400),
            _Kind.REOPEN,
            node.id,
            group=group,
            incarnation=node.incarnation,
        )

    def _close_pending(self, node: _Node) -> None:
        closing, node.closing = node.closing, []
        for replica in closing:
            replica.close()
            self._record(f"closed {node.id} g{replica.group_number}")

    def _reopen(self, node: _Node, event: _Event) -> None:
        key = (STREAM, PartitionId(event.group))
        if not node.up or node.incarnation != event.incarnation or key in node.driver.groups:
            return  # restarted meanwhile: every replica was opened then
        if node.disk_failing:
            return  # its disk-fail restart (scheduled) opens every replica
        if any(r.group_number == event.group for r in node.closing):
            self._schedule(
                10, _Kind.REOPEN, node.id, group=event.group, incarnation=node.incarnation
            )
            return
        self._record(f"reopen {node.id} g{event.group}")
        self._open_replica(node, event.group, reopened=self.reopens)
        self._check_storage(node)
        self._drive(node)

    def _change_membership(self, group: int) -> None:
        """ADR 0022 through the production Replica: on the group's leader, demote a follower
        to learner (two voters and a learner: a commit still needs two of the three replicas,
        so the shell's majority invariants hold as they are), promote the learner back, or
        transfer leadership to the other voter."""
        leaders = [
            replica
            for node in self.replicas
            if (replica := self._replica_of(node, group)) is not None and replica.is_leader
        ]
        if not leaders:
            return
        leader = leaders[0]
        membership = leader.raft.membership
        voters, learners = list(membership.voters), list(membership.learners)
        others = [v for v in voters if v != leader.node]
        choice = self.rng.random()
        proposed: Membership | None = None
        if learners:
            result: object = leader.propose_membership([*voters, *learners], [])
            what = f"promote {','.join(learners)}"
            proposed = Membership.of([*voters, *learners], [])
        elif choice < 0.5 and len(voters) == 3 and others:
            demoted = others[self.rng.randrange(len(others))]
            result = leader.propose_membership([v for v in voters if v != demoted], [demoted])
            what = f"demote {demoted}"
            proposed = Membership.of([v for v in voters if v != demoted], [demoted])
        elif others:
            target = others[self.rng.randrange(len(others))]
            result = leader.transfer_leadership(target)
            what = f"transfer to {target}"
        else:
            return
        if isinstance(result, int) and proposed is not None:  # appended at that index
            self.checker.membership_appended(group, result, proposed)
        self.membership_changes += 1
        self._record(f"g{group} at {leader.node}: {what}: {result}")

    def _crash(self, node: _Node) -> None:
        self._record(f"crash {node.id}")
        self.crashes += 1
        node.up = False
        node.incarnation += 1
        node.batch = None
        node.woken = False
        node.closing = []  # the process died with them
        for files in node.files:
            files.crash()
        node.driver = self._new_driver(node.id)
        for group in range(self.options.groups):
            self._check_durable(group)
        self._schedule(self.rng.randrange(20, 1000), _Kind.RESTART, node.id)

    def _restart(self, node: _Node) -> None:
        if node.up:  # a disk-fail restart: the process dies first
            self._crash(node)
        self._record(f"restart {node.id}")
        if node.disk_failing:
            node.disk_failing = False
            for files in node.files:
                files.set_fail_fsync(False)
        node.up = True
        self._start(node)
        self._check_storage(node)
        self._drive(node)

    def heal_all(self) -> None:
        self._record("liveness phase")
        self.faults = False
        self.blocked.clear()
        for node in self.ids:
            state = self.nodes[node]
            if not state.up or state.disk_failing:
                self._restart(state)
            elif any(r.failure is not None for r in state.driver.groups.values()):
                self._crash(state)
                self._restart(state)

    # -- storage invariants

    def _synced_logs(self, group: int, nodes: Sequence[NodeId]) -> list[_SyncedLog]:
        """What each node's replica of `group` would hold after a crash now."""
        logs = []
        for node in nodes:
            disk = self.nodes[node].files[group].log.durable_copy()
            log = PartitionLog.open(disk, self.log_config)
            first = log.first_raft_index()
            chunks = {}
            if first is not None:
                for data in log.chunks_from_index(first, 1 << 40):
                    header = chunk_codec.decode_header(data)
                    chunks[header.raft_index] = (Term(header.epoch), core_payload(data))
            # Entries below the first retained one were applied, then deleted by retention.
            logs.append(_SyncedLog(first or 0, chunks))
        return logs

    def _check_durable(self, group: int) -> None:
        """After a crash: every acknowledged entry is on the synced log of a majority."""
        if not self.acked[group]:
            return
        logs = self._synced_logs(group, self.replicas)
        quorum = len(self.replicas) // 2 + 1
        for ack in [*self.acked[group], *self.store_acked[group]]:
            holders = sum(1 for log in logs if log.holds(ack.index, ack.term, ack.payload))
            if holders < quorum:
                raise InvariantViolation(
                    "acknowledged-durable",
                    f"group {group} acknowledged {ack.term}/{ack.index} {ack.record!r} is on "
                    f"the synced log of {holders} of {len(logs)} replicas",
                )

    def _may_wipe(self, node: NodeId, group: int) -> bool:
        """A disk may be lost only while the other replicas' synced logs still hold every
        committed entry on a majority: losing more than Raft tolerates is not a bug."""
        others = [n for n in self.replicas if n != node]
        key = (STREAM, PartitionId(group))
        if any(not self.nodes[n].up or self.nodes[n].disk_failing for n in others):
            return False
        if any(key not in self.nodes[n].driver.groups for n in others):
            return False  # another replica is closed (the reopen nemesis)
        leaders = {self.nodes[n].driver.groups[key].raft.leader for n in others}
        if len(leaders) != 1 or None in leaders:
            return False  # replace a disk only while the others follow one leader
        logs = self._synced_logs(group, others)
        quorum = len(self.replicas) // 2 + 1
        # Committed entries (the history), and every entry the victim has synced: it may have
        # acked them already, and an ack in flight commits them after the disk is gone.
        committed = dict(self.checker.history[group])
        for index, (term, data) in self._synced_logs(group, [node])[0].chunks.items():
            committed.setdefault(index, (term, data))
        return all(
            sum(1 for log in logs if log.holds(index, term, payload)) >= quorum
            for index, (term, payload) in committed.items()
        )

    def _check_storage(self, node: _Node) -> None:
        """A (re)started or final replica: its chunks up to its commit index are the committed
        history byte for byte, and every acknowledged record it has committed reads back."""
        for replica in node.driver.groups.values():
            if replica.failure is not None:
                continue
            group = replica.group_number
            log = replica.store.log
            commit = replica.raft.log.committed
            first = log.first_raft_index()
            history = self.checker.history[group]
            if first is not None and commit >= first:
                for data in log.chunks_from_index(first, 1 << 40):
                    header = chunk_codec.decode_header(data)
                    if header.raft_index > commit:
                        break
                    known = history.get(header.raft_index)
                    if known is None:
                        continue  # committed before this run's checker saw it applied
                    term, payload = known
                    same = header.epoch == term and (
                        core_payload(data) == payload if payload else header.record_count == 0
                    )
                    if not same:
                        raise InvariantViolation(
                            "logs-identical",
                            f"{node.id} g{group} holds chunk {header.epoch}/{header.raft_index} "
                            f"({header.record_count} records) where {term}/{header.raft_index} "
                            f"was committed",
                        )
            end = replica.end_offset()
            start = replica.resolve(OffsetSpec.first())
            records: dict[int, bytes] = {}
            position: int = start
            while position < end:
                views = replica.read(Offset(position), 1 << 20)
                assert views, (node.id, group, position, end)
                for view in views:
                    for i, record in enumerate(view.records):
                        records[view.first_offset + i] = bytes(record)
                    position = max(position, view.first_offset + len(view.records))
            for ack in self.acked[group]:
                if start <= ack.offset < end and records.get(ack.offset) != ack.record:
                    raise InvariantViolation(
                        "acknowledged-readable",
                        f"{node.id} g{group} reads {records.get(ack.offset)!r} at offset "
                        f"{ack.offset}, where {ack.record!r} was acknowledged",
                    )
            _check_filtered(node.id, group, replica, start, end, records)


def _tail(replica: Replica, base: int) -> list[bytes]:
    """The chunks the replica's log holds after Raft index `base`: from the core's memory when
    it has handed every entry up to the log's end to the disk (no truncation since, so memory
    and disk agree), else read back from the log."""
    log, written = replica.store.log, replica.store.log.last_raft_index
    if written <= base:
        return []
    core = replica.raft.log
    if core.persist_from - 1 == written and base + 1 >= core.first_index:
        return [bytes(core.entry(i).payload) for i in range(base + 1, written + 1)]
    return log.chunks_from_index(base + 1, 1 << 40)


FILTER_VALUES = ("v0", "v1", "v2")


def _records(group: int, publishing_id: int, options: ShellOptions) -> list[bytes]:
    """What the client appends under `publishing_id` (the same for a resend): one record, or
    the 2-4 records of a sub-entry (every third id with `sub_entries`), each with its filter
    annotation when the seed has them."""
    count = 2 + publishing_id % 3 if options.sub_entries and publishing_id % 3 == 2 else 1
    out = []
    for i in range(count):
        annotation = _filter_annotation(publishing_id + i) if options.filter_values else b""
        suffix = f".{i}" if count > 1 else ""
        out.append(annotation + f"g{group}p{publishing_id}{suffix}".encode())
    return out


def _filter_annotation(publishing_id: int) -> bytes:
    """A message-annotations section with `x-stream-filter-value` (ADR 0016) for most ids (the
    same for a resend), none for every fourth: chunks with and without Bloom filters."""
    if publishing_id % 4 == 3:
        return b""
    value = FILTER_VALUES[publishing_id % len(FILTER_VALUES)].encode()
    key = filtering.FILTER_VALUE_ANNOTATION.encode()
    entries = b"\xa3" + bytes([len(key)]) + key + b"\xa1" + bytes([len(value)]) + value
    return b"\x00\x53\x72\xc1" + bytes([len(entries) + 1, 2]) + entries


def _cache_droppable(raft: Raft) -> int:
    """Bytes of the applied entries `raft` holds in memory that are also durable here: what
    `RaftLog.compact` may drop (applied entries above the stable index must stay)."""
    log = raft.log
    held = log.bytes_applied
    for index in range(max(log.stable, log.first_index - 1) + 1, log.applied + 1):
        held -= len(log.entry(index).payload)
    return held


def _check_cache(node: NodeId, replica: _SimReplica) -> None:
    """`log-cache` (ADR 0049), after every event: a replica's applied, durable entries in
    memory are within its config's limit (it compacts after every Ready and every commit it
    applies); a quiet follower keeps none (its peers had everything when its leader went
    quiet); a quiet leader keeps none that every peer has acknowledged."""
    raft = replica.raft
    log = raft.log
    droppable = _cache_droppable(raft)
    if not droppable:
        return
    where = f"{node} g{replica.group_number} {raft.role.value}"
    if droppable > raft.config.log_cache_bytes:
        raise InvariantViolation(
            "log-cache",
            f"{where}: {droppable} applied, durable entry bytes in memory, over the limit of "
            f"{raft.config.log_cache_bytes}",
        )
    if not raft.quiesced:
        return
    if raft.role is not Role.LEADER:
        raise InvariantViolation(
            "log-cache", f"{where} is quiet and keeps {droppable} applied entry bytes"
        )
    peers = [raft.match_of(p) for p in raft.membership.members if p != raft.id]
    floor = min((m or 0 for m in peers), default=log.applied)
    if log.first_index <= min(floor, log.applied, log.stable):
        raise InvariantViolation(
            "log-cache",
            f"{where} is quiet and keeps entry {log.first_index}, which every peer has "
            f"acknowledged (up to {floor})",
        )


def _check_filtered(  # noqa: PLR0917 (the replica's read, as its caller has it)
    node: NodeId, group: int, replica: Replica, start: int, end: int, records: dict[int, bytes]
) -> None:
    """`filter-complete` (ADR 0016): a read that passes over chunks by a consumer's filter
    values (`Replica.read(where=)`, skip marks included) still returns every record holding one
    of them, on every replica, whatever built its log (appends, catch-up, segment transfer)."""
    for value in FILTER_VALUES:
        wants = filtering.ValueFilter(frozenset({value}))
        seen: set[int] = set()
        position = start
        while position < end:
            views = replica.read(Offset(position), 4096, wants.chunk_may_match)
            assert views, (node, group, position, end)
            for view in views:
                seen.update(view.first_offset + i for i in range(len(view.records)))
                moved = view.first_offset + len(view.records)
                assert moved > position or view.records, (node, group, position, view)
                position = max(position, moved)
        missed = [
            o
            for o, r in sorted(records.items())
            if filtering.filter_value(r) == value and o not in seen
        ]
        if missed:
            raise InvariantViolation(
                "filter-complete",
                f"{node} g{group}: a read filtered on {value!r} passed over offsets {missed[:5]} "
                "holding it",
            )


def _producer_name(group: int) -> bytes:
    return f"sim-g{group}".encode()


def run_shell_seed(
    seed: int,
    *,
    nodes: int | None = None,
    groups: int | None = None,
    steps: int = 2000,
    bugs: ShellBugs = NO_BUGS,
) -> ShellResult:
    options = replace(ShellOptions.draw(seed, nodes=nodes, groups=groups, steps=steps), bugs=bugs)
    return ShellCluster(seed, options).run()
