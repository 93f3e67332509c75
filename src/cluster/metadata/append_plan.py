"""What a metadata follower does with a leader's append_entries (Raft §5.3, "AppendEntries RPC",
receiver steps 2-5), decided without I/O; the pysyncobj adapter (raft.py) carries it out.

pysyncobj 0.3.17's follower (`SyncObj.__onMessageReceived`) deletes every entry after
`prevLogIdx` and appends the message's entries without comparing them with the ones it holds.
When the leader re-sends from below the follower's end (a stale `next_node_idx` reset: the
answer a follower gave before it caught up, processed late), a message carrying fewer entries
than that tail leaves the follower's log shorter than what it has applied and acknowledged;
standing for election then, it can win without entries a quorum had — committed metadata lost
(benchmarks/RESULTS.md §29, docs/adr/0025 "Addendum: the follower's append"). Raft keeps what
matches and cuts only from the first conflict:

| the message (its prev index and term in the log)          | plan      | the log afterwards       |
|-----------------------------------------------------------|-----------|--------------------------|
| every entry matches (same index and term), or it has none | `Keep(m)` | unchanged, tail included |
| entry k differs in term, or lies past the end; k above    | `Append`  | cut at k, entries k..    |
| the committed index                                       |           | appended                 |
| entry k differs in term at or below the committed index   | `Refuse`  | unchanged: the replicas  |
|                                                           |           | have diverged (a bug)    |
| (prev index, prev term) not in the log                    | `Defer`   | pysyncobj refuses it     |

`matched` (m, and an Append's last entry) is the highest index the message proves equal to the
leader's log: the follower acknowledges no more (the leader counts acknowledgements to commit)
and commits no further, whatever the leader's commit index says — entries kept past it may be
a deposed leader's and are cut when the current leader's entry there arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keep:
    """Nothing to delete or append; the message proves the log up to `matched`."""

    matched: int


@dataclass(frozen=True, slots=True)
class Append:
    """Delete what follows `prev_index` (the last entry the message proves), then append the
    message's entries from position `start` on; the log then ends at `matched`."""

    prev_index: int
    prev_term: int
    start: int
    matched: int


@dataclass(frozen=True, slots=True)
class Refuse:
    """Entry `index`, committed here with `local_term`, has `leader_term` at the leader."""

    index: int
    local_term: int
    leader_term: int


@dataclass(frozen=True, slots=True)
class Defer:
    """The log has no entry (prev index, prev term): the leader must go back (pysyncobj's own
    answer)."""


Plan = Keep | Append | Refuse | Defer


def plan_append(
    term_at: Callable[[int], int | None],
    prev_index: int,
    prev_term: int,
    entries: Sequence[tuple[int, int]],
    committed: int,
) -> Plan:
    """The plan for a message whose entries are `entries` ((index, term), consecutive after
    `prev_index`). `term_at(i)` is the term of the log's entry at index i (None: the log has no
    entry there); `committed` the highest index this replica knows committed (its commit index,
    or the last applied entry if that is higher)."""
    if term_at(prev_index) != prev_term:
        return Defer()
    matched, matched_term = prev_index, prev_term
    for position, (index, term) in enumerate(entries):
        assert index == prev_index + 1 + position, (prev_index, position, index)
        local = term_at(index)
        if local == term:
            matched, matched_term = index, term
            continue
        if local is not None and index <= committed:
            return Refuse(index, local, term)
        return Append(matched, matched_term, position, entries[-1][0])
    return Keep(matched)
