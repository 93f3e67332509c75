"""ReplicatedPartition: a Replica (replica.py) as spate.core.backend.Partition, whose `append`
returns an asyncio future. Everything else is the Replica's, which the simulator runs as is."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from spate.core.errors import BrokerError
from spate.core.ids import Offset
from spate.node.replication.replica import Replica


class ReplicatedPartition(Replica):
    def append(self, records: Sequence[bytes]) -> asyncio.Future[Offset]:
        future: asyncio.Future[Offset] = asyncio.get_running_loop().create_future()

        def done(outcome: Offset | BrokerError) -> None:
            if future.done():
                return
            if isinstance(outcome, BrokerError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        self.propose(records, done)
        return future
