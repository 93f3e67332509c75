"""spate.core.ownership (ADR 0015): the claim decision at a partition's leader, without I/O
(its asyncio shell, spate.core.claiming, is exercised by tests/gateway over both brokers)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from spate.core import ownership
from spate.core.active import ActiveGroups
from spate.core.errors import AlreadyExists, FailedPrecondition, Unavailable

NAME = b"$group/g"


@dataclass
class _Leader:
    groups: ActiveGroups = field(default_factory=ActiveGroups)
    attached: dict[bytes, int] = field(default_factory=dict)


def test_a_first_claim_stores_the_generation_then_the_epoch_and_counts_the_link() -> None:
    leader = _Leader()
    claimed = ownership.decide_claim(leader, "s/0", NAME, None, 4, 7, 6)
    assert (claimed.epoch, claimed.current, claimed.holder) == (5, True, None)
    assert claimed.stores == ((b"$generation/g", 7), (b"$epoch/g", 5))
    assert leader.attached == {NAME: 1}
    # the same generation stored already: only the new epoch is stored
    again = ownership.decide_claim(_Leader(), "s/0", NAME, None, 5, 7, 7)
    assert again.stores == ((b"$epoch/g", 6),)


def test_a_newer_generation_waits_for_the_holder_and_an_older_one_is_fenced() -> None:
    leader = _Leader()
    first = ownership.decide_claim(leader, "s/0", NAME, None, 0, 1, 0)
    with pytest.raises(AlreadyExists):
        ownership.decide_claim(leader, "s/0", NAME, None, first.epoch, 1, 1)
    newer = ownership.decide_claim(leader, "s/0", NAME, None, first.epoch, 2, 1)
    assert (newer.current, newer.holder) == (False, first.member)
    with pytest.raises(Unavailable):
        ownership.decide_claim(leader, "s/0", NAME, None, newer.epoch, 1, 2)
    assert leader.attached == {NAME: 2}  # refusals are not counted
    ownership.check_store(leader.groups, "s/0", NAME, first.member)  # still the owner
    assert leader.groups.stepped_down(NAME, first.member) == newer.member
    with pytest.raises(FailedPrecondition):
        ownership.check_store(leader.groups, "s/0", NAME, first.member)
    ownership.release(leader, NAME, first.member)
    assert leader.attached == {NAME: 1} and leader.groups.active(NAME) == newer.member


def test_a_stale_epoch_is_refused_even_with_no_owner() -> None:
    with pytest.raises(FailedPrecondition):
        ownership.decide_claim(_Leader(), "s/0", NAME, 3, 4)


def test_an_event_hubs_group_is_taken_over_at_an_equal_epoch_and_never_below() -> None:
    """Event Hubs' owner-level rule (ADR 0021): a receiver with an owner level >= the current
    one takes over; a lower one is refused; Spate's own groups keep needing a greater epoch."""
    hubs = b"$group/eventhubs:$Default"
    leader = _Leader()
    first = ownership.decide_claim(leader, "s/0", hubs, 1, 0)
    assert (first.epoch, first.current) == (1, True)
    assert first.stores == ((b"$epoch/eventhubs:$Default", 1),)
    equal = ownership.decide_claim(leader, "s/0", hubs, 1, 1)
    assert (equal.epoch, equal.current, equal.holder, equal.stores) == (1, False, first.member, ())
    with pytest.raises(FailedPrecondition, match="stale"):  # a lower one: refused
        ownership.decide_claim(leader, "s/0", hubs, 0, 1)
    with pytest.raises(AlreadyExists, match="without one"):  # no epoch: refused
        ownership.decide_claim(leader, "s/0", hubs, None, 1)
    assert leader.groups.stepped_down(hubs, first.member) == equal.member
    ownership.release(leader, hubs, first.member)
    with pytest.raises(FailedPrecondition, match="stale"):  # epochs never go back, owner or not
        ownership.decide_claim(_Leader(), "s/0", hubs, 0, 1)
    # Spate's own groups: an equal epoch is refused, as before
    spate = _Leader()
    ownership.decide_claim(spate, "s/0", NAME, 1, 0)
    with pytest.raises(AlreadyExists, match="above 1"):
        ownership.decide_claim(spate, "s/0", NAME, 1, 1)


def test_event_hubs_receivers_without_an_epoch_share_and_give_way_to_one_with_an_epoch() -> None:
    """Event Hubs' mixed rules (ADR 0021 addendum): receivers without owner level read side
    by side; one with an owner level deposes them all (each told, then gone) before it is
    current; while it holds, one without is refused; once it left, they may come back."""
    hubs = b"$group/eventhubs:cg"
    leader = _Leader()
    a = ownership.decide_claim(leader, "s/0", hubs, None, 3)
    b = ownership.decide_claim(leader, "s/0", hubs, None, 3)
    assert (a.current, b.current, a.epoch, a.stores) == (True, True, 3, ())
    groups = leader.groups
    assert groups.active(hubs) is None  # neither commits
    told: dict[int, bool] = {}
    groups.watch_deposed(hubs, a.member, lambda v: told.__setitem__(a.member, v))
    owner = ownership.decide_claim(leader, "s/0", hubs, 3, 3)
    assert (owner.current, owner.holder, owner.shared) == (False, None, (a.member, b.member))
    assert told == {a.member: True}
    groups.watch_deposed(hubs, b.member, lambda v: told.__setitem__(b.member, v))
    assert told[b.member] is True  # a late watcher is told at once
    with pytest.raises(AlreadyExists, match="without one"):
        ownership.decide_claim(leader, "s/0", hubs, None, 3)
    became: list[bool] = []
    groups.watch(hubs, owner.member, became.append)
    assert groups.stepped_down(hubs, a.member) is None  # b is still reading
    ownership.release(leader, hubs, b.member)  # b's link went instead
    assert became == [True]
    assert groups.active(hubs) == owner.member
    with pytest.raises(AlreadyExists):
        ownership.decide_claim(leader, "s/0", hubs, None, 3)
    ownership.release(leader, hubs, owner.member)
    again = ownership.decide_claim(leader, "s/0", hubs, None, 3)
    assert again.current


def test_a_shared_receiver_that_does_not_give_way_is_dropped() -> None:
    hubs = b"$group/eventhubs:cg"
    leader = _Leader()
    a = ownership.decide_claim(leader, "s/0", hubs, None, 0)
    owner = ownership.decide_claim(leader, "s/0", hubs, 0, 0)
    ownership.drop_holder(leader, hubs, a.member, owner.member)
    assert leader.groups.active(hubs) == owner.member
