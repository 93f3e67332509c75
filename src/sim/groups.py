"""A consumer group under simulation: the production coordinator and ownership layer, their
hosts, members and faults (ADR 0015). `python -m spate.sim --model groups`.

One group over 1-6 partitions, drawn per seed with its strategy, rebalance delay and session
timeout. What runs as production code: the coordinator (`spate.core.coordinator.Coordinator`)
and, at each partition's replicas, the ownership layer — `spate.core.active.ActiveGroups` (one
per replica, node-local) driven through `spate.core.ownership`'s pure decisions: a claim is
`decide_claim` (granted or refused, the epoch, which reserved names to store), letting go is
`release`, a takeover's bound `drop_holder`, a step-down `ActiveGroups.stepped_down`, a leader
change `disband`, and every store of the committed offset passes `check_store` (the fence).
Their watchers (`watch`, `watch_deposed`) tell the members when a claim's turn comes or the
holder must step down. What is modelled: the shells around them, as simply as their contracts
allow.

- **coordinator host**: every `coordinator_tick_ms` it calls `expire` and `tick`; a generation
  to store is written to the home partition (`$generation/<g>`, durable when the write
  completes after 1-`store_ms_max` ms) and only then is `generation_stored` called. The host
  crashes (its soft state — members, targets — is gone; a store in flight is durable or lost,
  by a coin) and restarts 50-1000 ms later as a new incarnation from the last durable
  generation. Messages carry the incarnation they were sent to; others are dropped (a TCP
  connection does not survive its peer), and every member is told its connection broke.
- **partitions**: three replicas each, one leading. The log is durable state here (its
  replication is the other simulators' job): the stored `$epoch/<g>`, `$generation/<g>` and
  committed offset `$group/<g>`, written at once when a decision says to store them and fed to
  the next claim as `stored_epoch` and `stored_generation`; the log grows by itself. The
  leader's shell is `claiming.claim` and `ReplicatedPartition` (a claim is decided, its stores
  made, then answered; a claim that waits for a holder drops it after `takeover_ms`, the
  scaled `claiming.TAKEOVER_S`, if it has not stepped down; a step-down stores what the holder
  finished, then `stepped_down`; a store needs leadership) and the node's wire server (each
  member process is one gateway session; a detach of a link the session counted there stores
  and lets go, one it did not count only stores, fenced by the member number it carries). The
  leader sends new messages to its current member. A leader change disbands the old leader's
  groups, failing its members' waits: they are told the claim is gone at once, or, half the
  time (the old leader cut off from them too), 100-2000 ms later while the routing already
  names the new leader; the new leader reads the stored epoch and generation from the log.
- **members** (3-5 processes), modelled on the gateway's group links (`_group_member`,
  `claim_partition`, `_hold`, `_drop`, `RemoteWriter`): join, heartbeat every `heartbeat_ms`
  (the heartbeat's answer carries the member's `Assignment`: members poll), claim each
  assigned partition at its leader with the generation they were told (one claim in flight
  per partition; a claim waits for the holder to step down, or is displaced), commit what
  they received to the replica they claimed at while it leads, step down when told (storing
  what they received), and on a `release` set let go with what they received (to the leader
  the routing names: a store there and a let-go where the link was counted, as
  `RemoteWriter.consumer_detach` does) and report `released` to the coordinator. An unknown
  member (expired, or of a previous incarnation) joins again and drops what its new
  assignment does not list. Members crash (stop; every replica notices the session closing
  1-50 ms later and lets go of its links) and restart as new processes; some leave and
  rejoin; some are cut off from the coordinator (not from the partitions) for 0.5-3 s, so
  they are expired while they still believe they hold partitions, and keep retrying claims
  with the generation they last heard (the gateway rejoins instead: the zombie is harsher);
  some pause for 0.1-3 s (a long GC pause, a stuck client: what reaches them waits), so a
  deposed holder can miss the takeover bound and wake up to commit.
- **network**: messages to and from the coordinator are delayed 1-`delay_ms_max` ms (so
  reordered), dropped with `loss`, duplicated with `duplication`. A member's link to a
  replica is a TCP connection: delayed the same, in order, never lost or duplicated (a broken
  connection is a closed link: a member crash, a leader change). A crashed member's sessions
  close after what it sent on them.

Invariants (after every event, or where the event happens):

- `generation-stored`: the coordinator's current generation (what members see) is durable;
- `generation-monotonic`: each new generation is above every generation seen before, across
  incarnations; a restarted coordinator never starts below one seen;
- `single-owner`: in one incarnation, a partition leaves its holder only through an accepted
  release or the holder's removal (so two members never hold it at once);
- `owner-per-generation`: the ownership layer grants (partition, generation) to one member
  process only;
- `ownership-fence`: a grant's generation is at least the highest the partition granted and
  above its current owner's, and its epoch above every epoch granted there before (one owner
  at any moment, across generations and leaders; epochs never go back);
- `commit-not-ahead`: an accepted commit is at or below what the committing process received
  of that partition;
- `commit-fenced`: a commit is accepted only from the partition's current owner (the process
  and the claim it was made current by, as this checker saw it happen);
- `handover-commit`: a claimer that waited for a holder to step down starts after what that
  holder committed in stepping down.

Liveness, after the faults stop: the group becomes Stable with every live member in it,
every partition owned at its leader by its holder's process, its replicas counting that link
only (`ownership.Claims.attached`: a count left behind refuses an operator's reset), and the
holders are the strategy's target for the members (`quiet-target`: round-robin and range
exactly; sticky balanced).

Planted bugs (`--model groups --bug ...`; tests/sim/test_groups_sim.py requires each to be
caught): `announce-before-store`, `forget-generation`, `assign-before-revoke` in the
coordinator's host; `stale-claims`, `forget-epochs`, `commit-from-deposed`,
`promote-before-store` by perturbing the calls into the production ownership layer;
`commit-past-delivered` and `forget-waiting-claims` in the members (see `GroupBugs`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Literal

from spate.core import groups, ownership
from spate.core.active import ActiveGroups
from spate.core.coordinator import (
    GENERATION_NONE,
    STRATEGIES,
    Coordinator,
    GroupFull,
    GroupState,
    Strategy,
    compute_target,
)
from spate.core.errors import AlreadyExists, FailedPrecondition, Unavailable
from spate.core.ids import Generation, MemberId, PartitionId
from spate.sim.checker import InvariantViolation
from spate.sim.loop import SimLoop

coordinator_tick_ms = 25
"""How often the host calls `expire` and `tick`."""
partition_tick_ms = 30
"""How often a partition's log grows and its leader sends to the owner."""
restart_ms = (50, 1000)
"""A crashed coordinator host or member restarts after a time drawn from this range."""
replicas = 3
"""Replicas per partition, each with its own node-local ownership state."""
liveness_ms_max = 20_000
"""Simulated time the healed group gets to become Stable on its target."""
events_max = 200_000

NAME = groups.committed_name("g").encode()
"""The group's reserved consumer name on every partition (`$group/g`)."""
_EPOCH_NAME = ownership.epoch_name(NAME)
_GENERATION_NAME = ownership.generation_name(NAME)


@dataclass(frozen=True, slots=True)
class GroupBugs:
    """Deliberate bugs, to prove the checker can fail."""

    announce_before_store: bool = False
    """The host calls `generation_stored` when the store starts, not when it completes."""
    forget_generation: bool = False
    """A restarted coordinator starts from generation 0, not from the stored one."""
    assign_before_revoke: bool = False
    """The coordinator gives a moving partition to its new member at once."""
    stale_claims: bool = False
    """A leader feeds a claim stored epoch and generation 0 while no link of the group is on
    the partition (the seed's "MAY reset to zero when no links remain", which ADR 0015 does
    not use)."""
    forget_epochs: bool = False
    """A partition's new leader feeds claims the epoch and generation it stored itself since
    it took over (none at first) instead of those stored in the partition's log: the soft
    state taken for the durable one."""
    commit_from_deposed: bool = False
    """The leader stores the group's committed offset without `ownership.check_store`."""
    promote_before_store: bool = False
    """A step-down calls `stepped_down` (the claimer's turn) before it stores what the
    deposed holder finished."""
    commit_past_delivered: bool = False
    """Members commit the partition's end they were told of, not what they received."""
    forget_waiting_claims: bool = False
    """A member drops a waiting claim that was displaced or failed without letting go of it
    (as `claim_partition` did): the replica counts its link until the session closes."""


NO_BUGS = GroupBugs()


@dataclass(frozen=True, slots=True)
class GroupOptions:
    """One seed's group and fault mix (swarm testing)."""

    strategy: Strategy
    partitions: int
    members: int
    rebalance_delay_ms: int
    session_timeout_ms: int
    heartbeat_ms: int
    loss: float
    duplication: float
    delay_ms_max: int
    store_ms_max: int
    fault_ms: int
    """Mean time between faults."""
    coordinator_crash_weight: int
    member_crash_weight: int
    leave_weight: int
    isolate_weight: int
    """Cutting a member off from the coordinator (not from the partitions) for a while: it
    is expired and its partitions go on without it while it still believes it holds them."""
    leader_weight: int
    """A partition's leader changing: ownership is node-local, so the owner is detached and
    claims again at the new leader, which reads the epoch and generation from the log."""
    pause_weight: int
    """A member process stopping for 0.1-3 s (a long GC pause, a stuck client): it is
    expired, and a holder that does not step down within `takeover_ms` is dropped."""
    takeover_ms: int
    """The leader's bound on a takeover (`claiming.TAKEOVER_S`, scaled like the session
    timeouts here)."""
    steps: int
    bugs: GroupBugs = NO_BUGS

    @staticmethod
    def draw(seed: int, *, steps: int = 1500) -> GroupOptions:
        rng = random.Random(f"groups-options/{seed}")
        session = rng.choice((300, 600, 1000))
        return GroupOptions(
            strategy=rng.choice(STRATEGIES),
            partitions=rng.randint(1, 6),
            members=rng.randint(2, 5),
            rebalance_delay_ms=rng.choice((0, 50, 200)),
            session_timeout_ms=session,
            heartbeat_ms=session // rng.choice((3, 5)),
            loss=rng.choice((0.0, 0.02, 0.1, 0.2)),
            duplication=rng.choice((0.0, 0.02, 0.05)),
            delay_ms_max=rng.choice((2, 10, 40)),
            store_ms_max=rng.choice((1, 10, 30)),
            fault_ms=rng.choice((100, 300, 800)),
            coordinator_crash_weight=rng.choice((0, 1, 3)),
            member_crash_weight=rng.choice((0, 1, 3)),
            leave_weight=rng.choice((0, 1)),
            isolate_weight=rng.choice((0, 1, 3, 3)),
            leader_weight=rng.choice((0, 1, 3, 3)),
            pause_weight=rng.choice((0, 1, 3)),
            takeover_ms=rng.choice((200, 600, 2000)),
            steps=steps,
        )


# -- messages and events

Process = int
"""A member process's unique number (a restarted member is a new process)."""
_NO_MEMBER = MemberId(0)
_FROM_COORDINATOR = ("joined", "assignment", "unknown")
_FIRST = PartitionId(0)


@dataclass(frozen=True, slots=True)
class _ToCoordinator:
    kind: Literal["join", "heartbeat", "released", "leave"]
    process: Process
    incarnation: int
    member: MemberId = _NO_MEMBER
    partitions: frozenset[PartitionId] = frozenset()
    generation: Generation = GENERATION_NONE


@dataclass(frozen=True, slots=True)
class _Claim:
    """A claim the ownership layer granted: at `node`'s replica, as member `number` of its
    `ActiveGroups`, in `generation`."""

    process: Process
    node: int
    number: int
    generation: Generation


@dataclass(frozen=True, slots=True)
class _ToMember:
    kind: Literal[
        "joined",
        "assignment",
        "unknown",
        "broken",
        "granted",
        "refused",
        "active",
        "displaced",
        "deposed",
        "gone",
        "data",
    ]
    process: Process
    incarnation: int = 0
    member: MemberId = _NO_MEMBER
    generation: Generation = GENERATION_NONE
    partitions: frozenset[PartitionId] = frozenset()
    release: frozenset[PartitionId] = frozenset()
    partition: PartitionId = _FIRST
    claim: _Claim | None = None
    """Over a link: the claim it is about."""
    current: bool = False
    """`granted`: the claim owns the partition now (else it waits for the holder)."""
    upto: int = 0
    end: int = 0


@dataclass(frozen=True, slots=True)
class _ToPartition:
    """Over a member's link to one replica of a partition (`node`)."""

    kind: Literal["claim", "commit", "step-down", "detach", "closed"]
    process: Process
    partition: PartitionId
    node: int
    generation: Generation = GENERATION_NONE
    number: int = 0
    """The member number of the claim it is about (0 for a claim)."""
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class _Timer:
    kind: Literal[
        "coordinator-tick",
        "store-done",
        "coordinator-restart",
        "heartbeat",
        "commit",
        "member-restart",
        "rejoin",
        "partition-tick",
        "takeover",
        "resume",
        "fault",
    ]
    who: int = 0
    incarnation: int = 0
    generation: Generation = GENERATION_NONE
    process: Process = 0
    node: int = 0
    numbers: tuple[int, int] = (0, 0)
    """`takeover`: the holder's and the claimer's member numbers."""


_Event = _ToCoordinator | _ToMember | _ToPartition | _Timer


class _HastyCoordinator(Coordinator):
    """`assign-before-revoke`: moving partitions go to their new member when the generation
    is stored, without waiting for a release."""

    def generation_stored(self, generation: Generation) -> None:
        super().generation_stored(generation)
        for p, member in self.target.items():
            if member in self.members and self.holder(p) != member:
                self._holders[p] = (member, generation)


# -- the actors


@dataclass
class _Member:
    slot: int
    process: Process
    alive: bool = True
    incarnation: int | None = None
    """The coordinator incarnation of its session (None: not a member; joining)."""
    member: MemberId | None = None
    generation: Generation = GENERATION_NONE
    holding: dict[PartitionId, _Claim] = field(default_factory=dict)
    """Partitions it owns at their leaders, by the claim that owns them."""
    waiting: dict[PartitionId, _Claim] = field(default_factory=dict)
    """Claims granted that wait for their holder to step down."""
    claiming: set[PartitionId] = field(default_factory=set)
    """Claims sent and not answered yet (one at a time per partition)."""
    received: dict[PartitionId, int] = field(default_factory=dict)
    """What it received of each partition since its claim became current."""
    ends: dict[PartitionId, int] = field(default_factory=dict)
    wanted: frozenset[PartitionId] = frozenset()
    """The partitions its last assignment told it to keep."""
    paused: bool = False
    backlog: list[_ToMember | _Timer] = field(default_factory=list)
    """What reached it while paused, handled in order when it resumes."""


@dataclass
class _Replica:
    """One node's replica of a partition: the production ownership state (node-local soft
    state, `ownership.Claims`) and what the node's wire server keeps per gateway session."""

    node: int
    groups: ActiveGroups = field(default_factory=ActiveGroups)
    attached: dict[bytes, int] = field(default_factory=dict)
    sessions: dict[Process, list[int]] = field(default_factory=dict)
    """The member numbers each process's session counted here."""
    links: dict[int, _Claim] = field(default_factory=dict)
    """Member number -> its claim (whose process the watchers' news goes to)."""
    soft_epoch: int = 0
    soft_generation: int = 0
    """What it stored itself since it took over the lead (for the `forget-epochs` bug)."""


@dataclass
class _Partition:
    nodes: list[_Replica]
    leader: int = 0
    epoch: int = 0
    generation: int = 0
    committed: int = 0
    """Stored in the log (`$epoch/<g>`, `$generation/<g>`, `$group/<g>`): durable."""
    end: int = 0
    sent: int = 0
    """Offset up to which the current owner was sent messages."""

    @property
    def leading(self) -> _Replica:
        return self.nodes[self.leader]


@dataclass(frozen=True, slots=True)
class GroupResult:
    seed: int
    options: GroupOptions
    failure: str | None
    steps: int
    time_ms: int
    trace_digest: str
    rebalances: int
    coordinator_crashes: int
    member_crashes: int
    commits: int

    @property
    def ok(self) -> bool:
        return self.failure is None


class GroupSim(SimLoop[_Event]):
    def __init__(self, seed: int, options: GroupOptions, *, keep_trace: bool = False) -> None:
        super().__init__(
            seed, keep_trace=keep_trace, liveness_ms_max=liveness_ms_max, events_max=events_max
        )
        self.options = options
        self.bugs = options.bugs
        self.rng = random.Random(f"groups/{seed}")
        self.incarnation = 0
        self.coordinator: Coordinator | None = None
        self.durable = Generation(0)
        """The generation stored in the home partition's log."""
        self.storing: tuple[int, Generation] | None = None  # (incarnation, generation)
        self.processes = 0
        self.isolated: dict[Process, int] = {}
        """process -> until when it cannot reach the coordinator (ms)."""
        self.links_at: dict[tuple[bool, Process, PartitionId, int], int] = {}
        """When the last message over each link (direction, process, partition, node) arrives:
        the next one arrives no earlier (in order)."""
        self.members = [self._new_member(slot) for slot in range(options.members)]
        self.partitions = [
            _Partition([_Replica(node) for node in range(replicas)])
            for _ in range(options.partitions)
        ]
        # checker state
        self.generation_seen = Generation(0)
        self.observed: Generation | None = None
        """The coordinator's generation at the last check (None: just restarted)."""
        self.holders: dict[PartitionId, MemberId] = {}
        self.accepted: dict[MemberId, frozenset[PartitionId]] = {}
        self.removed: set[MemberId] = set()
        self.grants: dict[tuple[PartitionId, Generation], Process] = {}
        self.highest: dict[PartitionId, Generation] = {}
        self.epochs: dict[PartitionId, int] = {}
        """The highest generation and epoch each partition granted (the checker's record)."""
        self.owners: dict[PartitionId, _Claim] = {}
        """Each partition's owner as the checker saw it become current (and not end since)."""
        self.handing_over: dict[PartitionId, int] = {}
        """A step-down in progress: what the deposed holder finished."""
        self.delivered: dict[tuple[Process, PartitionId], int] = {}
        """What each process received of each partition (the highest offset)."""
        self.rebalances = self.coordinator_crashes = self.member_crashes = self.commits = 0
        self._start_coordinator()
        for member in self.members:
            self._join(member)
            self.push(self.rng.randrange(1, options.heartbeat_ms), _Timer("heartbeat", member.slot))
            self.push(self.rng.randrange(1, 100), _Timer("commit", member.slot))
        for p in range(options.partitions):
            self.push(self.rng.randrange(1, partition_tick_ms), _Timer("partition-tick", p))
        self.push(self._fault_delay(), _Timer("fault"))

    def run(self) -> GroupResult:
        failure = self.run_phases(self.options.steps)
        return GroupResult(
            self.seed,
            self.options,
            failure,
            self.steps,
            self.now_ms,
            self.trace_digest,
            self.rebalances,
            self.coordinator_crashes,
            self.member_crashes,
            self.commits,
        )

    # -- the loop

    def step(self) -> None:
        event = self.pop()
        if isinstance(event, _ToCoordinator):
            self._at_coordinator(event)
        elif isinstance(event, _ToMember):
            self._at_member(event)
        elif isinstance(event, _ToPartition):
            self._at_partition(event)
        else:
            self._timer(event)
        self._check()

    def _send(self, message: _ToCoordinator | _ToMember) -> None:
        """To or from the coordinator: lossy, duplicated, reordered."""
        if self.faults and self.rng.random() < self.options.loss:
            return
        if self.isolated.get(message.process, 0) > self.now_ms:
            return
        copies = 2 if self.faults and self.rng.random() < self.options.duplication else 1
        for _ in range(copies):
            self.push(self.rng.randint(1, self.options.delay_ms_max), message)

    def _link(
        self, message: _ToMember | _ToPartition, p: PartitionId, node: int, delay_ms: int = 0
    ) -> None:
        """Over a member's link to a replica: delayed, in order, never lost."""
        key = (isinstance(message, _ToMember), message.process, p, node)
        delay_ms = delay_ms or self.rng.randint(1, self.options.delay_ms_max)
        at = max(self.now_ms + delay_ms, self.links_at.get(key, 0))
        self.links_at[key] = at
        self.push(at - self.now_ms, message)

    def _fault_delay(self) -> int:
        return max(1, int(self.rng.expovariate(1 / self.options.fault_ms)))

    # -- coordinator host

    def _start_coordinator(self) -> None:
        o = self.options
        self.incarnation += 1
        generation = Generation(0) if self.bugs.forget_generation else self.durable
        kind = _HastyCoordinator if self.bugs.assign_before_revoke else Coordinator
        self.coordinator = kind(
            o.partitions,
            o.strategy,
            generation=generation,
            rebalance_delay_ms=o.rebalance_delay_ms,
            members_max=o.members + 2,
        )
        self.observed, self.holders = None, {}
        self._record(f"coordinator {self.incarnation} starts at generation {generation}")
        self.push(coordinator_tick_ms, _Timer("coordinator-tick", incarnation=self.incarnation))

    def _crash_coordinator(self) -> None:
        self._record(f"crash coordinator {self.incarnation}")
        self.coordinator_crashes += 1
        self.coordinator = None
        if self.storing is not None:
            if self.rng.random() < 0.5:  # the write reached a majority; the answer was lost
                self.durable = max(self.durable, self.storing[1])
            self.storing = None
        for member in self.members:
            if member.alive and member.incarnation is not None:
                self._send_reliably(_ToMember("broken", member.process, self.incarnation))
        self.push(self.rng.randrange(*restart_ms), _Timer("coordinator-restart"))

    def _send_reliably(self, message: _ToMember) -> None:
        """A connection's end is noticed (TCP reset or keepalive), not lost."""
        self.push(self.rng.randint(1, self.options.delay_ms_max), message)

    def _at_coordinator(self, m: _ToCoordinator) -> None:
        c = self.coordinator
        if c is None or m.incarnation != self.incarnation:
            return  # the connection is gone
        if m.kind == "join":
            try:
                member = c.join(self.now_ms, self.options.session_timeout_ms)
            except GroupFull:
                self._record(f"p{m.process} refused: the group is full")
                return  # it tries again (stale members expire)
            self._record(f"p{m.process} joins as {member}")
            self._send(_ToMember("joined", m.process, self.incarnation, member))
        elif m.kind == "heartbeat":
            assignment = c.assignment(m.member) if c.heartbeat(m.member, self.now_ms) else None
            if assignment is None:
                self._send(_ToMember("unknown", m.process, self.incarnation, m.member))
            else:
                self._send(
                    _ToMember(
                        "assignment",
                        m.process,
                        self.incarnation,
                        m.member,
                        assignment.generation,
                        assignment.partitions,
                        assignment.release,
                    )
                )
        elif m.kind == "released":
            if m.generation <= c.generation:
                accepted = c.released(m.member, m.partitions, m.generation)
                if accepted:
                    self._record(f"{m.member} released {sorted(accepted)}")
                    self.accepted[m.member] = self.accepted.get(m.member, frozenset()) | accepted
        elif c.leave(m.member, self.now_ms):
            self._record(f"{m.member} leaves")
            self.removed.add(m.member)

    def _coordinator_tick(self) -> None:
        c = self.coordinator
        assert c is not None
        for member in c.expire(self.now_ms):
            self._record(f"{member} expired")
            self.removed.add(member)
        generation = c.tick(self.now_ms)
        if generation is not None:
            self._record(f"store generation {generation}")
            self.storing = (self.incarnation, generation)
            delay = self.rng.randint(1, self.options.store_ms_max)
            self.push(
                delay, _Timer("store-done", incarnation=self.incarnation, generation=generation)
            )
            if self.bugs.announce_before_store:
                c.generation_stored(generation)
                self.rebalances += 1
        self.push(coordinator_tick_ms, _Timer("coordinator-tick", incarnation=self.incarnation))

    def _store_done(self, incarnation: int, generation: Generation) -> None:
        if self.storing != (incarnation, generation):
            return  # the host crashed while storing
        self.storing = None
        self.durable = max(self.durable, generation)
        if not self.bugs.announce_before_store:
            assert self.coordinator is not None
            self.coordinator.generation_stored(generation)
            self.rebalances += 1
        self._record(f"generation {generation} stored")

    # -- members

    def _new_member(self, slot: int) -> _Member:
        self.processes += 1
        return _Member(slot, self.processes)

    def _join(self, member: _Member) -> None:
        member.incarnation, member.member = None, None
        member.wanted = frozenset()  # claims nothing new until its new session's assignment
        self._send(_ToCoordinator("join", member.process, self.incarnation))
        self.push(
            4 * self.options.heartbeat_ms, _Timer("rejoin", member.slot, process=member.process)
        )

    def _at_member(self, m: _ToMember) -> None:
        member = self.members[_slot_of(self.members, m.process)] if self._alive(m.process) else None
        if member is None:
            return
        if member.paused:
            member.backlog.append(m)
            return
        if m.kind in _FROM_COORDINATOR and (
            self.coordinator is None or m.incarnation != self.incarnation
        ):
            return  # from a coordinator that crashed since: its connection is gone
        if m.kind == "joined":
            if member.incarnation is None and m.incarnation == self.incarnation:
                member.incarnation, member.member = m.incarnation, m.member
                member.generation = Generation(0)
            elif m.incarnation == self.incarnation:  # a duplicate join's member: leave it
                self._send(_ToCoordinator("leave", member.process, m.incarnation, m.member))
        elif m.kind == "broken":
            if member.incarnation == m.incarnation:
                self._join(member)  # keeps what it holds until a new assignment says otherwise
        elif m.kind in ("assignment", "unknown"):
            self._assignment(member, m)
        else:
            self._at_link(member, m)

    def _assignment(self, member: _Member, m: _ToMember) -> None:
        if (member.incarnation, member.member) != (m.incarnation, m.member):
            return  # an answer to an earlier session
        if m.kind == "unknown":
            self._record(f"p{member.process} is unknown as {m.member}")
            for p in list(member.holding):
                self._drop(member, p)
            self._join(member)
            return
        if m.generation < member.generation:
            return  # reordered: an older answer
        member.generation = m.generation
        member.wanted = m.partitions
        for p in list(member.holding):
            if p not in m.partitions:
                self._drop(member, p)
        if m.release:
            self._send(
                _ToCoordinator(
                    "released",
                    member.process,
                    m.incarnation,
                    m.member,
                    m.release,
                    m.generation,
                )
            )
        self._claim_wanted(member)

    def _at_link(self, member: _Member, m: _ToMember) -> None:
        """News from a replica about one of the member's claims."""
        p, claim = m.partition, m.claim
        if m.kind == "refused":
            member.claiming.discard(p)
            return
        assert claim is not None
        if m.kind == "granted":
            member.claiming.discard(p)
            if m.current:
                self._own(member, p, claim)
            else:
                member.waiting[p] = claim
        elif m.kind in ("active", "displaced") and member.waiting.get(p) == claim:
            del member.waiting[p]
            if m.kind == "active":
                self._own(member, p, claim)
            elif not self.bugs.forget_waiting_claims:  # `claim_partition` lets go of it
                self._let_go(member, p, claim, None)
        elif m.kind == "deposed" and member.holding.get(p) == claim:
            del member.holding[p]  # `_hold`: step down with what it finished, then let go
            if self.partitions[p].leader == claim.node:
                offset = member.received.get(p) or None
                self._link(
                    _ToPartition(
                        "step-down",
                        member.process,
                        p,
                        claim.node,
                        number=claim.number,
                        offset=offset,
                    ),
                    p,
                    claim.node,
                )
            else:  # the routing names another leader: the gateway refuses the step-down
                self._let_go(member, p, claim, None)
        elif m.kind == "gone":  # its replica stopped leading: the member's wait failed
            if member.holding.get(p) == claim:
                del member.holding[p]
                self._let_go(member, p, claim, None)
            elif member.waiting.get(p) == claim:
                del member.waiting[p]  # `claim_partition` fails, and lets go of it
                if not self.bugs.forget_waiting_claims:
                    self._let_go(member, p, claim, None)
        elif m.kind == "data" and member.holding.get(p) == claim:
            key = (member.process, p)
            self.delivered[key] = max(self.delivered.get(key, 0), m.upto)
            member.received[p] = max(member.received.get(p, 0), m.upto)
            member.ends[p] = m.end

    def _own(self, member: _Member, p: PartitionId, claim: _Claim) -> None:
        """A claim became current: consume p if still wanted, else let go of it."""
        if p in member.wanted:
            member.holding[p] = claim
            member.received[p] = 0
        else:
            self._let_go(member, p, claim, None)

    def _claim_wanted(self, member: _Member) -> None:
        """Claim at its leader each partition wanted and neither held nor being claimed, with
        the generation it last heard."""
        busy = member.holding.keys() | member.waiting.keys() | member.claiming
        for p in sorted(member.wanted - busy):
            node = self.partitions[p].leader
            member.claiming.add(p)
            self._link(_ToPartition("claim", member.process, p, node, member.generation), p, node)

    def _drop(self, member: _Member, p: PartitionId) -> None:
        """Give up p: let go of it with what it received."""
        claim = member.holding.pop(p)
        offset = member.received.get(p, 0)
        if self.bugs.commit_past_delivered:
            offset = max(offset, member.ends.get(p, 0))
        self._let_go(member, p, claim, offset or None)

    def _let_go(self, member: _Member, p: PartitionId, claim: _Claim, offset: int | None) -> None:
        """`RemoteWriter.consumer_detach`: a detach with `offset` where the link is counted
        when the routing names it the leader; else a plain store of `offset` (no member
        number) at the leader and a let-go where the link is counted."""
        leader = self.partitions[p].leader
        if leader == claim.node:
            detach = _ToPartition(
                "detach", member.process, p, leader, number=claim.number, offset=offset
            )
            self._link(detach, p, leader)
        elif offset is not None:
            self._link(_ToPartition("commit", member.process, p, leader, offset=offset), p, leader)
        if leader != claim.node:
            let_go = _ToPartition("detach", member.process, p, claim.node, number=claim.number)
            self._link(let_go, p, claim.node)

    def _commit(self, member: _Member, p: PartitionId, claim: _Claim) -> None:
        """Store what it received, where the link is counted while it leads (the gateway
        refuses a member's store at another leader)."""
        offset = member.received.get(p, 0)
        if self.bugs.commit_past_delivered:
            offset = max(offset, member.ends.get(p, 0))
        if offset and self.partitions[p].leader == claim.node:
            self._link(
                _ToPartition(
                    "commit", member.process, p, claim.node, number=claim.number, offset=offset
                ),
                p,
                claim.node,
            )

    def _alive(self, process: Process) -> bool:
        return any(m.process == process and m.alive for m in self.members)

    # -- the partitions' replicas (production ownership under a model of their shells)

    def _at_partition(self, m: _ToPartition) -> None:
        part = self.partitions[m.partition]
        replica = part.nodes[m.node]
        if m.kind == "claim":
            self._claim(m, part, replica)
        elif m.kind == "commit":
            self._store(m, part, replica)
        elif m.kind == "step-down":
            self._step_down(m, part, replica)
        elif m.kind == "detach":
            self._detach(m, part, replica)
        else:  # the process crashed: the node lets go of what its session counted
            numbers = list(replica.sessions.get(m.process, ()))
            if numbers:
                self._record(f"p{m.process}'s links {numbers} to {m.partition} at n{m.node} close")
            for number in numbers:
                self._release(replica, m.process, number)
        self._follow_owner(m.partition)

    def _claim(self, m: _ToPartition, part: _Partition, replica: _Replica) -> None:
        """`claiming.claim` at `replica`: decide, store what the decision raised, answer."""
        p = m.partition
        if part.leader != m.node:  # NotLeader
            self._link(_ToMember("refused", m.process, partition=p), p, m.node)
            return
        stored_epoch, stored_generation = part.epoch, part.generation
        if self.bugs.forget_epochs:
            stored_epoch, stored_generation = replica.soft_epoch, replica.soft_generation
        if self.bugs.stale_claims and not replica.groups.size(NAME):
            stored_epoch = stored_generation = 0
        try:
            claimed = ownership.decide_claim(
                replica, f"groups/{p}", NAME, None, stored_epoch, m.generation, stored_generation
            )
        except (AlreadyExists, Unavailable):
            self._link(_ToMember("refused", m.process, partition=p), p, m.node)
            return
        claim = _Claim(m.process, m.node, claimed.member, m.generation)
        self._check_grant(p, claim, claimed.epoch)
        for reserved, value in claimed.stores:  # durable at once: the log's job
            if reserved == _EPOCH_NAME:
                part.epoch = replica.soft_epoch = value
            else:
                assert reserved == _GENERATION_NAME
                part.generation = replica.soft_generation = value
        replica.sessions.setdefault(m.process, []).append(claimed.member)
        replica.links[claimed.member] = claim
        self._record(
            f"p{m.process} claims {p} at n{m.node} as {claimed.member} in generation "
            f"{m.generation}, epoch {claimed.epoch}" + ("" if claimed.current else ", waits")
        )
        granted = _ToMember("granted", m.process, partition=p, claim=claim, current=claimed.current)
        self._link(granted, p, m.node)
        if claimed.current:
            self._current(p, part, replica, claim)
        else:
            replica.groups.watch(NAME, claim.number, lambda now: self._turn(p, claim, now))
        if claimed.holder is not None:
            numbers = (claimed.holder, claimed.member)
            takeover = _Timer("takeover", p, node=m.node, numbers=numbers)
            self.push(self.options.takeover_ms, takeover)

    def _turn(self, p: PartitionId, claim: _Claim, active: bool) -> None:
        """A waiting claim's watcher: its turn came (or it left, or was displaced)."""
        part = self.partitions[p]
        self._link(
            _ToMember("active" if active else "displaced", claim.process, partition=p, claim=claim),
            p,
            claim.node,
        )
        if active:
            self._current(p, part, part.nodes[claim.node], claim)

    def _current(self, p: PartitionId, part: _Partition, replica: _Replica, claim: _Claim) -> None:
        """`claim` owns p now: it starts after the committed offset."""
        handed = self.handing_over.get(p)
        if handed is not None and part.committed < handed:
            raise InvariantViolation(
                "handover-commit",
                f"partition {p}: p{claim.process} starts after {part.committed}; the holder "
                f"it waited for stepped down having finished {handed}",
            )
        self._record(f"p{claim.process} owns {p} at n{claim.node} as {claim.number}")
        self.owners[p] = claim
        part.sent = part.committed

        def deposed(now: bool) -> None:
            if now:
                self._link(
                    _ToMember("deposed", claim.process, partition=p, claim=claim), p, claim.node
                )

        replica.groups.watch_deposed(NAME, claim.number, deposed)

    def _store(self, m: _ToPartition, part: _Partition, replica: _Replica) -> bool:
        """`ReplicatedPartition.store_offset` of the committed offset: at the leader, fenced
        by the member number it carries."""
        assert m.offset is not None
        if part.leader != m.node:
            return False  # NotLeader
        if not self.bugs.commit_from_deposed:
            try:
                ownership.check_store(replica.groups, f"groups/{m.partition}", NAME, m.number)
            except FailedPrecondition:
                return False
        self._check_commit(m)
        part.committed = m.offset
        self.commits += 1
        return True

    def _step_down(self, m: _ToPartition, part: _Partition, replica: _Replica) -> None:
        """`ReplicatedPartition.step_down` (store what the holder finished, then the next
        claim's turn), then the gateway lets go of the link."""
        p = m.partition
        if part.leader == m.node:  # else NotLeader: the store fails, the turn is not given
            if m.offset is not None:
                self.handing_over[p] = m.offset
            if self.bugs.promote_before_store:
                replica.groups.stepped_down(NAME, m.number)
                if m.offset is not None:
                    self._store(m, part, replica)
            elif m.offset is None or self._store(m, part, replica):
                replica.groups.stepped_down(NAME, m.number)
            self.handing_over.pop(p, None)
        self._detach(replace(m, offset=None), part, replica)

    def _detach(self, m: _ToPartition, part: _Partition, replica: _Replica) -> None:
        """The node's wire server, CONSUMER_DETACH: a let-go (no offset), or a detach at a
        replica that does not lead, counts down a link this session counted; with an offset,
        at the leader, a link counted here stores (if it owns p) and lets go
        (`consumer_detach`), one counted elsewhere only stores."""
        counted = m.number in replica.sessions.get(m.process, ())
        if m.offset is None or part.leader != m.node:  # NotLeader: nothing stored
            if counted:
                self._release(replica, m.process, m.number)
            return
        if not counted:
            self._store(m, part, replica)
            return
        if self.bugs.commit_from_deposed or replica.groups.active(NAME) == m.number:
            self._store(m, part, replica)
        self._release(replica, m.process, m.number)

    def _release(self, replica: _Replica, process: Process, number: int) -> None:
        replica.sessions[process].remove(number)
        replica.links.pop(number, None)
        ownership.release(replica, NAME, number)

    def _takeover(self, p: PartitionId, node: int, holder: int, claimer: int) -> None:
        """The bound on a takeover (`claiming.claim`'s timer): `ownership.drop_holder`."""
        replica = self.partitions[p].nodes[node]
        before = replica.groups.active(NAME)
        ownership.drop_holder(replica, NAME, holder, claimer)
        if replica.groups.active(NAME) != before:
            self._record(f"{holder} dropped from {p} at n{node}: it did not step down in time")
        self._follow_owner(p)

    def _follow_owner(self, p: PartitionId) -> None:
        """The checker's owner stops being it once its leader's group no longer has it
        current (it stepped down, left or was dropped; or the leader changed)."""
        owner = self.owners.get(p)
        if owner is None:
            return
        part = self.partitions[p]
        if part.leader != owner.node or part.leading.groups.active(NAME) != owner.number:
            del self.owners[p]

    def _change_leader(self, p: PartitionId) -> None:
        """`ReplicatedPartition.report_leader` at the replica that stops leading: its waits
        fail (the members are told), its groups are disbanded; another replica leads. Half
        the time the old leader was cut off from the members too: they are told only when
        their sessions' loss is noticed, 100-2000 ms later, while the routing names the new
        leader at once."""
        part = self.partitions[p]
        old = part.leading
        group = old.groups.groups.get(NAME)
        notice_ms = self.rng.choice((0, self.rng.randint(100, 2000)))
        self._record(f"partition {p} changes leader (n{old.node}: {group}, notice {notice_ms})")
        for number in group.members if group is not None else ():
            claim = old.links[number]
            gone = _ToMember("gone", claim.process, partition=p, claim=claim)
            self._link(gone, p, old.node, notice_ms)
        old.groups.disband()
        part.leader = self.rng.choice([n for n in range(replicas) if n != old.node])
        part.leading.soft_epoch = part.leading.soft_generation = 0
        self._follow_owner(p)

    def _partition_tick(self, p: PartitionId) -> None:
        part = self.partitions[p]
        part.end += self.rng.randint(0, 4)
        leader = part.leading
        number = leader.groups.active(NAME)
        if number is not None and part.sent < part.end:
            part.sent = min(part.end, part.sent + self.rng.randint(1, 3))
            owner = leader.links[number]
            self._link(
                _ToMember(
                    "data", owner.process, partition=p, claim=owner, upto=part.sent, end=part.end
                ),
                p,
                leader.node,
            )
        self.push(partition_tick_ms, _Timer("partition-tick", p))

    # -- timers and faults

    def _timer(self, t: _Timer) -> None:
        if t.kind == "coordinator-tick":
            if self.coordinator is not None and t.incarnation == self.incarnation:
                self._coordinator_tick()
        elif t.kind == "store-done":
            self._store_done(t.incarnation, t.generation)
        elif t.kind == "coordinator-restart":
            self._start_coordinator()
        elif t.kind == "partition-tick":
            self._partition_tick(PartitionId(t.who))
        elif t.kind == "takeover":
            self._takeover(PartitionId(t.who), t.node, *t.numbers)
        elif t.kind == "fault":
            if self.faults:
                self._fault()
                self.push(self._fault_delay(), _Timer("fault"))
        else:
            self._member_timer(t)

    def _member_timer(self, t: _Timer) -> None:
        member = self.members[t.who]
        if t.kind == "member-restart":
            self.members[t.who] = member = self._new_member(t.who)
            self._record(f"member slot {t.who} restarts as p{member.process}")
            self._join(member)
            return
        if t.kind == "resume":
            if t.process == member.process and member.alive:
                self._record(f"p{member.process} resumes ({len(member.backlog)} waiting)")
                member.paused = False
                backlog, member.backlog = member.backlog, []
                for event in backlog:
                    if isinstance(event, _ToMember):
                        self._at_member(event)
                    else:
                        self._member_timer(event)
            return
        if member.paused:
            member.backlog.append(t)
            return
        if t.kind == "heartbeat":
            if member.alive and member.incarnation is not None and member.member is not None:
                self._send(
                    _ToCoordinator("heartbeat", member.process, member.incarnation, member.member)
                )
            self.push(self.options.heartbeat_ms, _Timer("heartbeat", t.who))
        elif t.kind == "commit":
            if member.alive:
                for p, claim in sorted(member.holding.items()):
                    self._commit(member, p, claim)
                # a refused claim is tried again, with the generation the member last heard
                self._claim_wanted(member)
            self.push(self.rng.randint(20, 100), _Timer("commit", t.who))
        elif (
            t.kind == "rejoin"
            and member.alive
            and t.process == member.process
            and member.incarnation is None  # the join or its answer was lost
        ):
            self._join(member)

    def _fault(self) -> None:
        o = self.options
        weights = (
            o.coordinator_crash_weight,
            o.member_crash_weight,
            o.leave_weight,
            o.isolate_weight,
            o.leader_weight,
            o.pause_weight,
        )
        if not sum(weights):
            return
        kinds = ("coordinator", "member", "leave", "isolate", "leader", "pause")
        kind = self.rng.choices(kinds, weights)[0]
        if kind == "leader":
            self._change_leader(PartitionId(self.rng.randrange(o.partitions)))
        if kind == "coordinator" and self.coordinator is not None:
            self._crash_coordinator()
        elif kind in ("member", "leave", "isolate", "pause"):
            member = self.members[self.rng.randrange(len(self.members))]
            if not member.alive or member.paused:
                return
            if kind == "pause":
                pause_ms = self.rng.randint(100, 3000)
                self._record(f"p{member.process} pauses for {pause_ms} ms")
                member.paused = True
                self.push(pause_ms, _Timer("resume", member.slot, process=member.process))
            elif kind == "isolate":
                until = self.now_ms + self.rng.randint(500, 3000)
                self._record(f"p{member.process} cut off from the coordinator until {until}")
                self.isolated[member.process] = until
            elif kind == "member":
                self._record(f"crash p{member.process}")
                self.member_crashes += 1
                member.alive = False
                for p in range(o.partitions):  # its sessions close, after what it sent
                    for node in range(replicas):
                        closed = _ToPartition("closed", member.process, PartitionId(p), node)
                        self._link(closed, PartitionId(p), node, self.rng.randint(1, 50))
                self.push(self.rng.randrange(*restart_ms), _Timer("member-restart", member.slot))
            elif member.incarnation is not None and member.member is not None:
                self._record(f"p{member.process} leaves")
                for p in list(member.holding):
                    self._drop(member, p)
                self._send(
                    _ToCoordinator("leave", member.process, member.incarnation, member.member)
                )
                self._join(member)

    def heal_all(self) -> None:
        self._record("heal")
        self.faults = False
        self.isolated.clear()

    # -- invariants

    def _check(self) -> None:
        c = self.coordinator
        if c is not None:
            if c.generation > self.durable:
                raise InvariantViolation(
                    "generation-stored",
                    f"members see generation {c.generation}; the stored one is {self.durable}",
                )
            if self.observed is None:
                if c.generation < self.generation_seen:
                    raise InvariantViolation(
                        "generation-monotonic",
                        f"coordinator {self.incarnation} starts at {c.generation} after "
                        f"{self.generation_seen} was seen",
                    )
            elif c.generation != self.observed and c.generation <= self.generation_seen:
                raise InvariantViolation(
                    "generation-monotonic",
                    f"coordinator {self.incarnation} moved to generation {c.generation}; "
                    f"{self.generation_seen} was seen before",
                )
            self.observed = c.generation
            self.generation_seen = max(self.generation_seen, c.generation)
            holders = {}
            for p in range(self.options.partitions):
                holder = c.holder(PartitionId(p))
                if holder is not None:
                    holders[PartitionId(p)] = holder
            for p, before in self.holders.items():
                if holders.get(p) != before and not (
                    before in self.removed or p in self.accepted.get(before, frozenset())
                ):
                    raise InvariantViolation(
                        "single-owner",
                        f"partition {p} went from member {before} to {holders.get(p)} "
                        f"(generation {c.generation}) without a release",
                    )
            self.holders = holders
        self.accepted, self.removed = {}, set()

    def _check_grant(self, p: PartitionId, claim: _Claim, epoch: int) -> None:
        first = self.grants.setdefault((p, claim.generation), claim.process)
        if first != claim.process:
            raise InvariantViolation(
                "owner-per-generation",
                f"partition {p} generation {claim.generation} granted to p{first} "
                f"and p{claim.process}",
            )
        owner = self.owners.get(p)
        highest = self.highest.get(p, GENERATION_NONE)
        if claim.generation < highest or (
            owner is not None and claim.generation <= owner.generation
        ):
            raise InvariantViolation(
                "ownership-fence",
                f"partition {p} granted to p{claim.process} in generation {claim.generation}; "
                f"highest {highest}, owner {owner}",
            )
        if epoch <= self.epochs.get(p, 0):
            raise InvariantViolation(
                "ownership-fence",
                f"partition {p} granted to p{claim.process} with epoch {epoch}; epoch "
                f"{self.epochs[p]} was granted before",
            )
        self.highest[p] = max(highest, claim.generation)
        self.epochs[p] = epoch

    def _check_commit(self, m: _ToPartition) -> None:
        p, owner = m.partition, self.owners.get(m.partition)
        if owner is None or (owner.process, owner.node, owner.number) != (
            m.process,
            m.node,
            m.number,
        ):
            raise InvariantViolation(
                "commit-fenced",
                f"partition {p}: commit {m.offset} accepted from p{m.process} (member "
                f"{m.number} at n{m.node}); the owner is {owner}",
            )
        delivered = self.delivered.get((m.process, p), 0)
        assert m.offset is not None
        if m.offset > delivered:
            raise InvariantViolation(
                "commit-not-ahead",
                f"partition {p}: commit {m.offset} from p{m.process}, which received "
                f"up to {delivered}",
            )

    # -- liveness

    def live(self) -> bool:
        return self._not_live() is None

    def _not_live(self) -> str | None:
        c = self.coordinator
        if c is None:
            return "the coordinator is down"
        if c.state is not GroupState.STABLE:
            return f"the group is {c.state.value}: {c.describe()}"
        sessions = {}
        for member in self.members:
            if not member.alive or member.incarnation != self.incarnation:
                return f"p{member.process} is not in the group"
            assert member.member is not None
            if member.generation != c.generation:
                return f"p{member.process} has not heard generation {c.generation}"
            sessions[member.member] = member
        if set(c.members) != set(sessions):
            return f"members {c.members}, sessions {sorted(sessions)}"
        for p in range(self.options.partitions):
            holder = c.holder(PartitionId(p))
            if holder is None:
                return f"partition {p} has no holder"
            member = sessions[holder]
            leader = self.partitions[p].leading
            number = leader.groups.active(NAME)
            owner = None if number is None else leader.links[number]
            if owner is None or owner.process != member.process:
                return f"partition {p}: held by p{member.process}, owned by {owner} at its leader"
            if member.holding.get(PartitionId(p)) != owner:
                return f"partition {p}: owned by {owner}; p{member.process} holds {member.holding}"
            counts = [r.attached.get(NAME, 0) for r in self.partitions[p].nodes]
            if sum(counts) != 1:
                return f"partition {p}: its replicas count {counts} links of the group"
        return None

    def liveness_failure(self) -> str:
        return self._not_live() or "?"

    def final_checks(self) -> None:
        c = self.coordinator
        assert c is not None
        members = c.members
        holders = {PartitionId(p): c.holder(PartitionId(p)) for p in range(self.options.partitions)}
        if c.strategy != "sticky":
            if holders != compute_target(c.strategy, c.partitions, members, {}):
                raise InvariantViolation("quiet-target", f"{c.strategy}: {holders} for {members}")
            return
        counts = [sum(1 for h in holders.values() if h == m) for m in members]
        low = c.partitions // len(members)
        if not all(low <= n <= low + 1 for n in counts):
            raise InvariantViolation("quiet-target", f"sticky unbalanced: {holders}")


def _slot_of(members: list[_Member], process: Process) -> int:
    return next(m.slot for m in members if m.process == process)


def run_group_seed(
    seed: int, *, steps: int = 1500, bugs: GroupBugs = NO_BUGS, keep_trace: bool = False
) -> tuple[GroupResult, GroupSim]:
    options = replace(GroupOptions.draw(seed, steps=steps), bugs=bugs)
    sim = GroupSim(seed, options, keep_trace=keep_trace)
    return sim.run(), sim
