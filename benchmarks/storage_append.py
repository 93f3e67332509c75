"""Storage append throughput with fsync, against the disk's own sequential bandwidth (dd).

Run: .venv/bin/python benchmarks/storage_append.py [--mib 256]

A. batched: chunks of 1000 records of 100 bytes, each appended and fsynced (PartitionLog.sync)
   before the next: one writer, no overlap of CPU and disk;
B. pipelined: the same chunks through PartitionShell from one producer that keeps 10 appends
   (10,000 messages, W1's confirm window) unconfirmed: fsync in its thread overlaps with
   encoding and writing the next chunks, and each fsync covers the chunks written meanwhile;
C. single: 64 concurrent producers through PartitionShell, each appending one 100-byte record
   and awaiting its confirm before the next (group commit does the batching);
D. dd if=/dev/zero bs=1M count=<mib> conv=fdatasync on the same filesystem.

Prints MB/s and msg/s and the ratio Spate/dd (target: >= 0.8, brief §4).
The temp directory is created next to this file, so it is on the same disk as the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path

from spate.core.ids import Offset, PartitionId, StreamName
from spate.node.log import FileStorage, LogConfig, PartitionLog
from spate.node.partition import PartitionShell

RECORD = b"x" * 100
MB = 1_000_000


def batched(directory: Path, total_bytes: int, batch: int) -> tuple[float, int, int]:
    log = PartitionLog.open(FileStorage(directory), LogConfig())
    records = [RECORD] * batch
    messages = 0
    started = time.perf_counter()
    while messages * len(RECORD) < total_bytes:
        log.append(records, 0)
        log.sync()
        messages += batch
    elapsed = time.perf_counter() - started
    disk_bytes = log.info().bytes
    log.close()
    return elapsed, messages, disk_bytes


async def through_shell(
    directory: Path, messages: int, concurrency: int, batch: int
) -> tuple[float, int, int]:
    """`concurrency` producers, each awaiting every append of `batch` records."""
    shell = PartitionShell(StreamName("bench"), PartitionId(0), directory, LogConfig())
    await shell.start()
    each = messages // concurrency // batch
    records = [RECORD] * batch

    async def producer() -> None:
        for _ in range(each):
            await shell.append(records)

    started = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    fsyncs = shell.fsyncs
    await shell.close()
    return elapsed, each * concurrency * batch, fsyncs


async def pipelined(
    directory: Path, messages: int, window: int, batch: int
) -> tuple[float, int, int]:
    """One producer keeping `window` appends of `batch` records unconfirmed (W1's confirm
    window of 10,000 messages is 10 appends of 1000)."""
    shell = PartitionShell(StreamName("bench"), PartitionId(0), directory, LogConfig())
    await shell.start()
    records = [RECORD] * batch
    in_flight: deque[asyncio.Future[Offset]] = deque()
    appends = messages // batch
    started = time.perf_counter()
    for _ in range(appends):
        if len(in_flight) >= window:
            await in_flight.popleft()
        in_flight.append(shell.append(records))
        await asyncio.sleep(0)  # one append per loop turn, as when appends come off a socket
    for future in in_flight:
        await future
    elapsed = time.perf_counter() - started
    fsyncs = shell.fsyncs
    await shell.close()
    return elapsed, appends * batch, fsyncs


def dd(directory: Path, mib: int) -> float:
    target = directory / "dd.bin"
    result = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fdatasync"],
        capture_output=True,
        text=True,
        check=True,
    )
    target.unlink()
    match = re.search(r"copied, ([\d.]+) s", result.stderr)
    assert match, result.stderr
    return mib * 1024 * 1024 / float(match.group(1)) / MB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="data written per case")
    parser.add_argument("--single-messages", type=int, default=64_000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory(dir=here, prefix=".bench-storage-") as tmp:
        root = Path(tmp)
        total = args.mib * 1024 * 1024
        dd_mb_s = dd(root, args.mib)
        print(f"dd bs=1M count={args.mib} conv=fdatasync: {dd_mb_s:.1f} MB/s")
        b_elapsed, b_messages, disk_bytes = batched(root / "batched", total, 1000)
        b_mb_s = b_messages * len(RECORD) / b_elapsed / MB
        print(
            f"A batched 1000 x 100 B, append+fsync per chunk, 1 writer: {b_mb_s:.1f} MB/s of "
            f"records ({disk_bytes / b_elapsed / MB:.1f} MB/s on disk), "
            f"{b_messages / b_elapsed:,.0f} msg/s, {b_messages // 1000} fsyncs"
        )
        g_elapsed, g_messages, g_fsyncs = asyncio.run(
            pipelined(root / "grouped", total // len(RECORD), 10, 1000)
        )
        g_mb_s = g_messages * len(RECORD) / g_elapsed / MB
        print(
            f"B batched 1000 x 100 B via shell, window of 10 appends (10,000 msgs): "
            f"{g_mb_s:.1f} MB/s, {g_messages / g_elapsed:,.0f} msg/s, {g_fsyncs} fsyncs for "
            f"{g_messages // 1000} appends"
        )
        s_elapsed, s_messages, s_fsyncs = asyncio.run(
            through_shell(root / "single", args.single_messages, args.concurrency, 1)
        )
        s_mb_s = s_messages * len(RECORD) / s_elapsed / MB
        print(
            f"C single 1 x 100 B, {args.concurrency} concurrent producers via shell: "
            f"{s_mb_s:.1f} MB/s, {s_messages / s_elapsed:,.0f} msg/s, {s_fsyncs} fsyncs for "
            f"{s_messages} appends ({s_messages / max(s_fsyncs, 1):.1f} per fsync)"
        )
        print(
            f"ratio Spate/dd (record bytes): A {b_mb_s / dd_mb_s:.2f}, B {g_mb_s / dd_mb_s:.2f}"
            f", C {s_mb_s / dd_mb_s:.3f}"
        )


if __name__ == "__main__":
    main()
