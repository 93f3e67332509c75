"""What a named consumer link has finished with, and when to store it (pure; ADR 0012).

A link named `spate:consumer-name` is bound to one partition. The listener numbers its
deliveries with delivery tags 1, 2, 3, ... and records which offsets each run of tags carries
(`sent`). A delivery is *done* when the client settles it accepted or rejected (or settles it
with no outcome; or, on a pre-settled link, when it is sent); released and modified ones are
not, so the consumer gets them again after a restart. The stored offset is the offset of the
highest tag below which every delivery is done: never ahead of what the consumer finished,
whatever order it settles in.

A store is due after `every` done deliveries since the last one, or `interval_ms` after the
first of them, whichever comes first — or at once while a client in rcv-settle-mode second
waits for its accepted deliveries to be settled (its commit); the link's detach stores what
is left.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class OffsetTracker:
    every: int
    """Store after this many done deliveries..."""
    interval_ms: float
    """...or this long after the first one not stored."""
    runs: deque[tuple[int, int, int]] = field(default_factory=deque)
    """(first tag, first offset, count) of what was sent and is not below the watermark."""
    done_tag: int = 0
    """Every delivery with a tag at or below this one is done."""
    ahead: set[int] = field(default_factory=set)
    """Done tags above done_tag + 1 (settled out of order)."""
    done_offset: int | None = None
    """Offset of done_tag's delivery (None: nothing done yet on this link)."""
    stored: int | None = None
    """The last offset handed to the partition to store."""
    unstored: int = 0
    since_ms: float | None = None
    """When the first done delivery not yet stored was settled."""

    def sent(self, first_tag: int, first_offset: int, count: int) -> None:
        """Tags first_tag .. first_tag + count - 1 carry consecutive offsets from first_offset."""
        runs = self.runs
        if runs:
            tag, offset, n = runs[-1]
            if tag + n == first_tag and offset + n == first_offset:
                runs[-1] = (tag, offset, n + count)
                return
        runs.append((first_tag, first_offset, count))

    def settled(self, tag: int, done: bool, now_ms: float) -> None:
        """The client settled the delivery `tag`; `done`: accepted or rejected."""
        if not done or tag <= self.done_tag:
            return
        if tag != self.done_tag + 1:
            self.ahead.add(tag)
            return
        ahead = self.ahead
        tag += 1
        while tag in ahead:
            ahead.discard(tag)
            tag += 1
        self.done_tag = tag - 1
        self.done_offset = self._offset_of(self.done_tag)
        self.unstored += 1
        if self.since_ms is None:
            self.since_ms = now_ms

    def done_through(self, tag: int, now_ms: float) -> None:
        """Every delivery up to `tag` is done (a pre-settled link, as it sends)."""
        if tag <= self.done_tag:
            return
        self.unstored += tag - self.done_tag
        self.done_tag = tag
        self.ahead = {t for t in self.ahead if t > tag}
        self.done_offset = self._offset_of(tag)
        if self.since_ms is None:
            self.since_ms = now_ms

    def _offset_of(self, tag: int) -> int:
        runs = self.runs
        while runs:
            first_tag, first_offset, count = runs[0]
            if tag < first_tag + count:
                assert tag >= first_tag, (tag, first_tag)
                return first_offset + tag - first_tag
            runs.popleft()
        raise AssertionError(f"tag {tag} was never sent")

    def due(self, now_ms: float, *, urgent: bool = False) -> bool:
        """A store should start now (`urgent`: whenever there is something new to store — a
        client waits for it)."""
        if self.done_offset is None or self.done_offset == self.stored:
            return False
        assert self.since_ms is not None
        return urgent or self.unstored >= self.every or now_ms - self.since_ms >= self.interval_ms

    def take(self) -> int | None:
        """The offset to store now (None: nothing new); the tracker counts it stored."""
        if self.done_offset is None or self.done_offset == self.stored:
            return None
        self.stored = self.done_offset
        self.unstored = 0
        self.since_ms = None
        return self.stored

    def wake_at_ms(self) -> float | None:
        """When a store falls due by time (None: nothing waits)."""
        return None if self.since_ms is None else self.since_ms + self.interval_ms
