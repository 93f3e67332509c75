"""Opening many replicas at once (ADR 0031): `ReplicationHost.open_partitions` opens them in
batches on its opener thread and hands each batch to the driver only once every directory whose
entries it changed was fsynced; every replica is then usable, a replica that cannot be opened
fails alone, and the node reopens them all (the restart path, with data) in batches too. The
driver batches of their elections and appends sync side by side on several threads."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from spate.core.errors import InvalidArgument
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.node.log import LogConfig
from spate.node.replication import host as host_module
from spate.node.replication.host import OpenRequest, ReplicationHost
from spate.node.replication.partition import ReplicatedPartition

from tests.replication.test_shell_cluster import SECRET, TICK_MS, all_records, until

ME = NodeId("n1")
STREAM = StreamName("many")
BATCH = 8
COUNT = 2 * BATCH + 3  # three batches


def _host(root: Path) -> ReplicationHost:
    return ReplicationHost(
        ME, root, host="127.0.0.1", port=0, secret=SECRET, peers=lambda n: None, tick_ms=TICK_MS
    )


def _requests(count: int) -> list[OpenRequest]:
    return [OpenRequest(STREAM, PartitionId(i), (ME,), LogConfig()) for i in range(count)]


def test_many_replicas_open_in_batches_durably_and_reopen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: set[str] = set()
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(host_module, "OPEN_BATCH", BATCH)
    # The elections' and appends' syncs run on the side-by-side path too (ADR 0031).
    monkeypatch.setattr(host_module, "SIDE_BY_SIDE_SYNCS", 2)
    asyncio.run(_open_write_reopen(tmp_path, synced))


async def _open_write_reopen(root: Path, synced: set[str]) -> None:
    # Partition 5's place is taken by a file: it alone fails to open.
    (root / "partitions" / STREAM).mkdir(parents=True)
    (root / "partitions" / STREAM / "5").write_bytes(b"not a directory")
    requests = _requests(COUNT)
    requests.append(OpenRequest(STREAM, PartitionId(COUNT), (NodeId("n2"),), LogConfig()))
    other = StreamName("other")  # its directory is new too, and so is an entry of partitions/
    requests += [OpenRequest(other, PartitionId(i), (ME,), LogConfig()) for i in range(2)]
    host = _host(root)
    await host.start()
    opened: dict[PartitionId, ReplicatedPartition] = {}
    failed: dict[PartitionId, BaseException] = {}
    batches = 0
    try:
        async for batch in host.open_partitions(requests):
            batches += 1
            for request, outcome in batch:
                if isinstance(outcome, BaseException):
                    failed[request.partition] = outcome
                    continue
                # In the driver now, so it may vote and acknowledge: its place must be durable
                # (each directory whose entries changed was fsynced), with no sync per file.
                directory = host.partition_dir(request.stream, request.partition)
                places = [directory / "log", directory, directory.parent]
                if request.stream == other:
                    places.append(root / "partitions")
                for place in places:
                    assert str(place) in synced, (request.partition, place)
                assert host.partition(request.stream, request.partition) is outcome
                if request.stream == STREAM:
                    opened[request.partition] = outcome
        assert batches >= 3
        assert set(failed) == {PartitionId(5), PartitionId(COUNT)}
        assert isinstance(failed[PartitionId(COUNT)], InvalidArgument)  # n1 is no replica
        assert "not a replica" in str(failed[PartitionId(COUNT)])
        assert len(opened) == COUNT - 1
        await until(lambda: all(p.is_leader for p in opened.values()), "every replica leads")
        offsets = await asyncio.gather(*(p.append([b"r%d" % p.partition]) for p in opened.values()))
        assert offsets == [0] * len(opened)
    finally:
        await host.stop()

    # The restart path: the same replicas, now with data, reopened in batches.
    host = _host(root)
    await host.start()
    try:
        again = {}
        async for batch in host.open_partitions(_requests(COUNT)):
            for request, outcome in batch:
                if request.partition != 5:
                    assert isinstance(outcome, ReplicatedPartition), outcome
                    again[request.partition] = outcome
        assert len(again) == COUNT - 1
        for partition, replica in again.items():
            assert not replica.store.fresh
            assert all_records(replica) == [b"r%d" % partition]
        await until(lambda: all(p.is_leader for p in again.values()), "re-elected")
        assert await again[PartitionId(0)].append([b"more"]) == 1
    finally:
        await host.stop()
