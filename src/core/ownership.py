"""Consumer-group ownership of one partition at its leader (ADR 0015; 000 §4.5, §4.5.2).

A receiver attaching with `event-streams-consumer-group` = g to partition p claims p for g:
it is a named consumer of the reserved name `$group/<g>` (its committed offset is that name's
stored offset, ADR 0012) in an exclusive group of `spate.core.active` (one owner; a claim with
a greater `event-streams-epoch` displaces it after it stepped down). The epoch is stored as
`$epoch/<g>` in the partition's own log before a claim that raises it is answered, so it never
goes back. Stores for `$group/<g>` are accepted only from the current owner (`check_store`).

Pure (no I/O), so the simulator (`spate.sim.groups`) runs these decisions as they are: a claim
(`decide_claim`, over `ActiveGroups.claim`), letting go (`release`), dropping an owner that did
not step down in time (`drop_holder`) and the commit fence (`check_store`).
`spate.core.claiming.claim` is their asyncio shell, which both partition kinds run (the node's
replicas and the in-memory test broker): it reads the stored epoch and generation, decides,
stores what the decision raised before answering, and bounds a takeover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from spate.core import groups
from spate.core.active import ActiveGroups, Conflict, Owned, Stale
from spate.core.errors import AlreadyExists, FailedPrecondition, Unavailable

GROUP_PREFIX = groups.COMMITTED_PREFIX.encode()
EPOCH_PREFIX = groups.EPOCH_PREFIX.encode()
RESERVED_PREFIX = groups.RESERVED_PREFIX
"""Consumer names starting with it belong to groups (and other internal records)."""


def epoch_name(name: bytes) -> bytes:
    """`$group/<g>` -> `$epoch/<g>`: where the group's epoch on the partition is stored."""
    assert is_group(name)
    return EPOCH_PREFIX + name[len(GROUP_PREFIX) :]


def generation_name(name: bytes) -> bytes:
    """`$group/<g>` -> `$generation/<g>`: the highest generation the partition has seen."""
    assert is_group(name)
    return groups.GENERATION_PREFIX.encode() + name[len(GROUP_PREFIX) :]


def is_group(name: bytes) -> bool:
    return name.startswith(GROUP_PREFIX)


def group_of(name: bytes) -> str:
    return name[len(GROUP_PREFIX) :].decode(errors="replace")


class Claims(Protocol):
    """A partition leader's node-local claim state (ADR 0015: soft, re-formed at a new leader)."""

    groups: ActiveGroups
    attached: dict[bytes, int]


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim `decide_claim` granted."""

    member: int
    epoch: int
    current: bool
    """False: the owner is stepping down first (the claimer waits for its turn)."""
    stores: tuple[tuple[bytes, int], ...]
    """Reserved names to store, in this order, before the claim is answered (`$generation/<g>`
    then `$epoch/<g>`, each when the claim raised it), so neither goes back."""
    holder: int | None
    """When not current: the owner stepping down for it (its takeover is bounded)."""
    shared: tuple[int, ...] = ()
    """When not current in an Event Hubs group: the members without an epoch giving way for
    it (each bounded like `holder`)."""


def decide_claim(  # noqa: PLR0917 (the claim and what the partition stored)
    claims: Claims,
    where: str,
    name: bytes,
    epoch: int | None,
    stored_epoch: int,
    generation: int | None = None,
    stored_generation: int = 0,
) -> Claimed:
    """Claim the partition (`where`) for the group `name` (`$group/<g>`), given the epoch and
    generation stored in its log, with `ActiveGroups.claim`; the link is counted in
    `attached`. An Event Hubs group's claim (`groups.takes_over_at_equal_epoch`) takes over at
    an equal epoch too, and one without an epoch is a shared member (`ActiveGroups`).
    Raises AlreadyExists (owned, epoch not above), Unavailable (a coordinator's member from a
    generation below the partition's: it rejoins), FailedPrecondition (stale epoch, or the name
    is used otherwise)."""
    holder = claims.groups.active(name)
    try:
        member, granted, current = claims.groups.claim(
            name,
            epoch,
            stored_epoch,
            0,  # a `$group/` name has no plain links (the listener refuses such names); the
            # counts of links a disbanded group had may linger here until they detach
            generation,
            stored_generation,
            at_equal=groups.takes_over_at_equal_epoch(group_of(name)),
        )
    except Owned as owned:
        event_hubs = groups.takes_over_at_equal_epoch(group_of(name))
        if event_hubs and epoch is None:
            raise AlreadyExists(
                f"consumer group {group_of(name)!r} on {where} is held by a receiver with an "
                f"epoch (owner level {owned.epoch}): a receiver without one may not read it "
                "meanwhile (Event Hubs' rule)"
            ) from None
        relation = "at or above" if event_hubs else "above"
        raise AlreadyExists(
            f"consumer group {group_of(name)!r} already has an active receiver on {where} "
            f"(epoch {owned.epoch}); attach with 'event-streams-epoch' {relation} "
            f"{owned.epoch} to take over"
        ) from None
    except Stale as stale:
        if generation is not None:  # a coordinator's member: retryable, it rejoins
            raise Unavailable(
                f"consumer group {group_of(name)!r} on {where}: generation {generation} is "
                f"below the partition's generation {stale.epoch} (fenced by a newer "
                "rebalance); join the group again"
            ) from None
        raise FailedPrecondition(
            f"consumer group {group_of(name)!r} on {where}: epoch {epoch} is stale (the "
            f"partition's epoch is {stale.epoch} and never goes back)"
        ) from None
    except Conflict as conflict:
        raise FailedPrecondition(f"{conflict} on {where}") from None
    claims.attached[name] = claims.attached.get(name, 0) + 1
    stores: list[tuple[bytes, int]] = []
    if generation is not None and generation > stored_generation:
        stores.append((generation_name(name), generation))
    if granted > stored_epoch:
        stores.append((epoch_name(name), granted))
    group = claims.groups.groups.get(name)
    shared = tuple(group.shared) if group is not None and not current else ()
    return Claimed(member, granted, current, tuple(stores), None if current else holder, shared)


def release(host: Claims, name: bytes, member: int) -> None:
    """The member's link is gone: it no longer counts, nor holds a place in the group."""
    count = host.attached.get(name, 0) - 1
    if count > 0:
        host.attached[name] = count
    else:
        host.attached.pop(name, None)
    host.groups.leave(name, member)


def drop_holder(claims: Claims, name: bytes, holder: int, claimer: int) -> None:
    """A takeover's owner did not step down in time: drop it from the group (its stores are
    refused now; its link's detach still counts it down)."""
    group = claims.groups.groups.get(name)
    if (
        group is not None
        and (group.current == holder or holder in group.shared)
        and claimer in group.members
    ):
        claims.groups.leave(name, holder)


def check_store(groups: ActiveGroups, where: str, name: bytes, member: int) -> None:
    """A group's committed offset is stored only by its current owner (zombie fencing)."""
    if is_group(name) and groups.active(name) != member:
        raise FailedPrecondition(
            f"consumer group {group_of(name)!r} on {where}: this link no longer owns the "
            "partition (another took over with a greater epoch, or the partition's leader "
            "changed); its offset is not stored"
        )
