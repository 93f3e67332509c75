"""spate.core.active (ADR 0013): single-active-consumer groups of one partition, as scenarios
and as a property over random joins, waits, leaves and leadership losses."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spate.core.active import ActiveGroups, Conflict


def test_the_first_member_is_active_and_the_next_in_joining_order_takes_over() -> None:
    groups = ActiveGroups()
    told: list[tuple[int, bool]] = []
    a, a_active = groups.join(b"app", 0)
    b, b_active = groups.join(b"app", 0)
    c, c_active = groups.join(b"app", 0)
    assert (a_active, b_active, c_active) == (True, False, False)
    assert len({a, b, c}) == 3
    for member in (a, b, c):
        groups.watch(b"app", member, lambda active, m=member: told.append((m, active)))
    assert told == [(a, True)]  # told at once: it is active
    assert groups.leave(b"app", b) is None  # a standby leaves: nothing changes
    assert told == [(a, True), (b, False)]
    assert groups.leave(b"app", a) == c
    assert told == [(a, True), (b, False), (c, True)]
    assert groups.active(b"app") == c and groups.size(b"app") == 1
    assert groups.leave(b"app", c) is None
    assert groups.active(b"app") is None and b"app" not in groups.groups
    assert groups.leave(b"app", c) is None  # twice: nothing


def test_names_are_separate_groups() -> None:
    groups = ActiveGroups()
    assert groups.join(b"x", 0)[1] and groups.join(b"y", 0)[1]


def test_a_name_is_used_by_a_group_or_by_plain_links_never_both() -> None:
    groups = ActiveGroups()
    with pytest.raises(Conflict, match="without single-active-consumer"):
        groups.join(b"n", plain_links=1)
    groups.check_plain(b"n")  # no group: a plain link may attach
    member, _ = groups.join(b"n", 0)
    with pytest.raises(Conflict, match="single-active-consumer group of 1"):
        groups.check_plain(b"n")
    groups.leave(b"n", member)
    groups.check_plain(b"n")


def test_watching_a_member_that_is_not_there_answers_false() -> None:
    groups = ActiveGroups()
    told: list[bool] = []
    groups.watch(b"n", 42, told.append)
    assert told == [False]


def test_disbanding_forgets_groups_but_never_reuses_a_number() -> None:
    groups = ActiveGroups()
    old, _ = groups.join(b"n", 0)
    groups.disband()
    new, active = groups.join(b"n", 0)
    assert active and new != old
    assert groups.leave(b"n", old) is None  # a late leave of an old member touches nothing
    assert groups.active(b"n") == new


def test_a_spread_group_hands_each_partition_to_member_index_mod_size() -> None:
    """004 "Single Active Consumer Support": on partition 1 of a super stream, with members
    a, b joined in that order, b is designated; a was current and steps down first."""
    groups = ActiveGroups()
    deposed: list[bool] = []
    became: list[bool] = []
    a, a_current = groups.join(b"app", 0, spread=1)
    assert a_current  # alone: 1 % 1 == 0
    groups.watch_deposed(b"app", a, deposed.append)
    b, b_current = groups.join(b"app", 0, spread=1)
    assert not b_current and deposed == [True]  # a is asked to step down
    groups.watch(b"app", b, became.append)
    assert became == [] and groups.active(b"app") == a  # not before a stored its offset
    assert groups.stepped_down(b"app", a) == b
    assert became == [True] and groups.active(b"app") == b
    c, _ = groups.join(b"app", 0, spread=1)  # 1 % 3 == 1: still b
    assert groups.active(b"app") == b
    told: list[bool] = []
    groups.watch_deposed(b"app", b, told.append)
    assert told == []
    assert groups.leave(b"app", a) is None  # now [b, c]: 1 % 2 -> c
    assert told == [True]
    assert groups.stepped_down(b"app", b) == c


def test_a_group_joined_with_another_spread_is_refused() -> None:
    groups = ActiveGroups()
    groups.join(b"n", 0, spread=2)
    with pytest.raises(Conflict, match="super stream"):
        groups.join(b"n", 0)
    with pytest.raises(Conflict):
        groups.join(b"n", 0, spread=1)


_NAMES = st.sampled_from([b"a", b"b"])
_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("join"), _NAMES, st.integers(0, 0)),
        st.tuples(st.just("watch"), _NAMES, st.integers(0, 12)),
        st.tuples(st.just("deposed"), _NAMES, st.integers(0, 12)),
        st.tuples(st.just("stepped"), _NAMES, st.integers(0, 12)),
        st.tuples(st.just("leave"), _NAMES, st.integers(0, 12)),
        st.tuples(st.just("disband"), _NAMES, st.integers(0, 0)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(_ACTIONS, st.sampled_from([None, 0, 1, 2]))
def test_one_current_member_the_designated_one_once_the_last_stepped_down(
    actions: list[tuple[str, bytes, int]], spread: int | None
) -> None:
    groups = ActiveGroups()
    order: dict[bytes, list[int]] = {}
    joined: list[tuple[bytes, int]] = []
    told: dict[tuple[str, int], list[bool]] = {}

    def watcher(kind: str, name: bytes, member: int) -> Callable[[bool], None]:
        def tell(answer: bool) -> None:
            group = groups.groups.get(name)
            if kind == "watch" and answer:
                assert group is not None and group.current == member
            elif kind == "watch":
                assert group is None or member not in group.members
            elif answer:  # must step down: it is current and another one is designated
                assert group is not None and group.current == member and group.stepping_down
            told[kind, member].append(answer)

        return tell

    for action, name, pick in actions:
        if action == "join":
            member, current = groups.join(name, 0, spread)
            assert all(member != m for _, m in joined), "a member number was reused"
            joined.append((name, member))
            order.setdefault(name, []).append(member)
            assert current == (len(order[name]) == 1)
        elif action == "disband":
            groups.disband()
            order.clear()
        elif joined:
            gname, member = joined[pick % len(joined)]
            if action in ("watch", "deposed") and (action, member) not in told:
                told[action, member] = []
                watch = groups.watch if action == "watch" else groups.watch_deposed
                watch(gname, member, watcher(action, gname, member))
            elif action == "stepped":
                group = groups.groups.get(gname)
                if group is not None and group.current == member and group.stepping_down:
                    assert groups.stepped_down(gname, member) == group.designated()
                else:
                    before = None if group is None else group.current
                    assert groups.stepped_down(gname, member) is None or before == member
            elif action == "leave":
                if member in order.get(gname, []):
                    order[gname].remove(member)
                groups.leave(gname, member)
        order = {n: m for n, m in order.items() if m}
        assert set(groups.groups) == set(order)
        for gname, members in order.items():
            group = groups.groups[gname]
            assert group.members == members, "members keep their joining order"
            assert group.current in members, "a group always has a current member"
            if group.current != group.designated():
                assert group.stepping_down, "the current member was asked to step down"
            if spread is None:
                assert group.current == members[0]
        for key, answers in told.items():
            assert len(answers) <= 1, f"{key} was told {answers}"


# exclusive groups (consumer groups with epochs, ADR 0015) ---------------------------------------


def test_a_claim_takes_over_only_with_a_greater_epoch_after_the_owner_stepped_down() -> None:
    from spate.core.active import Owned, Stale

    groups = ActiveGroups()
    owner, epoch, current = groups.claim(b"$group/g", None, stored_epoch=2)
    assert (epoch, current) == (2, True)  # the stored epoch, as is
    with pytest.raises(Owned):
        groups.claim(b"$group/g", None, 2)
    with pytest.raises(Owned):
        groups.claim(b"$group/g", 2, 2)
    deposed: list[bool] = []
    groups.watch_deposed(b"$group/g", owner, deposed.append)
    thief, epoch, current = groups.claim(b"$group/g", 5, 2)
    assert (epoch, current, deposed) == (5, False, [True])
    activated: list[bool] = []
    groups.watch(b"$group/g", thief, activated.append)
    assert groups.stepped_down(b"$group/g", owner) == thief
    assert activated == [True] and groups.active(b"$group/g") == thief
    groups.leave(b"$group/g", owner)  # its link goes afterwards: nothing changes
    assert groups.active(b"$group/g") == thief
    groups.leave(b"$group/g", thief)  # nobody owns it now, but epochs never go back
    with pytest.raises(Stale):
        groups.claim(b"$group/g", 4, stored_epoch=5)
    groups.join(b"$group/h", 0)  # a single-active-consumer group of that name
    with pytest.raises(Conflict):
        groups.claim(b"$group/h", None, 0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["claim", "step", "leave"]),
            st.one_of(st.none(), st.integers(0, 6)),
            st.integers(0, 5),
        ),
        max_size=40,
    )
)
def test_exclusive_groups_keep_one_owner_and_epochs_never_go_back(
    ops: list[tuple[str, int | None, int]],
) -> None:
    """At most one current member; the group's epoch never decreases; a claim is granted only
    when nobody owns the partition or its epoch is above the group's."""
    from spate.core.active import Owned, Stale

    groups = ActiveGroups()
    name = b"$group/p"
    stored = 0  # the durable epoch, as the shell stores it
    members: list[int] = []
    highest = 0
    for op, epoch, pick in ops:
        if op == "claim":
            before = groups.active(name)
            try:
                member, granted, current = groups.claim(name, epoch, stored)
            except (Owned, Stale):
                continue
            assert granted >= highest
            assert before is None or (epoch is not None and epoch > highest)
            highest = stored = max(stored, granted)
            members.append(member)
            if before is not None:
                assert not current
        elif members:
            member = members[pick % len(members)]
            if op == "step":
                groups.stepped_down(name, member)
            else:
                groups.leave(name, member)
                members.remove(member)
        group = groups.groups.get(name)
        if group is not None:
            assert group.current is None or group.current in group.members
            assert (group.epoch or 0) >= 0
