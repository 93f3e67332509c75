"""Consumer-group ownership of one partition at its leader (ADR 0015; 000 §4.5, §4.5.2).

A receiver attaching with `event-streams-consumer-group` = g to partition p claims p for g:
it is a named consumer of the reserved name `$group/<g>` (its committed offset is that name's
stored offset, ADR 0012) in an exclusive group of `spate.core.active` (one owner; a claim with
a greater `event-streams-epoch` displaces it after it stepped down). The epoch is stored as
`$epoch/<g>` in the partition's own log before a claim that raises it is answered, so it never
goes back. Stores for `$group/<g>` are accepted only from the current owner (`check_store`).

`claim` is the shell both partition kinds run (the node's replicas and the in-memory test
broker): it reads the stored epoch, decides with `ActiveGroups.claim`, stores a raised epoch,
and bounds a takeover by `takeover_s` (an owner that has not stepped down by then is dropped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol

from spate.core import groups
from spate.core.active import ActiveGroups, Conflict, Owned, Stale
from spate.core.backend import Attached, ConsumerOffset
from spate.core.errors import AlreadyExists, FailedPrecondition, Unavailable

GROUP_PREFIX = groups.COMMITTED_PREFIX.encode()
EPOCH_PREFIX = groups.EPOCH_PREFIX.encode()
RESERVED_PREFIX = groups.RESERVED_PREFIX
"""Consumer names starting with it belong to groups (and other internal records)."""
TAKEOVER_S = 10.0
"""How long a claim with a greater epoch waits for the owner to step down before dropping it
(its later stores are refused)."""


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


class ClaimHost(Protocol):
    """What `claim` needs of a partition (at its leader)."""

    groups: ActiveGroups
    attached: dict[bytes, int]

    @property
    def stream(self) -> str: ...

    @property
    def partition(self) -> int: ...

    def stored_offset(self, name: bytes) -> Awaitable[ConsumerOffset | None]: ...

    def store_offset(self, name: bytes, offset: int, member: int = 0) -> Awaitable[None]: ...


async def claim(
    host: ClaimHost, name: bytes, epoch: int | None, generation: int | None = None
) -> Attached:
    """Claim the partition for the group `name` (`$group/<g>`); answered with the granted
    epoch once it is stored. `active` False: the owner is stepping down (wait with
    `until_active`). Raises AlreadyExists (owned, epoch not above), FailedPrecondition (stale
    epoch or generation, or the name is used otherwise). `generation`: a coordinator's member
    claims (ADR 0015); the generation is stored with the epoch, so a fenced member's claim is
    refused after a restart too."""
    where = f"{host.stream}/{host.partition}"
    stored_epoch = await host.stored_offset(epoch_name(name))
    durable = 0 if stored_epoch is None else stored_epoch.offset
    durable_generation = 0
    if generation is not None:
        stored_generation = await host.stored_offset(generation_name(name))
        durable_generation = 0 if stored_generation is None else stored_generation.offset
    holder = host.groups.active(name)
    try:
        member, granted, current = host.groups.claim(
            name,
            epoch,
            durable,
            0,  # a `$group/` name has no plain links (the listener refuses such names); the
            # counts of links a disbanded group had may linger here until they detach
            generation,
            durable_generation,
        )
    except Owned as owned:
        raise AlreadyExists(
            f"consumer group {group_of(name)!r} already has an active receiver on {where} "
            f"(epoch {owned.epoch}); attach with 'event-streams-epoch' above {owned.epoch} to "
            "take over"
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
    host.attached[name] = host.attached.get(name, 0) + 1
    try:
        if generation is not None and generation > durable_generation:
            await host.store_offset(generation_name(name), generation)
        if granted > durable:
            await host.store_offset(epoch_name(name), granted)
        stored = await host.stored_offset(name)
    except BaseException:
        release(host, name, member)
        raise
    if not current and holder is not None:
        asyncio.get_running_loop().call_later(TAKEOVER_S, _drop, host, name, holder, member)
    return Attached(stored, member, current, granted)


def _drop(host: ClaimHost, name: bytes, holder: int, claimer: int) -> None:
    """A takeover's owner did not step down in time: drop it from the group (its stores are
    refused now; its link's detach still counts it down)."""
    group = host.groups.groups.get(name)
    if group is not None and group.current == holder and claimer in group.members:
        host.groups.leave(name, holder)


def release(host: ClaimHost, name: bytes, member: int) -> None:
    """The member's link is gone: it no longer counts, nor holds a place in the group."""
    count = host.attached.get(name, 0) - 1
    if count > 0:
        host.attached[name] = count
    else:
        host.attached.pop(name, None)
    host.groups.leave(name, member)


def check_store(groups: ActiveGroups, where: str, name: bytes, member: int) -> None:
    """A group's committed offset is stored only by its current owner (zombie fencing)."""
    if is_group(name) and groups.active(name) != member:
        raise FailedPrecondition(
            f"consumer group {group_of(name)!r} on {where}: this link no longer owns the "
            "partition (another took over with a greater epoch, or the partition's leader "
            "changed); its offset is not stored"
        )
