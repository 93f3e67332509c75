"""ReplicatedPartition: a Replica (replica.py) as spate.core.backend.Partition, whose `append`
returns an asyncio future. Everything else is the Replica's, which the simulator runs as is,
but for the named consumers attached here (`attached`, ADR 0012): node-local, not replicated."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from spate.core.backend import ConsumerOffset, ProducerInfo, PublishingIds
from spate.core.errors import BrokerError, FailedPrecondition
from spate.core.ids import Offset
from spate.node.replication.replica import Replica


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

    def store_offset(self, name: bytes, offset: int) -> asyncio.Future[None]:
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

    async def consumer_attach(self, name: bytes) -> ConsumerOffset | None:
        stored = await self.stored_offset(name)  # NotLeader here: the link goes to the leader
        self.attached[name] = self.attached.get(name, 0) + 1
        return stored

    async def consumer_detach(self, name: bytes, offset: int | None) -> None:
        try:
            if offset is not None:
                await self.store_offset(name, offset)
        finally:
            count = self.attached.get(name, 0) - 1
            if count > 0:
                self.attached[name] = count
            else:
                self.attached.pop(name, None)

    async def reset_offset(self, name: bytes, offset: int) -> None:
        """An operator's reset: refused while a link of that name is attached here."""
        self._check_leader()
        if self.attached.get(name):
            raise FailedPrecondition(
                f"consumer {name.decode(errors='replace')!r} has {self.attached[name]} link(s) "
                f"attached to {self.stream}/{self.partition}; detach them before resetting"
            )
        await self.store_offset(name, offset)

    def consumer_offsets(self) -> list[ConsumerOffset]:
        """Stored offsets on this replica, with the links attached here."""
        attached = self.attached
        return [
            ConsumerOffset(c.name, c.offset, c.timestamp_ms, attached.get(c.name.encode(), 0))
            for c in self.offsets()
        ]
