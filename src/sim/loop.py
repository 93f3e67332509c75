"""What every simulator here shares: the event queue, the trace digest, the two phases, failures
as values, and the network-partition nemesis.

Events are ordered by (simulated time, sequence number), so equal times keep scheduling order
and nothing depends on object identity or hashing. Every event appends a line to a blake2b
digest (`trace_digest`), which tests compare across runs and processes.

A run is a fault phase of `steps` events (invariants checked by the subclass after every
event), then faults off (`heal_all`) and a liveness phase of at most `liveness_ms_max`
simulated ms until `live()`. An InvariantViolation or a failed assertion anywhere (in the
simulator or in the production code it drives) ends the run with a failure string naming the
invariant, or the file and line of the assertion.
"""

from __future__ import annotations

import hashlib
import heapq
import random
import traceback
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from spate.core.ids import NodeId
from spate.sim.checker import InvariantViolation

E = TypeVar("E")

partition_heal_ms = (50, 2000)
"""A partition heals after a time drawn uniformly from this range."""


class SimLoop(Generic[E]):
    def __init__(
        self, seed: int, *, keep_trace: bool, liveness_ms_max: int, events_max: int
    ) -> None:
        self.seed = seed
        self.trace_lines: list[str] = []
        self._keep_trace = keep_trace
        self.liveness_ms_max = liveness_ms_max
        self.events_max = events_max
        self.now_ms = 0
        self.steps = 0
        self.faults = True
        self.blocked: set[tuple[NodeId, NodeId]] = set()
        self._queue: list[tuple[int, int, E]] = []
        self._seq = 0
        self._trace = hashlib.blake2b(digest_size=16)
        self._liveness_from_ms = 0

    @property
    def trace_digest(self) -> str:
        return self._trace.hexdigest()

    def push(self, delay_ms: int, event: E) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now_ms + delay_ms, self._seq, event))

    def pop(self) -> E:
        self.now_ms, _, event = heapq.heappop(self._queue)
        self.steps += 1
        return event

    def _record(self, line: str) -> None:
        text = f"{self.now_ms} {line}"
        self._trace.update(text.encode() + b"\n")
        if self._keep_trace:
            self.trace_lines.append(text)

    # -- phases

    def run_phases(self, steps: int) -> str | None:
        """Both phases; the failure, or None."""
        try:
            self._run_until(lambda: self.steps >= steps)
            self.heal_all()
            self._liveness_from_ms = self.now_ms
            self._run_until(self.live)
            if not self.live():
                return f"liveness: within {self.liveness_ms_max} ms after healing, " + (
                    self.liveness_failure()
                )
            self.final_checks()
        except InvariantViolation as violation:
            return str(violation)
        except AssertionError as error:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
            return f"assertion at {where}: {error}"
        return None

    def _run_until(self, done: Callable[[], bool]) -> None:
        while not done() and self._queue and self.steps < self.events_max:
            if not self.faults and self.now_ms - self._liveness_from_ms > self.liveness_ms_max:
                return
            self.step()

    def step(self) -> None:
        raise NotImplementedError

    def live(self) -> bool:
        raise NotImplementedError

    def heal_all(self) -> None:
        raise NotImplementedError

    def liveness_failure(self) -> str:
        raise NotImplementedError

    def final_checks(self) -> None:
        """After a live liveness phase (subclasses add end-of-run invariants)."""

    # -- network partitions

    def partition(self, ids: Sequence[NodeId], rng: random.Random) -> int:
        """Split the nodes in two at random; returns the heal delay in ms."""
        side = [n for n in ids if rng.random() < 0.5]
        other = [n for n in ids if n not in side]
        self._record(f"partition {side} | {other}")
        for a in side:
            for b in other:
                self.blocked.update(((a, b), (b, a)))
        return rng.randrange(*partition_heal_ms)

    def one_way(self, ids: Sequence[NodeId], rng: random.Random) -> int:
        """Block one directed link; returns the heal delay in ms."""
        a, b = rng.sample(list(ids), 2)
        self._record(f"block {a} -> {b}")
        self.blocked.add((a, b))
        return rng.randrange(*partition_heal_ms)

    def heal(self) -> None:
        if self.blocked:
            self._record("heal")
        self.blocked.clear()
