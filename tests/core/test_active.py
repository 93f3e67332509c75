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


_NAMES = st.sampled_from([b"a", b"b"])
_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("join"), _NAMES, st.integers(0, 0)),
        st.tuples(st.just("watch"), _NAMES, st.integers(0, 12)),
        st.tuples(st.just("leave"), _NAMES, st.integers(0, 12)),
        st.tuples(st.just("disband"), _NAMES, st.integers(0, 0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_ACTIONS)
def test_one_active_member_the_earliest_present_and_every_watcher_told_once(
    actions: list[tuple[str, bytes, int]],
) -> None:
    groups = ActiveGroups()
    model: dict[bytes, list[int]] = {}
    joined: list[tuple[bytes, int]] = []
    told: dict[int, list[bool]] = {}

    def watcher(name: bytes, member: int) -> Callable[[bool], None]:
        def tell(active: bool) -> None:
            # True: it is the active one now; False: it is no longer in the group
            if active:
                assert groups.active(name) == member
            else:
                assert member not in groups.groups.get(name, [])
            told[member].append(active)

        return tell

    for action, name, pick in actions:
        if action == "join":
            member, active = groups.join(name, 0)
            assert all(member != m for _, m in joined), "a member number was reused"
            joined.append((name, member))
            model.setdefault(name, []).append(member)
            assert active == (model[name][0] == member)
        elif action == "disband":
            groups.disband()
            model.clear()
        elif joined:
            gname, member = joined[pick % len(joined)]
            if action == "watch" and member not in told:
                told[member] = []
                groups.watch(gname, member, watcher(gname, member))
            elif action == "leave":
                present = model.get(gname, [])
                was_first = bool(present) and present[0] == member
                if member in present:
                    present.remove(member)
                expect = present[0] if was_first and present else None
                assert groups.leave(gname, member) == expect
        for gname, members in list(model.items()):
            if not members:
                del model[gname]
                continue
            assert groups.active(gname) == members[0]
            assert groups.size(gname) == len(members)
        assert set(groups.groups) == set(model)
        for member, answers in told.items():
            assert len(answers) <= 1, f"member {member} was told {answers}"
