"""What a leader knows about one follower (etcd's tracker.Progress and Inflights).

State table::

    state      | sends                                         | leaves on
    -----------+-----------------------------------------------+---------------------------------
    PROBE      | one Append, then waits (probe_sent)           | accepted ack -> REPLICATE;
               |                                               | compacted next -> SNAPSHOT
    REPLICATE  | Appends back to back, next advanced           | rejection -> PROBE;
               | optimistically, at most inflight_appends_max  | compacted next -> SNAPSHOT
               | outstanding                                   |
    SNAPSHOT   | nothing but SnapshotNeeded (again on each     | ack >= pending_snapshot -> PROBE
               | heartbeat response)                           | (then REPLICATE); snapshot_failed
               |                                               | -> PROBE
"""

from __future__ import annotations

from collections import deque
from enum import Enum

from spate.node.replication import limits


class ProgressState(Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Inflights:
    """Last indexes of the Append messages outstanding to one follower, oldest first."""

    def __init__(self, capacity: int = limits.inflight_appends_max) -> None:
        assert capacity > 0
        self.capacity = capacity
        self._last_indexes: deque[int] = deque()

    def add(self, last_index: int) -> None:
        assert not self.full(), "sent past a full pipeline"
        assert not self._last_indexes or last_index >= self._last_indexes[-1]
        self._last_indexes.append(last_index)

    def free_to(self, index: int) -> None:
        """Acknowledged up to `index`: every message ending at or below it is done."""
        while self._last_indexes and self._last_indexes[0] <= index:
            self._last_indexes.popleft()

    def free_first(self) -> None:
        if self._last_indexes:
            self._last_indexes.popleft()

    def reset(self) -> None:
        self._last_indexes.clear()

    def full(self) -> bool:
        return len(self._last_indexes) >= self.capacity

    def __len__(self) -> int:
        return len(self._last_indexes)


class Progress:
    def __init__(self, next_index: int, inflight_max: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.recent_active = False
        self.read_round = 0
        """The highest leadership check round this follower has answered in this term."""
        self.readers = False
        """Its last accepted ack said it has readers: it gets commit updates (ADR 0044)."""
        self.commit_with_sent = 0
        """The highest `Append.commit_with_you` sent to it in this term (ADR 0050)."""
        self.inflights = Inflights(inflight_max)

    def paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.inflights.reset()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.probe_sent = False
        self.next = self.match + 1
        self.inflights.reset()

    def become_snapshot(self, snapshot_index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.probe_sent = False
        self.pending_snapshot = snapshot_index
        self.inflights.reset()

    def sent(self, last_index: int, entry_count: int) -> None:
        """An Append ending at `last_index` (carrying `entry_count` entries) went out."""
        if self.state is ProgressState.REPLICATE:
            if entry_count:
                self.next = last_index + 1
                self.inflights.add(last_index)
        else:
            assert self.state is ProgressState.PROBE
            self.probe_sent = True

    def forget(self) -> None:
        """The follower lost its log (a wiped replica): nothing is known to match any more."""
        self.match = 0
        self.become_probe()
        self.next = 1

    def maybe_update(self, index: int) -> bool:
        """An accepted ack for `index`; returns whether match moved."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def maybe_decrease(self, rejected: int, match_hint: int) -> bool:
        """A rejection of prev_index `rejected`; `match_hint` is where to probe next. Returns
        whether this rejection was current (stale ones are ignored)."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False  # stale: we already know it matches there
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False  # stale: not the probe we are waiting for
        self.next = max(min(rejected, match_hint + 1), self.match + 1, 1)
        self.probe_sent = False
        return True
