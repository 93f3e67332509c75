"""The consumer-group coordinator of one (stream, group) (pure; ADR 0015, 003 "Consumer Groups").

Members join (numbered 1, 2, ... in joining order), heartbeat and leave; a member silent for
longer than its session timeout is expired. Any of these is a *change*; a rebalance is due
`rebalance_delay_ms` after the first change not yet rebalanced, so changes within the delay
are coalesced into one rebalance. A rebalance gives the group a new *generation* (one more
than the last) and a *target*: which member should own which of the partitions 0..N-1, by the
group's strategy over the members in joining order:

- `round-robin`: partition i to member i mod M (6 partitions, 3 members: [0,3] [1,4] [2,5]);
- `range`: contiguous ranges, the first N mod M members one more ([0,1] [2,3] [4,5]);
- `sticky`: every member keeps what it was given in the last target, up to its quota (N // M,
  or one more for N mod M of them: those holding the most, then the earliest joined), keeping
  its lowest-numbered partitions; the surplus of the members above their quota and the
  partitions without a member go, lowest first, to the members below theirs in joining order.
  A new member thus takes from the most loaded. This moves the fewest partitions a balanced
  target can (`sticky_moves_min`): the members allowed one more are the ones that would
  otherwise give one up.

Members beyond the partition count get nothing (they are *pending*: still members, and given
partitions when others leave); `members_max` joins at most.

**Store before announce.** Starting a rebalance (`tick`) only says which generation to store
(`generation_to_store`); the shell stores it (`$generation/<g>` in the home partition's log)
and calls `generation_stored(g)`. Only then is the target computed — from the members present
then, so changes during the store are in it — and does any member see generation g. A
coordinator started on another node begins from the stored generation (`generation=`), so the
next one is above every generation any member ever saw.

**Revoke before assign.** A partition whose target member differs from its holder stays with
the holder (in its `release` set) until the holder reports it `released` — after storing what
it finished — or is removed (left or expired); only then is it given to its target. Partitions
that stay with their holder are not interrupted: they carry on under the new generation.

Invariants (asserted in `_check` after every change; tests/core/test_coordinator.py checks
them from outside over random histories):

1. single owner: a partition has at most one holder at every moment, and moves from one
   member to another only through an accepted release or the holder's removal;
2. the generation only increases, by one per rebalance, and a member only ever sees (and is
   given partitions under) the current generation, which has been stored;
3. a member holds only partitions the current or an earlier target gave it, and is told to
   release exactly those the current target gives to someone else;
4. when the group is quiet (no change pending, no store in flight, every release done) the
   holders are the strategy's target for the members present (`state` is Stable);
5. sticky moves the fewest partitions that a balanced target can.

`check_commit` is Kafka's generation check for a shell that keeps commits at the coordinator;
in Spate the partition's leader fences commits by ownership epoch (ADR 0015), and the
generation is the epoch the member claims with.

Node-local soft state, like `ActiveGroups`: only the generation is durable. Member numbers
are per coordinator: a member of a previous coordinator is unknown here and joins again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal, Protocol

from spate.core import groups, limits
from spate.core.errors import InvalidArgument, ResourceLimitExceeded
from spate.core.ids import Generation, MemberId, PartitionId

Strategy = Literal["round-robin", "range", "sticky"]
STRATEGIES: tuple[Strategy, ...] = ("round-robin", "range", "sticky")

GENERATION_NONE = Generation(0)
"""Before a group's first rebalance; the first one is generation 1."""

Target = dict[PartitionId, MemberId]
"""partition -> the member that should own it (absent: no member at all)."""


class GroupFull(ResourceLimitExceeded):
    """A join past the group's `members_max` (retryable: members leave)."""


class GroupState(Enum):
    """003 "Consumer Group Statistics"."""

    STABLE = "Stable"
    """Nothing to do: every partition is with its target member (or there are no members)."""
    REBALANCING = "Rebalancing"
    """A rebalance is due or being stored, or partitions wait for a release or a member."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """What a member polls: its partitions under `generation`."""

    generation: Generation
    partitions: frozenset[PartitionId]
    """Held and staying: consume these (claim them with `generation` if not yet claimed)."""
    release: frozenset[PartitionId]
    """Held but given to another member: stop, store what was finished, then `released`."""


@dataclass(frozen=True, slots=True)
class MemberView:
    member: MemberId
    partitions: frozenset[PartitionId]
    release: frozenset[PartitionId]
    last_heartbeat_ms: int
    session_timeout_ms: int


@dataclass(frozen=True, slots=True)
class GroupView:
    """`describe()`: 003's group statistics and what a shell needs to explain a stall."""

    strategy: Strategy
    partitions: int
    generation: Generation
    state: GroupState
    members: tuple[MemberView, ...]
    """In joining order."""
    awaiting_release: frozenset[PartitionId]
    """Held by a member that must release them first."""
    unassigned: frozenset[PartitionId]
    """Held by nobody (their target member left, or there are no members)."""
    storing: Generation | None
    rebalance_due_ms: int | None
    now_ms: int = 0
    """The coordinator's clock when described: a member's heartbeat age is `now_ms -
    last_heartbeat_ms` (both on the coordinator's clock, which other processes do not share)."""


PENDING_MAX_DEFAULT = 16
"""Members beyond the partition count a group keeps waiting for a partition (000 §4.5.1,
scenario 2); the next one is refused with `amqp:link:detach-forced`."""


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """How a group rebalances: its definition's (`spate group create`) or the defaults."""

    strategy: Strategy = "round-robin"
    session_timeout_ms: int = limits.group_session_timeout_ms_default
    rebalance_delay_ms: int = limits.group_rebalance_delay_ms_default
    pending_max: int = PENDING_MAX_DEFAULT

    def check(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InvalidArgument(f"strategy {self.strategy!r}: one of {', '.join(STRATEGIES)}")

    @staticmethod
    def of(definition: groups.GroupDefinition | None) -> GroupSettings:
        """A defined group's settings (`spate group create`), else the defaults."""
        if definition is None:
            return GroupSettings()
        strategy = definition.strategy.value
        assert strategy in STRATEGIES, strategy
        return GroupSettings(
            strategy,  # the same three names
            definition.session_timeout_ms,
            definition.rebalance_delay_ms,
            definition.pending_max,
        )


class GroupCoordinator(Protocol):
    """What a member link uses (`Broker.group_coordinator`): the home leader's
    `spate.core.coordination.Coordinators`, here or over the gateway wire."""

    def join(self, group: str, settings: GroupSettings) -> Awaitable[MemberId]: ...

    def sync(
        self,
        group: str,
        member: MemberId,
        known: Assignment | None,
        timeout_s: float,
    ) -> Awaitable[Assignment]: ...

    def released(
        self, group: str, member: MemberId, partitions: Iterable[PartitionId], generation: int
    ) -> Awaitable[None]: ...

    def leave(self, group: str, member: MemberId) -> Awaitable[None]: ...

    def describe(self, group: str) -> Awaitable[GroupView | None]:
        """The group as its coordinator sees it now (`spate group describe`); None when the
        coordinator has no such group (no members since it started here)."""
        ...


# -- strategies (pure functions of the members in joining order)


def round_robin(partitions: int, members: Sequence[MemberId]) -> Target:
    if not members:
        return {}
    return {PartitionId(p): members[p % len(members)] for p in range(partitions)}


def range_assign(partitions: int, members: Sequence[MemberId]) -> Target:
    if not members:
        return {}
    quota, extra = divmod(partitions, len(members))
    target: Target = {}
    first = 0
    for index, member in enumerate(members):
        count = quota + (1 if index < extra else 0)
        for p in range(first, first + count):
            target[PartitionId(p)] = member
        first += count
    return target


def sticky(
    partitions: int, members: Sequence[MemberId], previous: Mapping[PartitionId, MemberId]
) -> Target:
    """Balanced (every member N // M or one more), moving the fewest of `previous`."""
    if not members:
        return {}
    quota, extra = divmod(partitions, len(members))
    order = {member: index for index, member in enumerate(members)}
    kept: dict[MemberId, list[PartitionId]] = {member: [] for member in members}
    for p in sorted(previous):
        if previous[p] in kept and 0 <= p < partitions:
            kept[previous[p]].append(p)
    ranked = sorted(members, key=lambda m: (-min(len(kept[m]), quota + 1), order[m]))
    allowed = {member: quota + (1 if index < extra else 0) for index, member in enumerate(ranked)}
    target: Target = {}
    for member in members:
        for p in kept[member][: allowed[member]]:
            target[p] = member
    free = [PartitionId(p) for p in range(partitions) if p not in target]
    free.reverse()  # pop() from the end gives the lowest first
    for member in members:
        for _ in range(allowed[member] - len(kept[member][: allowed[member]])):
            target[free.pop()] = member
    assert not free and len(target) == partitions, (free, target)
    return target


def sticky_moves_min(
    partitions: int, members: Sequence[MemberId], previous: Mapping[PartitionId, MemberId]
) -> int:
    """The fewest partitions of present members that any balanced target takes from them:
    each member gives up what it holds above N // M, except that N mod M of them may keep
    one more."""
    if not members:
        return 0
    quota, extra = divmod(partitions, len(members))
    held = [sum(1 for p, m in previous.items() if m == member) for member in members]
    over = sum(max(0, count - quota) for count in held)
    return over - min(extra, sum(1 for count in held if count > quota))


def compute_target(
    strategy: Strategy,
    partitions: int,
    members: Sequence[MemberId],
    previous: Mapping[PartitionId, MemberId],
) -> Target:
    if strategy == "round-robin":
        return round_robin(partitions, members)
    if strategy == "range":
        return range_assign(partitions, members)
    return sticky(partitions, members, previous)


# -- the coordinator


@dataclass(slots=True)
class _Member:
    session_timeout_ms: int
    last_heartbeat_ms: int


class Coordinator:
    """One (stream, group): members, the current generation and target, who holds what."""

    def __init__(
        self,
        partitions: int,
        strategy: Strategy,
        *,
        generation: Generation = GENERATION_NONE,
        rebalance_delay_ms: int = limits.group_rebalance_delay_ms_default,
        members_max: int = limits.group_members_max,
    ) -> None:
        assert 1 <= partitions <= limits.partitions_max, partitions
        assert strategy in STRATEGIES, strategy
        assert generation >= 0 and rebalance_delay_ms >= 0, (generation, rebalance_delay_ms)
        assert 1 <= members_max <= limits.group_members_max, members_max
        self.partitions = partitions
        self.strategy: Strategy = strategy
        self.rebalance_delay_ms = rebalance_delay_ms
        self.members_max = members_max
        self._generation = generation
        """The current generation: stored, and the one members see."""
        self._storing: Generation | None = None
        self._due_ms: int | None = None
        """When the next rebalance starts (first change not yet rebalanced + delay)."""
        self._members: dict[MemberId, _Member] = {}  # joining order
        self._next_member = 1
        self._target: Target = {}
        self._target_members: tuple[MemberId, ...] = ()
        self._holders: dict[PartitionId, tuple[MemberId, Generation]] = {}
        """partition -> (holder, the generation it was given in)."""
        self._now_ms = 0

    # -- inputs

    def join(self, now_ms: int, session_timeout_ms: int) -> MemberId:
        """A new member; it gets partitions at the next rebalance."""
        self._clock(now_ms)
        if not 0 < session_timeout_ms <= limits.group_session_timeout_ms_max:
            raise InvalidArgument(
                f"session timeout {session_timeout_ms} ms is outside 1.."
                f"{limits.group_session_timeout_ms_max} ms"
            )
        if len(self._members) >= self.members_max:
            raise GroupFull(
                f"the group has {len(self._members)} members, its limit (members_max); "
                "join again when one leaves"
            )
        member = MemberId(self._next_member)
        self._next_member += 1
        self._members[member] = _Member(session_timeout_ms, now_ms)
        self._changed(now_ms)
        self._check()
        return member

    def leave(self, member: MemberId, now_ms: int) -> bool:
        """`member` leaves (False: it was not here); what it held is free at once."""
        self._clock(now_ms)
        if member not in self._members:
            return False
        self._remove(member, now_ms)
        self._check()
        return True

    def heartbeat(self, member: MemberId, now_ms: int) -> bool:
        """False: `member` is unknown (expired, left, or of a previous coordinator) and must
        join again."""
        self._clock(now_ms)
        known = self._members.get(member)
        if known is None:
            return False
        known.last_heartbeat_ms = now_ms
        return True

    def expire(self, now_ms: int) -> list[MemberId]:
        """Remove the members silent for longer than their session timeout (joining order)."""
        self._clock(now_ms)
        expired = [
            member
            for member, known in self._members.items()
            if now_ms - known.last_heartbeat_ms > known.session_timeout_ms
        ]
        for member in expired:
            self._remove(member, now_ms)
        self._check()
        return expired

    def released(
        self, member: MemberId, partitions: Iterable[PartitionId], generation: Generation
    ) -> frozenset[PartitionId]:
        """`member` stopped consuming `partitions` (told in `generation`); returns those
        accepted: held by it since `generation` or before and given to someone else. A late
        or repeated report from an earlier holding is ignored. Accepted partitions go to their
        target member at once."""
        assert generation <= self._generation, (generation, self._generation)
        accepted: set[PartitionId] = set()
        for p in partitions:
            holder = self._holders.get(p)
            if (
                holder is not None
                and holder[0] == member
                and holder[1] <= generation
                and self._target.get(p) != member
            ):
                del self._holders[p]
                accepted.add(p)
        self._give_free()
        self._check()
        return frozenset(accepted)

    def tick(self, now_ms: int) -> Generation | None:
        """Start a due rebalance: returns the generation to store (None: nothing to start).
        A rebalance whose members are those of the current target is skipped."""
        self._clock(now_ms)
        if self._storing is not None or self._due_ms is None or now_ms < self._due_ms:
            return None
        if tuple(self._members) == self._target_members:
            self._due_ms = None
            return None
        self._storing = Generation(self._generation + 1)
        return self._storing

    def generation_to_store(self) -> Generation | None:
        """The generation the shell must store before calling `generation_stored`."""
        return self._storing

    def generation_stored(self, generation: Generation) -> None:
        """The shell stored `generation`: it becomes current, with a target computed now."""
        assert generation == self._storing, (generation, self._storing)
        self._storing = None
        self._due_ms = None
        self._generation = generation
        members = tuple(self._members)
        self._target = compute_target(self.strategy, self.partitions, members, self._target)
        self._target_members = members
        for p, (holder, _) in self._holders.items():
            if self._target.get(p) == holder:
                self._holders[p] = (holder, generation)  # stays: carries on, not interrupted
        self._give_free()
        self._check()

    # -- outputs

    @property
    def generation(self) -> Generation:
        return self._generation

    @property
    def members(self) -> tuple[MemberId, ...]:
        return tuple(self._members)

    @property
    def target(self) -> Mapping[PartitionId, MemberId]:
        """The current generation's target (a copy)."""
        return dict(self._target)

    def holder(self, partition: PartitionId) -> MemberId | None:
        held = self._holders.get(partition)
        return None if held is None else held[0]

    def assignment(self, member: MemberId) -> Assignment | None:
        """None: unknown member (join again)."""
        if member not in self._members:
            return None
        held = [p for p, (m, _) in self._holders.items() if m == member]
        return Assignment(
            self._generation,
            frozenset(p for p in held if self._target.get(p) == member),
            frozenset(p for p in held if self._target.get(p) != member),
        )

    def check_commit(
        self, member: MemberId, generation: Generation, partition: PartitionId
    ) -> bool:
        """Kafka's generation check: `member` holds `partition` now and speaks the current
        generation (a member releasing a partition may still commit what it finished)."""
        held = self._holders.get(partition)
        return generation == self._generation and held is not None and held[0] == member

    @property
    def state(self) -> GroupState:
        if self._due_ms is not None or self._storing is not None:
            return GroupState.REBALANCING
        for p in range(self.partitions):
            held = self._holders.get(PartitionId(p))
            if (None if held is None else held[0]) != self._target.get(PartitionId(p)):
                return GroupState.REBALANCING
        return GroupState.STABLE

    def next_deadline_ms(self) -> int | None:
        """When `tick` or `expire` next has something to do (for the shell's timer)."""
        deadlines = [m.last_heartbeat_ms + m.session_timeout_ms + 1 for m in self._members.values()]
        if self._due_ms is not None and self._storing is None:
            deadlines.append(self._due_ms)
        return min(deadlines, default=None)

    def describe(self, now_ms: int | None = None) -> GroupView:
        """The group now (`now_ms`, else the time of the last input)."""
        if now_ms is not None:
            self._clock(now_ms)
        views = []
        for member, known in self._members.items():
            assignment = self.assignment(member)
            assert assignment is not None
            views.append(
                MemberView(
                    member,
                    assignment.partitions,
                    assignment.release,
                    known.last_heartbeat_ms,
                    known.session_timeout_ms,
                )
            )
        return GroupView(
            self.strategy,
            self.partitions,
            self._generation,
            self.state,
            tuple(views),
            frozenset(p for p, (m, _) in self._holders.items() if self._target.get(p) != m),
            frozenset(PartitionId(p) for p in range(self.partitions)) - set(self._holders),
            self._storing,
            self._due_ms,
            self._now_ms,
        )

    # -- inside

    def _clock(self, now_ms: int) -> None:
        assert now_ms >= self._now_ms, f"time went back: {self._now_ms} -> {now_ms}"
        self._now_ms = now_ms

    def _changed(self, now_ms: int) -> None:
        if self._due_ms is None:
            self._due_ms = now_ms + self.rebalance_delay_ms

    def _remove(self, member: MemberId, now_ms: int) -> None:
        del self._members[member]
        for p in [p for p, (m, _) in self._holders.items() if m == member]:
            del self._holders[p]
        self._give_free()
        self._changed(now_ms)

    def _give_free(self) -> None:
        """Free partitions go to their target member, if it is still here."""
        for p, member in self._target.items():
            if p not in self._holders and member in self._members:
                self._holders[p] = (member, self._generation)

    def _check(self) -> None:
        for p, (member, since) in self._holders.items():
            assert 0 <= p < self.partitions, p
            assert member in self._members, (p, member)
            assert since <= self._generation, (p, since, self._generation)
        for p, member in self._target.items():
            if member in self._members:
                assert p in self._holders, f"partition {p} is free but {member} is here"
        assert self._storing is None or self._storing == self._generation + 1
