"""The simulator's model of one replica's durable Raft state (log entries and hard state).

Fault model (faults a correct shell must survive, nothing more):
- writes handed to the store sit in a pending queue until `sync()`; a crash keeps a random
  prefix of the pending operations (written in order: snapshot, entries, hard state) and loses
  the rest;
- the last surviving entries write may be torn: a random prefix of its entries is kept and the
  next record is garbage, which recovery detects (by CRC in the real log) and truncates;
- everything synced survives.

The store keeps the whole log from index 1 (the simulated segments are never deleted), so a
snapshot transfer can copy a committed prefix from another replica's store.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from spate.node.replication.messages import (
    HARD_STATE_EMPTY,
    Entry,
    HardState,
    Ready,
    SnapshotMeta,
)


@dataclass(frozen=True, slots=True)
class _Write:
    entries: tuple[Entry, ...] = ()
    hard_state: HardState | None = None


class SimRaftStore:
    def __init__(self) -> None:
        self.durable: list[Entry] = []
        self.durable_hard_state = HARD_STATE_EMPTY
        self._pending: list[_Write] = []
        self.torn_writes = 0
        self.lost_writes = 0

    def write(self, ready: Ready) -> None:
        """Queue the Ready's writes (entries first, then hard state, as the shell must)."""
        if ready.entries:
            self._pending.append(_Write(entries=ready.entries))
        if ready.hard_state is not None:
            self._pending.append(_Write(hard_state=ready.hard_state))

    def sync(self) -> None:
        for write in self._pending:
            self._apply(write)
        self._pending.clear()

    def crash(self, rng: random.Random, torn_probability: float) -> None:
        keep = rng.randrange(len(self._pending) + 1)
        for write in self._pending[:keep]:
            self._apply(write)
        if keep < len(self._pending):
            self.lost_writes += len(self._pending) - keep
            torn = self._pending[keep]
            if torn.entries and rng.random() < torn_probability:
                self.torn_writes += 1
                self._apply(_Write(entries=torn.entries[: rng.randrange(len(torn.entries))]))
        self._pending.clear()

    def _apply(self, write: _Write) -> None:
        if write.entries:
            first = write.entries[0].index
            assert first <= len(self.durable) + 1, (first, len(self.durable))
            del self.durable[first - 1 :]
            self.durable.extend(write.entries)
        if write.hard_state is not None:
            self.durable_hard_state = write.hard_state

    def install(self, prefix: list[Entry]) -> None:
        """A snapshot transfer: the log becomes `prefix` (fetched from the leader and synced)."""
        self.sync()
        self.durable = list(prefix)

    def recovered(self) -> tuple[HardState, SnapshotMeta, list[Entry]]:
        """What a restarting replica reads back: hard state, snapshot marker, entries."""
        assert not self._pending
        hard_state = self.durable_hard_state
        if hard_state.commit > len(self.durable):
            # Commit is only ever written with (or after) the entries it covers, and those
            # are synced before it; a commit past the log end means the store is broken.
            raise AssertionError(f"durable commit {hard_state.commit} > log {len(self.durable)}")
        return hard_state, SnapshotMeta(), list(self.durable)
