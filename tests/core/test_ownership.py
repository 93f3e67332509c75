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
    with pytest.raises(AlreadyExists, match="at or above 1"):  # no epoch: refused
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
