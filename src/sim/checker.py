"""Invariants the simulator checks after every event (Raft §5 safety properties, KRaft-style).

1. election safety: at most one leader per (group, term);
2. commit monotonic: a replica's commit index never decreases within one incarnation;
3. log matching: an entry identified by (group, index, term) has one payload and one
   predecessor term everywhere, so two logs holding the same (index, term) agree on the whole
   prefix before it (induction on index);
4. state machine safety: every entry committed or applied anywhere at an index equals the one
   in the group's committed history (the first replica to commit an index defines it), so
   applied logs are prefixes of one another;
5. no acknowledged append lost: an acknowledged entry is in the committed history, every new
   leader's log holds the whole committed history above its snapshot (leader completeness), and
   after every crash each acknowledged entry is still on the synced disk of a majority of the
   voters of the group's newest committed membership, or of a membership appended after it;
6. commit quorum (ADR 0022): whenever a leader's commit index rises, the entry there is on the
   synced logs of a majority of the voters of the newest membership in that leader's log
   (learners and removed replicas never count; a new membership counts from its append).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spate.core.ids import NodeId, Term
from spate.node.replication.messages import Entry, Membership
from spate.node.replication.raft import Raft, Role


class InvariantViolation(Exception):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


class Checker:
    def __init__(self, groups: int) -> None:
        self.leaders: dict[tuple[int, Term], NodeId] = {}
        self.history: list[dict[int, tuple[Term, bytes]]] = [{} for _ in range(groups)]
        self.acked: list[list[tuple[int, Term, bytes]]] = [[] for _ in range(groups)]
        self._commit_seen: dict[tuple[NodeId, int], int] = {}
        self._entries: dict[tuple[int, int, Term], tuple[bytes, Term]] = {}
        self._memberships: list[dict[int, list[Membership]]] = [{} for _ in range(groups)]
        """Per group: every membership entry appended anywhere, by index (any term)."""

    def commit_seen(self, node: NodeId, group: int) -> int:
        return self._commit_seen.get((node, group), 0)

    def commit_backed(
        self,
        node: NodeId,
        group: int,
        raft: Raft,
        durable: Mapping[NodeId, Sequence[Entry]],
        memberships: Sequence[Membership] = (),
    ) -> None:
        """A leader's commit index rose: the entry there must be on the synced logs of a
        majority of the voters of the newest membership in its log. A follower's that rose
        past its leader's (completed by its own sync, ADR 0050): of one of `memberships`, those
        its leader may have counted for it (the one in force at the entry and every newer one:
        the leader said what commits with the follower's copy under its newest membership of
        the time; a later single-server change keeps every quorum of the new membership
        overlapping one of the old, so a quorum of either holding the entry keeps it in every
        future leader's log)."""
        commit = raft.log.committed
        term = raft.log.term(commit)
        holders: list[NodeId] = []
        voters: tuple[NodeId, ...] = ()
        for membership in memberships or [raft.membership]:
            voters = membership.voters
            holders = [
                v
                for v in voters
                if len(durable[v]) >= commit and durable[v][commit - 1].term == term
            ]
            if len(holders) >= len(voters) // 2 + 1:
                return
        role = "leader" if raft.role is Role.LEADER else "follower"
        raise InvariantViolation(
            "commit-quorum",
            f"{role} {node} of group {group} term {raft.term} committed {term}/{commit} "
            f"synced on {holders} only, of voters {list(voters)}",
        )

    def restarted(self, node: NodeId, group: int, commit: int) -> None:
        self._commit_seen[(node, group)] = commit

    def observe(self, node: NodeId, group: int, raft: Raft) -> None:
        """Called after every event for every live replica."""
        if raft.role is Role.LEADER:
            key = (group, raft.term)
            elected = self.leaders.get(key)
            if elected is None:
                self.leaders[key] = node
                self._check_new_leader(node, group, raft)
            elif elected != node:
                raise InvariantViolation(
                    "election-safety",
                    f"group {group} term {raft.term}: leaders {elected} and {node}",
                )
        seen = self._commit_seen.get((node, group), 0)
        commit = raft.log.committed
        if commit < seen:
            raise InvariantViolation(
                "commit-monotonic", f"{node} group {group}: commit {seen} -> {commit}"
            )
        for index in range(max(seen, raft.log.snapshot.index) + 1, commit + 1):
            self.committed(node, group, raft.log.entry(index), "committed")
        self._commit_seen[(node, group)] = commit

    def committed(self, node: NodeId, group: int, entry: Entry, what: str) -> None:
        history = self.history[group]
        known = history.get(entry.index)
        payload = bytes(entry.payload)  # a follower's is a view of its frame (ADR 0037)
        if known is None:
            history[entry.index] = (entry.term, payload)
        elif known != (entry.term, payload):
            raise InvariantViolation(
                "state-machine-safety",
                f"{node} {what} {entry.describe()} {entry.payload!r} in group {group}, but "
                f"{known[0]}/{entry.index} {known[1]!r} was committed there",
            )

    def appended(
        self, node: NodeId, group: int, entries: tuple[Entry, ...], prev_term: Term
    ) -> None:
        """Entries a replica's core handed to its disk, and the term of the entry before."""
        for entry in entries:
            key = (group, entry.index, entry.term)
            known = self._entries.get(key)
            payload = bytes(entry.payload)
            if known is None:
                self._entries[key] = (payload, prev_term)
            elif known != (payload, prev_term):
                raise InvariantViolation(
                    "log-matching",
                    f"{node} group {group} has {entry.describe()} {entry.payload!r} after term "
                    f"{prev_term}; elsewhere it is {known[0]!r} after term {known[1]}",
                )
            prev_term = entry.term
            membership = Membership.decode(entry.payload)
            if membership is not None:
                self.membership_appended(group, entry.index, membership)

    def membership_appended(self, group: int, index: int, membership: Membership) -> None:
        """A membership entry a leader's core appended at `index`. It counts from then (Raft
        thesis §4.1: a server uses the newest configuration in its log, committed or not), so
        it is recorded when proposed, not only when a Ready hands it to a disk: a leader may
        commit under it before its next Ready (found with ADR 0042's quiet commit updates,
        which changed which run core seed 29 made: an entry committed on the leader and the
        promoted learner before the promotion's Ready was reported not durable)."""
        seen = self._memberships[group].setdefault(index, [])
        if membership not in seen:
            seen.append(membership)

    def acknowledged(self, group: int, index: int, term: Term, payload: bytes) -> None:
        known = self.history[group].get(index)
        if known != (term, payload):
            raise InvariantViolation(
                "acknowledged-lost",
                f"group {group} acknowledged {term}/{index} {payload!r} but history has {known}",
            )
        self.acked[group].append((index, term, payload))

    def durable(
        self, group: int, logs: Mapping[NodeId, Sequence[Entry]], initial: Membership
    ) -> None:
        """After a crash: every acknowledged entry is on the synced log of a majority of the
        voters of the newest committed membership, or of one appended after it (an entry
        committed under a pending membership is on a majority of that one)."""
        committed_at, committed = 0, initial
        for index, (_, payload) in self.history[group].items():
            membership = Membership.decode(payload)
            if membership is not None and index > committed_at:
                committed_at, committed = index, membership
        candidates = [committed] + [
            m for index, ms in self._memberships[group].items() if index > committed_at for m in ms
        ]
        for index, term, payload in self.acked[group]:
            held = {
                node
                for node, log in logs.items()
                if len(log) >= index
                and log[index - 1].term == term
                and log[index - 1].payload == payload
            }
            if not any(len(held & set(m.voters)) >= m.quorum for m in candidates):
                raise InvariantViolation(
                    "acknowledged-durable",
                    f"group {group} acknowledged {term}/{index} {payload!r} is synced on "
                    f"{sorted(held)}: no majority of {[m.describe() for m in candidates]}",
                )

    def _check_new_leader(self, node: NodeId, group: int, raft: Raft) -> None:
        floor = raft.log.snapshot.index
        for index, term, payload in self.acked[group]:
            if index > floor and (
                raft.log.term(index) != term or raft.log.entry(index).payload != payload
            ):
                raise InvariantViolation(
                    "acknowledged-lost",
                    f"new leader {node} of group {group} term {raft.term} "
                    f"lacks acknowledged {term}/{index} {payload!r}",
                )
        for index, (term, payload) in self.history[group].items():
            if index > floor and (
                raft.log.term(index) != term or raft.log.entry(index).payload != payload
            ):
                raise InvariantViolation(
                    "leader-completeness",
                    f"new leader {node} of group {group} term "
                    f"{raft.term} lacks committed {term}/{index}",
                )
