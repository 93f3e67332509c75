"""The Raft log as the core sees it: a bounded in-memory window over the durable log.

Indexes, left to right::

    snapshot.index   applied    committed    stable      persist_from-1    last_index
    |-- compacted --|-- cached --|-- to apply --|-- in flight to disk --|-- unstable --|

- entries at or below `snapshot.index` are no longer in memory (they live in storage segments);
  a follower that needs them gets a SnapshotNeeded instead of an Append;
- `stable` is the highest index known durable on the local disk (Ready handed back);
- `persist_from` is the first index not yet handed to the shell in a Ready; a truncation of a
  divergent tail lowers both, so an outstanding Ready can never mark rewritten entries durable;
- `committed` never decreases and is never truncated (asserted).
"""

from __future__ import annotations

from collections.abc import Sequence

from spate.core.ids import Term
from spate.node.replication.messages import Entry, SnapshotMeta


class RaftLog:
    def __init__(self, snapshot: SnapshotMeta, entries: Sequence[Entry], committed: int) -> None:
        self.snapshot = snapshot
        self._entries: list[Entry] = list(entries)
        for offset, entry in enumerate(self._entries):
            assert entry.index == snapshot.index + 1 + offset, (entry.index, snapshot)
        assert snapshot.index <= committed <= self.last_index, (committed, self.last_index)
        self.stable = self.last_index
        self.persist_from = self.last_index + 1
        self.committed = committed
        self.applied = snapshot.index
        self.bytes_in_memory = sum(len(e.payload) for e in self._entries)
        self.bytes_applied = 0

    # -- reading

    @property
    def first_index(self) -> int:
        return self.snapshot.index + 1

    @property
    def last_index(self) -> int:
        return self.snapshot.index + len(self._entries)

    @property
    def last_term(self) -> Term:
        return self._entries[-1].term if self._entries else self.snapshot.term

    @property
    def bytes_unapplied(self) -> int:
        return self.bytes_in_memory - self.bytes_applied

    def term(self, index: int) -> Term | None:
        """The term of the entry at `index`; None when compacted away or beyond the end."""
        if index == self.snapshot.index:
            return self.snapshot.term
        if index < self.snapshot.index or index > self.last_index:
            return None
        return self._entries[index - self.first_index].term

    def entry(self, index: int) -> Entry:
        assert self.first_index <= index <= self.last_index, (index, self.first_index)
        return self._entries[index - self.first_index]

    def match_term(self, index: int, term: Term) -> bool:
        return self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: Term) -> bool:
        """Raft §5.4.1: the other log is at least as up to date as ours."""
        return last_term > self.last_term or (
            last_term == self.last_term and last_index >= self.last_index
        )

    def entries_from(self, low: int, bytes_max: int, count_max: int) -> tuple[Entry, ...] | None:
        """Entries from `low` up to the byte and count limits (at least one when any exist);
        None when `low` has been compacted away."""
        if low < self.first_index:
            return None
        out: list[Entry] = []
        size = 0
        for position in range(low - self.first_index, len(self._entries)):
            entry = self._entries[position]
            if out and (size + len(entry.payload) > bytes_max or len(out) >= count_max):
                break
            out.append(entry)
            size += len(entry.payload)
        return tuple(out)

    def find_conflict_by_term(self, index: int, term: Term) -> tuple[int, Term]:
        """The largest index <= `index` whose term is <= `term` (etcd's findConflictByTerm).

        Every entry above it has a bigger term, so none of them can match a log whose entry at
        `index` has `term`: the leader may skip them all in one round trip."""
        index = min(index, self.last_index)
        while True:
            found = self.term(index)
            if found is None:
                return index, Term(0)
            if found <= term:
                return index, found
            index -= 1

    # -- changing

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries that directly follow the last one (leader proposals)."""
        for entry in entries:
            assert entry.index == self.last_index + 1, (entry.index, self.last_index)
            assert entry.term >= self.last_term, (entry.term, self.last_term)
            self._entries.append(entry)
            self.bytes_in_memory += len(entry.payload)

    def maybe_append(
        self, prev_index: int, prev_term: Term, entries: Sequence[Entry]
    ) -> int | None:
        """Follower side of Append: None when (prev_index, prev_term) does not match; else the
        last index the message proves to match (prev_index + len(entries))."""
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        for position, entry in enumerate(entries):
            assert entry.index == prev_index + 1 + position, (entry.index, prev_index)
            existing = self.term(entry.index)
            if existing == entry.term:
                continue
            if existing is None and entry.index <= self.snapshot.index:
                continue  # compacted: committed, so it matches (Log Matching)
            self._truncate_from(entry.index)
            self.append(entries[position:])
            break
        return last_new

    def _truncate_from(self, index: int) -> None:
        """Drop entries at and after `index` (a divergent tail)."""
        assert index > self.committed, f"truncating committed entry {index} <= {self.committed}"
        assert index >= self.first_index, (index, self.first_index)
        dropped = self._entries[index - self.first_index :]
        del self._entries[index - self.first_index :]
        self.bytes_in_memory -= sum(len(e.payload) for e in dropped)
        self.stable = min(self.stable, index - 1)
        self.persist_from = min(self.persist_from, index)

    def commit_to(self, index: int) -> bool:
        """Advance the commit index; never moves back. Returns whether it moved."""
        if index <= self.committed:
            return False
        assert index <= self.last_index, f"commit {index} beyond last index {self.last_index}"
        self.committed = index
        return True

    def unstable(self) -> tuple[Entry, ...]:
        return tuple(self._entries[self.persist_from - self.first_index :])

    def handed_to_disk(self, last: int) -> None:
        self.persist_from = last + 1

    def stable_to(self, last: int) -> None:
        """The shell made entries up to `last` (handed in a Ready) durable; a truncation since
        then has lowered persist_from and caps what may be called durable."""
        self.stable = max(self.stable, min(last, self.persist_from - 1, self.last_index))

    def next_committed(self, bytes_max: int) -> tuple[Entry, ...]:
        """Committed entries not yet applied, up to `bytes_max` (at least one)."""
        high = min(self.committed, self.persist_from - 1)
        out: list[Entry] = []
        size = 0
        for index in range(self.applied + 1, high + 1):
            entry = self.entry(index)
            if out and size + len(entry.payload) > bytes_max:
                break
            out.append(entry)
            size += len(entry.payload)
        return tuple(out)

    def applied_to(self, index: int) -> None:
        assert self.applied <= index <= self.committed, (self.applied, index, self.committed)
        for position in range(self.applied + 1, index + 1):
            self.bytes_applied += len(self.entry(position).payload)
        self.applied = index

    def compact(self, keep_bytes: int, floor: int = 0) -> None:
        """Drop applied, durable entries from memory: every one at or below `floor` (every
        peer holds them) and, above it, the oldest until at most `keep_bytes` of applied
        entries remain. They stay in storage; a follower that needs one gets a snapshot."""
        limit = min(self.applied, self.stable)
        drop = freed = 0
        while (
            drop < len(self._entries)
            and (self.bytes_applied - freed > keep_bytes or self._entries[drop].index <= floor)
            and self._entries[drop].index <= limit
        ):
            freed += len(self._entries[drop].payload)
            drop += 1
        if drop:
            last = self._entries[drop - 1]
            del self._entries[:drop]
            self.bytes_in_memory -= freed
            self.bytes_applied -= freed
            self.snapshot = SnapshotMeta(last.index, last.term)

    def restore(self, snapshot: SnapshotMeta) -> None:
        """Replace the whole log by a snapshot marker (the shell already holds its data)."""
        assert snapshot.index > self.committed, (snapshot, self.committed)
        self.snapshot = snapshot
        self._entries = []
        self.bytes_in_memory = self.bytes_applied = 0
        self.stable = snapshot.index
        self.persist_from = snapshot.index + 1
        self.committed = self.applied = snapshot.index
