"""A node's leader changes, coalesced into ReportLeaders commands (issue 16)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from spate.cluster.metadata import codec, limits
from spate.cluster.metadata.state import LeaderReport, ReportLeaders, RequestId
from spate.core.errors import Unavailable
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.server.leader_reports import LeaderReports

N1 = NodeId("n1")


def test_a_thousand_changes_go_in_a_few_commands_each_partition_at_its_latest_epoch() -> None:
    sent: list[list[LeaderReport]] = []

    async def submit(batch: Sequence[LeaderReport]) -> None:
        sent.append(list(batch))

    async def main() -> None:
        reports = LeaderReports(N1, submit, window_ms=10)
        task = asyncio.create_task(reports.run())
        for partition in range(1000):
            reports.add(StreamName("big"), PartitionId(partition), LeaderEpoch(1))
        reports.add(StreamName("big"), PartitionId(7), LeaderEpoch(3))
        reports.add(StreamName("big"), PartitionId(7), LeaderEpoch(2))  # late: the 3 stays
        while reports.pending or reports.commands < 2:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())
    assert [len(batch) for batch in sent] == [limits.leader_reports_max] * 5
    flat = {(r.partition, r.epoch) for batch in sent for r in batch}
    assert len(flat) == 1000 and (7, 3) in flat and all(r.leader == N1 for r in sent[0])
    for batch in sent:  # each fits in one metadata command
        data = codec.encode_command(ReportLeaders(RequestId("x" * 32), tuple(batch)))
        assert len(data) <= limits.command_bytes_max


def test_long_stream_names_are_split_by_size_and_a_failed_batch_is_retried() -> None:
    sent: list[list[LeaderReport]] = []
    failures = [Unavailable("no metadata leader")]

    async def submit(batch: Sequence[LeaderReport]) -> None:
        if failures:
            raise failures.pop()
        sent.append(list(batch))

    async def main() -> None:
        reports = LeaderReports(N1, submit, window_ms=1, retry_ms=1)
        task = asyncio.create_task(reports.run())
        name = StreamName("s" * 240)
        for partition in range(300):
            reports.add(name, PartitionId(partition), LeaderEpoch(1))
        while reports.pending or sum(len(b) for b in sent) < 300:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())
    assert len(sent) >= 3 and sum(len(b) for b in sent) == 300
    for batch in sent:
        data = codec.encode_command(ReportLeaders(RequestId("x" * 32), tuple(batch)))
        assert len(data) <= limits.command_bytes_max
