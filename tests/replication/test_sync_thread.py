"""The node's sync thread (ADR 0040): jobs run in order on one thread, their outcomes come back
on the loop thread in the same order, through an eventfd the loop watches; no completion is
lost however the thread's signals and the loop's drains interleave; `drain` is a barrier and
`close` stops the thread after the jobs submitted. Run on both loops the project uses
(asyncio's, and uvloop's, which the node processes run on)."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spate.node.replication.syncthread import SyncThread

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def run(loop_name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    loop = LOOPS[loop_name]()
    try:
        loop.run_until_complete(asyncio.wait_for(main(), 30))
    finally:
        loop.close()


class Failed(Exception):
    pass


def job(delay_s: float, fail: bool) -> Callable[[int], int]:
    def run(index: int) -> int:
        if delay_s:
            time.sleep(delay_s)
        if fail:
            raise Failed(index)
        return index

    return run


@pytest.mark.parametrize("loop_name", LOOPS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(
        st.tuples(st.sampled_from([0.0, 0.0, 0.0002, 0.001]), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    pauses=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=40),
)
def test_outcomes_come_back_on_the_loop_thread_in_submission_order(
    loop_name: str, jobs: list[tuple[float, bool]], pauses: list[int]
) -> None:
    """Each job's result, or the exception it raised, reaches its `on_done` on the loop
    thread, in submission order, whatever the jobs' durations and the loop's pace between
    submissions (0-3 loop turns, or a short sleep)."""

    async def main() -> None:
        loop_thread = threading.get_ident()
        seen: list[tuple[int, int | BaseException, int]] = []
        workers: list[int] = []
        thread = SyncThread("test-sync", asyncio.get_running_loop())

        def on_done(index: int, outcome: int | BaseException) -> None:
            seen.append((index, outcome, threading.get_ident()))

        def traced(run: Callable[[int], int]) -> Callable[[int], int]:
            def inner(index: int) -> int:
                workers.append(threading.get_ident())
                return run(index)

            return inner

        try:
            for i, (delay_s, fail) in enumerate(jobs):
                thread.submit(traced(job(delay_s, fail)), i, lambda o, i=i: on_done(i, o))
                pause = pauses[i % len(pauses)]
                if pause == 3:
                    await asyncio.sleep(0.0005)
                for _ in range(pause if pause < 3 else 0):
                    await asyncio.sleep(0)
            await thread.drain()
            assert [index for index, _, _ in seen] == list(range(len(jobs)))
            assert {ident for _, _, ident in seen} == {loop_thread}
            assert len(set(workers)) == 1 and workers[0] != loop_thread
            for index, outcome, _ in seen:
                if jobs[index][1]:
                    assert isinstance(outcome, Failed) and outcome.args == (index,)
                else:
                    assert outcome == index
            assert thread.delivered == thread.submitted == len(jobs)
        finally:
            thread.close()

    run(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_no_completion_is_lost_while_the_loop_drains(loop_name: str) -> None:
    """Stress the one race there is: the thread appending a completion and signalling while
    the loop is between reading the eventfd and emptying the done queue (its `on_done`
    callbacks made slow, at random, so the thread finishes jobs meanwhile). 3,000 jobs, in
    bursts; every one is delivered exactly once, in order, and nothing waits for a timeout."""

    async def main() -> None:
        rng = random.Random(7)
        thread = SyncThread("test-sync", asyncio.get_running_loop())
        delivered: list[int] = []

        def on_done(outcome: int | BaseException) -> None:
            assert isinstance(outcome, int)
            delivered.append(outcome)
            if rng.random() < 0.05:
                time.sleep(0.0002)  # the loop busy inside the drain

        try:
            submitted = 0
            while submitted < 3000:
                for _ in range(min(rng.randint(1, 50), 3000 - submitted)):
                    thread.submit(lambda i: i, submitted, on_done)
                    submitted += 1
                if rng.random() < 0.5:
                    await asyncio.sleep(0)
                else:
                    await asyncio.wait_for(thread.drain(), 5)
            await asyncio.wait_for(thread.drain(), 5)
            assert delivered == list(range(3000))
        finally:
            thread.close()

    run(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_drain_waits_for_the_jobs_in_flight(loop_name: str) -> None:
    """`drain` returns only once every job submitted before it has run and its `on_done`
    was called (the host's barrier before it closes a replica's files)."""

    async def main() -> None:
        thread = SyncThread("test-sync", asyncio.get_running_loop())
        gate = threading.Event()
        done: list[int | BaseException] = []
        try:
            thread.submit(lambda _: gate.wait(5) and 1, None, done.append)
            thread.submit(lambda _: 2, None, done.append)
            drained = asyncio.ensure_future(thread.drain())
            await asyncio.sleep(0.05)
            assert not drained.done() and done == []
            gate.set()
            await asyncio.wait_for(drained, 5)
            assert done == [1, 2]
            await asyncio.wait_for(thread.drain(), 1)  # nothing in flight: at once
        finally:
            thread.close()

    run(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_close_runs_the_submitted_jobs_then_stops_the_thread(loop_name: str) -> None:
    """`close` with jobs in flight: they all run (a batch's fsyncs are never cut short), then
    the thread ends and the eventfd is released; their `on_done` are not called after close
    (the host abandons a stopping node's batch, as the cancelled driver task did)."""

    async def main() -> None:
        thread = SyncThread("test-sync", asyncio.get_running_loop())
        ran: list[int] = []
        delivered: list[int | BaseException] = []

        def slow(index: int) -> int:
            time.sleep(0.01)
            ran.append(index)
            return index

        for i in range(5):
            thread.submit(slow, i, delivered.append)
        fd = thread._signal.read_fd
        thread.close()
        assert ran == [0, 1, 2, 3, 4]
        assert not thread._thread.is_alive()
        with pytest.raises(OSError):
            os.fstat(fd)
        await asyncio.sleep(0.02)
        assert delivered == []
        await asyncio.wait_for(thread.drain(), 1)  # closed: returns at once
        thread.close()  # idempotent

    run(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_an_on_done_that_raises_does_not_strand_the_rest(loop_name: str) -> None:
    """A bug in one `on_done` (logged by the loop's exception handler) does not lose the
    completions queued behind it: they arrive on the next turn."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[BaseException | None] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))
        thread = SyncThread("test-sync", loop)
        delivered: list[int | BaseException] = []
        gate = threading.Event()

        def boom(_outcome: int | BaseException) -> None:
            raise RuntimeError("a bug")

        try:
            thread.submit(lambda _: gate.wait(5) and 0, None, boom)
            thread.submit(lambda _: 1, None, delivered.append)
            thread.submit(lambda _: 2, None, delivered.append)
            await asyncio.sleep(0.02)  # jobs 1 and 2 wait behind the gate
            gate.set()
            await asyncio.wait_for(thread.drain(), 5)
            assert delivered == [1, 2]
            assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
        finally:
            thread.close()

    run(loop_name, main)
