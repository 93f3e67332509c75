"""A whole Spate replication cluster in one process: simulated time, network, disks, client.

One seed drives everything: `SimOptions.draw(seed)` picks the cluster shape and fault mix
(swarm testing), and every random choice afterwards comes from `random.Random`s derived from the
seed, events are ordered by (time, sequence number), and nothing iterates over unordered sets,
so a seed always produces the same event trace (its blake2b digest is `SimResult.trace_digest`).

Phases: safety (faults on, `steps` events, invariants checked after every event), then
liveness (faults off, crashed nodes restarted, partitions healed; every group must elect a
leader and acknowledge a new proposal within `liveness_ms_max` of simulated time).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from spate.core.ids import NodeId, Term
from spate.node.replication.messages import (
    AppendResponse,
    Entry,
    Membership,
    Message,
    Proposed,
    Ready,
    Refusal,
    SnapshotRequest,
    describe,
)
from spate.node.replication.raft import Raft, RaftConfig, Role
from spate.sim.checker import Checker
from spate.sim.loop import SimLoop
from spate.sim.raft_store import SimRaftStore

tick_ms = 10
"""Simulated milliseconds per Raft tick."""
READERS_CHANCE = 0.5
"""A replica (re)started with readers waiting on it (`Raft.readers`, ADR 0044)."""
READERS_TOGGLE_CHANCE = 0.02
"""Per replica and tick: its readers come or go."""
liveness_ms_max = 15_000
"""Simulated time the healed cluster gets to elect leaders and acknowledge a proposal."""
events_max = 400_000
"""Events one run may process in all (a livelocked run fails instead of spinning)."""


@dataclass(frozen=True, slots=True)
class Bugs:
    """Deliberate shell bugs, to prove the checker can fail."""

    ack_before_persist: bool = False
    """Send all of a Ready's messages (acks and votes too) before its sync, instead of only
    `Ready.messages_before_sync()`."""
    early_append_response: bool = False
    """Obey the send rule except for AppendResponse, which leaves at write time too."""
    forget_vote: bool = False
    """Never persist the hard state (term and vote survive no crash)."""
    learners_count: bool = False
    """In the core (a Raft subclass): the leader counts learners' acknowledgements towards
    the commit quorum (ADR 0022; caught by `commit-quorum`)."""
    membership_on_commit: bool = False
    """In the core: the leader counts the commit quorum with the membership as of its commit
    index, not the newest one in its log, i.e. a new membership takes effect for commits only
    once committed under the old one (ADR 0022; caught by `commit-quorum`)."""
    commit_with_unsynced: bool = False
    """In the core: a follower commits what the leader said commits once it holds it
    (`Append.commit_with_you`, ADR 0050) as soon as it has *appended* the entries, before its
    own sync (caught by `commit-quorum`, which checks followers' commits too)."""


NO_BUGS = Bugs()


@dataclass(frozen=True, slots=True)
class SimOptions:
    nodes: int
    groups: int
    loss: float  # probability a message is dropped
    duplication: float  # probability a message is delivered twice
    delay_ms_max: int  # message delay is uniform in [1, delay_ms_max] (so reordering)
    disk_ms_max: int  # write + sync latency is uniform in [0, disk_ms_max]
    torn: float  # probability the first lost write of a crash is torn
    nemesis_ms: int  # mean time between fault actions
    crash_weight: int
    partition_weight: int
    propose_ms: int  # mean time between client proposals (per group)
    log_cache_bytes: int  # small values force snapshots
    steps: int
    bugs: Bugs = NO_BUGS
    membership_ms: int = 0
    """Mean time between replica-set operations (ADR 0022: add a learner, promote it, remove
    a voter or a learner, transfer leadership); 0: none, every node a voter of every group."""

    @staticmethod
    def draw(seed: int, *, nodes: int | None = None, steps: int = 3000) -> SimOptions:
        rng = random.Random(f"options/{seed}")
        return SimOptions(
            nodes=nodes if nodes is not None else rng.choice((3, 3, 4, 5)),
            groups=rng.randint(1, 3),
            loss=rng.choice((0.0, 0.01, 0.05, 0.2)),
            duplication=rng.choice((0.0, 0.01, 0.05)),
            delay_ms_max=rng.choice((2, 10, 30)),
            disk_ms_max=rng.choice((0, 3, 15)),
            torn=rng.choice((0.0, 0.5)),
            nemesis_ms=rng.choice((50, 200, 600)),
            crash_weight=rng.choice((0, 1, 3)),
            partition_weight=rng.choice((0, 1, 3)),
            propose_ms=rng.choice((5, 20, 60)),
            log_cache_bytes=rng.choice((0, 200, 100_000)),
            steps=steps,
            # A separate stream, so the seeds without replica-set changes keep their runs.
            membership_ms=random.Random(f"membership/{seed}").choice((0, 0, 40, 150)),
        )


class _Kind(Enum):
    TICK = "tick"
    DELIVER = "deliver"
    DISK = "disk"
    TRANSFER = "transfer"
    PROPOSE = "propose"
    NEMESIS = "nemesis"
    RESTART = "restart"
    HEAL = "heal"
    MEMBERSHIP = "membership"


@dataclass(slots=True)
class _Event:
    kind: _Kind
    node: NodeId
    group: int = 0
    message: Message | None = None
    incarnation: int = 0
    request: SnapshotRequest | None = None


@dataclass
class _Replica:
    store: SimRaftStore
    raft: Raft | None = None
    inflight: Ready | None = None
    applied: list[Entry] = field(default_factory=list)
    proposals: dict[int, tuple[Term, bytes]] = field(default_factory=dict)


@dataclass
class _Node:
    id: NodeId
    replicas: list[_Replica]
    up: bool = True
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class SimResult:
    seed: int
    options: SimOptions
    failure: str | None
    steps: int
    time_ms: int
    trace_digest: str
    acknowledged: int
    elections: int
    crashes: int
    snapshots: int
    membership_changes: int = 0
    transfers: int = 0
    early_commits: int = 0
    """Followers' commits past their leader's (ADR 0050), each checked by `commit-quorum`."""

    @property
    def ok(self) -> bool:
        return self.failure is None


class _LearnersCountRaft(Raft):
    """Planted bug `learners-count`: learners' acknowledgements count for commit."""

    def _maybe_commit(self) -> bool:
        matches = sorted(
            [self.log.stable, *(p.match for p in self._progress.values())], reverse=True
        )
        candidate = matches[self.quorum - 1]
        if candidate > self.log.committed and self.log.term(candidate) == self.term:
            return self.log.commit_to(candidate)
        return False


class _MembershipOnCommitRaft(Raft):
    """Planted bug `membership-on-commit`: the commit quorum is counted with the membership as
    of the commit index (the new one counts only once committed under the old)."""

    def _maybe_commit(self) -> bool:
        voters = self.membership_at(self.log.committed).voters
        matches = sorted(
            [
                *([self.log.stable] if self.id in voters else []),
                *(p.match for peer, p in self._progress.items() if peer in voters),
            ],
            reverse=True,
        )
        quorum = len(voters) // 2 + 1
        if len(matches) < quorum:
            return False
        candidate = matches[quorum - 1]
        if candidate > self.log.committed and self.log.term(candidate) == self.term:
            return self.log.commit_to(candidate)
        return False


class _CommitWithUnsyncedRaft(Raft):
    """Planted bug `commit-with-unsynced`: a follower counts its appended log as held."""

    def _persisted_end(self) -> int:
        return self.log.last_index


class SimCluster(SimLoop[_Event]):
    def __init__(self, seed: int, options: SimOptions, *, keep_trace: bool = False) -> None:
        super().__init__(
            seed, keep_trace=keep_trace, liveness_ms_max=liveness_ms_max, events_max=events_max
        )
        self.options = options
        self.rng = random.Random(f"cluster/{seed}")
        self.readers_rng = random.Random(f"readers/{seed}")
        """Which replicas have readers (`Raft.readers`), apart from `rng` so that drawing them
        leaves the other draws of a seed where they were."""
        self.ids = [NodeId(f"n{i}") for i in range(1, options.nodes + 1)]
        self.config = RaftConfig(
            election_timeout_ticks=10,
            heartbeat_interval_ticks=2,
            inflight_appends_max=8,
            append_bytes_max=256,
            log_cache_bytes=options.log_cache_bytes,
        )
        self.checker = Checker(options.groups)
        self.raft_class: type[Raft] = Raft
        if options.bugs.learners_count:
            self.raft_class = _LearnersCountRaft
        elif options.bugs.membership_on_commit:
            self.raft_class = _MembershipOnCommitRaft
        elif options.bugs.commit_with_unsynced:
            self.raft_class = _CommitWithUnsyncedRaft
        self.initial_membership = [
            Membership.of(
                self.ids
                if not options.membership_ms
                else [self.ids[(group + i) % len(self.ids)] for i in range(3)]
            )
            for group in range(options.groups)
        ]
        self.membership_changes = 0
        self.transfers = 0
        self.early_commits = 0
        self.nodes = {
            node: _Node(node, [_Replica(SimRaftStore()) for _ in range(options.groups)])
            for node in self.ids
        }
        self.crashes = 0
        self.snapshots = 0
        self._client_seq = 0
        self._leader_hint: list[NodeId | None] = [None] * options.groups
        self._acked_after: list[int | None] = [None] * options.groups
        """Per group: the index of the first proposal acknowledged after faults stopped."""
        for node in self.ids:
            self._start(self.nodes[node])
            self._schedule(self.rng.randrange(tick_ms), _Kind.TICK, node)
        for group in range(options.groups):
            self._schedule(
                self.rng.randrange(1, 2 * options.propose_ms),
                _Kind.PROPOSE,
                self.ids[0],
                group=group,
            )
        self._schedule(options.nemesis_ms, _Kind.NEMESIS, self.ids[0])
        if options.membership_ms:
            self._schedule(options.membership_ms, _Kind.MEMBERSHIP, self.ids[0])

    # -- running

    def run(self) -> SimResult:
        failure = self.run_phases(self.options.steps)
        return SimResult(
            seed=self.seed,
            options=self.options,
            failure=failure,
            steps=self.steps,
            time_ms=self.now_ms,
            trace_digest=self.trace_digest,
            acknowledged=sum(len(a) for a in self.checker.acked),
            elections=len(self.checker.leaders),
            crashes=self.crashes,
            snapshots=self.snapshots,
            membership_changes=self.membership_changes,
            transfers=self.transfers,
            early_commits=self.early_commits,
        )

    def liveness_failure(self) -> str:
        return (
            "not every group acknowledged a proposal that every replica then applied "
            f"(acknowledged at {self._acked_after})"
        )

    def live(self) -> bool:
        """Every group acknowledged a proposal after healing, and every replica has applied
        it (no follower is left stuck behind, e.g. waiting for a snapshot forever)."""
        if self.faults:
            return False
        for group, index in enumerate(self._acked_after):
            if index is None:
                return False
            for node in self._members(group):
                if len(self.nodes[node].replicas[group].applied) < index:
                    return False
        return True

    def _members(self, group: int) -> tuple[NodeId, ...]:
        """The group's members as its leader sees them (a removed replica is left behind);
        every node while no leader is known."""
        for node in self.ids:
            raft = self.nodes[node].replicas[group].raft
            if raft is not None and raft.role is Role.LEADER:
                return raft.membership.members
        return tuple(self.ids)

    def step(self) -> None:
        event = self.pop()
        self._dispatch(event)
        self._check()

    def _schedule(
        self,
        delay_ms: int,
        kind: _Kind,
        node: NodeId,
        *,
        group: int = 0,
        message: Message | None = None,
        incarnation: int = 0,
        request: SnapshotRequest | None = None,
    ) -> None:
        self.push(delay_ms, _Event(kind, node, group, message, incarnation, request))

    def _durable(self, group: int) -> dict[NodeId, Sequence[Entry]]:
        return {n: self.nodes[n].replicas[group].store.durable for n in self.ids}

    def _check(self) -> None:
        for node in self.ids:
            state = self.nodes[node]
            if not state.up:
                continue
            for group, replica in enumerate(state.replicas):
                assert replica.raft is not None
                raft = replica.raft
                before = self.checker.commit_seen(node, group)
                self.checker.observe(node, group, raft)
                if raft.role is Role.LEADER and raft.log.committed > before:
                    self.checker.commit_backed(node, group, raft, self._durable(group))
                elif raft.log.committed > before and raft.leader in self.nodes:
                    # A follower's commit past its leader's: completed by its own sync (ADR
                    # 0050); it must be on a synced quorum of the leader's voters.
                    lead = self.nodes[raft.leader]
                    lead_raft = lead.replicas[group].raft if lead.up else None
                    if (
                        lead_raft is not None
                        and lead_raft.term == raft.term
                        and raft.log.committed > lead_raft.log.committed
                    ):
                        self.early_commits += 1
                        self.checker.commit_backed(
                            node,
                            group,
                            raft,
                            self._durable(group),
                            lead_raft.memberships_since(raft.log.committed),
                        )

    # -- events

    def _dispatch(self, event: _Event) -> None:
        node = self.nodes[event.node]
        match event.kind:
            case _Kind.TICK:
                self._schedule(tick_ms, _Kind.TICK, event.node)
                if node.up:
                    for group, replica in enumerate(node.replicas):
                        assert replica.raft is not None
                        if self.readers_rng.random() < READERS_TOGGLE_CHANCE:
                            replica.raft.readers = not replica.raft.readers
                        replica.raft.tick()
                        self._pump(node, group)
            case _Kind.DELIVER:
                assert event.message is not None
                self._deliver(node, event.group, event.message)
            case _Kind.DISK:
                if node.up and node.incarnation == event.incarnation:
                    self._record(f"{node.id} g{event.group} synced")
                    self._complete(node, event.group)
            case _Kind.TRANSFER:
                assert event.request is not None
                if node.up and node.incarnation == event.incarnation:
                    self._transfer(node, event.group, event.request)
            case _Kind.PROPOSE:
                self._schedule(
                    self.rng.randrange(1, 2 * self.options.propose_ms),
                    _Kind.PROPOSE,
                    event.node,
                    group=event.group,
                )
                self._propose(event.group)
            case _Kind.NEMESIS:
                if self.faults:
                    self._nemesis()
                    self._schedule(
                        self.rng.randrange(1, 2 * self.options.nemesis_ms),
                        _Kind.NEMESIS,
                        event.node,
                    )
            case _Kind.RESTART:
                if not node.up:
                    self._restart(node)
            case _Kind.HEAL:
                self.heal()
            case _Kind.MEMBERSHIP:
                if self.faults:
                    self._change_membership()
                    self._schedule(
                        self.rng.randrange(1, 2 * self.options.membership_ms),
                        _Kind.MEMBERSHIP,
                        event.node,
                    )

    def _deliver(self, node: _Node, group: int, message: Message) -> None:
        if not node.up or (message.source, message.target) in self.blocked:
            self._record(f"g{group} lost {describe(message)}")
            return
        self._record(f"g{group} {describe(message)}")
        replica = node.replicas[group]
        assert replica.raft is not None
        replica.raft.step(message)
        for entry in replica.raft.take_committed():  # as the shell: a commit during a sync
            self._apply(node, group, entry)
        self._pump(node, group)

    def _send(self, group: int, message: Message) -> None:
        if self.faults:
            if (
                message.source,
                message.target,
            ) in self.blocked or self.rng.random() < self.options.loss:
                self._record(f"g{group} dropped {describe(message)}")
                return
            copies = 2 if self.rng.random() < self.options.duplication else 1
        else:
            copies = 1
        for _ in range(copies):
            self._schedule(
                self.rng.randint(1, self.options.delay_ms_max),
                _Kind.DELIVER,
                message.target,
                group=group,
                message=message,
            )

    # -- the shell: Ready handling, the way spate.node's driver must do it

    def _pump(self, node: _Node, group: int) -> None:
        replica = node.replicas[group]
        raft = replica.raft
        assert raft is not None
        if replica.inflight is not None or not raft.has_ready():
            return
        ready = raft.ready()
        replica.inflight = ready
        if ready.entries:
            prev_term = raft.log.term(ready.entries[0].index - 1)
            assert prev_term is not None
            self.checker.appended(node.id, group, ready.entries, prev_term)
        if self.options.bugs.forget_vote:
            ready = replace(ready, hard_state=None)
        replica.store.write(ready)
        # Before the sync, as the shell does: what the Ready allows (a leader's Appends and
        # Heartbeats; everything when nothing is to sync), then the committed entries.
        for message in self._early(ready):
            self._send(group, message)
        for entry in ready.committed:
            self._apply(node, group, entry)
        if ready.entries or ready.must_sync:
            latency = self.rng.randint(0, self.options.disk_ms_max)
            self._schedule(latency, _Kind.DISK, node.id, group=group, incarnation=node.incarnation)
        else:
            self._complete(node, group)

    def _early(self, ready: Ready) -> tuple[Message, ...]:
        """What this shell sends at write time: `messages_before_sync`, unless a bug says more."""
        bugs = self.options.bugs
        if bugs.ack_before_persist:
            return ready.messages
        if bugs.early_append_response:
            return tuple(
                m
                for m in ready.messages
                if m in ready.messages_before_sync() or isinstance(m, AppendResponse)
            )
        return ready.messages_before_sync()

    def _complete(self, node: _Node, group: int) -> None:
        replica = node.replicas[group]
        ready, raft = replica.inflight, replica.raft
        assert ready is not None and raft is not None
        if ready.entries or ready.must_sync:
            replica.store.sync()
        early = self._early(ready)
        for message in ready.messages_after_sync():
            if message not in early:
                self._send(group, message)
        if ready.leader_change is not None:
            self._record(
                f"{node.id} g{group} leader {ready.leader_change.leader} "
                f"epoch {ready.leader_change.epoch}"
            )
            if ready.leader_change.leader is not None:
                self._leader_hint[group] = ready.leader_change.leader
        if ready.snapshot_request is not None:
            self._schedule(
                self.rng.randint(1, self.options.delay_ms_max),
                _Kind.TRANSFER,
                node.id,
                group=group,
                incarnation=node.incarnation,
                request=ready.snapshot_request,
            )
        replica.inflight = None
        raft.advance(ready)
        self._pump(node, group)

    def _apply(self, node: _Node, group: int, entry: Entry) -> None:
        replica = node.replicas[group]
        assert entry.index == len(replica.applied) + 1, (entry.index, len(replica.applied))
        replica.applied.append(entry)
        self.checker.committed(node.id, group, entry, "applied")
        proposal = replica.proposals.pop(entry.index, None)
        if proposal is not None and proposal == (entry.term, entry.payload):
            self._record(f"ack g{group} {entry.describe()}")
            self.checker.acknowledged(group, entry.index, entry.term, bytes(entry.payload))
            if not self.faults and self._acked_after[group] is None:
                self._acked_after[group] = entry.index

    def _transfer(self, node: _Node, group: int, request: SnapshotRequest) -> None:
        """Fetch the leader's segments up to the snapshot index, then restore the core."""
        replica = node.replicas[group]
        raft = replica.raft
        assert raft is not None
        if replica.inflight is not None:  # a write is in flight: transfer once it is done
            self._schedule(
                1,
                _Kind.TRANSFER,
                node.id,
                group=group,
                incarnation=node.incarnation,
                request=request,
            )
            return
        source = self.nodes[request.leader]
        index, term = request.snapshot.index, request.snapshot.term
        if (
            not source.up
            or (source.id, node.id) in self.blocked
            or index <= raft.log.committed
            or raft.role is Role.LEADER
        ):
            self._record(f"{node.id} g{group} transfer from {source.id} skipped")
            return
        prefix = source.replicas[group].store.durable[:index]
        assert len(prefix) == index and prefix[-1].term == term, (len(prefix), request)
        self._record(f"{node.id} g{group} snapshot {term}/{index} from {source.id}")
        self.snapshots += 1
        if not raft.log.match_term(index, term):
            replica.store.install(prefix)
            for entry in prefix[len(replica.applied) :]:
                self._apply(node, group, entry)
        raft.restore(index, term, request.snapshot.membership)
        self._pump(node, group)

    # -- client

    def _propose(self, group: int) -> None:
        hint = self._leader_hint[group]
        target = hint if hint is not None else self.ids[self.rng.randrange(len(self.ids))]
        node = self.nodes[target]
        if not node.up:
            self._leader_hint[group] = None
            return
        replica = node.replicas[group]
        assert replica.raft is not None
        payload = self._next_payload(group)
        result = replica.raft.propose(payload)
        match result:
            case Proposed():
                self._record(
                    f"propose g{group} {payload!r} at {target} -> {result.term}/{result.index}"
                )
                replica.proposals[result.index] = (result.term, payload)
                self._pump(node, group)
            case Refusal():
                self._leader_hint[group] = result.leader if result.leader != target else None
                self._record(f"propose g{group} at {target} refused {result.reason.value}")

    def _next_payload(self, group: int) -> bytes:
        """What the client proposes next (state-machine simulators override it)."""
        self._client_seq += 1
        return f"g{group}c{self._client_seq}".encode()

    # -- replica-set changes (ADR 0022)

    def _change_membership(self) -> None:
        """One operator step on a random group, at the node believed to lead it: add a
        learner, promote a learner, remove a learner or a voter (never the leader), or
        transfer leadership. The core refuses what it must (a change pending, the barrier
        not committed); the refusal is part of the trace."""
        group = self.rng.randrange(self.options.groups)
        target = self._leader_hint[group]
        if target is None or not self.nodes[target].up:
            return
        raft = self.nodes[target].replicas[group].raft
        assert raft is not None
        if raft.role is not Role.LEADER:
            return
        current = raft.membership
        outsiders = [n for n in self.ids if n not in current.members]
        others = [v for v in current.voters if v != target]
        choice = self.rng.random()
        new: Membership | None = None
        if choice < 0.15 and others:
            peer = others[self.rng.randrange(len(others))]
            refusal = raft.transfer_leadership(peer)
            self.transfers += refusal is None
            self._record(f"transfer g{group} {target}->{peer}: {refusal or 'started'}")
            self._pump(self.nodes[target], group)
            return
        if current.learners and choice < 0.7 and len(current.voters) < 5:
            learner = current.learners[self.rng.randrange(len(current.learners))]
            new = Membership.of(
                (*current.voters, learner), [n for n in current.learners if n != learner]
            )
        elif current.learners and choice < 0.8:
            learner = current.learners[self.rng.randrange(len(current.learners))]
            new = Membership.of(current.voters, [n for n in current.learners if n != learner])
        elif outsiders and (choice < 0.9 or len(current.voters) <= 2):
            outsider = outsiders[self.rng.randrange(len(outsiders))]
            new = Membership.of(current.voters, (*current.learners, outsider))
        elif others and len(current.voters) > 2:
            voter = others[self.rng.randrange(len(others))]
            new = Membership.of([v for v in current.voters if v != voter], current.learners)
        if new is None:
            return
        result = raft.propose_membership(new)
        match result:
            case Proposed():
                self.membership_changes += 1
                self.checker.membership_appended(group, result.index, new)
                self._record(
                    f"membership g{group} at {target} -> {result.term}/{result.index}: "
                    f"{new.describe()}"
                )
                self._pump(self.nodes[target], group)
            case Refusal():
                self._record(f"membership g{group} at {target} refused {result.reason.value}")

    # -- faults

    def _nemesis(self) -> None:
        options = self.options
        weights = [
            options.crash_weight,
            options.crash_weight,
            options.partition_weight,
            options.partition_weight,
            1,
        ]
        action = self.rng.choices(["crash", "restart", "partition", "one-way", "heal"], weights)[0]
        if action == "crash":
            up = [n for n in self.ids if self.nodes[n].up]
            if up:
                self._crash(self.nodes[up[self.rng.randrange(len(up))]])
        elif action == "restart":
            down = [n for n in self.ids if not self.nodes[n].up]
            if down:
                self._restart(self.nodes[down[self.rng.randrange(len(down))]])
        elif action == "partition":
            self._schedule(self.partition(self.ids, self.rng), _Kind.HEAL, self.ids[0])
        elif action == "one-way":
            self._schedule(self.one_way(self.ids, self.rng), _Kind.HEAL, self.ids[0])
        else:
            self.blocked.clear()
            self._record("heal")

    def _crash(self, node: _Node) -> None:
        self._record(f"crash {node.id}")
        self.crashes += 1
        node.up = False
        node.incarnation += 1
        for replica in node.replicas:
            replica.store.crash(self.rng, self.options.torn)
            replica.raft = None
            replica.inflight = None
            replica.applied = []
            replica.proposals = {}
        for group in range(self.options.groups):
            self.checker.durable(
                group,
                {n: self.nodes[n].replicas[group].store.durable for n in self.ids},
                self.initial_membership[group],
            )
        self._schedule(self.rng.randrange(20, 1000), _Kind.RESTART, node.id)

    def _start(self, node: _Node) -> None:
        for group, replica in enumerate(node.replicas):
            hard_state, snapshot, entries = replica.store.recovered()
            rng = random.Random(f"raft/{self.seed}/{node.id}/{group}/{node.incarnation}")
            replica.raft = self.raft_class(
                node.id,
                self.initial_membership[group],
                self.config,
                rng,
                hard_state=hard_state,
                snapshot=snapshot,
                entries=entries,
            )
            # Consumers waiting on this replica or not (ADR 0044: only then does the leader send
            # it commit updates); from a generator of its own, toggled at ticks.
            replica.raft.readers = self.readers_rng.random() < READERS_CHANCE
            self.checker.restarted(node.id, group, hard_state.commit)

    def _restart(self, node: _Node) -> None:
        self._record(f"restart {node.id}")
        node.up = True
        self._start(node)
        for group in range(len(node.replicas)):
            self._pump(node, group)

    def heal_all(self) -> None:
        self._record("liveness phase")
        self.faults = False
        self.blocked.clear()
        for node in self.ids:
            if not self.nodes[node].up:
                self._restart(self.nodes[node])


def run_seed(
    seed: int, *, nodes: int | None = None, steps: int = 3000, bugs: Bugs = NO_BUGS
) -> SimResult:
    options = replace(SimOptions.draw(seed, nodes=nodes, steps=steps), bugs=bugs)
    return SimCluster(seed, options).run()
