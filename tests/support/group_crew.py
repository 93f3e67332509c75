"""GroupConsumers in one process for the consumer-group tests (tests/gateway and
tests/integration test_consumer_groups.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from spate.core.groups import GroupDefinition, Strategy
from spate.core.ids import StreamName


def define_group(  # noqa: PLR0917 (the definition's fields)
    broker: Any,
    loop_thread: Any,
    stream: str,
    group: str,
    strategy: str = "round-robin",
    pending_max: int = 16,
) -> None:
    """A group whose rebalances start at once (no coalescing delay), defined on a test broker
    of the gateway suites (a proxy gateway's routes refreshed at once)."""
    definition = GroupDefinition(
        StreamName(stream), group, Strategy(strategy), rebalance_delay_ms=0, pending_max=pending_max
    )

    def apply() -> None:
        broker.define_group(definition)
        if hasattr(broker, "refresh"):  # a proxy gateway: its next metadata refresh, now
            broker.refresh()

    loop_thread.run(apply)


class Crew:
    """GroupConsumers in this process, each consuming in its own thread and recording what it
    got: (member, partition, offset) in arrival order."""

    def __init__(self, url: str, stream: str, group: str) -> None:
        self.url, self.stream, self.group = url, stream, group
        self.members: dict[int, tuple[Any, threading.Thread]] = {}
        self.got: list[tuple[int, int, int]] = []
        self.errors: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.next_id = 0

    def add(self, count: int) -> None:
        from spate.client import GroupConsumer

        for _ in range(count):
            self.next_id += 1
            member = GroupConsumer(self.url, self.stream, self.group, credit=20)
            thread = threading.Thread(target=self._run, args=(self.next_id, member), daemon=True)
            self.members[self.next_id] = (member, thread)
            thread.start()

    def _run(self, ident: int, member: Any) -> None:
        from spate.client import ConsumerClosed

        while True:
            try:
                event = member.receive(timeout=None)
            except ConsumerClosed:
                return
            except Exception as error:  # a member that stopped: the test says why
                with self.lock:
                    self.errors.append((ident, repr(error)))
                return
            with self.lock:
                self.got.append((ident, int(event.partition), event.offset))

    def remove(self, count: int) -> None:
        for ident in sorted(self.members)[:count]:
            member, thread = self.members.pop(ident)
            member.close()
            thread.join(10)

    def assignments(self) -> dict[int, frozenset[int]]:
        return {ident: member.assignment for ident, (member, _) in self.members.items()}

    def wait_delivered(self, published: dict[int, int], timeout_s: float) -> None:
        """Until every (partition, offset) below `published[partition]` reached a member."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                seen = {(p, o) for _, p, o in self.got}
            missing = [(p, o) for p, n in published.items() for o in range(n) if (p, o) not in seen]
            if not missing:
                return
            if time.monotonic() > deadline:
                with self.lock:
                    history = [(i, p, o) for i, p, o in self.got if p == missing[0][0]]
                raise AssertionError(
                    f"never delivered: {missing[:10]}; {history}; members stopped: {self.errors}"
                )
            time.sleep(0.2)

    def close(self) -> None:
        self.remove(len(self.members))


def settle(crew: Crew, publish_round: Callable[[], None], size: int, timeout_s: float = 60) -> None:
    """Publish a round to every partition until the members' partitions are disjoint, cover
    the stream and are balanced (each holds 6 // members or one more)."""
    deadline = time.monotonic() + timeout_s
    while True:
        publish_round()
        time.sleep(0.3)
        held = crew.assignments()
        union = [p for parts in held.values() for p in parts]
        sizes = sorted(len(parts) for parts in held.values())
        balanced = sizes and sizes[0] >= size // len(held) and sizes[-1] <= -(-size // len(held))
        if sorted(union) == list(range(size)) and balanced:
            return
        assert time.monotonic() < deadline, f"the group never settled: {held}"
