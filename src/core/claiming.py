"""A consumer group's claim at a partition's leader (ADR 0015): the asyncio shell of
`spate.core.ownership`, which both partition kinds run (the node's replicas and the in-memory
test broker). It reads the stored epoch (and generation), decides with
`ownership.decide_claim`, stores what the decision raised before the claim is answered, and
bounds a takeover by `TAKEOVER_S` (an owner that has not stepped down by then is dropped).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol

from spate.core.backend import Attached, ConsumerOffset
from spate.core.ownership import (
    Claims,
    decide_claim,
    drop_holder,
    epoch_name,
    generation_name,
    release,
)

TAKEOVER_S = 10.0
"""How long a claim with a greater epoch waits for the owner to step down before dropping it
(its later stores are refused)."""


class ClaimHost(Claims, Protocol):
    """What `claim` needs of a partition (at its leader)."""

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
    claimed = decide_claim(host, where, name, epoch, durable, generation, durable_generation)
    try:
        for reserved, value in claimed.stores:
            await host.store_offset(reserved, value)
        stored = await host.stored_offset(name)
    except BaseException:
        release(host, name, claimed.member)
        raise
    for holder in (claimed.holder, *claimed.shared):
        if holder is not None:
            asyncio.get_running_loop().call_later(
                TAKEOVER_S, drop_holder, host, name, holder, claimed.member
            )
    return Attached(stored, claimed.member, claimed.current, claimed.epoch)
