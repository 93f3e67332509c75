"""A consumer group under simulation: the production coordinator, its host, members and the
partitions' ownership layer (ADR 0015). `python -m spate.sim --model groups`.

One group over 1-6 partitions, drawn per seed with its strategy, rebalance delay and session
timeout. The parts:

- **coordinator host**: the production `spate.core.coordinator.Coordinator` under a model of
  its shell: every `coordinator_tick_ms` it calls `expire` and `tick`; a generation to store
  is written to the home partition (`$generation/<g>`, durable when the write completes after
  1-`store_ms_max` ms) and only then is `generation_stored` called. The host crashes (its soft
  state — members, targets — is gone; a store in flight is durable or lost, by a coin) and
  restarts 50-1000 ms later as a new incarnation from the last durable generation. Messages
  carry the incarnation they were sent to; others are dropped (a TCP connection does not
  survive its peer), and every member is told its connection broke.
- **members** (3-5 processes): join, heartbeat every `heartbeat_ms` (the heartbeat's answer
  carries the member's `Assignment`: members poll), claim each assigned partition at the
  ownership layer with the generation they were told, commit what they received, and on a
  `release` set commit, release at the ownership layer and report `released` to the
  coordinator. An unknown member (expired, or of a previous incarnation) joins again and
  drops what its new assignment does not list. Members crash (stop; the ownership layer
  notices the link closing 1-50 ms later) and restart as new processes; some leave and
  rejoin; some are cut off from the coordinator (not from the partitions) for 0.5-3 s, so
  they are expired while they still believe they hold partitions, and keep retrying claims
  with the generation they last heard.
- **ownership layer** (each partition's leader, ADR 0015, modelled): a claim for partition p
  in generation g is refused when g is below the highest generation p has seen, or when
  another member owns p in a generation not below g; otherwise the owner is deposed (told)
  and the claimant owns p, starting after p's committed offset. Messages are delivered only
  to the current owner; a commit is accepted only from p's current owner (process and
  generation). The log grows by itself. A partition's leader changes: ownership is
  node-local, so the owner is detached and claims again; the new leader reads the highest
  generation from the partition's log.
- **network**: every message delayed 1-`delay_ms_max` ms (so reordered), dropped with `loss`,
  duplicated with `duplication`.

Invariants (after every event):

- `generation-stored`: the coordinator's current generation (what members see) is durable;
- `generation-monotonic`: each new generation is above every generation seen before, across
  incarnations; a restarted coordinator never starts below one seen;
- `single-owner`: in one incarnation, a partition leaves its holder only through an accepted
  release or the holder's removal (so two members never hold it at once);
- `owner-per-generation`: the ownership layer grants (partition, generation) to one member
  process only;
- `ownership-fence`: a grant's generation is at least the highest p has seen, and above a
  deposed owner's (one owner at any moment, across generations);
- `commit-not-ahead`: an accepted commit is at or below what the committing process received
  of that partition;
- `commit-fenced`: a commit is accepted only from the partition's current owner.

Liveness, after the faults stop: the group becomes Stable with every live member in it,
every partition owned at the ownership layer by its holder's process, and the holders are
the strategy's target for the members (`quiet-target`: round-robin and range exactly;
sticky balanced).

Planted bugs (`--model groups --bug ...`; tests/sim/test_groups_sim.py requires each to be
caught): `announce-before-store`, `forget-generation`, `assign-before-revoke`,
`stale-claims`, `forget-epochs`, `commit-from-deposed`, `commit-past-delivered` (see
`GroupBugs`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Literal

from spate.core.coordinator import (
    GENERATION_NONE,
    STRATEGIES,
    Coordinator,
    GroupFull,
    GroupState,
    Strategy,
    compute_target,
)
from spate.core.ids import Generation, MemberId, PartitionId
from spate.sim.checker import InvariantViolation
from spate.sim.loop import SimLoop

coordinator_tick_ms = 25
"""How often the host calls `expire` and `tick`."""
partition_tick_ms = 30
"""How often a partition's log grows and its leader sends to the owner."""
restart_ms = (50, 1000)
"""A crashed coordinator host or member restarts after a time drawn from this range."""
liveness_ms_max = 20_000
"""Simulated time the healed group gets to become Stable on its target."""
events_max = 200_000


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
    """The ownership layer grants a claim below p's highest generation while p has no owner
    (the seed's "MAY reset to zero when no links remain", which ADR 0015 does not use)."""
    forget_epochs: bool = False
    """A partition's new leader starts from generation 0 instead of the highest one stored in
    the partition's log (`$epoch/<g>`): the soft state taken for the durable one."""
    commit_from_deposed: bool = False
    """The ownership layer accepts a commit from any process that ever owned p."""
    commit_past_delivered: bool = False
    """Members commit the partition's end they were told of, not what they received."""


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
    leader_weight: int
    """A partition's leader changing: ownership is node-local, so the owner is detached and
    claims again at the new leader, which reads the highest generation from the log."""
    """Cutting a member off from the coordinator (not from the partitions) for a while: it
    is expired and its partitions go on without it while it still believes it holds them."""
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
class _ToMember:
    kind: Literal[
        "joined", "assignment", "unknown", "granted", "refused", "deposed", "data", "broken"
    ]
    process: Process
    incarnation: int = 0
    member: MemberId = _NO_MEMBER
    generation: Generation = GENERATION_NONE
    partitions: frozenset[PartitionId] = frozenset()
    release: frozenset[PartitionId] = frozenset()
    partition: PartitionId = _FIRST
    upto: int = 0
    end: int = 0


@dataclass(frozen=True, slots=True)
class _ToPartition:
    kind: Literal["claim", "commit", "release"]
    process: Process
    partition: PartitionId
    generation: Generation
    offset: int = 0


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
        "link-closed",
        "fault",
    ]
    who: int = 0
    incarnation: int = 0
    generation: Generation = GENERATION_NONE
    process: Process = 0


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
    holding: dict[PartitionId, Generation] = field(default_factory=dict)
    """Partitions granted at the ownership layer -> the claim's generation."""
    received: dict[PartitionId, int] = field(default_factory=dict)
    ends: dict[PartitionId, int] = field(default_factory=dict)
    wanted: frozenset[PartitionId] = frozenset()
    """The partitions its last assignment told it to keep."""


@dataclass
class _Partition:
    owner: tuple[Process, Generation] | None = None
    highest: Generation = GENERATION_NONE
    committed: int = 0
    end: int = 0
    sent: int = 0
    """Offset up to which the current owner was sent messages."""
    owned_by: set[Process] = field(default_factory=set)
    """Every process that ever owned it (for the `commit-from-deposed` bug)."""


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
        self.members = [self._new_member(slot) for slot in range(options.members)]
        self.partitions = [_Partition() for _ in range(options.partitions)]
        # checker state
        self.generation_seen = Generation(0)
        self.observed: Generation | None = None
        """The coordinator's generation at the last check (None: just restarted)."""
        self.holders: dict[PartitionId, MemberId] = {}
        self.accepted: dict[MemberId, frozenset[PartitionId]] = {}
        self.removed: set[MemberId] = set()
        self.grants: dict[tuple[PartitionId, Generation], Process] = {}
        self.highest: dict[PartitionId, Generation] = {}
        """The highest generation each partition granted (the checker's own record)."""
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

    def _send(self, message: _ToCoordinator | _ToMember | _ToPartition) -> None:
        if self.faults and self.rng.random() < self.options.loss:
            return
        if (
            isinstance(message, _ToCoordinator)
            or (isinstance(message, _ToMember) and message.kind in _FROM_COORDINATOR)
        ) and self.isolated.get(message.process, 0) > self.now_ms:
            return
        copies = 2 if self.faults and self.rng.random() < self.options.duplication else 1
        for _ in range(copies):
            self.push(self.rng.randint(1, self.options.delay_ms_max), message)

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
            for p in sorted(m.partitions - member.holding.keys()):
                self._send(_ToPartition("claim", member.process, p, m.generation))
        elif m.kind == "granted":
            held = member.holding.get(m.partition)
            fresh = held is None or m.generation > held  # else a late answer to an earlier claim
            if fresh and m.partition in member.wanted:
                member.holding[m.partition] = m.generation  # the leader's owner is this claim
            elif fresh:  # no longer wanted: give it back
                self._send(_ToPartition("release", member.process, m.partition, m.generation))
        elif m.kind == "deposed":
            if member.holding.get(m.partition) == m.generation:
                del member.holding[m.partition]
        elif m.kind == "data" and member.holding.get(m.partition) == m.generation:
            key = (member.process, m.partition)
            self.delivered[key] = max(self.delivered.get(key, 0), m.upto)
            member.received[m.partition] = max(member.received.get(m.partition, 0), m.upto)
            member.ends[m.partition] = m.end

    def _drop(self, member: _Member, p: PartitionId) -> None:
        """Stop consuming p: commit what was received, then release it at its leader."""
        generation = member.holding.pop(p)
        self._commit(member, p, generation)
        self._send(_ToPartition("release", member.process, p, generation))

    def _commit(self, member: _Member, p: PartitionId, generation: Generation) -> None:
        offset = member.received.get(p, 0)
        if self.bugs.commit_past_delivered:
            offset = max(offset, member.ends.get(p, 0))
        if offset:
            self._send(_ToPartition("commit", member.process, p, generation, offset))

    def _alive(self, process: Process) -> bool:
        return any(m.process == process and m.alive for m in self.members)

    # -- the ownership layer

    def _at_partition(self, m: _ToPartition) -> None:
        part = self.partitions[m.partition]
        if m.kind == "claim":
            self._claim(m, part)
        elif m.kind == "release":
            if part.owner == (m.process, m.generation):
                self._record(f"p{m.process} releases {m.partition} at its leader")
                part.owner = None
        else:
            current = part.owner is not None and part.owner == (m.process, m.generation)
            if current or (self.bugs.commit_from_deposed and m.process in part.owned_by):
                self._check_commit(m, part)
                part.committed = m.offset
                self.commits += 1

    def _claim(self, m: _ToPartition, part: _Partition) -> None:
        p, owner = m.partition, part.owner
        if owner == (m.process, m.generation):
            granted = True  # a repeated claim
        elif owner is None:
            granted = m.generation >= part.highest or self.bugs.stale_claims
        else:
            granted = m.generation > owner[1] and m.generation >= part.highest
        if not granted:
            self._send(_ToMember("refused", m.process, partition=p, generation=m.generation))
            return
        if owner != (m.process, m.generation):
            self._check_grant(m, part)
            if owner is not None and owner[0] != m.process:
                self._record(f"p{owner[0]} deposed from {p} (generation {owner[1]})")
                self._send_reliably(
                    _ToMember("deposed", owner[0], partition=p, generation=owner[1])
                )
            self._record(f"p{m.process} owns {p} in generation {m.generation}")
            part.owner = (m.process, m.generation)
            part.highest = max(part.highest, m.generation)
            part.sent = part.committed
            part.owned_by.add(m.process)
        self._send(_ToMember("granted", m.process, partition=p, generation=m.generation))

    def _change_leader(self, p: PartitionId) -> None:
        part = self.partitions[p]
        self._record(f"partition {p} changes leader (owner {part.owner})")
        if part.owner is not None:
            process, generation = part.owner
            self._send_reliably(_ToMember("deposed", process, partition=p, generation=generation))
        part.owner = None
        part.owned_by.clear()
        if self.bugs.forget_epochs:
            part.highest = GENERATION_NONE

    def _partition_tick(self, p: PartitionId) -> None:
        part = self.partitions[p]
        part.end += self.rng.randint(0, 4)
        if part.owner is not None and part.sent < part.end:
            part.sent = min(part.end, part.sent + self.rng.randint(1, 3))
            process, generation = part.owner
            self._send(
                _ToMember(
                    "data",
                    process,
                    partition=p,
                    generation=generation,
                    upto=part.sent,
                    end=part.end,
                )
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
        elif t.kind == "fault":
            if self.faults:
                self._fault()
                self.push(self._fault_delay(), _Timer("fault"))
        elif t.kind == "link-closed":
            for p, part in enumerate(self.partitions):
                if part.owner is not None and part.owner[0] == t.process:
                    self._record(f"p{t.process}'s link to {p} closed")
                    part.owner = None
        else:
            self._member_timer(t)

    def _member_timer(self, t: _Timer) -> None:
        member = self.members[t.who]
        if t.kind == "member-restart":
            self.members[t.who] = member = self._new_member(t.who)
            self._record(f"member slot {t.who} restarts as p{member.process}")
            self._join(member)
            return
        if t.kind == "heartbeat":
            if member.alive and member.incarnation is not None and member.member is not None:
                self._send(
                    _ToCoordinator("heartbeat", member.process, member.incarnation, member.member)
                )
            self.push(self.options.heartbeat_ms, _Timer("heartbeat", t.who))
        elif t.kind == "commit":
            for p, generation in sorted(member.holding.items()) if member.alive else ():
                self._commit(member, p, generation)
            for p in sorted(member.wanted - member.holding.keys()) if member.alive else ():
                # a claim refused or lost is tried again, with what the member last heard
                self._send(_ToPartition("claim", member.process, p, member.generation))
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
        )
        if not sum(weights):
            return
        kind = self.rng.choices(("coordinator", "member", "leave", "isolate", "leader"), weights)[0]
        if kind == "leader":
            self._change_leader(PartitionId(self.rng.randrange(o.partitions)))
        if kind == "coordinator" and self.coordinator is not None:
            self._crash_coordinator()
        elif kind in ("member", "leave", "isolate"):
            member = self.members[self.rng.randrange(len(self.members))]
            if not member.alive:
                return
            if kind == "isolate":
                until = self.now_ms + self.rng.randint(500, 3000)
                self._record(f"p{member.process} cut off from the coordinator until {until}")
                self.isolated[member.process] = until
            elif kind == "member":
                self._record(f"crash p{member.process}")
                self.member_crashes += 1
                member.alive = False
                self.push(self.rng.randint(1, 50), _Timer("link-closed", process=member.process))
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

    def _check_grant(self, m: _ToPartition, part: _Partition) -> None:
        first = self.grants.setdefault((m.partition, m.generation), m.process)
        if first != m.process:
            raise InvariantViolation(
                "owner-per-generation",
                f"partition {m.partition} generation {m.generation} granted to p{first} "
                f"and p{m.process}",
            )
        owner = part.owner
        highest = self.highest.get(m.partition, GENERATION_NONE)
        if m.generation < highest or (
            owner is not None and owner[0] != m.process and m.generation <= owner[1]
        ):
            raise InvariantViolation(
                "ownership-fence",
                f"partition {m.partition} granted to p{m.process} in generation {m.generation}; "
                f"highest {highest}, owner {owner}",
            )
        self.highest[m.partition] = max(highest, m.generation)

    def _check_commit(self, m: _ToPartition, part: _Partition) -> None:
        if part.owner != (m.process, m.generation):
            raise InvariantViolation(
                "commit-fenced",
                f"partition {m.partition}: commit {m.offset} accepted from p{m.process} "
                f"(generation {m.generation}); the owner is {part.owner}",
            )
        delivered = self.delivered.get((m.process, m.partition), 0)
        if m.offset > delivered:
            raise InvariantViolation(
                "commit-not-ahead",
                f"partition {m.partition}: commit {m.offset} from p{m.process}, which received "
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
            owner = self.partitions[p].owner
            if holder is None:
                return f"partition {p} has no holder"
            process = sessions[holder].process
            if (
                owner is None
                or owner[0] != process
                or PartitionId(p) not in sessions[holder].holding
            ):
                return f"partition {p}: held by p{process}, owned by {owner} at its leader"
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
