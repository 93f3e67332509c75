"""PartitionShell: group-commit fsync in a thread, durable-only reads, listeners, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from spate.core.backend import OffsetSpec
from spate.core.errors import (
    MessageSizeExceeded,
    ResourceLimitExceeded,
    StorageFailure,
    Unavailable,
)
from spate.core.ids import NodeId, Offset, PartitionId, StreamName
from spate.core.streams import Retention
from spate.node.log import FileStorage, LogConfig, PartitionLog
from spate.node.partition import PartitionShell
from spate.sim.disk import SimDisk

STREAM = StreamName("orders")


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


def make_shell(
    directory: Path, config: LogConfig | None = None, **kwargs: object
) -> PartitionShell:
    return PartitionShell(
        STREAM, PartitionId(0), directory, config or LogConfig(), leader=NodeId("n1"), **kwargs
    )  # type: ignore[arg-type]


def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    """64 producers each awaiting 20 appends: 1280 appends, each fsync covers a whole group."""

    async def body() -> None:
        shell = make_shell(tmp_path)
        await shell.start()
        offsets: list[Offset] = []

        async def producer(p: int) -> None:
            for i in range(20):
                offsets.append(await shell.append([b"p%d-%d" % (p, i)]))

        await asyncio.gather(*(producer(p) for p in range(64)))
        assert sorted(offsets) == list(range(1280))
        assert 1 <= shell.fsyncs <= 1280 // 20, shell.fsyncs
        assert shell.end_offset() == 1280
        await shell.close()

    run(body)


def test_appends_written_together_are_covered_by_one_fsync(tmp_path: Path) -> None:
    async def body() -> None:
        shell = make_shell(tmp_path)
        await shell.start()
        futures = [shell.append([b"m%d" % i]) for i in range(500)]
        assert await asyncio.gather(*futures) == list(range(500))
        assert shell.fsyncs == 1
        await shell.close()

    run(body)


def test_consumers_only_see_durable_data(tmp_path: Path) -> None:
    async def body() -> None:
        shell = make_shell(tmp_path)
        await shell.start()
        await shell.append([b"a"])
        future = shell.append([b"b", b"c"])
        assert shell.log_core.end_offset == 3, "written at once"
        assert shell.end_offset() == 1, "but not durable yet"
        assert shell.resolve(OffsetSpec.next()) == 1
        assert [v.first_offset for v in shell.read(Offset(0), 10_000)] == [0]
        assert await future == 1
        assert shell.end_offset() == 3
        assert [bytes(r) for v in shell.read(Offset(0), 10_000) for r in v.records] == [
            b"a",
            b"b",
            b"c",
        ]
        await shell.close()

    run(body)


def test_listeners_are_called_after_each_sync(tmp_path: Path) -> None:
    async def body() -> None:
        shell = make_shell(tmp_path)
        await shell.start()
        seen: list[Offset] = []

        def listener() -> None:
            seen.append(shell.end_offset())

        shell.add_listener(listener)
        await shell.append([b"a"])
        await asyncio.sleep(0)
        assert seen == [1]
        shell.remove_listener(listener)
        await shell.append([b"b"])
        await asyncio.sleep(0)
        assert seen == [1]
        await shell.close()

    run(body)


def test_failed_fsync_fails_waiting_appends_and_refuses_later_ones(tmp_path: Path) -> None:
    async def body() -> None:
        disk = SimDisk(5)
        shell = make_shell(tmp_path, storage=disk)
        await shell.start()
        assert await shell.append([b"ok"]) == 0
        disk.fail_fsync = True
        waiting = [shell.append([b"w%d" % i]) for i in range(3)]
        for future in waiting:
            with pytest.raises(StorageFailure, match="could not make the write durable"):
                await future
        with pytest.raises(StorageFailure, match="refuses writes since: fsync failed"):
            await shell.append([b"later"])
        assert shell.end_offset() == 1
        await shell.close()

    run(body)


def test_too_many_pending_appends_fail_fast(tmp_path: Path) -> None:
    """Over the bound an append fails at once with a retryable ResourceLimitExceeded."""

    async def body() -> None:
        shell = make_shell(tmp_path, pending_appends_max=10)
        await shell.start()
        futures = [shell.append([b"m"]) for _ in range(11)]
        with pytest.raises(ResourceLimitExceeded) as refused:
            await futures[10]
        assert refused.value.retryable
        assert await asyncio.gather(*futures[:10]) == list(range(10))
        assert await shell.append([b"again"]) == 10
        await shell.close()

    run(body)


def test_bad_input_fails_through_the_future(tmp_path: Path) -> None:
    async def body() -> None:
        shell = make_shell(tmp_path)
        await shell.start()
        with pytest.raises(MessageSizeExceeded):
            await shell.append([b"x" * (1024 * 1024 + 1)])
        await shell.close()
        with pytest.raises(Unavailable):
            await shell.append([b"late"])

    run(body)


def test_close_makes_written_appends_durable(tmp_path: Path) -> None:
    async def body() -> None:
        shell = make_shell(tmp_path)
        await shell.start()
        futures = [shell.append([b"m%d" % i]) for i in range(50)]
        await shell.close()
        assert [f.result() for f in futures] == list(range(50))

    run(body)
    log = PartitionLog.open(FileStorage(tmp_path), LogConfig())
    assert log.end_offset == 50 and log.recovery.truncated_bytes == 0


def test_retention_and_info(tmp_path: Path) -> None:
    async def body() -> None:
        clock = Clock()
        config = LogConfig(segment_bytes=1000, retention=Retention(max_age_ms=10_000))
        shell = make_shell(tmp_path, config, clock_ms=clock)
        await shell.start()
        for _ in range(10):
            await shell.append([b"x" * 400])
            clock.now_ms += 1_000
        info = shell.info()
        assert (info.first_offset, info.last_offset, info.end_offset) == (0, 9, 10)
        assert (info.first_timestamp_ms, info.last_timestamp_ms) == (1_000, 10_000)
        assert (info.segments, info.leader, info.stream) == (5, "n1", STREAM)
        clock.now_ms = 14_500  # segments whose newest record is before 4_500 go
        shell.request_retention()
        assert shell.info().first_offset == 4
        await shell.close()

    run(body)


def test_the_retention_task_runs_on_its_interval(tmp_path: Path) -> None:
    async def body() -> None:
        config = LogConfig(segment_bytes=1000, retention=Retention(max_messages=2))
        shell = make_shell(tmp_path, config, retention_interval_ms=5)
        await shell.start()
        for _ in range(10):
            await shell.append([b"x" * 400])
        for _ in range(2000):  # wait for the task, however slow the machine
            if len(shell.log_core.segments) == 1:
                break
            await asyncio.sleep(0.005)
        assert shell.info().first_offset == 8
        await shell.close()

    run(body)
