"""SyncThread: the node's fsync thread, long-lived, handing each job's outcome back to the event
loop through an eventfd the loop watches (ADR 0040).

The driver loop's syncs used to go through `loop.run_in_executor`: a `concurrent.futures`
work item, and on completion the worker thread's `Future.set_result` (a condition variable, its
callbacks), `loop.call_soon_threadsafe` (the loop's self-pipe), an asyncio Future set on the
loop, and the driver task resumed on the *next* loop turn. RESULTS §40 measured the two
hand-offs around a batch's fdatasync at more than the fdatasync itself. Here:

    loop thread                          sync thread
    submit(run, arg, on_done)
      jobs.put(job)  ------------------>  job = jobs.get()       (blocks without the GIL)
      (back to the loop's poll)            outcome = run(arg)     (the fdatasyncs)
                                           done.append(job)
    on_signal()      <------------------  eventfd_write(1)
      eventfd_read()
      every done job: on_done(outcome)     (on the loop thread, in submission order)

`on_done` runs inside the loop's reader callback for the eventfd: the batch's acks can be
queued and flushed on the very loop turn that sees the sync done, not a turn later.

No lost wake-up: the thread appends to `done` *before* it writes the eventfd, and the loop
reads (resets) the eventfd *before* it drains `done`; a completion appended after a drain
always has a write after that drain's read, so the reader fires again. `jobs` is a
`queue.SimpleQueue` (a C semaphore: a put before the get is never lost). Jobs run one at a time
in submission order, and their `on_done` run in the same order: the job list and the done
deque are both FIFO and there is one thread.

An exception a job raises is its outcome (the `on_done` receives it and decides: the host
re-raises a bug in the driver task, as `run_in_executor` did). `drain()` waits until every job
submitted so far has run and its `on_done` has been called; `close()` stops the thread after
the jobs already submitted (their `on_done` are not called any more) and closes the eventfd.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_STOP: Any = object()


class _Job(Generic[T, R]):
    __slots__ = ("arg", "on_done", "outcome", "run")

    def __init__(
        self, run: Callable[[T], R], arg: T, on_done: Callable[[R | BaseException], None]
    ) -> None:
        self.run = run
        self.arg = arg
        self.on_done = on_done
        self.outcome: R | BaseException | None = None


class _Signal:
    """A readable file descriptor the other thread can make readable: an eventfd on Linux,
    a pipe elsewhere."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self.read_fd = self.write_fd = fd
            self._eventfd = True
        else:  # pragma: no cover - the nodes run on Linux
            self.read_fd, self.write_fd = os.pipe()
            os.set_blocking(self.read_fd, False)
            self._eventfd = False

    def set(self) -> None:
        if self._eventfd:
            os.eventfd_write(self.write_fd, 1)
        else:  # pragma: no cover
            os.write(self.write_fd, b"\x01")

    def clear(self) -> None:
        try:
            if self._eventfd:
                os.eventfd_read(self.read_fd)
            else:  # pragma: no cover
                while os.read(self.read_fd, 4096):
                    pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.read_fd)
        if self.write_fd != self.read_fd:  # pragma: no cover
            os.close(self.write_fd)


class SyncThread:
    """One thread running jobs in order; their outcomes handed to the loop (module docstring).
    Create and use it on the loop's thread."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[_Job[Any, Any]] = queue.SimpleQueue()
        self._done: deque[_Job[Any, Any]] = deque()
        self._signal = _Signal()
        self.submitted = 0
        """Jobs submitted (the loop thread's count)..."""
        self.delivered = 0
        """... and whose `on_done` was called."""
        self._drained: list[tuple[int, asyncio.Future[None]]] = []
        self._closed = False
        self.loop.add_reader(self._signal.read_fd, self._on_signal)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(
        self, run: Callable[[T], R], arg: T, on_done: Callable[[R | BaseException], None]
    ) -> None:
        """Run `run(arg)` on the thread after the jobs before it; then call `on_done` with its
        result (or the exception it raised) on the loop thread."""
        assert not self._closed, "submit after close"
        self.submitted += 1
        self._jobs.put(_Job(run, arg, on_done))

    async def drain(self) -> None:
        """Wait until every job submitted so far has run and its `on_done` was called (a
        barrier: nothing of theirs touches files any more)."""
        if self.delivered == self.submitted or self._closed:
            return
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._drained.append((self.submitted, waiter))
        await waiter

    def close(self) -> None:
        """Stop the thread once the jobs submitted so far have run (their `on_done` are no
        longer called), and release the eventfd. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(_STOP)
        self._thread.join()
        self.loop.remove_reader(self._signal.read_fd)
        self._signal.close()
        for _count, waiter in self._drained:
            if not waiter.done():
                waiter.set_result(None)
        self._drained.clear()

    # -- the thread

    def _run(self) -> None:
        jobs, done, signal = self._jobs, self._done, self._signal
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            try:
                job.outcome = job.run(job.arg)
            except BaseException as error:  # the outcome: `on_done` decides (a bug re-raises)
                job.outcome = error
            done.append(job)  # before the signal: see "No lost wake-up"
            signal.set()

    # -- the loop

    def _on_signal(self) -> None:
        self._signal.clear()  # before the drain: see "No lost wake-up"
        done = self._done
        try:
            while done:
                job = done.popleft()
                self.delivered += 1
                job.on_done(job.outcome)
        finally:
            if done:  # an `on_done` raised (a bug, logged by the loop): the rest still arrive
                self._signal.set()
        while self._drained and self._drained[0][0] <= self.delivered:
            _count, waiter = self._drained.pop(0)
            if not waiter.done():
                waiter.set_result(None)
