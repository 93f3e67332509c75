"""ReplicatedPartition: a Replica (replica.py) as spate.core.backend.Partition, whose `append`
returns an asyncio future. Everything else is the Replica's, which the simulator runs as is,
but for the named consumers attached here (`attached`, ADR 0012) and their single active
consumer groups (`groups`, ADR 0013): node-local, not replicated. When this replica stops
leading, the groups are disbanded and every standby waiting for its turn is told NotLeader (its
link is detached, and the client attaches again at the new leader).

A stream's partition 0 is the home of its consumer groups (ADR 0015): while this replica leads
it, `group_coordinators` is the stream's `Coordinators` (created on first use); when it stops
leading they are disbanded (every waiting poll fails with NotLeader) and dropped, and the next
leader starts over from the stored generations."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from spate.core import claiming, ownership
from spate.core.active import ActiveGroups, Conflict
from spate.core.backend import (
    Attached,
    ConsumerOffset,
    ProducerInfo,
    PublishingIds,
    check_reset,
)
from spate.core.coordination import Coordinators
from spate.core.errors import BrokerError, FailedPrecondition, NotLeader
from spate.core.ids import LeaderEpoch, Offset, Term
from spate.node.replication.messages import Ready
from spate.node.replication.replica import Replica

SETTLE_MARGIN_TICKS = 3
"""Ticks a new leader waits beyond one election timeout before granting consumer-group claims
(`ReplicatedPartition.settle_ticks`): covers a heartbeat answer's delay on the wire and a tick's
rounding on either side."""
SETTLE_POLL_S = 0.02


def _settle(future: asyncio.Future[Any]) -> Any:
    def done(outcome: Any) -> None:
        if future.done():
            return
        if isinstance(outcome, BrokerError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    return done


class ReplicatedPartition(Replica):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attached: dict[bytes, int] = {}
        """Named consumer links attached through this replica, by name (ADR 0012)."""
        self.groups = ActiveGroups()
        """Single active consumer groups (ADR 0013), node-local like `attached`."""
        self.standbys: set[asyncio.Future[Attached]] = set()
        """`until_active` and `until_deposed` futures not resolved yet."""
        self.coordinators: Coordinators | None = None
        """The stream's consumer-group coordinators while this replica leads partition 0."""
        self._coordinators_epoch: LeaderEpoch | None = None
        self._led_since = 0
        """The tick (`ticks`) at which this replica last became the leader."""
        self._led_term: Term | None = None
        """The term of that leadership: a leader whose term is not this one became leader
        after `report_leader` last ran (its new term's fsync is still pending), so it has just
        started to lead and is settling (found by the parallel test suite: between the role
        change and report_leader, a stale `_led_since` let a claim skip the settle wait)."""

    def group_coordinators(self, partitions: int) -> Coordinators:
        """The stream's consumer groups, homed here (partition 0, at its leader; ADR 0015).
        NotLeader when this replica does not lead."""
        assert self.partition == 0, "a stream's groups live at its partition 0"
        self._check_leader()
        if self.coordinators is not None and self._coordinators_epoch != self.leader_epoch:
            self._disband_coordinators()  # led again since: those members joined another
        if self.coordinators is None:
            self.coordinators = Coordinators(self, self.stream, partitions)
            self._coordinators_epoch = self.leader_epoch
        return self.coordinators

    def close(self) -> None:
        super().close()
        self._disband_coordinators()
        self._dismiss(f"{self.stream}/{self.partition} closed on this node (shut down or moved)")

    def _disband_coordinators(self) -> None:
        if self.coordinators is not None:
            self.coordinators.disband()
            self.coordinators = None
            self._coordinators_epoch = None

    def append(
        self, records: Sequence[bytes], producer: PublishingIds | None = None
    ) -> asyncio.Future[Offset]:
        future: asyncio.Future[Offset] = asyncio.get_running_loop().create_future()
        self.propose(records, _settle(future), producer)
        return future

    def last_publishing_id(self, name: bytes) -> asyncio.Future[ProducerInfo | None]:
        future: asyncio.Future[ProducerInfo | None] = asyncio.get_running_loop().create_future()
        self.query_publishing_id(name, _settle(future))
        return future

    # -- offset tracking (ADR 0012)

    def store_offset(self, name: bytes, offset: int, member: int = 0) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done = _settle(future)
        try:
            ownership.check_store(self.groups, f"{self.stream}/{self.partition}", name, member)
        except BrokerError as fenced:
            done(fenced)
            return future
        self.propose_offsets(
            [(name, offset)], lambda o: done(o if isinstance(o, BrokerError) else None)
        )
        return future

    def _store_unfenced(self, name: bytes, offset: int) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done = _settle(future)
        self.propose_offsets(
            [(name, offset)], lambda o: done(o if isinstance(o, BrokerError) else None)
        )
        return future

    def stored_offset(self, name: bytes) -> asyncio.Future[ConsumerOffset | None]:
        future: asyncio.Future[ConsumerOffset | None] = asyncio.get_running_loop().create_future()
        self.query_offset(name, _settle(future))
        return future

    async def consumer_attach(
        self, name: bytes, *, single_active: bool = False, spread: int | None = None
    ) -> Attached:
        stored = await self.stored_offset(name)  # NotLeader here: the link goes to the leader
        try:
            member, active = self.groups.attach(
                name, self.attached.get(name, 0), single_active=single_active, spread=spread
            )
        except Conflict as conflict:
            raise FailedPrecondition(f"{conflict} on {self.stream}/{self.partition}") from None
        self.attached[name] = self.attached.get(name, 0) + 1
        return Attached(stored, member, active)

    async def claim(
        self, name: bytes, epoch: int | None, generation: int | None = None
    ) -> Attached:
        """A consumer group's link claims this partition (ADR 0015, spate.core.claiming),
        once this leader has settled (`settle_ticks`)."""
        self._check_leader()
        while self.settling():
            await asyncio.sleep(SETTLE_POLL_S)
            self._check_leader()
        return await claiming.claim(self, name, epoch, generation)

    def settle_ticks(self) -> int:
        """How long a new leader grants no consumer-group claim: one election timeout and
        SETTLE_MARGIN_TICKS. Its election took a majority that had not heard the leader before
        it for an election timeout, and that leader steps down when it has not heard a majority
        for two (check-quorum), so by then it has stepped down and told its holders to stop
        (ADR 0015, "Leader changes") — a holder there never overlaps one granted here."""
        return self.raft.config.election_timeout_ticks + SETTLE_MARGIN_TICKS

    def settling(self) -> bool:
        """This replica leads, and became leader less than `settle_ticks` ago, with entries
        before its own first one: a leader that found the log empty has no holder before it to
        wait out (nothing was ever committed, so no holder could have received anything)."""
        if not self.is_leader or self.raft.barrier <= 1:
            return False
        if self._led_term != self.raft.term:
            return True  # leading since this term began; report_leader has not run yet
        return self.ticks - self._led_since < self.settle_ticks()

    def until_active(self, name: bytes, member: int) -> asyncio.Future[Attached]:
        future = self._standby()

        def told(active: bool) -> None:
            if not active:
                if not future.done():
                    future.set_result(Attached(None, member, active=False))
                return
            stored = self.stored_offset(name)  # committed: what the last member stored

            def answer(query: asyncio.Future[ConsumerOffset | None]) -> None:
                if future.done():
                    return
                error = None if query.cancelled() else query.exception()
                if error is not None or query.cancelled():
                    future.set_exception(error or asyncio.CancelledError())
                else:
                    future.set_result(Attached(query.result(), member, active=True))

            stored.add_done_callback(answer)

        self.groups.watch(name, member, told)
        return future

    def in_contact(self) -> bool:
        return True  # the claim is held right here

    def until_deposed(self, name: bytes, member: int) -> asyncio.Future[Attached]:
        future = self._standby()

        def told(deposed: bool) -> None:
            if not future.done():
                future.set_result(Attached(None, member, active=not deposed))

        self.groups.watch_deposed(name, member, told)
        return future

    async def step_down(self, name: bytes, member: int, offset: int | None) -> None:
        if offset is not None:
            await self.store_offset(name, offset, member)
        self.groups.stepped_down(name, member)

    def _standby(self) -> asyncio.Future[Attached]:
        """A future answered when a group member's turn comes (or goes); failed with NotLeader
        when this replica stops leading."""
        future: asyncio.Future[Attached] = asyncio.get_running_loop().create_future()
        self.standbys.add(future)
        future.add_done_callback(self.standbys.discard)
        return future

    def report_leader(self, ready: Ready) -> None:
        super().report_leader(ready)
        if ready.leader_change is not None and self.is_leader:
            self._led_since, self._led_term = self.ticks, self.raft.term
        if ready.leader_change is not None and not self.is_leader:
            self._disband_coordinators()
            self._dismiss(f"{self.stream}/{self.partition} has a new leader")

    def _dismiss(self, why: str) -> None:
        """Disband the groups: every standby and holder waiting here is told NotLeader."""
        self.groups.disband()
        for future in list(self.standbys):
            if not future.done():
                future.set_exception(
                    NotLeader(
                        f"{why}: attach again at its leader to rejoin the group",
                        leader_node=self.raft.leader,
                    )
                )

    async def consumer_detach(self, name: bytes, offset: int | None, member: int = 0) -> None:
        try:
            if offset is not None and not (
                ownership.is_group(name) and self.groups.active(name) != member
            ):  # a group's former owner is fenced: what it finished is not stored
                await self.store_offset(name, offset, member)
        finally:
            count = self.attached.get(name, 0) - 1
            if count > 0:
                self.attached[name] = count
            else:
                self.attached.pop(name, None)
            if member:
                self.groups.leave(name, member)

    async def reset_offset(self, name: bytes, offset: int) -> None:
        """An operator's reset: refused while a link of that name is attached here, and past
        the partition's last committed message."""
        self._check_leader()
        check_reset(self.stream, self.partition, offset, int(self.end_offset()))
        if self.attached.get(name):
            raise FailedPrecondition(
                f"consumer {name.decode(errors='replace')!r} has {self.attached[name]} link(s) "
                f"attached to {self.stream}/{self.partition}; detach them before resetting"
            )
        # No link of the name is attached here, so a group's committed offset has no owner
        # to fence (ownership.check_store): the operator may set it, as for any name.
        await self._store_unfenced(name, offset)

    def consumer_offsets(self) -> list[ConsumerOffset]:
        """Stored offsets on this replica, with the links attached here."""
        attached, groups = self.attached, self.groups
        return [
            ConsumerOffset(
                c.name,
                c.offset,
                c.timestamp_ms,
                attached.get(c.name.encode(), 0),
                groups.size(c.name.encode()),
            )
            for c in self.offsets()
        ]
