"""spate.core.coordinator (ADR 0015): the consumer-group coordinator, as 003's scenarios and
as properties over random joins, leaves, heartbeats, expiries, stores, releases and time."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spate.core.coordinator import (
    STRATEGIES,
    Coordinator,
    GroupFull,
    GroupState,
    Strategy,
    compute_target,
    range_assign,
    round_robin,
    sticky,
    sticky_moves_min,
)
from spate.core.errors import InvalidArgument
from spate.core.ids import Generation, MemberId, PartitionId


def _p(*numbers: int) -> frozenset[PartitionId]:
    return frozenset(PartitionId(n) for n in numbers)


def _rebalance(c: Coordinator, now_ms: int) -> Generation:
    generation = c.tick(now_ms)
    assert generation is not None
    c.generation_stored(generation)
    return generation


def _held(
    c: Coordinator, member: MemberId
) -> tuple[frozenset[PartitionId], frozenset[PartitionId]]:
    assignment = c.assignment(member)
    assert assignment is not None
    return assignment.partitions, assignment.release


def _release_all(c: Coordinator) -> None:
    for member in c.members:
        _, release = _held(c, member)
        if release:
            assert c.released(member, release, c.generation) == release


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("round-robin", [_p(0, 3), _p(1, 4), _p(2, 5)]),
        ("range", [_p(0, 1), _p(2, 3), _p(4, 5)]),
        ("sticky", [_p(0, 1), _p(2, 3), _p(4, 5)]),
    ],
)
def test_three_members_on_six_partitions(strategy: Strategy, expected: list[object]) -> None:
    """003 "Assignment Strategies" (sticky from nothing gives contiguous quotas)."""
    c = Coordinator(6, strategy, rebalance_delay_ms=0)
    members = [c.join(0, 10_000) for _ in range(3)]
    assert members == [1, 2, 3]
    assert _rebalance(c, 0) == 1
    assert [_held(c, m)[0] for m in members] == expected
    assert c.describe().state is GroupState.STABLE


def test_003_consumer_3_joins_then_consumer_2_leaves_range() -> None:
    """003 "Consumer Group Rebalancing": the initial state and the state after consumer 2
    leaves are range's; a partition moves only after its holder released it."""
    c = Coordinator(6, "range", rebalance_delay_ms=0)
    c1, c2 = c.join(0, 10_000), c.join(0, 10_000)
    _rebalance(c, 0)
    assert [_held(c, m)[0] for m in (c1, c2)] == [_p(0, 1, 2), _p(3, 4, 5)]
    c3 = c.join(10, 10_000)
    assert _held(c, c3) == (_p(), _p())  # nothing before the rebalance
    assert _rebalance(c, 10) == 2
    # Target [0,1] [2,3] [4,5]: 2 moves from c1 to c2, 4 and 5 from c2 to c3.
    assert _held(c, c1) == (_p(0, 1), _p(2))
    assert _held(c, c2) == (_p(3), _p(4, 5))
    assert _held(c, c3) == (_p(), _p())
    assert c.describe().state is GroupState.REBALANCING
    assert c.released(c2, _p(4, 5), Generation(2)) == _p(4, 5)
    assert _held(c, c3) == (_p(4, 5), _p())
    assert _held(c, c2) == (_p(3), _p())  # 2 still with c1
    assert c.released(c1, _p(2), Generation(2)) == _p(2)
    assert [_held(c, m)[0] for m in (c1, c2, c3)] == [_p(0, 1), _p(2, 3), _p(4, 5)]
    assert c.describe().state is GroupState.STABLE
    assert c.leave(c2, 20)
    assert c.describe().unassigned == _p(2, 3)  # free until the rebalance
    assert _rebalance(c, 20) == 3
    # [0,1,2] [3,4,5]: 2 and 3 are free, so they go at once; 4 and 5 move from c3 to c1?
    # No: range gives c1 [0,1,2] and c3 [3,4,5], so c3 keeps 4, 5 and gets 3.
    assert [_held(c, m)[0] for m in (c1, c3)] == [_p(0, 1, 2), _p(3, 4, 5)]
    assert c.describe().state is GroupState.STABLE


def test_003_consumer_3_joins_round_robin() -> None:
    c = Coordinator(6, "round-robin", rebalance_delay_ms=0)
    c1, c2 = c.join(0, 10_000), c.join(0, 10_000)
    _rebalance(c, 0)
    assert [_held(c, m)[0] for m in (c1, c2)] == [_p(0, 2, 4), _p(1, 3, 5)]
    c3 = c.join(5, 10_000)
    _rebalance(c, 5)
    assert _held(c, c1) == (_p(0), _p(2, 4))
    assert _held(c, c2) == (_p(1), _p(3, 5))
    _release_all(c)
    assert [_held(c, m)[0] for m in (c1, c2, c3)] == [_p(0, 3), _p(1, 4), _p(2, 5)]


def test_003_consumer_3_joins_sticky_moves_two() -> None:
    """From 003's initial state, sticky moves 2 partitions where round-robin moves 4."""
    c = Coordinator(6, "sticky", rebalance_delay_ms=0)
    c1, c2 = c.join(0, 10_000), c.join(0, 10_000)
    _rebalance(c, 0)
    assert [_held(c, m)[0] for m in (c1, c2)] == [_p(0, 1, 2), _p(3, 4, 5)]
    c3 = c.join(5, 10_000)
    _rebalance(c, 5)
    assert _held(c, c1) == (_p(0, 1), _p(2))
    assert _held(c, c2) == (_p(3, 4), _p(5))
    _release_all(c)
    assert _held(c, c3) == (_p(2, 5), _p())
    c.leave(c1, 6)
    _rebalance(c, 6)  # c1's 0 and 1 were free: they go to c2 and c3, nothing else moves
    assert [_held(c, m)[0] for m in (c2, c3)] == [_p(0, 3, 4), _p(1, 2, 5)]


def test_a_silent_member_expires_after_its_session_timeout() -> None:
    c = Coordinator(4, "range", rebalance_delay_ms=0)
    a, b = c.join(0, 1000), c.join(0, 3000)
    _rebalance(c, 0)
    assert c.heartbeat(a, 900)
    assert c.expire(1900) == []  # 1000 ms since a's heartbeat is not longer than 1000
    assert c.next_deadline_ms() == 1901
    assert c.expire(1901) == [a]
    assert not c.heartbeat(a, 1901) and c.assignment(a) is None  # a must join again
    assert c.describe().unassigned == _p(0, 1)
    assert c.describe().state is GroupState.REBALANCING
    _rebalance(c, 1901)
    assert _held(c, b) == (_p(0, 1, 2, 3), _p())
    assert c.expire(3001) == [b]


def test_changes_within_the_delay_are_one_rebalance() -> None:
    c = Coordinator(6, "round-robin", rebalance_delay_ms=500)
    a = c.join(0, 10_000)
    assert c.tick(100) is None
    b = c.join(100, 10_000)
    c3 = c.join(400, 10_000)
    assert c.leave(c3, 450)
    assert c.tick(499) is None and c.describe().rebalance_due_ms == 500
    assert _rebalance(c, 500) == 1  # due at the first change + the delay
    assert [_held(c, m)[0] for m in (a, b)] == [_p(0, 2, 4), _p(1, 3, 5)]
    assert c.tick(5000) is None
    # A join and a leave that cancel out within the delay: no rebalance, no generation.
    d = c.join(6000, 10_000)
    c.leave(d, 6100)
    assert c.tick(6500) is None and c.generation == 1
    assert c.describe().state is GroupState.STABLE


def test_a_coordinator_starts_from_the_stored_generation_and_announces_after_storing() -> None:
    c = Coordinator(3, "range", generation=Generation(7), rebalance_delay_ms=0)
    a = c.join(0, 10_000)
    assert c.generation_to_store() is None
    assert c.tick(0) == 8
    assert c.generation_to_store() == 8
    assert c.assignment(a) is not None
    assert _held(c, a) == (_p(), _p()) and c.generation == 7  # nothing of 8 before it is stored
    assert c.describe().state is GroupState.REBALANCING and c.describe().storing == 8
    b = c.join(1, 10_000)  # during the store: the target is computed when it is stored
    assert c.tick(1) is None
    c.generation_stored(Generation(8))
    assert [_held(c, m)[0] for m in (a, b)] == [_p(0, 1), _p(2)]
    assert c.assignment(a) is not None and c.assignment(a).generation == 8  # type: ignore[union-attr]
    assert c.tick(2) is None  # b's join is in generation 8 already


def test_members_beyond_the_partitions_wait_and_members_max_is_a_clear_error() -> None:
    c = Coordinator(2, "round-robin", rebalance_delay_ms=0, members_max=3)
    a, b, pending = (c.join(0, 10_000) for _ in range(3))
    with pytest.raises(GroupFull, match="3 members"):
        c.join(0, 10_000)
    with pytest.raises(InvalidArgument, match="session timeout"):
        Coordinator(1, "range").join(0, 0)
    _rebalance(c, 0)
    assert _held(c, pending) == (_p(), _p())
    c.leave(a, 1)
    _rebalance(c, 1)  # round-robin over [b, pending]: b moves from 1 to 0
    assert _held(c, b) == (_p(0), _p(1)) and _held(c, pending) == (_p(), _p())
    _release_all(c)
    assert [_held(c, m)[0] for m in (b, pending)] == [_p(0), _p(1)]


def test_releases_and_commits_are_fenced_by_generation() -> None:
    c = Coordinator(2, "round-robin", rebalance_delay_ms=0)
    a = c.join(0, 10_000)
    _rebalance(c, 0)
    assert c.check_commit(a, Generation(1), PartitionId(1))
    b = c.join(1, 10_000)
    _rebalance(c, 1)
    assert not c.check_commit(a, Generation(1), PartitionId(1))  # stale generation
    assert c.check_commit(a, Generation(2), PartitionId(1))  # still holds it, releasing
    assert not c.check_commit(b, Generation(2), PartitionId(1))  # not yet its own
    assert c.released(a, _p(0), Generation(2)) == _p()  # 0 stays with a: not a release
    assert c.released(b, _p(1), Generation(2)) == _p()  # b does not hold it
    assert c.released(a, _p(1), Generation(2)) == _p(1)
    assert c.check_commit(b, Generation(2), PartitionId(1))
    # a gets 1 back in generation 4; a late copy of its generation-2 release is ignored.
    c.leave(b, 2)
    _rebalance(c, 2)
    assert _held(c, a) == (_p(0, 1), _p())
    assert c.released(a, _p(1), Generation(2)) == _p()
    assert not c.heartbeat(MemberId(99), 3) and not c.leave(MemberId(99), 3)


def test_time_never_goes_back() -> None:
    c = Coordinator(1, "range")
    c.join(10, 1000)
    with pytest.raises(AssertionError, match="time went back"):
        c.expire(5)


# -- sticky: balanced and minimal, checked against every balanced target


def _moves(previous: Mapping[PartitionId, MemberId], target: Mapping[PartitionId, MemberId]) -> int:
    return sum(1 for p, m in previous.items() if p in target and target[p] != m)


def _balanced(
    partitions: int, members: Sequence[MemberId], target: Mapping[PartitionId, MemberId]
) -> bool:
    if not members:
        return not target
    counts = [sum(1 for m in target.values() if m == member) for member in members]
    low = partitions // len(members)
    return len(target) == partitions and all(low <= n <= low + 1 for n in counts)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(0, 4),
    st.lists(st.integers(0, 5), min_size=6, max_size=6),
)
def test_sticky_is_balanced_and_moves_the_fewest(
    partitions: int, size: int, owners: list[int]
) -> None:
    """Against brute force over every balanced target (owners 4 and 5 have left)."""
    members = [MemberId(m) for m in range(size)]
    previous = {
        PartitionId(p): MemberId(owners[p]) for p in range(partitions) if owners[p] < size + 2
    }
    present = {p: m for p, m in previous.items() if m in members}
    target = sticky(partitions, members, previous)
    assert _balanced(partitions, members, target)
    assert sticky(partitions, members, previous) == target  # deterministic
    best = min(
        (
            _moves(present, dict(zip(map(PartitionId, range(partitions)), choice, strict=True)))
            for choice in itertools.product(members, repeat=partitions)
            if _balanced(
                partitions,
                members,
                dict(zip(map(PartitionId, range(partitions)), choice, strict=True)),
            )
        ),
        default=0,
    )
    assert _moves(present, target) == best == sticky_moves_min(partitions, members, present)


def test_round_robin_and_range_are_functions_of_the_members() -> None:
    members = [MemberId(5), MemberId(9)]
    assert round_robin(3, members) == {0: 5, 1: 9, 2: 5}
    assert range_assign(5, members) == {0: 5, 1: 5, 2: 5, 3: 9, 4: 9}
    assert range_assign(1, members) == {0: 5} and round_robin(2, []) == {}


# -- the invariants over random histories

_KINDS = (
    # joins, rebalances and releases more often than the rest, so histories move partitions
    *("join", "join", "tick", "store", "rebalance", "rebalance", "release", "release"),
    *("leave", "heartbeat", "time", "expire", "stale-release", "wild-release"),
)
_ACTIONS = st.lists(
    st.tuples(st.sampled_from(_KINDS), st.integers(0, 20)), min_size=30, max_size=120
)
_TIMEOUTS_MS = (300, 1000, 5000)
_STEPS_MS = (1, 50, 200, 700, 2000)


class _Observer:
    """Checks the coordinator from outside: every step's effects against the last snapshot."""

    def __init__(self, c: Coordinator, stored: Generation) -> None:
        self.c = c
        self.stored = stored
        self.generation = c.generation
        self.holders: dict[PartitionId, MemberId] = {}
        self.target: dict[PartitionId, MemberId] = dict(c.target)
        self.target_members: tuple[MemberId, ...] = ()

    def step(
        self, released: Mapping[MemberId, frozenset[PartitionId]], removed: set[MemberId]
    ) -> None:
        c = self.c
        # 2. the generation only increases, by one per stored rebalance, never unstored
        assert self.generation <= c.generation <= self.stored
        assert c.generation - self.generation in (0, 1)
        target = dict(c.target)
        if c.generation != self.generation:
            self._check_target(target)
            self.generation = c.generation
            self.target, self.target_members = target, c.members
        assert target == self.target, "the target changes only with the generation"
        holders: dict[PartitionId, MemberId] = {}
        for member in c.members:
            assignment = c.assignment(member)
            assert assignment is not None and assignment.generation == c.generation
            assert not assignment.partitions & assignment.release
            for p in assignment.partitions | assignment.release:
                assert p not in holders, f"1. partition {p}: {holders[p]} and {member}"
                holders[p] = member
                # 3. kept iff this generation's target says so
                assert (p in assignment.partitions) == (target.get(p) == member)
                assert c.check_commit(member, c.generation, p)
                assert not c.check_commit(member, Generation(c.generation - 1), p)
        for p, before in self.holders.items():
            after = holders.get(p)
            if after != before:
                # 1. a partition leaves its holder only by a release or the holder's removal
                assert before in removed or p in released.get(before, frozenset()), (
                    f"partition {p} moved {before} -> {after} without a release"
                )
        for p, member in holders.items():
            if self.holders.get(p) != member:
                assert target.get(p) == member, "a partition is given only to its target"
        self.holders = holders

    def _check_target(self, target: dict[PartitionId, MemberId]) -> None:
        c = self.c
        members = c.members
        if c.strategy != "sticky":
            assert target == compute_target(c.strategy, c.partitions, members, {})
            return
        # 5. balanced, moving the fewest of the last target's partitions of present members
        assert _balanced(c.partitions, members, target)
        present = {p: m for p, m in self.target.items() if m in members}
        assert _moves(present, target) == sticky_moves_min(c.partitions, members, present)

    def quiet(self) -> None:
        """4. once every change is rebalanced and every release done: the target, Stable."""
        c = self.c
        view = c.describe()
        assert view.state is GroupState.STABLE, view
        assert not view.awaiting_release
        assert self.holders == self.target
        assert set(self.holders.values()) <= set(c.members)
        if c.members and c.strategy != "sticky":
            assert self.holders == compute_target(c.strategy, c.partitions, c.members, {})
        if c.members:
            assert len(self.holders) == c.partitions


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(STRATEGIES),
    st.integers(1, 7),
    st.sampled_from([0, 100, 1000]),
    st.integers(0, 5),
    _ACTIONS,
)
def test_invariants_hold_after_every_step_and_quiet_means_the_target(
    strategy: Strategy,
    partitions: int,
    delay_ms: int,
    persisted: int,
    actions: list[tuple[str, int]],
) -> None:
    c = Coordinator(
        partitions,
        strategy,
        generation=Generation(persisted),
        rebalance_delay_ms=delay_ms,
        members_max=6,
    )
    observer = _Observer(c, Generation(persisted))
    now_ms = 0
    joined: list[MemberId] = []

    def pick(index: int) -> MemberId:
        return joined[index % len(joined)] if joined else MemberId(index + 1)

    for action, arg in actions:
        released: dict[MemberId, frozenset[PartitionId]] = {}
        removed: set[MemberId] = set()
        if action == "join":
            if len(c.members) < 6:
                member = c.join(now_ms, _TIMEOUTS_MS[arg % len(_TIMEOUTS_MS)])
                assert member not in joined and all(member > m for m in joined)
                joined.append(member)
            else:
                with pytest.raises(GroupFull):
                    c.join(now_ms, 1000)
        elif action == "leave":
            member = pick(arg)
            present = member in c.members
            assert c.leave(member, now_ms) == present
            removed.add(member)
        elif action == "heartbeat":
            member = pick(arg)
            assert c.heartbeat(member, now_ms) == (member in c.members)
        elif action == "time":
            now_ms += _STEPS_MS[arg % len(_STEPS_MS)]
        elif action == "expire":
            removed.update(c.expire(now_ms))
        elif action == "tick":
            before = c.generation_to_store()
            started = c.tick(now_ms)
            assert started is None or (before is None and started == c.generation + 1)
        elif action == "rebalance":  # the members heartbeat until it is due, then it is stored
            due = c.describe().rebalance_due_ms
            now_ms = max(now_ms, due or now_ms)
            for member in c.members:
                c.heartbeat(member, now_ms)
            c.tick(now_ms)
            storing = c.generation_to_store()
            if storing is not None:
                observer.stored = storing
                c.generation_stored(storing)
        elif action == "store":
            storing = c.generation_to_store()
            if storing is not None:
                observer.stored = storing
                c.generation_stored(storing)
        elif c.members:
            member = pick(arg)
            assignment = c.assignment(member)
            if assignment is None:
                continue
            if action == "release":
                accepted = c.released(member, assignment.release, assignment.generation)
                assert accepted == assignment.release
            elif action == "stale-release":
                generation = Generation(max(0, assignment.generation - 1))
                accepted = c.released(member, assignment.release, generation)
            else:  # partitions it keeps, or does not hold
                accepted = c.released(
                    member, [PartitionId(p) for p in range(partitions)], c.generation
                )
                assert accepted <= assignment.release
            released[member] = accepted
        observer.step(released, removed)

    # Quiet down: heartbeats, the rebalance, every store, every release.
    for _ in range(3):
        for member in c.members:
            c.heartbeat(member, now_ms)
        due = c.describe().rebalance_due_ms
        if due is not None:
            now_ms = max(now_ms, due)
            for member in c.members:
                c.heartbeat(member, now_ms)
        if c.tick(now_ms) is not None or c.generation_to_store() is not None:
            storing = c.generation_to_store()
            assert storing is not None
            observer.stored = storing
            c.generation_stored(storing)
            observer.step({}, set())
        released = {}
        for member in c.members:
            assignment = c.assignment(member)
            assert assignment is not None
            released[member] = c.released(member, assignment.release, assignment.generation)
        observer.step(released, set())
    observer.quiet()
