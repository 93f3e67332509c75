"""ReplicationDriver: everything the node's replication shell decides, with no asyncio, no
threads, no sockets and no clock of its own, so the simulator runs it exactly as a node does.

The asyncio shell (host.py) only moves things in and out: it calls `tick()` from its timer,
`receive()` for every frame the transport reads, runs `begin_batch()` when woken, hands the
batch's syncs to its fsync thread (`run_syncs`, the only blocking I/O), then `finish_batch()`.
The simulator (spate.sim.shell) calls the same methods from its event loop, with frames carried
by the simulated network and syncs completed after a simulated disk latency.

One batch is the loop turn the Raft cores' contract asks for, across all partitions:

1. `begin_batch`: installs and retention first (never while a batch syncs); then take a Ready
   from every replica that has one; write each (entries as chunks, hard state; page cache
   only); send at once what `Ready.messages_before_sync` allows (a leader's Appends and
   Heartbeats, or everything when the Ready has nothing to sync) and apply the committed
   entries (resolving producers' appends: committed means a quorum has them on disk);
2. `run_syncs`: ONE batch of fsyncs for every dirty file of every replica (group commit across
   partitions). Messages, ticks and proposals keep arriving meanwhile and are stepped into the
   cores (allowed between `ready` and `advance`): they make the next batch;
3. `finish_batch`: send `Ready.messages_after_sync` (acks and votes: only now, they promise
   what step 2 synced), report leader changes, start catch-ups, `advance` every Ready, apply
   the commit a leader's own sync made and send its commit advance (ADR 0043); a replica
   whose core has more (`has_ready`) is marked for the next batch, and the shell goes again
   while anything is marked or woke it.

A commit is applied where it is learned (`Raft.take_committed`: in `receive` after each
message, in `finish_batch` after each advance), not in a batch of its own: a commit point
that moved alone is written at the next tick (ADR 0043).

A leader's Appends need not wait for a batch (ADR 0033): `receive` sends what a leader's core
queued as it steps each message (the commit advance an ack made), and `send_early`, which the
shell calls when woken while step 2 runs, sends what woken leaders queued meanwhile (entries
proposed during the fsyncs); `Raft.take_leader_messages` hands out only what a leader may send
before its own write.

Node liveness (ADR 0026, liveness.py): every tick a PING frame goes to each peer node of the
local groups, and each peer's silence is counted in ticks (any frame from it ends the count). A
peer silent for `liveness_ticks` is *silent*: a quiet leader here left without a quorum of
voters not silent steps down an election timeout later unless they are heard from (ADR 0027).
A peer silent for longer than its lateness allows (`liveness_ticks` if it has been punctual,
up to `liveness_ticks_max`) is *suspected*: the quiet followers whose leader it is wake
(`Raft.wake`); in between it is *late*, and followers whose leader's node is late hold their
campaigns (`Raft.late_peers`; RESULTS §42). Heard from again, the followers it woke that did
nothing since go back to sleep, and the quiet groups led here that lack its acknowledgement
wake so it gets what it missed (ADR 0026 addendum: a late node is not a dead one). Quiet groups
are not ticked at all: the tick visits the awake ones (`_awake`), a quiet replica's `ticks`
count from the driver's clock, and a group rejoins the awake ones when it wakes (every wake-up
passes through `_wake_group` or a batch; a sweep of all replicas every SWEEP_TICKS is the
safety net).

Catch-up transfers (catchup.Fetch) run here too: one request in flight per partition, matched
by request id, abandoned after `catchup_request_timeout_ms` (default: the limit of that name)
without a reply (checked on tick) and resumed by the next SnapshotNeeded. Replies to the
leader-side requests are built here from committed, durable data.

The methods `_early_messages`/`_late_messages`, `_serves_catchup` and `_retention_floor`,
`_open` and `_observe_ready`, are the seams the
simulator's planted bugs override (tests prove the checker catches each).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from spate.core import frames
from spate.core.errors import BrokerError, NotFound
from spate.core.histogram import Histogram
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.node.replication import catchup, codec, limits
from spate.node.replication.liveness import Liveness
from spate.node.replication.messages import Append, Message, Ready, SnapshotRequest
from spate.node.replication.raft import Role
from spate.node.replication.replica import Replica
from spate.node.replication.storage import SyncWork

log = logging.getLogger(__name__)

RETENTION_INTERVAL_MS = 10_000
"""How often retention is applied to every replica (between batches)."""

SWEEP_TICKS = 20
"""Every this many ticks the driver looks at every replica, not only the awake ones: a group
woken by a path that did not tell the driver is ticked again within a second (a safety net;
every wake-up known is reported at once)."""

PEERS_REFRESH_TICKS = 200
"""How often the peer nodes of the local groups are collected again (membership changes; a new
peer is PINGed at the latest this many ticks after it joins a group)."""

WAKE_LEADER_SUSPECTED = "leader_suspected"
WAKE_QUORUM_SUSPECTED = "quorum_suspected"
WAKE_PEER_BACK = "peer_back"
WAKE_REASONS = (WAKE_LEADER_SUSPECTED, WAKE_QUORUM_SUSPECTED, WAKE_PEER_BACK)
"""Why node liveness woke a quiet group: a follower's leader (or every leader it knew) is
suspected; a leader's voters not suspected have been no quorum for an election timeout (it
steps down); a suspected peer came back and lacks entries of a group led here."""

LeaderListener = Callable[[StreamName, PartitionId, NodeId | None, LeaderEpoch], None]
Send = Callable[[NodeId, frames.Frame], bool]
"""Queue one encoded frame (whole, or in pieces: `frames.FrameParts`) for a peer; False when it
was dropped."""

R = TypeVar("R", bound=Replica)


def water_level(sizes: Sequence[int], budget: int) -> int | None:
    """The largest cap `c` with sum(min(size, c)) <= `budget`: what every cache larger than
    it is lowered to so that they all fit (ADR 0049); None when they fit already."""
    assert budget >= 0
    if sum(sizes) <= budget:
        return None
    ordered = sorted(sizes)
    remaining = budget
    for position, size in enumerate(ordered):
        share = remaining // (len(ordered) - position)
        if size > share:
            return share  # this and every larger one get `share`: the rest fit below it
        remaining -= size
    raise AssertionError("unreachable: the sizes fit")


@dataclass(slots=True)
class Batch(Generic[R]):
    """The Readies taken by one `begin_batch`, and the syncs they need."""

    items: list[tuple[R, Ready, SyncWork | None]]
    bytes_written: int = 0
    """Bytes of entries written by the Readies that need a sync: what the batch's fsyncs
    flush (the host runs a small batch's syncs on its loop thread, ADR 0036)."""

    @property
    def syncs(self) -> list[tuple[R, SyncWork]]:
        return [(group, work) for group, _, work in self.items if work is not None]


@dataclass(slots=True)
class _Transfer(Generic[R]):
    group: R
    fetch: catchup.Fetch
    request_id: int = 0
    deadline_ms: float = 0.0


class ReplicationDriver(Generic[R]):
    def __init__(
        self,
        node_id: NodeId,
        *,
        send: Send,
        wake: Callable[[], None],
        monotonic_ms: Callable[[], float],
        wall_ms: Callable[[], int],
        retention_interval_ms: int = RETENTION_INTERVAL_MS,
        catchup_request_timeout_ms: int = limits.catchup_request_timeout_ms,
        request_id_base: int = 1,
        liveness_ticks: int = limits.liveness_ticks,
        liveness_ticks_max: int = limits.liveness_ticks_max,
        log_cache_budget_bytes: int = limits.node_log_cache_bytes_max,
    ) -> None:
        assert retention_interval_ms > 0 and catchup_request_timeout_ms > 0
        assert log_cache_budget_bytes >= 0
        self.node_id = node_id
        self._send_frame = send
        self.wake = wake
        self._monotonic_ms = monotonic_ms
        self._wall_ms = wall_ms
        self.retention_interval_ms = retention_interval_ms
        self.catchup_request_timeout_ms = catchup_request_timeout_ms
        self.groups: dict[frames.GroupKey, R] = {}
        self._dirty: dict[frames.GroupKey, R] = {}
        """Replicas touched since the last batch: only they can have a Ready (a batch looks at
        these, not at every replica: O(touched), not O(partitions), per wake-up)."""
        self.leader_listeners: list[LeaderListener] = []
        self._transfers: dict[int, _Transfer[R]] = {}  # by request id
        self._installs: list[R] = []  # replicas whose transfer is staged, to install
        # Request ids must not repeat across this node's restarts: a peer may answer a request
        # of the previous incarnation after this one asked its own (found by the simulator: a
        # wiped replica installed an old manifest). The host starts them at a random point.
        assert 0 < request_id_base < 1 << 63
        self._request_ids = itertools.count(request_id_base)
        self._retention_due_ms = 0.0
        self.batches = 0
        self.fsyncs = 0
        self.appends_sent = 0
        """Append messages sent (entries or a commit advance; /metrics: how many Appends, and
        so acks, a MiB costs)."""
        self.appends_received = 0
        self.entries_received = 0
        """Append messages, and the Raft entries in them, received from leaders."""
        self.commits_ahead_of_write = 0
        """Messages from a leader that left this follower's commit index above what it has
        handed to disk: the entries between wait for its next batch's write before they can
        be applied and read here (/metrics; RESULTS §60: where a follower's consumers wait)."""
        self.append_seconds = Histogram()
        """Every local leader's appends, proposed to committed (ADR 0023: /metrics)."""
        self.fsync_seconds = Histogram()
        """Wall time of each batch's fsyncs (`run_syncs`), observed by the shell that ran it."""
        self.liveness = Liveness(liveness_ticks, liveness_ticks_max)
        """Each peer node's silence, and its lateness learned (ADR 0026, liveness.py)."""
        self.silent: set[NodeId] = self.liveness.silent
        """Peer nodes silent for `liveness_ticks` or more: what leaders here decide on."""
        self.suspected: set[NodeId] = self.liveness.suspected
        """Peer nodes silent for longer than their lateness allows: what followers here decide
        on (their groups elect another leader)."""
        self.wakes = 0
        """Quiet groups woken by node liveness (a figure for tests and /metrics)..."""
        self.wakes_by_reason: dict[str, int] = dict.fromkeys(WAKE_REASONS, 0)
        """... by reason (WAKE_REASONS)."""
        self.settled = 0
        """Followers woken by a suspicion of their leader's node put back to sleep when it was
        heard from again (`Raft.settle_again`)."""
        self.suspicions = 0
        """Times a peer node was suspected."""
        self.message_wakes = 0
        """Quiet replicas woken by a Raft message from a peer (a pre-vote, an append...)."""
        self.tick_gap_seconds = Histogram()
        """Time between two ticks, observed by the shell that runs them: past `tick_ms`, the
        loop was late (a long batch, a GC pause), and so were this node's PINGs."""
        self._quorum_lost: dict[frames.GroupKey, tuple[R, int]] = {}
        """Quiet leaders whose voters not suspected are no quorum, with the tick that found it:
        they step down an election timeout later unless the quorum is heard from again."""
        self.quorum_back = 0
        """Quiet leaders that lost their quorum to node liveness and got it back within an
        election timeout: never woken, nothing sent."""
        self._woken_for: dict[NodeId, dict[frames.GroupKey, R]] = {}
        """Followers woken because their leader's node is suspected, by that node: settled
        again if it is heard from before anything else happens to them."""
        self._peers: list[NodeId] = []
        self._peers_of = -1
        self._liveness_ticks = 0
        self.ticks = 0
        """Ticks since this driver started (quiet replicas count theirs from it)."""
        self._awake: dict[frames.GroupKey, R] = {}
        """Replicas the tick visits: every one but the quiet groups (ADR 0026; issue 16: a tick
        over 1,000 quiet groups, 20 times a second, was most of an idle node's cost)."""
        self._clock = self._ticks_now
        self.log_cache_budget_bytes = log_cache_budget_bytes
        """Applied Raft entry bytes all replicas here may keep in memory (ADR 0049)."""
        self.log_cache_bytes = 0
        """What they kept at the last sweep (SWEEP_TICKS), before it lowered any (/metrics)."""
        self.log_cache_level: int | None = None
        """The cap the last sweep set on the largest caches; None: they fit the budget."""
        self.log_cache_trims = 0
        """Caches lowered by a sweep to fit the budget."""
        self._capped: list[R] = []

    # -- replicas

    def add(self, group: R) -> None:
        key = (group.stream, group.partition)
        assert key not in self.groups, key

        def report(leader: NodeId | None, epoch: LeaderEpoch) -> None:
            for listener in list(self.leader_listeners):
                listener(group.stream, group.partition, leader, epoch)

        group.leader_listeners.append(report)
        group.append_seconds = self.append_seconds
        group.set_wake(functools.partial(self._wake_group, key, group))
        # Shared: the core reads node liveness (ADR 0026): a leader may go quiet without a silent
        # peer's acknowledgement; a follower holds its campaign while its leader's node is late.
        group.raft.dead_peers = self.silent
        group.raft.late_peers = self.liveness.late
        self.groups[key] = group
        self._awake[key] = group
        if not group.raft.peers or (group.replicas[0] == self.node_id and group.raft.term == 0):
            # A single-voter group, or the preferred leader of a brand-new group, need not wait
            # an election timeout: a client can publish right after `stream create`.
            group.raft.campaign()
        self._wake_group(key, group)

    def _wake_group(self, key: frames.GroupKey, group: R, *, work: bool = True) -> None:
        """`group` may have work: mark it for the next batch and wake the shell; with
        `work=False` (its core has no Ready: a stepped message that changed nothing to write or
        send) only keep it among the awake ones, so the shell does not turn for an empty batch."""
        if not self._open(key, group):
            return  # removed (closing): no batch may touch its files again (`remove`)
        if key not in self._awake and not group.raft.quiesced:
            group.resume()
            self._awake[key] = group
        if work:
            self._dirty[key] = group
            self.wake()

    def _ticks_now(self) -> int:
        return self.ticks

    def remove(self, stream: StreamName, partition: PartitionId) -> R:
        """Forget a replica (the caller closes it once no sync can touch its files): from now
        on no batch takes it, not even one begun while a batch holding it syncs, nor a wake."""
        group = self.groups.pop((stream, partition), None)
        if group is None:
            raise NotFound(f"{stream}/{partition} is not open on {self.node_id}")
        self._dirty.pop((stream, partition), None)
        self._awake.pop((stream, partition), None)
        self._quorum_lost.pop((stream, partition), None)
        for request_id, transfer in list(self._transfers.items()):
            if transfer.group is group:
                self._end_transfer(request_id)
        return group

    def get(self, stream: StreamName, partition: PartitionId) -> R:
        group = self.groups.get((stream, partition))
        if group is None:
            raise NotFound(f"{stream}/{partition} is not open on {self.node_id}")
        return group

    # -- time

    def tick(self) -> None:
        """Every tick_ms: node liveness, tick every awake core, time out catch-up requests."""
        self.ticks += 1
        self._liveness()
        dirty, awake = self._dirty, self._awake
        # Quiet groups are not visited (their core would return at once: no timer runs while
        # nothing is pending); their `ticks` count from the driver's clock. A sweep every
        # SWEEP_TICKS looks at them all, in case one woke without telling the driver.
        sweep = self.ticks % SWEEP_TICKS == 0
        if sweep:
            self._bound_caches()
        visit = self.groups if sweep else awake
        for key, group in list(visit.items()):
            if group.raft.quiesced:
                if key in awake:
                    group.sleep(self._clock, self.ticks - 1)  # this tick counts for it
                    del awake[key]
                continue
            if key not in awake:
                group.resume()
                awake[key] = group
            if group.failure is None:
                group.tick()
                dirty[key] = group  # (a tick that quiesces leaves its quiesce heartbeats to send)
        now_ms = self._monotonic_ms()
        for request_id, transfer in list(self._transfers.items()):
            if transfer.deadline_ms <= now_ms:
                self._abandon(request_id, f"{transfer.fetch.leader} did not answer")
        self.wake()

    def _bound_caches(self) -> None:
        """Keep the replicas' Raft log caches within the node's budget (ADR 0049): when they
        hold more than the budget together, lower the largest to one level at which they fit
        (`water_level`); lift the caps once they hold less than three quarters of it (not at
        once, or capped caches would refill and be cut every other sweep). Their entries stay
        on disk; a follower that needs one of them gets a segment transfer, not an Append."""
        held = [(g, size) for g in self.groups.values() if (size := g.raft.cache_bytes)]
        total = self.log_cache_bytes = sum(size for _, size in held)
        budget = self.log_cache_budget_bytes
        level = water_level([size for _, size in held], budget)
        if level is None and total > budget * 3 // 4:
            return  # under the budget, thanks to the caps in force: they stay
        for group in self._capped:
            group.raft.cache_cap = None
        self._capped = []
        self.log_cache_level = level
        if level is None:
            return
        for group, size in held:
            if size > level:
                group.raft.cache_cap = level
                group.raft.compact_cache()
                self._capped.append(group)
                self.log_cache_trims += 1

    def _liveness(self) -> None:
        self._liveness_ticks += 1
        if self._liveness_ticks % PEERS_REFRESH_TICKS == 1 or len(self.groups) != self._peers_of:
            found: set[NodeId] = set()
            for group in self.groups.values():
                found.update(group.raft.peers)
            # sorted: a set's order depends on the hash seed; the simulator replays exactly
            self._peers, self._peers_of = sorted(found), len(self.groups)
        peers = self._peers
        for peer in list(self._woken_for):
            if peer not in peers:
                del self._woken_for[peer]
        for peer in peers:
            self._send_frame(peer, codec.PING_FRAME)
        went_silent, suspected = self.liveness.tick(peers)
        for peer in went_silent:
            self._on_silent(peer)
        for peer in suspected:
            self.suspicions += 1
            self._on_suspected(peer)
        if self._quorum_lost:
            self._check_quorum_lost()

    def link_closed(self, peer: NodeId) -> None:
        """The transport saw `peer`'s process close its connection (a dead process's sockets
        close; a late one's stay open): suspect it after `liveness_ticks`, whatever lateness
        it showed before."""
        self.liveness.link_closed(peer)

    def _check_quorum_lost(self) -> None:
        """Leaders that were quiet when their unsuspected voters stopped being a quorum:
        forgotten when the quorum is heard from again (or they no longer lead); stepped down
        (`Raft.step_down`) once it has been missing for an election timeout, counting the tick
        that found it: the tick on which check-quorum deposed a leader woken then (ADR 0026
        addendum; ADR 0015's settle rule relies on that timing). Woken meanwhile for other
        work, a leader still steps down then: a suspected voter sent nothing, not even an
        answer to the woken leader's heartbeats."""
        silent = self.silent
        for key, (group, since) in list(self._quorum_lost.items()):
            raft = group.raft
            if self.groups.get(key) is not group or raft.role is not Role.LEADER:
                del self._quorum_lost[key]
                continue
            live = sum(1 for v in raft.voters if v == self.node_id or v not in silent)
            if live >= raft.quorum:
                del self._quorum_lost[key]
                self.quorum_back += int(raft.quiesced)
            elif self.ticks - since + 1 >= raft.config.election_timeout_ticks:
                del self._quorum_lost[key]
                raft.step_down()
                self._count_wake(WAKE_QUORUM_SUSPECTED)
                self._wake_group(key, group)

    def _heard(self, peer: NodeId) -> None:
        was_silent, was_suspected = self.liveness.heard(peer)
        if was_silent:
            self._peer_back(peer, was_suspected)

    def _on_silent(self, peer: NodeId) -> None:
        """`peer` has been silent for an election timeout: the quiet leaders here whose voters
        not silent are no quorum step down an election timeout from now unless the quorum is
        heard from first (`_check_quorum_lost`). Not woken (their heartbeats would wake every
        replica of the group, and a quorum that was only late would answer them all); a leader
        that still reaches a quorum has nothing to do (ADR 0027: waking every group on every
        suspicion made an overloaded node's 3,000 groups heartbeat for good)."""
        silent = self.silent
        for key, group in self.groups.items():
            raft = group.raft
            if raft.quiesced and raft.role is Role.LEADER and peer in raft.peers:
                live = sum(1 for v in raft.voters if v == self.node_id or v not in silent)
                if live < raft.quorum:
                    self._quorum_lost.setdefault(key, (group, self.ticks))

    def _on_suspected(self, peer: NodeId) -> None:
        """`peer` has been silent for longer than its lateness allows: wake the quiet followers
        here that need another leader (their leader's node is suspected)."""
        suspected = self.suspected
        for key, group in self.groups.items():
            raft = group.raft
            if not raft.quiesced or raft.role is Role.LEADER or peer not in raft.peers:
                continue
            if (leader := raft.leader) is None:
                raft.wake()
                self._count_wake(WAKE_LEADER_SUSPECTED)
            elif leader in suspected:
                raft.wake(leader_suspected=True)  # settled again if its leader comes back
                self._woken_for.setdefault(leader, {})[key] = group
                self._count_wake(WAKE_LEADER_SUSPECTED)
            else:
                continue  # a follower whose leader is not suspected: nothing to elect
            self._wake_group(key, group)

    def _peer_back(self, peer: NodeId, was_suspected: bool) -> None:
        """A silent `peer` is heard from again. If it was suspected, its followers woken here
        by the suspicion that have done nothing since go back to sleep
        (`Raft.settle_again`): a late node is not a dead one, and campaigns for thousands of
        groups, each waking its leader and third replica, are what made nodes late (issue
        16). The quiet groups led here that went quiet without its acknowledgements wake, so
        it gets what it missed; one that went quiet with its acknowledgement has nothing to
        tell it (a restarted peer's replica is awake and campaigns, and its pre-vote wakes
        the leader, which answers)."""
        if was_suspected:
            for key, group in self._woken_for.pop(peer, {}).items():
                if self.groups.get(key) is group and group.raft.settle_again():
                    self.settled += 1  # the next tick stops visiting it
        for key, group in self.groups.items():
            raft = group.raft
            if raft.quiesced and raft.lags(peer):
                raft.wake()
                self._count_wake(WAKE_PEER_BACK)
                self._wake_group(key, group)

    def _count_wake(self, reason: str) -> None:
        self.wakes += 1
        self.wakes_by_reason[reason] += 1

    # -- batches

    def begin_batch(self) -> Batch[R] | None:
        """Steps 1 of a batch (see the module docstring); None when no replica has work."""
        self._between_batches()
        items: list[tuple[R, Ready, SyncWork | None]] = []
        written = 0
        dirty, self._dirty = self._dirty, {}
        awake = self._awake
        for key, group in dirty.items():
            if not self._open(key, group):
                continue  # removed since it was marked (`remove`)
            if key not in awake and not group.raft.quiesced:
                group.resume()  # woken by a path that did not go through `_wake_group`
                awake[key] = group
            if group.failure is not None or group.closed or not group.raft.has_ready():
                continue
            ready = group.raft.ready()
            self._observe_ready(group, ready)
            try:
                work = group.persist(ready)
            except (BrokerError, OSError) as error:
                self._fail(group, str(error))
                continue
            items.append((group, ready, work))
            if work is not None:
                for entry in ready.entries:
                    written += len(entry.payload)
            # Before the sync: a leader's Appends and Heartbeats (its commit counts its own
            # *persisted* index, so a follower may hold an entry before the leader's disk
            # does), everything when there is nothing to sync, and the committed entries (a
            # quorum holds them on disk; this replica has written them).
            self._send(group, self._early_messages(ready))
            group.apply_committed(ready)
        return Batch(items, written) if items else None

    def run_syncs(self, batch: Batch[R]) -> dict[R, str]:
        """Step 2: the fsyncs (the only blocking I/O; the asyncio shell runs this in its fsync
        thread). Failures per replica."""
        failures: dict[R, str] = {}
        for group, work in batch.syncs:
            try:
                group.store.run_sync(work)
            except OSError as error:
                failures[group] = f"fsync failed: {error}"
        return failures

    def finish_batch(self, batch: Batch[R], failures: dict[R, str]) -> None:
        """Step 3 (see the module docstring)."""
        syncs = batch.syncs
        self.fsyncs += len(syncs)
        for group, work in syncs:
            if group in failures:
                self._fail(group, failures[group])
            elif not group.closed:
                group.store.finish_sync(work)
        self.batches += 1
        dirty = self._dirty
        for group, ready, _ in batch.items:
            if group.failure is not None or group.closed:
                continue
            self._send(group, self._late_messages(ready))  # synced: its acks are true
            group.report_leader(ready)
            group.raft.advance(ready)
            key = (group.stream, group.partition)
            if not self._open(key, group):
                continue  # removed while it synced: no transfer, no next batch (`remove`)
            # A leader's own sync may have made the commit (its persisted index counts): apply
            # it and send the commit advance now, not in a batch of their own (ADR 0043); or,
            # short of a commit, tell followers with readers what commits once they hold it
            # (ADR 0050). A follower's sync may have completed such a commit: apply it.
            committed = group.raft.take_committed()
            if committed:
                group.apply_entries(committed)
            if committed or group.raft.commit_with_pending:
                self._send(group, self._early_leader_messages(group))
            if ready.snapshot_request is not None:
                self._start_transfer(group, ready.snapshot_request)
            if key not in dirty and group.raft.has_ready():
                dirty[key] = group  # more came in while it synced
        if dirty:
            # Only then: a finished batch with nothing after it used to wake the loop for an
            # empty batch (~2 per replicated append on each node, RESULTS §52). Work that comes
            # later marks its group and wakes the loop itself (`_wake_group`, `tick`).
            self.wake()

    def send_early(self) -> None:
        """Between a batch's steps 1 and 3, when woken while its fsyncs run: send what the
        woken leaders may send at once (`Raft.take_leader_messages`: the entries proposed
        meanwhile) instead of in the next batch, which waits for these fsyncs (issue 16, ADR
        0030). The groups stay marked for the next batch (their writes, applies and other
        messages)."""
        for group in self._dirty.values():
            if group.failure is None and not group.closed:
                self._send(group, self._early_leader_messages(group))

    def _early_leader_messages(self, group: R) -> Sequence[Message]:
        """Seam for the simulator's planted bugs: a leader's messages sent between batches."""
        return group.raft.take_leader_messages()

    def _open(self, key: frames.GroupKey, group: R) -> bool:
        """Seam for the simulator's planted bugs: `group` is still this driver's (not removed:
        the host closes a removed replica's files once the syncs in flight have returned, so
        no batch may take it again)."""
        return self.groups.get(key) is group

    def _observe_ready(self, group: R, ready: Ready) -> None:
        """Seam for the simulator's checker: a Ready was just taken from `group`'s core."""

    def _early_messages(self, ready: Ready) -> Sequence[Message]:
        """What leaves at write time (ADR 0005's send rule)..."""
        return ready.messages_before_sync()

    def _late_messages(self, ready: Ready) -> Sequence[Message]:
        """... and what leaves once the batch's fsyncs are done."""
        return ready.messages_after_sync()

    def _between_batches(self) -> None:
        """Work that must not overlap an fsync batch: installs and retention."""
        installs, self._installs = self._installs, []
        for group in installs:
            if not self._open((group.stream, group.partition), group):
                continue  # removed while its transfer ran
            self._dirty[(group.stream, group.partition)] = group
            if group.install is not None and group.failure is None and not group.closed:
                manifest, index, term = group.install
                group.install = None
                if group.raft.role is Role.LEADER or index <= group.raft.log.committed:
                    continue
                if group.raft.log.match_term(index, term):
                    # The log already holds that point (entries arrived while the transfer ran):
                    # installing would cut the entries after it from the disk while the core
                    # keeps them (found by the shell simulator). Commit to it instead. A log
                    # that does not match it matches no later point either (log matching), so
                    # an installed later point (manifest_reply) never meets this case.
                    group.raft.restore(index, term, group.install_membership)
                    continue
                asked = min(group.install_asked, index)
                try:
                    index, term = catchup.install(group.store, manifest, index)
                except catchup.ShortInstall as error:
                    # Committed data, only less of it than asked: the next transfer goes on.
                    log.warning("%s: %s/%s: %s", self.node_id, group.stream, group.partition, error)
                    continue
                except (BrokerError, OSError) as error:
                    self._fail(group, f"installing segments failed: {error}")
                    continue
                group.restored(index)
                membership = group.install_membership
                if index > asked:
                    # The install went past the snapshot asked for: a membership entry in
                    # between is in force there.
                    membership = group.store.membership_between(asked, index) or membership
                group.raft.restore(index, term, membership)
                log.info(
                    "%s: %s/%s caught up to Raft index %d by segment transfer",
                    self.node_id,
                    group.stream,
                    group.partition,
                    index,
                    extra={"stream": group.stream, "partition": group.partition},
                )
        now_ms = self._monotonic_ms()
        if now_ms >= self._retention_due_ms:
            self._retention_due_ms = now_ms + self.retention_interval_ms
            for group in list(self.groups.values()):
                self.apply_retention(group)

    def apply_retention(self, group: R) -> int:
        """Delete expired segments, keeping the chunk at the applied commit point (a restart
        starts at the later of the durable commit point and the first retained chunk)."""
        if group.failure is not None or group.install is not None:
            return 0
        try:
            return group.store.log.apply_retention(
                self._wall_ms(), index_floor=self._retention_floor(group)
            )
        except BrokerError as error:
            self._fail(group, str(error))
            return 0

    def _retention_floor(self, group: R) -> int | None:
        return group.raft.log.applied

    def _fail(self, group: R, reason: str) -> None:
        log.error(
            "%s: %s/%s stops: the disk failed: %s",
            self.node_id,
            group.stream,
            group.partition,
            reason,
            extra={"stream": group.stream, "partition": group.partition},
        )
        group.fail(reason)

    def _send(self, group: R, messages: Sequence[Message]) -> None:
        if not messages:
            return
        key = (group.stream, group.partition)
        for message in messages:
            if type(message) is Append:
                self.appends_sent += 1
            self._send_frame(message.target, codec.encode_raft(key, message))

    # -- receiving

    def receive(self, peer: NodeId, kind: int, body: memoryview) -> None:
        """One frame from an authenticated peer. Garbage is logged and dropped (the transport
        closes a connection that breaks framing)."""
        try:
            self._receive(peer, kind, body)
        except frames.CodecError as error:
            log.warning("replication: bad frame from %s: %s", peer, error)

    def _receive(self, peer: NodeId, kind: int, body: memoryview) -> None:
        self._heard(peer)
        if kind == codec.KIND_PING:
            return
        if kind == codec.KIND_RAFT:
            key, message = codec.decode_raft(body)
            if type(message) is Append:
                self.appends_received += 1
                self.entries_received += len(message.entries)
            group = self.groups.get(key)
            if group is not None and message.source == peer and group.failure is None:
                quiet = group.raft.quiesced
                group.step(message)
                if quiet and not group.raft.quiesced:
                    self.message_wakes += 1
                # A commit learned from this message: apply it now (producers' confirms,
                # readers), not after the fsync of this group's Ready in flight nor in a batch
                # of its own (ADR 0043).
                committed = group.raft.take_committed()
                if committed:
                    group.apply_entries(committed)
                core_log = group.raft.log
                if core_log.committed >= core_log.persist_from and group.raft.role is Role.FOLLOWER:
                    self.commits_ahead_of_write += 1
                # A leader answers at once: the commit advance an ack made (the followers'
                # consumers wait for it) and the entries it unblocked leave on this loop turn,
                # not in the next batch, which may wait for a running fsync (issue 16, ADR 0033).
                self._send(group, self._early_leader_messages(group))
                self._wake_group(key, group, work=group.raft.has_ready())
        elif kind == codec.KIND_FETCH_MANIFEST:
            key, request_id, raft_index = codec.decode_fetch_manifest(body)
            group = self.groups.get(key)
            if group is None or not self._serves_catchup(group, raft_index):
                reply = codec.encode_fetch_error(request_id, "not committed here")
            else:
                applied = group.raft.log.applied
                reply = catchup.manifest_reply(group.store, request_id, raft_index, applied)
            self._send_frame(peer, reply)
        elif kind == codec.KIND_FETCH_PIECE:
            key, request_id, name, position, length = codec.decode_fetch_piece(body)
            group = self.groups.get(key)
            if group is None:
                reply = codec.encode_fetch_error(request_id, "no such partition here")
            else:
                reply = catchup.piece_reply(group.store, request_id, name, position, length)
            self._send_frame(peer, reply)
        elif kind in (
            codec.KIND_MANIFEST,
            codec.KIND_PIECE,
            codec.KIND_FETCH_ERROR,
            codec.KIND_PIECE_GONE,
        ):
            request_id = frames.Reader(body).u64()
            transfer = self._transfers.get(request_id)
            if transfer is not None and transfer.fetch.leader == peer:
                self._on_transfer_reply(request_id, transfer, kind, body)
        else:
            raise frames.CodecError(f"unknown frame kind {kind}")

    def _serves_catchup(self, group: R, raft_index: int) -> bool:
        """Only committed data is transferred (it is durable here and identical everywhere)."""
        return raft_index <= group.raft.log.committed

    # -- catch-up (follower side)

    def _start_transfer(self, group: R, request: SnapshotRequest) -> None:
        if group.catching_up or group.install is not None:
            return
        group.catching_up = True
        group.install_membership = request.snapshot.membership
        group.install_asked = request.snapshot.index
        fetch = catchup.Fetch(
            group.store,
            (group.stream, group.partition),
            request.leader,
            request.snapshot.index,
            request.snapshot.term,
        )
        self._ask(_Transfer(group, fetch))

    def _ask(self, transfer: _Transfer[R]) -> None:
        request_id = next(self._request_ids)
        transfer.request_id = request_id
        transfer.deadline_ms = self._monotonic_ms() + self.catchup_request_timeout_ms
        self._transfers[request_id] = transfer
        if not self._send_frame(transfer.fetch.leader, transfer.fetch.request(request_id)):
            self._abandon(request_id, f"no link to {transfer.fetch.leader}")

    def _on_transfer_reply(
        self, request_id: int, transfer: _Transfer[R], kind: int, body: memoryview
    ) -> None:
        group, fetch = transfer.group, transfer.fetch
        del self._transfers[request_id]
        if group.closed or group.failure is not None:
            self._finish_transfer(transfer)
            return
        try:
            fetch.on_reply(kind, body)
        except (BrokerError, OSError) as error:
            self._abandon_transfer(transfer, str(error))
            return
        if not fetch.done:
            self._ask(transfer)
            return
        assert fetch.manifest is not None
        self._finish_transfer(transfer)
        group.install = (fetch.manifest, fetch.raft_index, fetch.term)
        self._installs.append(group)
        self.wake()

    def _abandon(self, request_id: int, reason: str) -> None:
        self._abandon_transfer(self._transfers.pop(request_id), reason)

    def _abandon_transfer(self, transfer: _Transfer[R], reason: str) -> None:
        self._finish_transfer(transfer)
        log.info(
            "%s: catch-up of %s/%s from %s interrupted (will resume): %s",
            self.node_id,
            transfer.group.stream,
            transfer.group.partition,
            transfer.fetch.leader,
            reason,
            extra={
                "stream": transfer.group.stream,
                "partition": transfer.group.partition,
                "peer": transfer.fetch.leader,
            },
        )
        if not transfer.group.closed:
            transfer.group.raft.snapshot_failed(transfer.fetch.leader)  # no-op on a follower
            key = (transfer.group.stream, transfer.group.partition)
            self._dirty[key] = transfer.group

    def _end_transfer(self, request_id: int) -> _Transfer[R]:
        transfer = self._transfers.pop(request_id)
        self._finish_transfer(transfer)
        return transfer

    @staticmethod
    def _finish_transfer(transfer: _Transfer[R]) -> None:
        transfer.fetch.close()
        transfer.group.catching_up = False

    @property
    def awake(self) -> int:
        """Replicas the tick visits (every one but the quiet groups)."""
        return len(self._awake)

    @property
    def transfers(self) -> int:
        """Catch-up transfers in progress."""
        return len(self._transfers)
