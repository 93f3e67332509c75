"""Leader changes of this node, coalesced into ReportLeaders commands (issue 16).

Every partition whose Raft group elects this node reports it to the metadata service, which
routes clients by it. One command per change made a stream of 1,000 partitions take minutes
to show its leaders: each command is a metadata Raft round with a journal fsync, and each
applied change woke every node's placement and routing pass. Here the changes of
`window_ms` are gathered (the latest epoch per partition wins) and sent as one command of at
most `limits.leader_reports_max` reports and `_BYTES_MAX` bytes; a failed command's reports
go back in the queue (unless a newer epoch arrived meanwhile) and are retried after
`retry_ms`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from spate.cluster.metadata import limits
from spate.cluster.metadata.state import LeaderReport
from spate.core.errors import BrokerError
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName

log = logging.getLogger(__name__)

_BYTES_MAX = limits.command_bytes_max // 4
"""Encoded size a batch stays under (each report costs its stream name plus ~40 bytes)."""
_REPORT_OVERHEAD = 48

Submit = Callable[[Sequence[LeaderReport]], Awaitable[None]]


class LeaderReports:
    """A queue of this node's leader changes and the task that sends them."""

    def __init__(
        self,
        node_id: NodeId,
        submit: Submit,
        *,
        window_ms: int = limits.leader_report_window_ms,
        retry_ms: int = 1_000,
    ) -> None:
        self.node_id = node_id
        self._submit = submit
        self.window_ms = window_ms
        self.retry_ms = retry_ms
        self._pending: dict[tuple[StreamName, PartitionId], LeaderEpoch] = {}
        self._wake = asyncio.Event()
        self.commands = 0
        """ReportLeaders commands committed (a figure for tests)."""

    def add(self, stream: StreamName, partition: PartitionId, epoch: LeaderEpoch) -> None:
        key = (stream, partition)
        if self._pending.get(key, -1) < epoch:
            self._pending[key] = epoch
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self) -> list[LeaderReport]:
        """The next batch (oldest changes first), removed from the queue."""
        batch: list[LeaderReport] = []
        size = 0
        for (stream, partition), epoch in self._pending.items():
            cost = len(stream.encode()) + _REPORT_OVERHEAD
            if batch and (len(batch) >= limits.leader_reports_max or size + cost > _BYTES_MAX):
                break
            batch.append(LeaderReport(stream, partition, self.node_id, epoch))
            size += cost
        for report in batch:
            del self._pending[(report.stream, report.partition)]
        return batch

    def put_back(self, batch: Sequence[LeaderReport]) -> None:
        """Re-queue a failed batch's reports, unless a newer epoch is queued already."""
        for report in batch:
            self.add(report.stream, report.partition, report.epoch)

    async def run(self) -> None:
        """Send batches for ever (cancel to stop)."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.window_ms / 1000)  # gather the changes of one window
            self._wake.clear()
            while self._pending:
                batch = self.take()
                try:
                    await self._submit(batch)
                except BrokerError as error:
                    self.put_back(batch)
                    log.warning(
                        "could not report leadership of %d partitions (will retry): %s",
                        len(batch),
                        error.message,
                    )
                    await asyncio.sleep(self.retry_ms / 1000)
                    continue
                self.commands += 1
