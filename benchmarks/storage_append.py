"""Storage append throughput with fsync, against the disk's own sequential bandwidth (dd).

Run: .venv/bin/python benchmarks/storage_append.py [--mib 256] [--only large|G]

Small chunks (~100 KiB, the W1 batch):
A. batched: chunks of 1000 records of 100 bytes, each appended and fsynced (PartitionLog.sync)
   before the next: one writer, no overlap of CPU and disk;
B. pipelined: the same chunks through PartitionShell from one producer that keeps 10 appends
   (10,000 messages, W1's confirm window) unconfirmed: fsync in its thread overlaps with
   encoding and writing the next chunks, and each fsync covers the chunks written meanwhile;
C. single: 64 concurrent producers through PartitionShell, each appending one 100-byte record
   and awaiting its confirm before the next (group commit does the batching).
Large chunks (~1 MiB, like for like with dd's 1 MiB blocks):
E. batched 10,000 x 100 B and F. batched 1,000 x 1 KiB: each chunk appended and fsynced before
   the next (as A);
G. pipelined 1,000 x 1 KiB through PartitionShell, 4 appends (4 MiB) unconfirmed (as B).
Disk:
D. dd if=/dev/zero bs=1M count=<mib> conv=fdatasync (one fdatasync at the end),
   dd ... oflag=dsync (one sync per 1 MiB block), and a bare Python loop of os.write +
   os.fdatasync per 1 MiB (the ceiling of any design that syncs every chunk), on the same
   filesystem.

Prints MB/s of record bytes, msg/s, CPU ms per MiB of records (this process: less disturbed by
other work on the machine than wall clock), fsyncs, the load average, and the ratio Spate/dd.
The target (brief §4: >= 0.8 of dd conv=fdatasync with fsync before every confirm) is judged
on G: 1 MiB appends as producers make them, each confirmed only after an fsync covering it,
against dd's 1 MiB blocks; A-C show what smaller chunks cost.
The temp directory is created next to this file, so it is on the same disk as the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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
MIB = 1024 * 1024


def batched(
    directory: Path, total_bytes: int, batch: int, record: bytes = RECORD
) -> tuple[float, int, int]:
    log = PartitionLog.open(FileStorage(directory), LogConfig())
    records = [record] * batch
    messages = 0
    started = time.perf_counter()
    while messages * len(record) < total_bytes:
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
    directory: Path, messages: int, window: int, batch: int, record: bytes = RECORD
) -> tuple[float, int, int]:
    """One producer keeping `window` appends of `batch` records unconfirmed (W1's confirm
    window of 10,000 messages is 10 appends of 1000)."""
    shell = PartitionShell(StreamName("bench"), PartitionId(0), directory, LogConfig())
    await shell.start()
    records = [record] * batch
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


def dd(directory: Path, mib: int, sync: str = "conv=fdatasync") -> float:
    target = directory / "dd.bin"
    result = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", sync],
        capture_output=True,
        text=True,
        check=True,
    )
    target.unlink()
    match = re.search(r"copied, ([\d.]+) s", result.stderr)
    assert match, result.stderr
    return mib * 1024 * 1024 / float(match.group(1)) / MB


class Case:
    """Wall clock and this process's CPU time around one case."""

    def __enter__(self) -> Case:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        self.cpu = time.process_time() - self.cpu

    def cpu_ms_per_mib(self, record_bytes: int) -> float:
        return self.cpu * 1000 / (record_bytes / MIB)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def raw_python(directory: Path, mib: int) -> float:
    """The ceiling of any fsync-per-chunk design here: os.write + os.fdatasync of 1 MiB blocks
    to an O_APPEND file from Python, nothing else."""
    block = b"x" * MIB
    target = directory / "raw.bin"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        started = time.perf_counter()
        for _ in range(mib):
            os.write(fd, block)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        target.unlink()
    return mib * MIB / elapsed / MB


def case_g(root: Path, total: int) -> float:
    """G: 1 MiB appends of 1 KiB records, 4 unconfirmed; prints it, returns its MB/s."""
    kib = b"x" * 1024
    with Case() as case:
        h_elapsed, h_messages, h_fsyncs = asyncio.run(
            pipelined(root / "large-shell", total // len(kib), 4, 1000, kib)
        )
    h_mb_s = h_messages * len(kib) / h_elapsed / MB
    print(
        f"G pipelined 1,000 x 1 KiB via shell, window of 4 appends (4 MiB): "
        f"{h_mb_s:.1f} MB/s, {h_messages / h_elapsed:,.0f} msg/s, {h_fsyncs} fsyncs "
        f"for {h_messages // 1000} appends, "
        f"{case.cpu_ms_per_mib(h_messages * len(kib)):.2f} CPU ms/MiB"
    )
    return h_mb_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="data written per case")
    parser.add_argument("--single-messages", type=int, default=64_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--only", choices=("small", "large", "G"), help="run one group of cases, or case G alone"
    )
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    ratios: list[str] = []
    with tempfile.TemporaryDirectory(dir=here, prefix=".bench-storage-") as tmp:
        root = Path(tmp)
        total = args.mib * MIB
        print(load())
        dd_mb_s = dd(root, args.mib)
        dsync_mb_s = dd(root, args.mib, "oflag=dsync")
        raw_mb_s = raw_python(root, args.mib)
        print(
            f"D dd bs=1M count={args.mib}: conv=fdatasync {dd_mb_s:.1f} MB/s, "
            f"oflag=dsync (sync per 1 MiB) {dsync_mb_s:.1f} MB/s; Python write+fdatasync per "
            f"1 MiB: {raw_mb_s:.1f} MB/s"
        )
        if args.only is None or args.only == "small":
            with Case() as case:
                b_elapsed, b_messages, disk_bytes = batched(root / "batched", total, 1000)
            b_mb_s = b_messages * len(RECORD) / b_elapsed / MB
            print(
                f"A batched 1000 x 100 B, append+fsync per chunk, 1 writer: {b_mb_s:.1f} MB/s "
                f"of records ({disk_bytes / b_elapsed / MB:.1f} MB/s on disk), "
                f"{b_messages / b_elapsed:,.0f} msg/s, {b_messages // 1000} fsyncs, "
                f"{case.cpu_ms_per_mib(b_messages * len(RECORD)):.2f} CPU ms/MiB"
            )
            with Case() as case:
                g_elapsed, g_messages, g_fsyncs = asyncio.run(
                    pipelined(root / "grouped", total // len(RECORD), 10, 1000)
                )
            g_mb_s = g_messages * len(RECORD) / g_elapsed / MB
            print(
                f"B batched 1000 x 100 B via shell, window of 10 appends (10,000 msgs): "
                f"{g_mb_s:.1f} MB/s, {g_messages / g_elapsed:,.0f} msg/s, {g_fsyncs} fsyncs for "
                f"{g_messages // 1000} appends, "
                f"{case.cpu_ms_per_mib(g_messages * len(RECORD)):.2f} CPU ms/MiB"
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
            ratios.append(
                f"A {b_mb_s / dd_mb_s:.2f}, B {g_mb_s / dd_mb_s:.2f}, C {s_mb_s / dd_mb_s:.3f}"
            )
        if args.only == "G":
            h_mb_s = case_g(root, total)
            ratios.append(f"G {h_mb_s / dd_mb_s:.2f} (target: G >= 0.8)")
        elif args.only != "small":
            kib = b"x" * 1024
            with Case() as case:
                e_elapsed, e_messages, _ = batched(root / "large100", total, 10_000)
            e_mb_s = e_messages * len(RECORD) / e_elapsed / MB
            print(
                f"E batched 10,000 x 100 B (1 MiB chunks), append+fsync per chunk: "
                f"{e_mb_s:.1f} MB/s, {e_messages / e_elapsed:,.0f} msg/s, "
                f"{e_messages // 10_000} fsyncs, "
                f"{case.cpu_ms_per_mib(e_messages * len(RECORD)):.2f} CPU ms/MiB"
            )
            with Case() as case:
                f_elapsed, f_messages, _ = batched(root / "large1k", total, 1000, kib)
            f_mb_s = f_messages * len(kib) / f_elapsed / MB
            print(
                f"F batched 1,000 x 1 KiB (1 MiB chunks), append+fsync per chunk: "
                f"{f_mb_s:.1f} MB/s, {f_messages / f_elapsed:,.0f} msg/s, "
                f"{f_messages // 1000} fsyncs, "
                f"{case.cpu_ms_per_mib(f_messages * len(kib)):.2f} CPU ms/MiB"
            )
            h_mb_s = case_g(root, total)
            ratios.append(
                f"E {e_mb_s / dd_mb_s:.2f}, F {f_mb_s / dd_mb_s:.2f}, G {h_mb_s / dd_mb_s:.2f}"
                f" (target: G >= 0.8); against dd oflag=dsync: F {f_mb_s / dsync_mb_s:.2f}"
                f"; against Python write+fdatasync per 1 MiB: F {f_mb_s / raw_mb_s:.2f}"
            )
        print(f"ratio Spate/dd conv=fdatasync (record bytes): {'; '.join(ratios)}")
        print(load())


if __name__ == "__main__":
    main()
