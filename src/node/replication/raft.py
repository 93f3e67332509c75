"""A sans-IO Raft core for one partition's replication group, in the etcd-raft style.

Inputs: `step(message)`, `tick()`, `propose(payload)`, `campaign()`, `restore(index, term)`,
`snapshot_failed(peer)`, `confirm_leadership()` (a read's check that this replica still leads:
`leadership_confirmed`). Outputs: `ready()` returns a `Ready` (what to persist, then send,
then apply) and the shell hands it back with `advance(ready)`. Time is abstract ticks;
randomness (election jitter) comes from the `random.Random` passed in. No I/O, no clock, no
threads.

Role table (pre-vote and check-quorum on, as the shell always runs it)::

    role           | on tick                               | becomes
    ---------------+---------------------------------------+------------------------------------
    FOLLOWER       | election timeout -> PRE_CANDIDATE     | higher term seen -> FOLLOWER(term)
    PRE_CANDIDATE  | asks for pre-votes at term+1, own term| quorum of pre-votes -> CANDIDATE;
                   | unchanged; timeout -> again           | quorum rejected / leader -> FOLLOWER
    CANDIDATE      | term+1, votes for itself; timeout ->  | quorum of votes -> LEADER;
                   | PRE_CANDIDATE again                   | leader of term -> FOLLOWER
    LEADER         | heartbeat every heartbeat interval;   | no quorum heard from within one
                   | check-quorum every election timeout   | election timeout -> FOLLOWER

Durability rules the core relies on (see messages.Ready): entries and hard state in a Ready are
persisted before its acknowledging messages are sent, so a follower's AppendResponse (produced
while stepping the Append that carried the entries) is only sent once those entries are
durable, and a vote only once the vote is; the leader counts its own *persisted* index, not its
appended one, when computing the commit index, so its Appends, Heartbeats and SnapshotNeeded
may leave before its own sync (`Ready.messages_before_sync`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from enum import Enum

from spate.core.ids import LeaderEpoch, NodeId, Term
from spate.node.replication import limits
from spate.node.replication.log import RaftLog
from spate.node.replication.messages import (
    HARD_STATE_EMPTY,
    LEADER_OUTPUT,
    SNAPSHOT_EMPTY,
    Append,
    AppendResponse,
    Entry,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    LeaderChange,
    Membership,
    Message,
    Proposed,
    Ready,
    Refusal,
    RefusalReason,
    SnapshotMeta,
    SnapshotNeeded,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    is_membership,
)
from spate.node.replication.progress import Progress, ProgressState

COMMIT_LAG_ENTRIES_MAX = 8
"""A commit point that moved alone is written at the next tick (ADR 0043), when the group goes
quiet, or once it trails the one written by this many entries: at most 8 entries of
`limits.entry_bytes_max` (64 MiB) more for a restart to read back as uncommitted, within
`limits.restart_window_bytes_max` with the uncommitted entries themselves."""


class Role(Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


QUIET_COMMITS = os.environ.get("SPATE_QUIET_COMMITS", "1") != "0"
"""Send a commit update to a follower in REPLICATE state as a quiet Append, which it does not
answer when it accepts it (ADR 0042: the leader stepped about two answers per append that told
it nothing new). `$SPATE_QUIET_COMMITS=0` turns it off, for A/B measurements."""

COMMIT_UPDATES_TO_ALL = os.environ.get("SPATE_COMMIT_UPDATES", "readers") == "all"
"""Send a commit update (an empty Append carrying only a new commit index) to every follower in
REPLICATE state, not only to those whose last ack said they have readers (ADR 0044).
`$SPATE_COMMIT_UPDATES=all` turns the old behaviour on, for A/B measurements."""

COMMIT_WITH_YOU = os.environ.get("SPATE_COMMIT_WITH", "1") != "0"
"""Tell followers what commits once they hold it (`Append.commit_with_you`, ADR 0050): a
follower with readers applies an entry when its own fsync ends, not a round trip later.
`$SPATE_COMMIT_WITH=0` turns it off (the leader sends 0), for A/B measurements."""

FOLD_ACKS = True
"""Fold a follower's accepted acks of one Ready into the last (ADR 0035, `_send`). Switched off
for a day while the shell simulator's seed 208 failed `offset-durable` with it on; the folding
was not the fault (ADR 0035's second addendum): it changed which messages the seed's network
lost, and so reached a stale leader answering a stored-offset query from its own log, which
`confirm_leadership` now prevents. A switch for A/B measurements (benchmarks/w1_cpu.py)."""


@dataclass(frozen=True, slots=True)
class RaftConfig:
    election_timeout_ticks: int = 10
    """A follower campaigns after a random timeout in [this, 2 * this) ticks without a leader."""
    heartbeat_interval_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    inflight_appends_max: int = limits.inflight_appends_max
    append_bytes_max: int = limits.append_bytes_max
    log_cache_bytes: int = limits.log_cache_bytes_max
    """Applied entry bytes a leader keeps in memory for peers that lack them (entries every
    peer acknowledged go at once, ADR 0049); 0 drops every applied, persisted entry at once
    (tests and the simulator use small values to exercise the snapshot path)."""
    follower_log_cache_bytes: int = limits.follower_log_cache_bytes_max
    """Applied entry bytes a replica that does not lead keeps (at most `log_cache_bytes`; none
    while quiet): what it would feed a peer a little behind it if elected (ADR 0049)."""
    quiesce: bool = False
    """An idle group goes quiet (ADR 0026): no heartbeats, no election timer, until `wake()`,
    a proposal or a message. Only for shells that call `wake()` when a peer node goes silent
    (the replication driver's node liveness); a bare core would never notice a dead leader."""

    def __post_init__(self) -> None:
        assert 0 < self.heartbeat_interval_ticks < self.election_timeout_ticks
        assert 0 < self.inflight_appends_max <= limits.inflight_appends_max
        assert 0 < self.append_bytes_max <= limits.append_bytes_max
        assert 0 <= self.log_cache_bytes <= limits.log_cache_bytes_max
        assert 0 <= self.follower_log_cache_bytes <= limits.follower_log_cache_bytes_max


@dataclass(frozen=True, slots=True)
class Status:
    node: NodeId
    role: Role
    term: Term
    leader: NodeId | None
    leader_epoch: LeaderEpoch
    commit: int
    applied: int
    persisted: int
    last_index: int
    membership: Membership
    transferring_to: NodeId | None = None


class Raft:
    """One replica of one group.

    `voters` is the group's membership when its log says nothing else: a sequence of voters
    (the partition's replica set as first placed) or a `Membership`. The log overrides it:
    `snapshot.membership` (what the shell recorded at the commit point it restarts from, or a
    leader's snapshot) and then every membership entry in `entries`, the last one winning. A
    replica need not be a member: a learner catches up without voting, and a removed replica
    neither campaigns nor counts (ADR 0022).

    Membership changes (ADR 0022): `propose_membership(new)` on the leader appends a
    membership entry that changes at most one voter (learners freely), only once the previous
    membership entry and this leader's barrier are committed; every replica uses the newest
    membership in its log, committed or not, and reverts when a truncation removes it.
    `transfer_leadership(target)` brings a voter up to date and sends it TimeoutNow.
    """

    def __init__(
        self,
        node: NodeId,
        voters: Sequence[NodeId] | Membership,
        config: RaftConfig,
        rng: random.Random,
        *,
        hard_state: HardState = HARD_STATE_EMPTY,
        snapshot: SnapshotMeta = SNAPSHOT_EMPTY,
        entries: Sequence[Entry] = (),
    ) -> None:
        initial = voters if isinstance(voters, Membership) else Membership.of(voters)
        if snapshot.membership is not None:
            initial = snapshot.membership
        self.id = node
        self._configs: list[tuple[int, Membership]] = [(snapshot.index, initial)]
        """Membership entries in the log above the snapshot, in index order, after the
        membership in force at the snapshot (the first item; its index is the snapshot's)."""
        for entry in entries:
            membership = Membership.decode(entry.payload)
            if membership is not None and entry.index > snapshot.index:
                self._configs.append((entry.index, membership))
        self.config = config
        self._rng = rng
        self.log = RaftLog(snapshot, entries, hard_state.commit)
        self._transfer_to: NodeId | None = None
        self._transfer_elapsed = 0
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.role = Role.FOLLOWER
        self.leader: NodeId | None = None
        self.leader_epoch = LeaderEpoch(0)
        self.barrier = 0
        """The index of the empty entry this replica appended when it last became leader: where
        its leadership begins (1: nothing was ever written before it)."""
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = config.election_timeout_ticks
        self._votes: dict[NodeId, bool] = {}
        self._progress: dict[NodeId, Progress] = {}
        self._outbox: list[Message] = []
        self._handed_hard_state = hard_state
        self._handed_leader: tuple[NodeId | None, LeaderEpoch] = (None, LeaderEpoch(0))
        self._snapshot_to_persist: SnapshotMeta | None = None
        self._snapshot_request: SnapshotRequest | None = None
        self._outstanding: Ready | None = None
        self._serial = 0
        self._commit_due = False
        """A tick found the commit point moved since the last Ready: the next Ready is due
        (`has_ready`), not left for the next entries."""
        self._entries_pending = False
        self._commit_pending = False
        self._commit_with_pending = False
        """A leader: some follower with readers may now commit further once it holds the
        entries (its own sync or another voter's ack): tell it (ADR 0050)."""
        self._commit_with_me = 0
        """A follower: the highest `Append.commit_with_you` of this term's leader, within what
        its Appends matched; committed as far as this replica's log is persisted (ADR 0050)."""
        self._read_round = 0
        """The latest leadership check (`confirm_leadership`); rises for this object's life."""
        self._read_pending = False
        """A check began since the last heartbeats: send them at the next flush."""
        self.appends_dropped = 0
        self.messages_dropped = 0
        self.acks_coalesced = 0
        """Accepted AppendResponses replaced by a later one to the same leader in the same
        Ready (`_send`)."""
        self.commits_completed = 0
        """Times this follower's commit index moved because its own persisted log completed a
        quorum the leader had counted (`Append.commit_with_you`, ADR 0050)."""
        self.readers = False
        """Set by the shell: this replica has readers waiting for what commits (consumers on
        this node). A follower says so in its acks, and only then does the leader send it
        commit updates of their own (ADR 0044); others learn the commit index from the next
        Append or heartbeat."""
        self.quiesced = False
        """Quiet (ADR 0026): not ticking, no heartbeats; `wake()` or a message ends it."""
        self.cache_cap: int | None = None
        """Set by the shell: at most this many applied entry bytes kept in memory, below the
        config's limits, while the node's caches together are over their budget (ADR 0049)."""
        self._quiet_rounds = 0
        self._woken_by_liveness = False
        """A follower woken only because node liveness suspects its leader's node, with nothing
        happened to the group since (`settle_again`)."""
        self.dead_peers: AbstractSet[NodeId] = frozenset()
        """Peers the shell's node liveness finds silent (the driver shares its set): a leader
        may go quiet without their answers, as long as a quorum is up to date (ADR 0026)."""
        self.late_peers: AbstractSet[NodeId] = frozenset()
        """Peers the shell's node liveness finds silent but, from the lateness they have shown,
        not dead yet (the driver shares its set; liveness.py). A follower whose leader's node
        is late holds its campaign and keeps its lease until that node is heard from (its
        heartbeats follow) or suspected (issue 16: a node whose loop stalls for a second lost
        its leaders to followers that counted the stall as a death)."""
        self.campaigns_held = 0
        """Ticks on which a follower's election timer had run out but its leader's node was
        late (`late_peers`)."""
        self._held = False
        self._release_ticks = 0
        self._become_follower(self.term, None)

    # -- reading

    @property
    def membership(self) -> Membership:
        """The membership in force here: the newest membership entry in this replica's log."""
        return self._configs[-1][1]

    @property
    def membership_index(self) -> int:
        """The log index of the membership entry in force (the snapshot's index for the one
        the replica started from)."""
        return self._configs[-1][0]

    def membership_at(self, index: int) -> Membership:
        """The membership as of log index `index` (the last membership entry at or before)."""
        found = self._configs[0][1]
        for at, membership in self._configs:
            if at <= index:
                found = membership
        return found

    @property
    def commit_with_pending(self) -> bool:
        """A leader has `commit_with_you` updates to send (ADR 0050): the shell sends them with
        `take_leader_messages` at once, as it does a commit advance."""
        return self._commit_with_pending

    def memberships_since(self, index: int) -> list[Membership]:
        """The membership as of log index `index` and every newer one in the log, oldest
        first: those a leader may have counted a quorum with for an entry at `index`."""
        since = [m for at, m in self._configs if at > index]
        return [self.membership_at(index), *since]

    @property
    def voters(self) -> tuple[NodeId, ...]:
        return self.membership.voters

    @property
    def peers(self) -> tuple[NodeId, ...]:
        """Every other member, voters and learners: whom a leader replicates to."""
        return tuple(m for m in self.membership.members if m != self.id)

    @property
    def is_voter(self) -> bool:
        return self.id in self.membership.voters

    @property
    def quorum(self) -> int:
        return self.membership.quorum

    def status(self) -> Status:
        return Status(
            self.id,
            self.role,
            self.term,
            self.leader,
            self.leader_epoch,
            self.log.committed,
            self.log.applied,
            self.log.stable,
            self.log.last_index,
            self.membership,
            self._transfer_to,
        )

    def progress(self, peer: NodeId) -> Progress:
        assert self.role is Role.LEADER
        return self._progress[peer]

    @property
    def leadership_confirmed(self) -> int:
        """The highest leadership check (`confirm_leadership`) a quorum of voters has answered
        in this term, this replica counting itself if it votes; 0 when not leading."""
        if self.role is not Role.LEADER:
            return 0
        voters = self.membership.voters
        rounds = sorted(
            [
                *([self._read_round] if self.is_voter else []),
                *(p.read_round for peer, p in self._progress.items() if peer in voters),
            ],
            reverse=True,
        )
        return rounds[self.quorum - 1] if len(rounds) >= self.quorum else 0

    def match_of(self, peer: NodeId) -> int | None:
        """On a leader: the highest index `peer` has persisted, as far as known (None: not a
        member or not leading). What an operator's move waits on before promoting a learner."""
        if self.role is not Role.LEADER:
            return None
        if peer == self.id:
            return self.log.stable
        progress = self._progress.get(peer)
        return None if progress is None else progress.match

    # -- inputs

    def tick(self) -> None:
        if self.log.committed != self._handed_hard_state.commit:
            self._commit_due = True  # a commit point left unwritten goes with the next Ready
        if self.quiesced:
            return
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        if not self.is_voter:
            # A learner or removed replica never campaigns, but its lease (heard a leader
            # within the election timeout) must still run out, or it would ignore a new
            # voter's campaign for ever.
            self._election_elapsed = min(self._election_elapsed + 1, 2 * self._timeout)
            return
        self._election_elapsed += 1
        if self._election_elapsed >= self._timeout:
            if self.leader is not None and self.leader in self.late_peers:
                self.campaigns_held += 1  # its node is late, not dead (yet): wait for it
                self._held = True
                return
            if self._held:
                # Released by node liveness (the leader's node is suspected now): campaign
                # after a random share of an election timeout, as the other followers released
                # on the same tick will, not all at once (split votes).
                self._held = False
                self._release_ticks = self._rng.randrange(self.config.election_timeout_ticks)
            if self._release_ticks:
                self._release_ticks -= 1
                return
            self._election_elapsed = 0
            self.campaign()

    def campaign(self, *, transfer: bool = False) -> None:
        """Start an election now (etcd's MsgHup); a leader ignores it, and so does a replica
        that is not a voter (a learner, or a removed replica). `transfer`: the leader asked
        (TimeoutNow), so no pre-vote and the voters waive their lease."""
        if self.role is Role.LEADER or not self.is_voter:
            return
        if self.config.pre_vote and not transfer:
            self._become_pre_candidate()
        else:
            self._become_candidate(transfer=transfer)

    @property
    def cache_bytes(self) -> int:
        """Applied entry bytes still in memory (the cache `compact_cache` bounds)."""
        return self.log.bytes_applied

    def compact_cache(self) -> None:
        """Drop the applied, persisted entries no peer will be sent (ADR 0049; TiKV's entry
        cache does the same). A leader keeps those some peer has not acknowledged, up to
        `log_cache_bytes` (a dead or slow peer is fed from memory, not by a segment transfer,
        while it is at most that far behind); a replica that does not lead keeps the last
        `follower_log_cache_bytes`, none while quiet (its peers had everything when the
        leader went quiet); `cache_cap`, when the shell set one, caps both. Called after each
        Ready and when the group goes quiet; the shell calls it when it lowers the cap."""
        log = self.log
        config = self.config
        if self.role is Role.LEADER:
            keep = config.log_cache_bytes
            floor = min((p.match for p in self._progress.values()), default=log.applied)
        else:
            keep = (
                0 if self.quiesced else min(config.follower_log_cache_bytes, config.log_cache_bytes)
            )
            floor = 0
        cap = self.cache_cap
        if cap is not None and cap < keep:
            keep = cap
        log.compact(keep, floor)

    def wake(self, *, leader_suspected: bool = False) -> None:
        """End quiet (ADR 0026): the shell suspects a peer node, or has work for the group.
        A leader heartbeats on its next tick and restarts its check-quorum window (a quorum
        must answer within an election timeout); a follower restarts its election timer,
        keeping its lease on the leader for one election timeout. `leader_suspected`: the
        shell's node liveness suspects this follower's leader, and nothing else woke it; if
        that node is heard from again before anything happens here, `settle_again` puts the
        follower back to sleep."""
        self._quiet_rounds = 0
        self._woken_by_liveness = False
        if not self.quiesced:
            return
        self.quiesced = False
        self._election_elapsed = 0
        if self.role is Role.LEADER:
            self._heartbeat_elapsed = self.config.heartbeat_interval_ticks - 1
            for progress in self._progress.values():
                progress.recent_active = False
        else:
            self._woken_by_liveness = leader_suspected and self.leader is not None

    def settle_again(self) -> bool:
        """Back to quiet after `wake(leader_suspected=True)`, when the suspected leader's node
        is heard from again and nothing happened to this follower meanwhile: no message
        stepped, no campaign, no proposal, no change of term or role (ADR 0026 addendum). The
        group is then as it was before the suspicion: its leader was quiet (a leader with work
        sends heartbeats and appends, which this follower would have stepped), the lease holds
        again, and a leader that did change (its node restarted, say) campaigns, and its
        pre-vote wakes this follower as it wakes any quiet one. Without this, every follower of
        a node that was late for an election timeout (an overloaded loop, not a dead node)
        campaigned, woke its leader and the third replica, and the heartbeats of those
        thousands of groups made the nodes late again (issue 16: 5,000 partitions per node
        never came to rest). False: nothing to do (the wake-up was not liveness's alone)."""
        if not self._woken_by_liveness:
            return False
        assert self.role is Role.FOLLOWER and not self.quiesced and self.leader is not None
        self._woken_by_liveness = False
        self.quiesced = True
        self._election_elapsed = 0
        self.compact_cache()
        return True

    def step_down(self) -> None:
        """On a leader: the shell's node liveness has heard nothing at all from a quorum of its
        voters for an election timeout, so none of them answered anything either: step down,
        as check-quorum would (ADR 0026 addendum: a quiet leader is not woken when its quorum
        is suspected, so a quorum that was only late and is heard from again in time costs
        no heartbeat at all; this keeps the time at which a cut-off leader steps down)."""
        assert self.role is Role.LEADER
        self._become_follower(self.term, None)

    def confirm_leadership(self) -> int:
        """On a leader: check that it still leads (Raft thesis §6.4, ReadIndex's heartbeat
        round). Returns a round r; Heartbeats carrying it go to every peer at the next flush,
        and `leadership_confirmed` reaches r once a quorum of voters has answered one sent
        after this call, still in this term. No leader of a later term had then been elected
        when this was called (its voters would have left this term first), so whatever was
        committed before this call is in this replica's log: a read of the log's state taken
        at any moment from this call until r is confirmed, answered once the entry it read is
        committed, is never older than a write acknowledged before the call. Without the round
        a leader cut off from a quorum, or left behind by a leadership transfer, answers from
        a log that misses what a newer leader committed (issue 16: the shell simulator's seed
        208 with acks folded)."""
        assert self.role is Role.LEADER
        self.wake()
        self._read_round += 1
        self._read_pending = True
        return self._read_round

    def lags(self, peer: NodeId) -> bool:
        """On a leader: `peer` has not acknowledged this log to its end (a leader goes quiet
        without the acknowledgements of peers node liveness suspects)."""
        if self.role is not Role.LEADER:
            return False
        progress = self._progress.get(peer)
        return progress is not None and progress.match < self.log.last_index

    def propose(self, payload: bytes | memoryview) -> Proposed | Refusal:
        self.wake()
        if self.role is not Role.LEADER:
            return Refusal(RefusalReason.NOT_LEADER, self.leader)
        if not payload:
            return Refusal(RefusalReason.EMPTY, self.id)
        if Membership.decode(payload) is not None:
            return Refusal(RefusalReason.MEMBERSHIP_INVALID, self.id)  # propose_membership
        return self._append_proposal(payload)

    def _append_proposal(self, payload: bytes | memoryview) -> Proposed | Refusal:
        if self._transfer_to is not None:
            return Refusal(RefusalReason.TRANSFERRING, self.id)
        if len(payload) > limits.entry_bytes_max:
            return Refusal(RefusalReason.TOO_LARGE, self.id)
        if self.log.bytes_unapplied + len(payload) > limits.log_unapplied_bytes_max:
            return Refusal(RefusalReason.BACKPRESSURE, self.id)
        entry = Entry(self.log.last_index + 1, self.term, payload)
        self.log.append([entry])
        self._note_entry(entry)
        self._entries_pending = True
        return Proposed(entry.index, entry.term)

    def membership_change_refusal(self, new: Membership) -> Refusal | None:
        """Why `propose_membership(new)` would be refused now, or None."""
        if self.role is not Role.LEADER:
            return Refusal(RefusalReason.NOT_LEADER, self.leader)
        if self.membership_index > self.log.committed or self.log.committed < self.barrier:
            # One change at a time, and none before this leader's barrier commits: a leader
            # that has not committed in its term may not know the latest membership (the bug
            # in single-server changes found by Ongaro, raft-dev 2015).
            return Refusal(RefusalReason.MEMBERSHIP_PENDING, self.id)
        if self.id not in new.voters or self.membership.voter_changes(new) > 1:
            return Refusal(RefusalReason.MEMBERSHIP_INVALID, self.id)
        return None

    def propose_membership(self, new: Membership) -> Proposed | Refusal:
        """Append a membership entry (leader only). Refused while the previous one is not
        committed, before this leader's barrier commits, or when `new` changes more than one
        voter or leaves this leader out (transfer leadership first). It takes effect here at
        once: new members get a Progress and the next Appends; removed ones are dropped."""
        self.wake()
        refusal = self.membership_change_refusal(new)
        if refusal is not None:
            return refusal
        return self._append_proposal(new.encode())

    def transfer_leadership(self, target: NodeId) -> Refusal | None:
        """Hand leadership to voter `target`: stop taking proposals, bring it up to date,
        send it TimeoutNow; abandoned after one election timeout. None: started (or `target`
        already leads); a Refusal says why not."""
        self.wake()
        if self.role is not Role.LEADER:
            return Refusal(RefusalReason.NOT_LEADER, self.leader)
        if target == self.id:
            return None
        if target not in self.membership.voters:
            return Refusal(RefusalReason.MEMBERSHIP_INVALID, self.id)
        self._transfer_to = target
        self._transfer_elapsed = 0
        self._maybe_send_timeout_now()
        return None

    def _maybe_send_timeout_now(self) -> None:
        target = self._transfer_to
        assert target is not None and self.role is Role.LEADER
        progress = self._progress[target]
        if progress.match == self.log.last_index:
            self._send(TimeoutNow(self.term, self.id, target))
        else:
            self._send_appends(target, send_if_empty=True)

    def _note_entry(self, entry: Entry) -> None:
        """Track a membership entry appended to the log (it takes effect at once)."""
        membership = Membership.decode(entry.payload)
        if membership is None:
            return
        assert entry.index > self._configs[-1][0], (entry.index, self._configs)
        self._configs.append((entry.index, membership))
        self._membership_changed()

    def _membership_changed(self) -> None:
        """Progress for new members, none for removed ones; a transfer to a voter that is no
        longer one is abandoned."""
        if self._transfer_to is not None and self._transfer_to not in self.membership.voters:
            self._transfer_to = None
        if self.role is not Role.LEADER:
            return
        members = set(self.peers)
        for peer in list(self._progress):
            if peer not in members:
                del self._progress[peer]
        for peer in self.peers:
            if peer not in self._progress:
                progress = Progress(self.log.last_index + 1, self.config.inflight_appends_max)
                progress.recent_active = True
                self._progress[peer] = progress

    def step(self, message: Message) -> None:
        """Any sender is accepted: a replica may hear from a leader (or a new voter) before
        the membership entry naming it reaches its own log. Responses from non-members are
        ignored by the leader; votes from non-voters are not counted."""
        assert message.target == self.id, message
        assert message.source != self.id, message
        self._woken_by_liveness = False  # something happens: the group stays awake
        if self.quiesced and not (
            isinstance(message, HeartbeatResponse)
            or (isinstance(message, Heartbeat) and message.quiesce)
        ):
            self.wake()  # something happens: a restarted follower's pre-vote, new entries
        if message.term > self.term:
            if not self._step_higher_term(message):
                return
        elif message.term < self.term:
            self._step_lower_term(message)
            return
        match message:
            case VoteRequest():
                self._handle_vote_request(message)
            case VoteResponse():
                if self.role in (Role.PRE_CANDIDATE, Role.CANDIDATE):
                    self._handle_vote_response(message)
            case Append() | Heartbeat() | SnapshotNeeded():
                assert self.role is not Role.LEADER, f"two leaders in term {self.term}: {message}"
                if self.role is not Role.FOLLOWER:
                    self._become_follower(self.term, message.source)
                self._election_elapsed = 0
                self._held = False
                self._release_ticks = 0
                self._set_leader(message.source)
                self._handle_from_leader(message)
            case AppendResponse():
                if self.role is Role.LEADER and message.source in self._progress:
                    self._handle_append_response(message)
            case HeartbeatResponse():
                if self.role is Role.LEADER and message.source in self._progress:
                    self._handle_heartbeat_response(message)
            case TimeoutNow():
                if self.role is Role.FOLLOWER and message.source == self.leader:
                    self.campaign(transfer=True)

    def restore(
        self, snapshot_index: int, snapshot_term: Term, membership: Membership | None = None
    ) -> bool:
        """The shell has fetched (and synced) the partition's data up to `snapshot_index`:
        make it the log's new start, with `membership` (the SnapshotNeeded's) in force there.
        Returns False when the log already covers it."""
        assert self.role is not Role.LEADER
        self._woken_by_liveness = False
        if snapshot_index <= self.log.committed:
            if self.leader is not None:
                self._send(
                    AppendResponse(
                        self.term, self.id, self.leader, self.log.committed, readers=self.readers
                    )
                )
            return False
        if self.log.match_term(snapshot_index, snapshot_term):
            self.log.commit_to(snapshot_index)
        else:
            meta = SnapshotMeta(snapshot_index, snapshot_term)
            self.log.restore(meta)
            self._snapshot_to_persist = meta
            base = membership if membership is not None else self.membership_at(snapshot_index)
            self._configs = [(snapshot_index, base)]
            self._membership_changed()
        if self.leader is not None:
            self._send(
                AppendResponse(
                    self.term, self.id, self.leader, snapshot_index, readers=self.readers
                )
            )
        return True

    def snapshot_failed(self, peer: NodeId) -> None:
        """The shell could not transfer a snapshot to `peer`; probe it again."""
        if self.role is Role.LEADER and self._progress[peer].state is ProgressState.SNAPSHOT:
            self._progress[peer].become_probe()

    # -- Ready / advance

    def has_ready(self) -> bool:
        """Whether `ready()` has anything to persist, send or apply. A commit point that moved
        alone is no work while it may wait (`_lone_commit_waits`; the shell applies commits
        on the spot with `take_committed`, ADR 0043)."""
        if self._outstanding is not None:
            return False
        self._flush_appends()
        log = self.log
        handed = self._handed_hard_state
        return bool(
            self._outbox
            or log.persist_from <= log.last_index
            or self.term != handed.term
            or self.vote != handed.vote
            or log.applied < log.committed
            or (log.committed != handed.commit and not self._lone_commit_waits(handed))
            or self._handed_leader != (self.leader, self.leader_epoch)
            or self._snapshot_to_persist is not None
            or self._snapshot_request is not None
        )

    def _lone_commit_waits(self, handed: HardState) -> bool:
        """A commit point that moved alone (term and vote as handed) is left out of Readies
        (ADR 0043: not written before the entries' fsync, on the way of their ack) until a
        tick marks it due, the group goes quiet (no tick comes), it trails the one written by
        COMMIT_LAG_ENTRIES_MAX entries, or a membership entry (or the snapshot point,
        conservatively) lies in (written, committed]: the hard state's membership moves and
        is synced at once (storage.RaftStore.persist). It is written without a sync anyway;
        a restart that finds an older one learns it again from the leader."""
        committed = self.log.committed
        return (
            self.term == handed.term
            and self.vote == handed.vote
            and not self._commit_due
            and not self.quiesced
            and committed - handed.commit < COMMIT_LAG_ENTRIES_MAX
            and not any(handed.commit < index <= committed for index, _ in self._configs)
        )

    def ready(self) -> Ready:
        assert self._outstanding is None, "advance the previous Ready first"
        self._flush_appends()
        entries = self.log.unstable()
        if entries:
            self.log.handed_to_disk(entries[-1].index)
        hard_state = self._hard_state()
        handed = self._handed_hard_state
        changed_hard_state = hard_state if hard_state != handed else None
        hard_state_sync = changed_hard_state is not None and (
            hard_state.term != handed.term or hard_state.vote != handed.vote
        )
        if changed_hard_state is not None and self._lone_commit_waits(handed):
            changed_hard_state = None  # a commit point that moved alone waits (ADR 0043)
        must_sync = bool(entries) or self._snapshot_to_persist is not None or hard_state_sync
        if changed_hard_state is not None:
            self._handed_hard_state = hard_state
            self._commit_due = False
        leader_change = None
        if self._handed_leader != (self.leader, self.leader_epoch):
            self._handed_leader = (self.leader, self.leader_epoch)
            leader_change = LeaderChange(self.leader, self.leader_epoch)
        assert len(self._outbox) <= limits.messages_per_ready_max, len(self._outbox)
        self._serial += 1
        ready = Ready(
            hard_state=changed_hard_state,
            entries=entries,
            snapshot=self._snapshot_to_persist,
            messages=tuple(self._outbox),
            committed=self.log.next_committed(limits.apply_bytes_max),
            leader_change=leader_change,
            snapshot_request=self._snapshot_request,
            must_sync=must_sync,
            hard_state_sync=hard_state_sync,
            serial=self._serial,
        )
        self._outbox = []
        self._snapshot_to_persist = None
        self._snapshot_request = None
        self._outstanding = ready
        return ready

    def commit_state(self) -> HardState | None:
        """The hard state with the commit point reached, when only the commit point moved since
        the last Ready (term and vote as handed): what a closing replica writes so that a
        clean restart starts where it stopped (ADR 0043). None otherwise, and while a Ready is
        outstanding."""
        handed = self._handed_hard_state
        if (
            self._outstanding is not None
            or self.log.committed <= handed.commit
            or (self.term, self.vote) != (handed.term, handed.vote)
        ):
            return None
        return self._hard_state()

    def take_committed(self) -> tuple[Entry, ...]:
        """Entries committed and not yet applied, for the shell to apply at once instead of in
        the next Ready: while a Ready's sync runs (a leader learns a commit from a follower's
        ack while its own fsync is in flight; without this the producer's confirm would wait
        for that fsync), and between Readies (a commit advance from an ack, or a follower's
        commit update, needs no batch of its own: ADR 0043). While a Ready is outstanding,
        only after the shell applied that Ready's own `committed` (the contract's step 2).
        Bounded like `Ready.committed` and by what was handed to disk. They count as applied
        from now on; `advance` keeps it."""
        ready = self._outstanding
        if ready is not None and ready.committed and ready.committed[-1].index > self.log.applied:
            self.log.applied_to(ready.committed[-1].index)
        entries = self.log.next_committed(limits.apply_bytes_max)
        if entries:
            self.log.applied_to(entries[-1].index)
            self.compact_cache()
        return entries

    def take_leader_messages(self) -> tuple[Message, ...]:
        """A leader's Appends, Heartbeats, SnapshotNeeded and TimeoutNow produced since the
        last Ready (new proposals, a commit advance learned from an ack), for the shell to send
        at once instead of in the next Ready, which waits for the outstanding one's sync (issue
        16: a follower learned every commit, and got the entries proposed meanwhile, one leader
        fsync late). They promise nothing about this node's disk (the leader counts its own
        *persisted* index), so they may leave before its write, as
        `Ready.messages_before_sync` lets them; never while a Ready changing the term or the
        vote is outstanding (or the term or vote is not yet handed to disk), nor from any other
        role. The other messages stay for the next Ready."""
        ready = self._outstanding
        handed = self._handed_hard_state
        if (
            (ready is not None and ready.hard_state_sync)
            or self.role is not Role.LEADER
            or (self.term, self.vote) != (handed.term, handed.vote)
        ):
            return ()
        self._flush_appends()
        outbox = self._outbox
        early = tuple(m for m in outbox if isinstance(m, LEADER_OUTPUT))
        if early:
            self._outbox = [m for m in outbox if not isinstance(m, LEADER_OUTPUT)]
        return early

    def advance(self, ready: Ready) -> None:
        assert ready is self._outstanding, "advance must get the last Ready back"
        self._outstanding = None
        if ready.entries:
            self.log.stable_to(ready.entries[-1].index)
            self._commit_what_we_hold()
        if ready.committed and ready.committed[-1].index > self.log.applied:
            self.log.applied_to(ready.committed[-1].index)  # unless a restore jumped past it
        self.compact_cache()
        floor = self.log.snapshot.index
        while len(self._configs) > 1 and self._configs[1][0] <= floor:
            del self._configs[0]
        if self.role is Role.LEADER:
            if self._maybe_commit():
                self._commit_pending = True
            elif ready.entries:
                self._note_commit_with()
        assert self.log.bytes_unapplied <= limits.log_unapplied_bytes_max + limits.entry_bytes_max

    # -- roles

    def _reset(self, term: Term) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
        self.leader = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._rng.randrange(
            self.config.election_timeout_ticks, 2 * self.config.election_timeout_ticks
        )
        self._votes = {}
        self._held = False
        self._release_ticks = 0
        self._progress = {}
        self._entries_pending = self._commit_pending = self._commit_with_pending = False
        self._commit_with_me = 0
        self._read_pending = False
        self._transfer_to = None
        self.quiesced = False
        self._quiet_rounds = 0
        self._woken_by_liveness = False

    def _become_follower(self, term: Term, leader: NodeId | None) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        if leader is not None:
            self._set_leader(leader)

    def _become_pre_candidate(self) -> None:
        # Like etcd: neither the term nor the vote changes, so a node cut off from the cluster
        # can campaign forever without raising the term the others will see on its return.
        self._votes = {}
        self.leader = None
        self.role = Role.PRE_CANDIDATE
        self._woken_by_liveness = False
        self._election_elapsed = 0
        self._timeout = self._rng.randrange(
            self.config.election_timeout_ticks, 2 * self.config.election_timeout_ticks
        )
        self._request_votes(Term(self.term + 1), pre_vote=True)

    def _become_candidate(self, *, transfer: bool = False) -> None:
        self._reset(Term(self.term + 1))
        self.vote = self.id
        self.role = Role.CANDIDATE
        self._request_votes(self.term, pre_vote=False, transfer=transfer)

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE
        self._reset(self.term)
        self.role = Role.LEADER
        self._set_leader(self.id)
        for peer in self.peers:
            progress = Progress(self.log.last_index + 1, self.config.inflight_appends_max)
            progress.recent_active = True
            self._progress[peer] = progress
        # The barrier: commits earlier terms' entries and marks where this leader epoch begins.
        self.barrier = self.log.last_index + 1
        self.log.append([Entry(self.barrier, self.term, b"")])
        self._entries_pending = True

    def _set_leader(self, leader: NodeId) -> None:
        self.leader = leader
        assert self.term >= self.leader_epoch
        self.leader_epoch = LeaderEpoch(self.term)

    def _hard_state(self) -> HardState:
        committed = self.log.committed
        return HardState(self.term, self.vote, committed, self.membership_at(committed))

    # -- elections

    def _request_votes(self, term: Term, *, pre_vote: bool, transfer: bool = False) -> None:
        self._votes[self.id] = True
        if self._poll() is not None:
            return
        for peer in self.voters:
            if peer != self.id:
                self._send(
                    VoteRequest(
                        term,
                        self.id,
                        peer,
                        self.log.last_index,
                        self.log.last_term,
                        pre_vote,
                        transfer,
                    )
                )

    def _poll(self) -> bool | None:
        """Count the voters' votes; act on a decided election. Returns the outcome or None if
        undecided."""
        voters = self.membership.voters
        granted = sum(1 for node, v in self._votes.items() if v and node in voters)
        rejected = sum(1 for node, v in self._votes.items() if not v and node in voters)
        if granted >= self.quorum:
            if self.role is Role.PRE_CANDIDATE:
                self._become_candidate()
            else:
                self._become_leader()
            return True
        if rejected >= self.quorum:
            self._become_follower(self.term, None)
            return False
        return None

    def _handle_vote_request(self, message: VoteRequest) -> None:
        can_vote = (
            self.vote == message.source
            or (self.vote is None and self.leader is None)
            or (message.pre_vote and message.term > self.term)
        )
        if can_vote and self.log.is_up_to_date(message.last_index, message.last_term):
            # The response carries the request's term so a pre-candidate can count it.
            self._send(VoteResponse(message.term, self.id, message.source, True, message.pre_vote))
            if not message.pre_vote:
                self._election_elapsed = 0
                self.vote = message.source
        else:
            self._send(VoteResponse(self.term, self.id, message.source, False, message.pre_vote))

    def _handle_vote_response(self, message: VoteResponse) -> None:
        if message.pre_vote != (self.role is Role.PRE_CANDIDATE):
            return  # a response to a campaign we are no longer running
        self._votes.setdefault(message.source, message.granted)
        self._poll()

    def _step_higher_term(self, message: Message) -> bool:
        """A message from a later term. Returns whether to go on stepping it."""
        if isinstance(message, VoteRequest):
            in_lease = (
                self.config.check_quorum
                and not message.transfer
                and self.leader is not None
                and (
                    self._election_elapsed < self.config.election_timeout_ticks
                    or self.leader in self.late_peers
                )
            )
            if in_lease:
                # We heard from a live leader within the election timeout (or its node is late,
                # not dead: liveness.py): a node that wants to be elected now is partitioned
                # or slow, or counted a late node as dead, and must not disrupt the group.
                return False
            if message.pre_vote:
                return True  # answering a pre-vote never changes our term
            self._become_follower(message.term, None)
            return True
        if isinstance(message, VoteResponse) and message.pre_vote and message.granted:
            return True  # our own pre-campaign at term+1 being granted
        leader = (
            message.source if isinstance(message, Append | Heartbeat | SnapshotNeeded) else None
        )
        self._become_follower(message.term, leader)
        return True

    def _step_lower_term(self, message: Message) -> None:
        if isinstance(message, Append | Heartbeat) and (
            self.config.check_quorum or self.config.pre_vote
        ):
            # A stale leader (e.g. back from a partition): tell it the current term so it steps
            # down; without this it would never learn it, pre-vote keeping our term from it.
            self._send(AppendResponse(self.term, self.id, message.source, 0, rejected=False))
        elif isinstance(message, VoteRequest) and message.pre_vote:
            self._send(VoteResponse(self.term, self.id, message.source, False, True))

    # -- follower

    def _handle_from_leader(self, message: Append | Heartbeat | SnapshotNeeded) -> None:
        match message:
            case Append():
                self._handle_append(message)
            case Heartbeat():
                if message.commit > self.log.last_index:
                    # The leader saw us persist entries we no longer have: our data directory
                    # was wiped. Committing would assert; ask to be probed from scratch.
                    self._send(
                        AppendResponse(
                            self.term,
                            self.id,
                            message.source,
                            0,
                            rejected=True,
                            hint_index=self.log.last_index,
                            hint_term=self.log.last_term,
                            lost=True,
                        )
                    )
                    return
                self.log.commit_to(message.commit)
                self._send(HeartbeatResponse(self.term, self.id, message.source, message.round))
                if message.quiesce:  # quiet until woken (ADR 0026); the lease holds meanwhile
                    self.quiesced = True
                    self._election_elapsed = 0
                    self.compact_cache()
            case SnapshotNeeded():
                if message.snapshot.index > self.log.committed:
                    self._snapshot_request = SnapshotRequest(message.source, message.snapshot)
                else:
                    # Already restored (our ack was lost) or caught up since: say how far we
                    # are, or the leader would wait for a snapshot that never comes.
                    self._send(
                        AppendResponse(
                            self.term,
                            self.id,
                            message.source,
                            self.log.committed,
                            readers=self.readers,
                        )
                    )

    def _handle_append(self, message: Append) -> None:
        if message.prev_index < self.log.committed:
            self._send(
                AppendResponse(
                    self.term, self.id, message.source, self.log.committed, readers=self.readers
                )
            )
            return
        incoming = sum(len(e.payload) for e in message.entries)
        if self.log.bytes_unapplied + incoming > limits.log_unapplied_bytes_max:
            self.appends_dropped += 1  # bounded memory: the leader resends after a heartbeat
            return
        last_new = self.log.maybe_append(message.prev_index, message.prev_term, message.entries)
        if last_new is not None:
            self._track_appended(message.prev_index, message.entries, last_new)
            self.log.commit_to(min(message.commit, last_new))
            if message.commit_with_you > self._commit_with_me:
                # Within what this Append matched: those entries are the leader's (ADR 0050).
                self._commit_with_me = max(
                    self._commit_with_me, min(message.commit_with_you, last_new)
                )
                self._commit_what_we_hold()
            if not (message.quiet and not message.entries):
                self._send(
                    AppendResponse(
                        self.term, self.id, message.source, last_new, readers=self.readers
                    )
                )
            return
        hint_index, hint_term = self.log.find_conflict_by_term(
            min(message.prev_index, self.log.last_index), message.prev_term
        )
        self._send(
            AppendResponse(
                self.term,
                self.id,
                message.source,
                message.prev_index,
                rejected=True,
                hint_index=hint_index,
                hint_term=hint_term,
            )
        )

    def _commit_what_we_hold(self) -> None:
        """A follower: commit what this term's leader said commits once we hold it
        (`Append.commit_with_you`), as far as our log is on disk (ADR 0050)."""
        if (
            self._commit_with_me > self.log.committed
            and self.role is Role.FOLLOWER
            and self.log.commit_to(min(self._commit_with_me, self._persisted_end()))
        ):
            self.commits_completed += 1

    def _persisted_end(self) -> int:
        """The end of this replica's log on disk (a seam for the simulator's planted bug)."""
        return self.log.stable

    def _track_appended(self, prev_index: int, entries: Sequence[Entry], last_new: int) -> None:
        """After an accepted Append: the log now holds `entries` at (prev_index, last_new],
        and nothing past last_new if it truncated. Bring the membership entries in line."""
        if not any(c[0] > prev_index for c in self._configs[1:]) and not any(
            is_membership(e.payload) for e in entries
        ):
            return
        beyond = self.log.last_index if self.log.last_index > last_new else last_new
        kept = [
            c
            for i, c in enumerate(self._configs)
            if i == 0 or c[0] <= prev_index or last_new < c[0] <= beyond
        ]
        for entry in entries:
            membership = Membership.decode(entry.payload)
            if membership is not None and entry.index > kept[0][0]:
                kept.append((entry.index, membership))
        kept.sort(key=lambda c: c[0])
        if kept != self._configs:
            self._configs = kept
            self._membership_changed()

    # -- leader

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._transfer_to is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= self.config.election_timeout_ticks:
                self._transfer_to = None  # the target did not take over: lead on
        if self._election_elapsed >= self.config.election_timeout_ticks:
            self._election_elapsed = 0
            if self.config.check_quorum:
                voters = self.membership.voters
                active = int(self.is_voter) + sum(
                    1 for peer, p in self._progress.items() if p.recent_active and peer in voters
                )
                if active < self.quorum:
                    self._become_follower(self.term, None)
                    return
                for progress in self._progress.values():
                    progress.recent_active = False
        if self._heartbeat_elapsed >= self.config.heartbeat_interval_ticks:
            self._heartbeat_elapsed = 0
            quiesce = self._may_quiesce()
            self._send_heartbeats(quiesce=quiesce)
            self.quiesced = quiesce
            if quiesce:
                self.compact_cache()

    def _send_heartbeats(self, *, quiesce: bool) -> None:
        """To every peer, with the latest leadership check's round (`confirm_leadership`)."""
        self._read_pending = False
        for peer in self.peers:
            commit = min(self._progress[peer].match, self.log.committed)
            self._send(Heartbeat(self.term, self.id, peer, commit, quiesce, self._read_round))

    def _may_quiesce(self) -> bool:
        """Two heartbeat rounds in a row with nothing to do (ADR 0026): the log committed,
        persisted and applied to its end, no transfer, every peer's log acknowledged to the end
        (a peer that misses the quiesce heartbeat campaigns, and its pre-vote wakes us; answers
        are not awaited per round, which an overloaded node could never give)."""
        if not self.config.quiesce:
            return False
        log = self.log
        last = log.last_index
        dead = self.dead_peers
        idle = (
            self._transfer_to is None
            and self.leadership_confirmed >= self._read_round
            and not self._entries_pending
            and not self._commit_pending
            and log.committed == last
            and log.stable == last
            and log.applied == last
            and all(
                peer in dead or progress.match == last for peer, progress in self._progress.items()
            )
        )
        if idle and dead:  # without the suspected peers, a quorum must be up to date
            voters = self.membership.voters
            live = sum(1 for v in voters if v == self.id or v not in dead)
            idle = live >= self.quorum
        self._quiet_rounds = self._quiet_rounds + 1 if idle else 0
        return self._quiet_rounds >= 2

    def _handle_append_response(self, message: AppendResponse) -> None:
        progress = self._progress[message.source]
        progress.recent_active = True
        if not message.rejected:
            progress.readers = message.readers
        if message.lost:
            if progress.match > message.hint_index:
                progress.forget()
                self._send_appends(message.source, send_if_empty=True)
            return
        if message.rejected:
            probe = message.hint_index
            if message.hint_term > 0:
                probe, _ = self.log.find_conflict_by_term(message.hint_index, message.hint_term)
            if progress.maybe_decrease(message.index, probe):
                if progress.state is ProgressState.REPLICATE:
                    progress.become_probe()
                self._send_appends(message.source, send_if_empty=True)
            return
        assert message.index <= self.log.last_index, (message, self.log.last_index)
        was_paused = progress.paused()
        if not progress.maybe_update(message.index):
            return
        if progress.state is ProgressState.PROBE:
            progress.become_replicate()
        elif progress.state is ProgressState.SNAPSHOT:
            if progress.match >= progress.pending_snapshot:
                progress.become_probe()
                progress.become_replicate()
        else:
            progress.inflights.free_to(message.index)
        if self._maybe_commit():
            self._commit_pending = True
        else:
            self._note_commit_with()
        self._send_appends(message.source, send_if_empty=was_paused)
        if self._transfer_to == message.source:
            self._maybe_send_timeout_now()

    def _handle_heartbeat_response(self, message: HeartbeatResponse) -> None:
        progress = self._progress[message.source]
        progress.recent_active = True
        progress.read_round = max(progress.read_round, message.round)
        progress.probe_sent = False
        if progress.state is ProgressState.SNAPSHOT:
            # The SnapshotNeeded may have been lost; the follower's shell ignores duplicates.
            self._send(SnapshotNeeded(self.term, self.id, message.source, self._snapshot_meta()))
            return
        if progress.state is ProgressState.REPLICATE and progress.inflights.full():
            progress.inflights.free_first()  # lost appends must not stall the pipeline
        if progress.match < self.log.last_index:
            self._send_appends(message.source, send_if_empty=True)

    def _maybe_commit(self) -> bool:
        """Commit the highest index a quorum has *persisted* (the leader's own stable index,
        never its appended one), if it is from this term (Raft §5.4.2)."""
        voters = self.membership.voters
        matches = sorted(
            [
                *([self.log.stable] if self.is_voter else []),
                *(p.match for peer, p in self._progress.items() if peer in voters),
            ],
            reverse=True,
        )
        if len(matches) < self.quorum:
            return False
        candidate = matches[self.quorum - 1]
        if candidate > self.log.committed and self.log.term(candidate) == self.term:
            return self.log.commit_to(candidate)
        return False

    def _commit_with(self, peer: NodeId) -> int:
        """The highest index that a quorum of voters holds on disk when `peer` is counted as
        holding it, if it is of this term and not yet committed; else 0 (ADR 0050). The rule of
        `_maybe_commit` with the peer's vote given: once the peer has persisted its log that
        far (its log matches ours there), the entry is on a quorum's disks, which is what makes
        it committed (Raft §5.4.2), whether or not this leader has heard the peer's ack."""
        if not COMMIT_WITH_YOU:
            return 0
        voters = self.membership.voters
        need = self.quorum - 1
        if need < 1 or peer not in voters:
            return 0
        held = sorted(
            [
                *([self.log.stable] if self.is_voter else []),
                *(p.match for q, p in self._progress.items() if q in voters and q != peer),
            ],
            reverse=True,
        )
        if len(held) < need:
            return 0
        candidate = held[need - 1]
        if candidate > self.log.committed and self.log.term(candidate) == self.term:
            return candidate
        return 0

    def _knows_commit(self, progress: Progress) -> bool:
        """The follower has committed up to our commit index by itself: it acknowledged
        holding the entries and was told they commit once it does (ADR 0050). Only a lost
        `commit_with_you` would make this wrong, and then it learns the commit index from the
        next Append or heartbeat, as a follower without readers does (ADR 0044)."""
        committed = self.log.committed
        return progress.match >= committed and progress.commit_with_sent >= committed

    def _note_commit_with(self) -> None:
        """The leader's own persisted index or a voter's ack moved without a commit: a
        follower with readers that could commit further once it holds the entries gets told
        at the next flush (an empty, unanswered Append), so that its readers need not wait
        for its ack's round trip to this leader and the commit update back (ADR 0050)."""
        for peer, progress in self._progress.items():
            if (
                progress.readers
                and progress.state is ProgressState.REPLICATE
                and self._commit_with(peer) > progress.commit_with_sent
            ):
                self._commit_with_pending = True
                return

    def _flush_appends(self) -> None:
        if self.role is not Role.LEADER:
            return
        if self._read_pending:
            self._send_heartbeats(quiesce=False)
        if self._entries_pending or self._commit_pending or self._commit_with_pending:
            commit = self._commit_pending
            commit_with = self._commit_with_pending
            quiet = (commit or commit_with) and QUIET_COMMITS
            progress = self._progress
            for peer in self.peers:
                # A commit update of its own only to a follower with readers, or one not
                # replicating (a probe's empty Append): ADR 0044.
                p = progress[peer]
                update = commit and (
                    COMMIT_UPDATES_TO_ALL
                    or p.state is not ProgressState.REPLICATE
                    or (p.readers and not self._knows_commit(p))
                )
                if commit_with and not update and p.readers:
                    update = self._commit_with(peer) > p.commit_with_sent  # ADR 0050
                self._send_appends(peer, send_if_empty=update, quiet=quiet)
        self._entries_pending = self._commit_pending = self._commit_with_pending = False

    def _send_appends(self, peer: NodeId, *, send_if_empty: bool, quiet: bool = False) -> None:
        """Fill the follower's pipeline: batches of entries up to the byte limit per message
        and up to the in-flight limit of messages. `quiet`: an empty Append sent to a follower
        in REPLICATE state is a commit update it does not answer (ADR 0042)."""
        sent = self._maybe_send_append(peer, send_if_empty=send_if_empty, quiet=quiet)
        while sent and self._progress[peer].state is ProgressState.REPLICATE:
            sent = self._maybe_send_append(peer, send_if_empty=False)

    def _maybe_send_append(self, peer: NodeId, *, send_if_empty: bool, quiet: bool = False) -> bool:
        progress = self._progress[peer]
        if progress.paused():
            return False
        prev_index = progress.next - 1
        prev_term = self.log.term(prev_index)
        entries = self.log.entries_from(
            progress.next, self.config.append_bytes_max, limits.append_entries_max
        )
        if prev_term is None or entries is None:
            snapshot = self._snapshot_meta()
            progress.become_snapshot(snapshot.index)
            self._send(SnapshotNeeded(self.term, self.id, peer, snapshot))
            return True
        if not entries and not send_if_empty:
            return False
        quiet = quiet and not entries and progress.state is ProgressState.REPLICATE
        commit_with = self._commit_with(peer)
        progress.commit_with_sent = max(progress.commit_with_sent, commit_with)
        self._send(
            Append(
                self.term,
                self.id,
                peer,
                prev_index,
                prev_term,
                entries,
                self.log.committed,
                quiet,
                commit_with,
            )
        )
        progress.sent(entries[-1].index if entries else prev_index, len(entries))
        return True

    def _snapshot_meta(self) -> SnapshotMeta:
        """The log's snapshot marker with the membership in force there."""
        snapshot = self.log.snapshot
        return replace(snapshot, membership=self.membership_at(snapshot.index))

    def _send(self, message: Message) -> None:
        outbox = self._outbox
        if FOLD_ACKS and type(message) is AppendResponse and not message.rejected and outbox:
            last = outbox[-1]
            if (
                type(last) is AppendResponse
                and not last.rejected
                and last.target == message.target
                and last.term == message.term
                and last.index <= message.index
            ):
                # Acks are cumulative: this one says all the one before it says (the log
                # matches the leader's up to a later index), and both leave together after the
                # same sync (the outbox is one Ready's). A follower that took several Appends
                # while its fsync ran sends one ack for them, and the leader steps one (issue
                # 16: the leader's per-ack work was paid per Append).
                outbox[-1] = message
                self.acks_coalesced += 1
                return
        if len(outbox) >= limits.messages_per_ready_max:
            # Bounded memory while the shell is slow to take a Ready: drop, as a lossy network
            # would; every message is retried or superseded by a later one.
            self.messages_dropped += 1
            return
        self._outbox.append(message)
