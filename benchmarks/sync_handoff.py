#!/usr/bin/env python3
"""The fsync hand-off alone (ADR 0040): one process, one uvloop loop, a small write and an
fdatasync per round trip, handed to a thread and back either way the replication host can:

  executor  `loop.run_in_executor` on a one-worker ThreadPoolExecutor (before ADR 0040); the
            round trip ends when the awaiting coroutine runs again
  thread    `SyncThread` (ADR 0040): a SimpleQueue in, an eventfd out; the round trip ends in
            the loop's reader callback (where the host finishes the batch and flushes acks)
  uring     no Python thread at all (ADR 0040's "next step", not in the broker): the fdatasync
            submitted to an io_uring (IORING_OP_FSYNC, datasync) from the loop thread, its
            completion signalled by the kernel to an eventfd the loop watches; only the round
            trip is known (the kernel's worker stamps nothing). Linux only; `--modes` leaves it
            out where io_uring is refused.

Per round trip, stamps with `perf_counter_ns`: submitted (loop) -> job start (thread) -> job
end (thread) -> back (loop): hop in, sync, hop out. The modes alternate in rounds (A B A B ...)
in one process, so the machine's load falls on both alike. Optional company for the GIL, as a
node has: `--loop-busy-us` of Python on the loop every `--every-ms` (a loop reading frames),
and `--side-thread-us` of Python on a second thread every `--every-ms` (pysyncobj's tick
thread).

  python benchmarks/sync_handoff.py [--rounds 3] [--count 2000] [--dir /tmp] [--out F]

Prints one JSON line per mode and round (p50/p99/mean of each step, ms; CPU µs per round
trip from the process's CPU clock), then the medians over the rounds and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import mmap
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import uvloop
from loadclient import emit, loadavg
from spate.node.replication.syncthread import SyncThread

MODES = ("executor", "thread", "uring")
STEPS = ("hop_in", "sync", "hop_out", "round_trip")


def spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def summary(samples: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for step in STEPS:
        ordered = sorted(samples[step])
        out[f"{step}_p50_ms"] = round(ordered[len(ordered) // 2], 4)
        out[f"{step}_p99_ms"] = round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4)
        out[f"{step}_mean_ms"] = round(statistics.fmean(ordered), 4)
    return out


class Ring:
    """A minimal io_uring for fdatasyncs (x86-64 Linux; ctypes + mmap; one SQE at a time)."""

    SETUP, ENTER, REGISTER = 425, 426, 427
    OP_FSYNC, FSYNC_DATASYNC, REGISTER_EVENTFD = 3, 1, 4
    OFF_SQ_RING, OFF_CQ_RING, OFF_SQES = 0, 0x8000000, 0x10000000

    def __init__(self, entries: int = 8) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long
        params = (ctypes.c_uint32 * 30)()
        fd = self._syscall(self.SETUP, entries, ctypes.addressof(params))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "io_uring_setup")
        self.fd = fd
        p = list(params)
        sq_entries, cq_entries = p[0], p[1]
        sq_off, cq_off = p[10:20], p[20:30]  # io_sqring_offsets, io_cqring_offsets (u32 view)
        self.sq_head, self.sq_tail, self.sq_mask_off, self.sq_array = (
            sq_off[0],
            sq_off[1],
            sq_off[2],
            sq_off[6],
        )
        self.cq_head, self.cq_tail, self.cq_mask_off, self.cqes = (
            cq_off[0],
            cq_off[1],
            cq_off[2],
            cq_off[5],
        )
        rw = mmap.PROT_READ | mmap.PROT_WRITE
        self.sq = mmap.mmap(
            fd, self.sq_array + sq_entries * 4, mmap.MAP_SHARED, rw, offset=self.OFF_SQ_RING
        )
        self.cq = mmap.mmap(
            fd, self.cqes + cq_entries * 16, mmap.MAP_SHARED, rw, offset=self.OFF_CQ_RING
        )
        self.sqes = mmap.mmap(fd, sq_entries * 64, mmap.MAP_SHARED, rw, offset=self.OFF_SQES)
        self.event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        value = ctypes.c_int32(self.event)
        if self._syscall(self.REGISTER, fd, self.REGISTER_EVENTFD, ctypes.addressof(value), 1):
            raise OSError(ctypes.get_errno(), "io_uring_register(EVENTFD)")

    def _syscall(self, number: int, *args: int) -> int:
        """syscall(2) with every argument a C long (ctypes releases the GIL during it)."""
        return int(self.libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args)))

    def _u32(self, buf: mmap.mmap, off: int) -> int:
        return int.from_bytes(buf[off : off + 4], "little")

    def fdatasync(self, fd: int, user_data: int) -> None:
        tail = self._u32(self.sq, self.sq_tail)
        index = tail & self._u32(self.sq, self.sq_mask_off)
        sqe = bytearray(64)
        sqe[0] = self.OP_FSYNC
        sqe[4:8] = fd.to_bytes(4, "little", signed=True)
        sqe[28:32] = self.FSYNC_DATASYNC.to_bytes(4, "little")
        sqe[32:40] = user_data.to_bytes(8, "little")
        self.sqes[index * 64 : index * 64 + 64] = bytes(sqe)
        self.sq[self.sq_array + index * 4 : self.sq_array + index * 4 + 4] = index.to_bytes(
            4, "little"
        )
        self.sq[self.sq_tail : self.sq_tail + 4] = ((tail + 1) & 0xFFFFFFFF).to_bytes(4, "little")
        submitted = self._syscall(self.ENTER, self.fd, 1, 0, 0, 0, 0)
        if submitted != 1:
            raise OSError(ctypes.get_errno(), "io_uring_enter")

    def reap(self) -> list[tuple[int, int]]:
        """(user_data, res) of every completion posted."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.event)
        head, tail = self._u32(self.cq, self.cq_head), self._u32(self.cq, self.cq_tail)
        mask = self._u32(self.cq, self.cq_mask_off)
        out = []
        while head != tail:
            at = self.cqes + (head & mask) * 16
            user_data = int.from_bytes(self.cq[at : at + 8], "little")
            res = int.from_bytes(self.cq[at + 8 : at + 12], "little", signed=True)
            out.append((user_data, res))
            head = (head + 1) & 0xFFFFFFFF
        self.cq[self.cq_head : self.cq_head + 4] = head.to_bytes(4, "little")
        return out

    def close(self) -> None:
        for buf in (self.sq, self.cq, self.sqes):
            buf.close()
        os.close(self.event)
        os.close(self.fd)


async def uring_mode(fd: int, args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    ring = Ring()
    trips: list[float] = []
    waiting: dict[int, asyncio.Future[int]] = {}

    def on_event() -> None:
        now = time.perf_counter_ns()
        for user_data, res in ring.reap():
            if res < 0:
                waiting.pop(user_data).set_exception(OSError(-res, os.strerror(-res)))
            else:
                waiting.pop(user_data).set_result(now)

    loop.add_reader(ring.event, on_event)
    payload = b"x" * args.bytes
    cpu0 = time.process_time()
    try:
        for i in range(args.count):
            os.write(fd, payload)
            done: asyncio.Future[int] = loop.create_future()
            waiting[i] = done
            submitted = time.perf_counter_ns()
            ring.fdatasync(fd, i)
            back = await done
            trips.append((back - submitted) / 1e6)
            if args.gap_ms:
                await asyncio.sleep(args.gap_ms / 1000)
    finally:
        loop.remove_reader(ring.event)
        ring.close()
    cpu_us = (time.process_time() - cpu0) / args.count * 1e6
    ordered = sorted(trips)
    return {
        "cpu_us_per_trip": round(cpu_us, 1),
        "round_trip_p50_ms": round(ordered[len(ordered) // 2], 4),
        "round_trip_p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4),
        "round_trip_mean_ms": round(statistics.fmean(ordered), 4),
    }


async def one_mode(mode: str, fd: int, args: argparse.Namespace) -> dict[str, Any]:
    if mode == "uring":
        return await uring_mode(fd, args)
    loop = asyncio.get_running_loop()
    samples: dict[str, list[float]] = {step: [] for step in STEPS}
    stamps = [0, 0]

    def job(descriptor: int) -> None:
        stamps[0] = time.perf_counter_ns()
        os.fdatasync(descriptor)
        stamps[1] = time.perf_counter_ns()

    executor = ThreadPoolExecutor(1) if mode == "executor" else None
    thread = SyncThread("bench-sync", loop) if mode == "thread" else None
    payload = b"x" * args.bytes
    cpu0 = time.process_time()
    try:
        for _ in range(args.count):
            os.write(fd, payload)
            submitted = time.perf_counter_ns()
            if executor is not None:
                await loop.run_in_executor(executor, job, fd)
                back = time.perf_counter_ns()
            else:
                assert thread is not None
                done: asyncio.Future[int] = loop.create_future()

                def on_done(outcome: object, done: asyncio.Future[int] = done) -> None:
                    done.set_result(time.perf_counter_ns())

                thread.submit(job, fd, on_done)
                back = await done
            start, end = stamps
            samples["hop_in"].append((start - submitted) / 1e6)
            samples["sync"].append((end - start) / 1e6)
            samples["hop_out"].append((back - end) / 1e6)
            samples["round_trip"].append((back - submitted) / 1e6)
            if args.gap_ms:
                await asyncio.sleep(args.gap_ms / 1000)
    finally:
        if executor is not None:
            executor.shutdown(wait=True)
        if thread is not None:
            thread.close()
    cpu_us = (time.process_time() - cpu0) / args.count * 1e6
    return {"cpu_us_per_trip": round(cpu_us, 1), **summary(samples)}


async def company(args: argparse.Namespace, stop: threading.Event) -> Callable[[], None]:
    """The loop's and a side thread's periodic Python, if asked for."""
    loop = asyncio.get_running_loop()
    handles: list[asyncio.TimerHandle] = []

    def loop_work() -> None:
        spin(args.loop_busy_us)
        handles[0] = loop.call_later(args.every_ms / 1000, loop_work)

    if args.loop_busy_us:
        handles.append(loop.call_later(args.every_ms / 1000, loop_work))

    def side() -> None:
        while not stop.wait(args.every_ms / 1000):
            spin(args.side_thread_us)

    side_thread = threading.Thread(target=side, daemon=True)
    if args.side_thread_us:
        side_thread.start()

    def end() -> None:
        stop.set()
        for handle in handles:
            handle.cancel()
        if side_thread.is_alive():
            side_thread.join()

    return end


async def main(args: argparse.Namespace) -> None:
    directory = tempfile.mkdtemp(prefix="sync-handoff-", dir=args.dir)
    path = Path(directory) / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    end = await company(args, threading.Event())
    modes = tuple(args.modes.split(","))
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        for run in range(args.rounds):
            for mode in modes if run % 2 == 0 else reversed(modes):
                load = loadavg()
                result = await one_mode(mode, fd, args)
                result.update(mode=mode, run=run, load=load, count=args.count)
                result.update(
                    loop_busy_us=args.loop_busy_us,
                    side_thread_us=args.side_thread_us,
                    every_ms=args.every_ms,
                )
                results[mode].append(result)
                emit({"bench": "sync_handoff", **result}, args.out)
    finally:
        end()
        os.close(fd)
        path.unlink()
        os.rmdir(directory)
    for mode in modes:
        medians = {
            key: round(statistics.median(r[key] for r in results[mode]), 4)
            for key in results[mode][0]
            if key.endswith("_ms") or key == "cpu_us_per_trip"
        }
        emit({"bench": "sync_handoff", "mode": mode, "median_of": args.rounds, **medians})
    print(f"load {loadavg()}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--count", type=int, default=2000, help="round trips per mode and round")
    p.add_argument("--bytes", type=int, default=200, help="written before each fdatasync")
    p.add_argument("--gap-ms", type=float, default=0.0, help="pause between round trips")
    p.add_argument("--loop-busy-us", type=float, default=0.0)
    p.add_argument("--side-thread-us", type=float, default=0.0)
    p.add_argument("--every-ms", type=float, default=2.0)
    p.add_argument("--modes", default=",".join(MODES), help="which, comma-separated")
    p.add_argument("--dir", default=None, help="where the file is (default: the temp dir)")
    p.add_argument("--out", type=Path)
    uvloop.run(main(p.parse_args()))
