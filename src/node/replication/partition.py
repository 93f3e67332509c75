"""ReplicatedPartition: a Replica (replica.py) as spate.core.backend.Partition, whose `append`
returns an asyncio future. Everything else is the Replica's, which the simulator runs as is."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from spate.core.backend import ProducerInfo, PublishingIds
from spate.core.errors import BrokerError
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
