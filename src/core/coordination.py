"""The consumer-group coordinator's shell (ADR 0015): `spate.core.coordinator` driven by the
event loop's clock, at the leader of a stream's partition 0 (the groups' *home*).

`Coordinators` holds one `Coordinator` per group of the stream. It stores each new generation
as `$generation/<group>` in the home partition's log before any member sees it
(`generation_stored`), expires silent members and runs due rebalances on a timer, and answers
members' long polls (`sync`) when their assignment changes. The home partition kind (the
node's replica, the in-memory test partition) provides `stored_offset` and `store_offset`.

Members are a gateway's (or node listener's) partition-agnostic group links: `join`, then
`sync` in a loop (each poll is a heartbeat), `released` after storing what they finished of a
partition they must give up, `leave` when the link goes. When the home partition's leadership
moves, `disband` fails every waiting poll with NotLeader: members end their links (their
clients attach again, at the new home, where the groups start over from the stored
generations).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Protocol

from spate.core import groups
from spate.core.backend import ConsumerOffset
from spate.core.coordinator import (
    Assignment,
    Coordinator,
    GroupSettings,
    GroupView,
)
from spate.core.errors import (
    FailedPrecondition,
    NoPartitionFree,
    NotFound,
    NotLeader,
)
from spate.core.ids import Generation, MemberId, PartitionId

GENERATION_PREFIX = groups.GENERATION_PREFIX.encode()


def generation_name(group: str) -> bytes:
    return GENERATION_PREFIX + group.encode()


class Home(Protocol):
    """The home partition, at its leader."""

    def stored_offset(self, name: bytes) -> Awaitable[ConsumerOffset | None]: ...

    def store_offset(self, name: bytes, offset: int, member: int = 0) -> Awaitable[None]: ...


@dataclass
class _Group:
    coordinator: Coordinator
    settings: GroupSettings
    changed: asyncio.Event
    """Set (and replaced) whenever any assignment may have changed."""


class Coordinators:
    """The groups of one stream at its home partition's leader (see the module docstring)."""

    def __init__(self, home: Home, stream: str, partitions: int) -> None:
        self.home = home
        self.stream = stream
        self.partitions = partitions
        self.groups: dict[str, _Group] = {}
        self._starting: dict[str, asyncio.Future[_Group]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._storing: set[str] = set()
        self._disbanded = False
        self._loop = asyncio.get_running_loop()

    def _now_ms(self) -> int:
        return int(self._loop.time() * 1000)

    async def _group(self, group: str, settings: GroupSettings) -> _Group:
        """The group's coordinator, started from its stored generation if it is new here."""
        found = self.groups.get(group)
        if found is None:
            starting = self._starting.get(group)
            if starting is None:
                starting = self._loop.create_future()
                self._starting[group] = starting
                try:
                    stored = await self.home.stored_offset(generation_name(group))
                    self._check_live()
                    found = _Group(
                        Coordinator(
                            self.partitions,
                            settings.strategy,
                            generation=Generation(0 if stored is None else stored.offset),
                            rebalance_delay_ms=settings.rebalance_delay_ms,
                        ),
                        settings,
                        asyncio.Event(),
                    )
                    self.groups[group] = found
                    starting.set_result(found)
                except BaseException as error:
                    starting.set_exception(error)
                    starting.exception()  # retrieved: the joiners waiting re-raise it
                    raise
                finally:
                    del self._starting[group]
            else:
                found = await asyncio.shield(starting)
        if found.settings.strategy != settings.strategy:
            raise FailedPrecondition(
                f"consumer group {group!r} of {self.stream!r} assigns with "
                f"{found.settings.strategy!r}, not {settings.strategy!r}"
            )
        return found

    def _check_live(self) -> None:
        if self._disbanded:
            raise NotLeader(
                f"{self.stream}/0, the home of its consumer groups, has a new leader: join again "
                "there"
            )

    async def join(self, group: str, settings: GroupSettings) -> MemberId:
        settings.check()
        self._check_live()
        state = await self._group(group, settings)
        coordinator = state.coordinator
        waiting = len(coordinator.members) - self.partitions
        if waiting >= state.settings.pending_max:
            raise NoPartitionFree(
                f"consumer group {group!r} has {len(coordinator.members)} members for the "
                f"{self.partitions} partition(s) of {self.stream!r} and {waiting} waiting for "
                f"one, its limit (spate group create --pending-max; 000 §4.5.1): attach again "
                "when a member leaves"
            )
        member = coordinator.join(self._now_ms(), settings.session_timeout_ms)
        self._changed(group)
        return member

    async def sync(
        self, group: str, member: MemberId, known: Assignment | None, timeout_s: float
    ) -> Assignment:
        """The member's assignment once it differs from `known` (at once when None), or as it
        is after `timeout_s`; a heartbeat either way. NotFound: unknown member (join again)."""
        self._check_live()
        deadline = self._loop.time() + timeout_s
        while True:
            state = self.groups.get(group)
            if state is None or not state.coordinator.heartbeat(member, self._now_ms()):
                raise NotFound(
                    f"member {member} is not in consumer group {group!r} of {self.stream!r} "
                    "(it left or its session expired): join again"
                )
            now = state.coordinator.assignment(member)
            assert now is not None
            if now != known or self._loop.time() >= deadline:
                return now
            changed = state.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), deadline - self._loop.time())
            self._check_live()

    async def released(
        self, group: str, member: MemberId, partitions: Iterable[PartitionId], generation: int
    ) -> None:
        self._check_live()
        state = self.groups.get(group)
        if state is None:
            return
        state.coordinator.released(member, partitions, Generation(generation))
        self._changed(group)

    async def leave(self, group: str, member: MemberId) -> None:
        state = self.groups.get(group)
        if state is not None and state.coordinator.leave(member, self._now_ms()):
            self._changed(group)

    async def describe(self, group: str) -> GroupView | None:
        """None when no member is in `group` here (it never had one since this coordinator
        started, or the last one left)."""
        self._check_live()
        state = self.groups.get(group)
        return None if state is None else state.coordinator.describe(self._now_ms())

    def disband(self) -> None:
        """This replica stopped leading the home partition: every poll fails with NotLeader."""
        self._disbanded = True
        if self._timer is not None:
            self._timer.cancel()
        for state in self.groups.values():
            state.changed.set()
        self.groups.clear()

    # -- the clock

    def _changed(self, group: str) -> None:
        """Wake the group's polls, and run what is due now or arm the timer for later."""
        state = self.groups.get(group)
        if state is not None:
            state.changed.set()
            state.changed = asyncio.Event()
        self._run_due()

    def _run_due(self) -> None:
        if self._disbanded:
            return
        now = self._now_ms()
        wake: int | None = None
        for name, state in list(self.groups.items()):
            coordinator = state.coordinator
            if coordinator.expire(now):
                state.changed.set()
                state.changed = asyncio.Event()
            if name not in self._storing:
                generation = coordinator.tick(now)
                if generation is not None:
                    self._storing.add(name)
                    task = self._loop.create_task(self._store(name, state, generation))
                    task.add_done_callback(_retrieve)
            deadline = coordinator.next_deadline_ms()
            if deadline is not None:
                wake = deadline if wake is None else min(wake, deadline)
            if not coordinator.members and name not in self._storing:
                del self.groups[name]  # nobody left: its generation is stored
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wake is not None:
            self._timer = self._loop.call_at(max(wake, now) / 1000, self._run_due)

    async def _store(self, name: str, state: _Group, generation: Generation) -> None:
        """Store before announce: the generation is in the home partition's log before any
        member sees it."""
        try:
            await self.home.store_offset(generation_name(name), generation)
        except BaseException:
            self._storing.discard(name)
            if not self._disbanded:  # try again shortly (e.g. a slow disk): nothing was seen
                self._loop.call_later(0.2, self._retry_store, name, state, generation)
            raise
        self._storing.discard(name)
        if self._disbanded or self.groups.get(name) is not state:
            return
        state.coordinator.generation_stored(generation)
        self._changed(name)

    def _retry_store(self, name: str, state: _Group, generation: Generation) -> None:
        if self._disbanded or self.groups.get(name) is not state or name in self._storing:
            return
        self._storing.add(name)
        task = self._loop.create_task(self._store(name, state, generation))
        task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
