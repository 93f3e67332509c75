"""Server-side offset tracking under the shell simulator (ADR 0012): the named consumer the
client plays, and the stored-offset invariants (`offset-not-ahead`, `offset-durable`,
`offset-table`; shell.py's docstring and src/sim/README.md say what each means).

The production rule being checked: a tracking chunk stores `offset` for a name; every replica
derives its offset table by reading tracking chunks in log order, the *last* store of a name
wins (an older offset stored later moves it back: a consumer that re-attached with an explicit
start filter, or an operator's reset, docs/amqp.md "Offset tracking"). So "never lost" means
"never behind the store that was acknowledged, in log order": a table or an answer may hold a
smaller offset only when a later store committed it.

`ConsumerModel` is pure bookkeeping: shell.py feeds it the committed history (through
`TrackingChecker`), the client's accepts, requests and acknowledgements, and each replica's
table and log tail; it raises InvariantViolation.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spate.core.backend import ConsumerOffset
from spate.core.ids import NodeId, Term
from spate.node.log import chunk as chunk_codec
from spate.node.log.tracking import TrackedOffset
from spate.node.replication.messages import MEMBERSHIP_MAGIC, Entry
from spate.sim.checker import Checker, InvariantViolation


def consumer_name(group: int) -> bytes:
    return f"sim-c{group}".encode()


@dataclass(frozen=True, slots=True)
class Store:
    """One tracking entry of the consumer's name: acknowledged, or committed (history)."""

    index: int
    term: Term
    offset: int


def tracking_stores(payload: bytes | memoryview, name: bytes) -> list[int]:
    """The offsets a chunk stores for `name` (none unless it is a tracking chunk)."""
    if not payload or bytes(payload[:4]) == MEMBERSHIP_MAGIC:
        return []  # a barrier, a membership entry (ADR 0022)
    header = chunk_codec.decode_header(payload)
    if not header.flags & chunk_codec.FLAG_TRACKING:
        return []
    return [o for n, o in chunk_codec.tracking_section(payload, 0, header) if n == name]


class ConsumerModel:
    """One group's named consumer and what the cluster committed for its name."""

    def __init__(self, group: int) -> None:
        self.group = group
        self.name = consumer_name(group)
        self.accepted = -1
        """Highest offset the consumer accepted: it read it committed, and finished with it
        (a consumer accepts in order, so everything below is accepted too)."""
        self.requested: set[int] = set()
        """Every offset the consumer asked to store (only accepted ones)."""
        self.floor = 0
        """Raft index of the latest acknowledged store (0: none yet)."""
        self._committed: dict[int, Store] = {}
        self._indices: list[int] = []
        self.known_through = 0
        """The committed history holds every index up to here."""
        self._seen: dict[NodeId, tuple[object, ...]] = {}

    # -- what the client and the cluster report

    def accept(self, offset: int) -> None:
        assert offset >= self.accepted
        self.accepted = offset

    def request(self, offset: int) -> None:
        assert -1 <= offset <= self.accepted, (offset, self.accepted)
        self.requested.add(offset)

    def acknowledged(self, store: Store) -> None:
        self.floor = max(self.floor, store.index)

    def committed(self, entry: Entry, history: dict[int, tuple[Term, bytes]]) -> None:
        """A new index entered the committed history."""
        for offset in tracking_stores(entry.payload, self.name):
            self._check_not_ahead(f"committed at {entry.term}/{entry.index}", offset)
            if entry.index not in self._committed:
                bisect.insort(self._indices, entry.index)
            self._committed[entry.index] = Store(entry.index, entry.term, offset)
        while self.known_through + 1 in history:
            self.known_through += 1

    def stored_at(self, index: int) -> Store | None:
        """The last committed store of the name at or below `index`."""
        at = bisect.bisect_right(self._indices, index)
        return self._committed[self._indices[at - 1]] if at else None

    # -- the invariants

    def _check_not_ahead(self, where: str, offset: int) -> None:
        if offset not in self.requested or offset > self.accepted:
            raise InvariantViolation(
                "offset-not-ahead",
                f"g{self.group} {where}: stored offset {offset}, but the consumer accepted up "
                f"to {self.accepted} and asked to store "
                f"{'it' if offset in self.requested else 'never that'}",
            )

    def check_answer(self, node: NodeId, answer: ConsumerOffset | None, floor: int) -> None:
        """A leader's answer to a query issued when the latest acknowledged store was at Raft
        index `floor`: the value of a committed store at or after it."""
        if answer is None:
            if floor:
                raise InvariantViolation(
                    "offset-durable",
                    f"g{self.group} {node} answered no stored offset, after the store at index "
                    f"{floor} was acknowledged",
                )
            return
        at = bisect.bisect_left(self._indices, floor)
        later = [self._committed[i] for i in self._indices[at:]]
        if not any(s.offset == answer.offset for s in later):
            since = f"the acknowledged one at index {floor}" if floor else "the start"
            raise InvariantViolation(
                "offset-durable",
                f"g{self.group} {node} answered offset {answer.offset}; the stores committed "
                f"since {since} hold {sorted({s.offset for s in later})}",
            )

    def check_replica(
        self,
        node: NodeId,
        key: tuple[object, ...],
        got: TrackedOffset | None,
        base: int,
        read_tail: Callable[[], Sequence[bytes]],
    ) -> None:
        """One replica's table entry for the name, `got`, over a log that equals the committed
        history up to Raft index `base` and holds the chunks `read_tail()` after it. `key`
        names the replica's state: while it is unchanged, the replica is not checked again."""
        key = (*key, self.floor)
        if self._seen.get(node) == key:
            return
        if got is not None:
            self._check_not_ahead(f"{node}'s table (index {got.raft_index})", got.offset)
        if (
            base
            and self.floor
            and base >= self.floor
            and (got is None or got.raft_index < self.floor)
        ):
            raise InvariantViolation(
                "offset-durable",
                f"g{self.group} {node} holds the committed log to index {base}, but its table "
                f"has {_describe(got)}, behind the store acknowledged at index {self.floor}",
            )
        if base > self.known_through:
            return  # the history cannot speak for this log yet; checked again when it can
        stored = self.stored_at(base)
        expected = None if stored is None else (stored.offset, stored.index, int(stored.term))
        tail = read_tail()
        for data in tail:  # barriers: empty in the core's memory, headers on disk
            for offset in tracking_stores(data, self.name):
                header = chunk_codec.decode_header(data)
                expected = (offset, header.raft_index, header.epoch)
        actual = None if got is None else (got.offset, got.raft_index, got.epoch)
        if actual != expected:
            raise InvariantViolation(
                "offset-table",
                f"g{self.group} {node} has {_describe(got)}; its log (committed to index "
                f"{base}, then {len(tail)} chunks) stores "
                f"{'nothing' if expected is None else f'{expected[0]} at index {expected[1]}'}",
            )
        self._seen[node] = key


def _describe(got: TrackedOffset | None) -> str:
    return "no offset" if got is None else f"offset {got.offset} at index {got.raft_index}"


class TrackingChecker(Checker):
    """The Raft checker, telling each group's consumer model about every newly committed
    entry (the committed history is where `offset-table` and `offset-durable` look)."""

    def __init__(self, groups: int) -> None:
        super().__init__(groups)
        self.consumers = [ConsumerModel(g) for g in range(groups)]

    def committed(self, node: NodeId, group: int, entry: Entry, what: str) -> None:
        new = entry.index not in self.history[group]
        super().committed(node, group, entry, what)
        if new:
            self.consumers[group].committed(entry, self.history[group])
