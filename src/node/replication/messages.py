"""Typed values crossing the Raft core's boundary: entries, hard state, messages, Ready.

Messages are plain frozen dataclasses; the shell encodes them with its own codec (never pickle).
Every message names the group's `term` of its sender, `source` and `target`. The terms used here
are `spate.core.ids.Term`; indexes are Raft log indexes (1-based, 0 = before the first entry),
distinct from stream offsets (one entry is one chunk of many records).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from spate.core.errors import (
    BrokerError,
    InvalidArgument,
    MessageSizeExceeded,
    NotLeader,
    ResourceLimitExceeded,
    Unavailable,
)
from spate.core.ids import LeaderEpoch, NodeId, Term
from spate.node.replication import limits

TERM_ZERO = Term(0)
"""The term before any election; the term of index 0."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry: an opaque payload (one storage chunk) and the term it was proposed in.

    An empty payload is the barrier entry a new leader appends at the start of its term (it
    commits earlier terms' entries and marks where the leader epoch begins); storage keeps it as
    an empty chunk and readers skip it.

    A follower's entries are views of the Append frame they came in (codec.decode_raft: never
    copied on their way to the disk, ADR 0037); the frame's bytes are immutable, so a view is
    as good as a copy, and it keeps the frame alive while the entry is in memory.
    """

    index: int
    term: Term
    payload: bytes | memoryview

    def describe(self) -> str:
        return f"{self.term}/{self.index}" + ("" if self.payload else "(barrier)")


MEMBERSHIP_MAGIC = b"SPCF"


def is_membership(payload: bytes | memoryview) -> bool:
    """Whether an entry's payload is a membership entry (bytes or a view alike)."""
    return payload[: len(MEMBERSHIP_MAGIC)] == MEMBERSHIP_MAGIC


_MEMBERSHIP_HEAD = struct.Struct(">4sBBB")
MEMBERSHIP_VERSION = 1
MEMBER_NAME_BYTES_MAX = 31
"""A member's node id in a membership entry, UTF-8 (the hard-state file's vote field too)."""


@dataclass(frozen=True, slots=True)
class Membership:
    """Who replicates a group (ADR 0022): `voters` elect leaders and count for commit;
    `learners` receive the log (and snapshots) but never vote, campaign or count. Both sorted,
    disjoint. A membership entry's payload is `encode()`; it takes effect on every replica as
    soon as it is in that replica's log (committed or not), and a truncation of it reverts to
    the one before (Raft thesis §4.1).

    Payload layout (big-endian): ``magic "SPCF" | version u8 (1) | voters u8 | learners u8``,
    then each voter, then each learner, as ``length u8 | UTF-8 node id``. The magic cannot
    begin a chunk (chunks begin with "SPCK"), so a payload is a membership entry iff it starts
    with it."""

    voters: tuple[NodeId, ...]
    learners: tuple[NodeId, ...] = ()

    def __post_init__(self) -> None:
        assert self.voters, "a group needs at least one voter"
        assert self.voters == tuple(sorted(set(self.voters))), self.voters
        assert self.learners == tuple(sorted(set(self.learners))), self.learners
        assert not set(self.voters) & set(self.learners), (self.voters, self.learners)
        assert len(self.voters) <= limits.peers_max, self.voters
        assert len(self.voters) + len(self.learners) <= limits.members_max, self

    @staticmethod
    def of(voters: Iterable[NodeId], learners: Iterable[NodeId] = ()) -> Membership:
        return Membership(tuple(sorted(set(voters))), tuple(sorted(set(learners))))

    @property
    def members(self) -> tuple[NodeId, ...]:
        return tuple(sorted(self.voters + self.learners))

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def voter_changes(self, other: Membership) -> int:
        """How many voters differ (added plus removed) between this membership and `other`."""
        return len(set(self.voters) ^ set(other.voters))

    def encode(self) -> bytes:
        out = bytearray(
            _MEMBERSHIP_HEAD.pack(
                MEMBERSHIP_MAGIC, MEMBERSHIP_VERSION, len(self.voters), len(self.learners)
            )
        )
        for node in self.voters + self.learners:
            name = node.encode()
            assert 0 < len(name) <= MEMBER_NAME_BYTES_MAX, node
            out.append(len(name))
            out += name
        return bytes(out)

    @staticmethod
    def decode(payload: bytes | memoryview) -> Membership | None:
        """The membership a payload holds, or None when it is not a membership entry.
        A payload that starts with the magic but does not parse is a bug: it asserts."""
        if not is_membership(payload):
            return None
        _, version, voters, learners = _MEMBERSHIP_HEAD.unpack_from(payload)
        assert version == MEMBERSHIP_VERSION, version
        position = _MEMBERSHIP_HEAD.size
        names: list[NodeId] = []
        for _ in range(voters + learners):
            length = payload[position]
            names.append(NodeId(bytes(payload[position + 1 : position + 1 + length]).decode()))
            position += 1 + length
        assert position == len(payload), (position, len(payload))
        return Membership(tuple(names[:voters]), tuple(names[voters:]))

    def describe(self) -> str:
        text = ",".join(self.voters)
        return text + (f" learners {','.join(self.learners)}" if self.learners else "")


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be on disk (synced) before any message produced with it is sent.

    `membership` is the group's membership as of `commit` (the last membership entry at or
    before it), so a restart that takes the commit point as its snapshot knows the members
    there; None: never recorded (a replica from before ADR 0022, or a new one)."""

    term: Term = TERM_ZERO
    vote: NodeId | None = None
    commit: int = 0
    membership: Membership | None = field(default=None, compare=False)
    """Not compared: it only changes with `commit`."""


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """The log prefix a snapshot covers: everything up to `index`, whose entry had `term`;
    `membership` is the group's membership there when known (a leader's SnapshotNeeded always
    carries it, so a replica restored from a snapshot knows who its peers are)."""

    index: int = 0
    term: Term = TERM_ZERO
    membership: Membership | None = field(default=None, compare=False)


HARD_STATE_EMPTY = HardState()
SNAPSHOT_EMPTY = SnapshotMeta()


@dataclass(frozen=True, slots=True)
class VoteRequest:
    """Campaign for `term`. With `pre_vote` the sender has not incremented its own term yet."""

    term: Term
    source: NodeId
    target: NodeId
    last_index: int
    last_term: Term
    pre_vote: bool
    transfer: bool = False
    """Sent because the leader asked for it (TimeoutNow): voters grant it even while they
    heard from that leader within the election timeout (the check-quorum lease)."""


@dataclass(frozen=True, slots=True)
class VoteResponse:
    term: Term
    source: NodeId
    target: NodeId
    granted: bool
    pre_vote: bool


@dataclass(frozen=True, slots=True)
class Append:
    """Entries following (prev_index, prev_term); may be empty (a probe or a commit update).

    `quiet`: an empty commit update to a follower in REPLICATE state; accepted, it is not
    answered (ADR 0042): the leader learns nothing from the answer that the follower's acks of
    the entries and its heartbeat answers do not tell it. A rejection is still answered.

    `commit_with_you`: an index of the leader's term that a quorum of voters holds on disk if
    the target (a voter) is counted as holding it: the target commits up to it, within what
    this Append matched, as soon as its own log is persisted that far, without waiting for the
    leader to hear its ack (ADR 0050). 0: nothing beyond `commit`."""

    term: Term
    source: NodeId
    target: NodeId
    prev_index: int
    prev_term: Term
    entries: tuple[Entry, ...]
    commit: int
    quiet: bool = False
    commit_with_you: int = 0


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """Accepted: the follower has persisted its log up to `index` matching the leader.

    Rejected: `index` is the rejected prev_index; `hint_index`/`hint_term` is the follower's best
    guess of the last entry that may match (fast backtracking, etcd's RejectHint/LogTerm).
    """

    term: Term
    source: NodeId
    target: NodeId
    index: int
    rejected: bool = False
    hint_index: int = 0
    hint_term: Term = TERM_ZERO
    lost: bool = False
    """Rejected because the follower's log is shorter than the commit the leader sent it
    (its data directory was wiped): the leader forgets what it knew matched and probes it from
    scratch. `hint_index`/`hint_term` are the follower's last entry."""
    readers: bool = False
    """Accepted, from a follower with readers waiting for commits (`Raft.readers`): the leader
    sends it commit updates of their own (ADR 0044)."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    term: Term
    source: NodeId
    target: NodeId
    commit: int
    quiesce: bool = False
    """The leader goes quiet after this one (ADR 0026): stop the election timer."""
    round: int = 0
    """The leader's latest leadership check (`Raft.confirm_leadership`; 0: none yet), echoed
    in the response: an answer carrying round r was sent after that check began."""


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    term: Term
    source: NodeId
    target: NodeId
    round: int = 0
    """The round of the Heartbeat this answers."""


@dataclass(frozen=True, slots=True)
class SnapshotNeeded:
    """The leader has compacted entries the follower needs: the follower's shell must fetch the
    partition's segments up to `snapshot.index` from `source` and then call `Raft.restore`."""

    term: Term
    source: NodeId
    target: NodeId
    snapshot: SnapshotMeta


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: the leader has brought `target` up to date and asks it to campaign
    now, without a pre-vote (etcd's MsgTimeoutNow)."""

    term: Term
    source: NodeId
    target: NodeId


Message = (
    VoteRequest
    | VoteResponse
    | Append
    | AppendResponse
    | Heartbeat
    | HeartbeatResponse
    | SnapshotNeeded
    | TimeoutNow
)


class RefusalReason(Enum):
    NOT_LEADER = "not-leader"
    EMPTY = "empty"  # empty payloads are reserved for barrier entries
    TOO_LARGE = "too-large"  # payload above limits.entry_bytes_max
    BACKPRESSURE = "backpressure"  # unapplied bytes at limits.log_unapplied_bytes_max
    TRANSFERRING = "transferring"  # leadership is being handed to another voter
    MEMBERSHIP_PENDING = "membership-pending"  # an earlier membership change is not committed
    MEMBERSHIP_INVALID = "membership-invalid"  # not a single-voter change, or drops the leader


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a proposal was not appended; `leader` is where to go when known."""

    reason: RefusalReason
    leader: NodeId | None = None

    def error(self) -> BrokerError:
        """The failure to report to whoever proposed (the gateway maps it to a condition)."""
        match self.reason:
            case RefusalReason.NOT_LEADER:
                return NotLeader(
                    "this replica does not lead the partition", leader_node=self.leader
                )
            case RefusalReason.EMPTY:
                return InvalidArgument("an entry must not be empty")
            case RefusalReason.TOO_LARGE:
                return MessageSizeExceeded(
                    f"an entry may hold at most {limits.entry_bytes_max} bytes"
                )
            case RefusalReason.BACKPRESSURE:
                return ResourceLimitExceeded(
                    "the partition has too many bytes waiting to commit; retry shortly"
                )
            case RefusalReason.TRANSFERRING:
                return Unavailable("the partition's leadership is moving; retry shortly")
            case RefusalReason.MEMBERSHIP_PENDING:
                return Unavailable(
                    "an earlier replica-set change of this partition is not committed yet"
                )
            case RefusalReason.MEMBERSHIP_INVALID:
                return InvalidArgument(
                    "a replica-set change may add or remove one voter at a time and must keep "
                    "the leader a voter"
                )


@dataclass(frozen=True, slots=True)
class Proposed:
    """The proposal was appended at `index` in `term`; it is acknowledged once an applied entry
    at that index has that term."""

    index: int
    term: Term


@dataclass(frozen=True, slots=True)
class LeaderChange:
    """The known leader changed; `epoch` is the term it was elected in (0 when unknown)."""

    leader: NodeId | None
    epoch: LeaderEpoch


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """For the follower's shell: fetch data up to `snapshot.index` from `leader`, then restore."""

    leader: NodeId
    snapshot: SnapshotMeta


@dataclass(frozen=True, slots=True)
class Ready:
    """Work for the shell, to be done in this order, then handed back with `Raft.advance`:

    1. write `snapshot` (a restored prefix marker), `entries` (write from entries[0].index,
       discarding any later entries on disk) and `hard_state` (page cache);
    2. send `messages_before_sync()` (a leader's Appends, Heartbeats and SnapshotNeeded: they
       acknowledge nothing) and apply `committed` entries in order (committed means a quorum
       has them on disk already, so neither waits for this replica's sync);
    3. sync if `must_sync`;
    4. send `messages_after_sync()` (acks, votes, anything after a term or vote change: they
       may promise what steps 1 and 3 made durable); report `leader_change`; start
       `snapshot_request`.

    A shell may also run step 3 before step 2 (the order the rule is written against).
    """

    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: SnapshotMeta | None = None
    messages: tuple[Message, ...] = ()
    committed: tuple[Entry, ...] = ()
    leader_change: LeaderChange | None = None
    snapshot_request: SnapshotRequest | None = None
    must_sync: bool = False
    hard_state_sync: bool = False
    """The term or the vote changed: the hard state itself must be synced (it always is when
    `must_sync` is set for this reason), and no message of this Ready may leave before."""
    serial: int = field(default=0, compare=False)

    def messages_before_sync(self) -> tuple[Message, ...]:
        """The messages that may leave once the Ready is written, before its sync: all of them
        when there is nothing to sync; otherwise a leader's Append, Heartbeat and
        SnapshotNeeded, unless the term or vote changed. None of those acknowledges or
        votes: the leader counts its own *persisted* index, never its written one, so a
        follower may hold an entry before the leader's disk does (Raft thesis §10.2.1)."""
        if not self.must_sync:
            return self.messages
        if self.hard_state_sync:
            return ()
        return tuple(m for m in self.messages if isinstance(m, LEADER_OUTPUT))

    def messages_after_sync(self) -> tuple[Message, ...]:
        """The rest of `messages`, in order: acknowledgements (AppendResponse,
        HeartbeatResponse), votes (VoteRequest, VoteResponse) and every message of a Ready
        that changes the term or the vote. They leave only once the sync is done."""
        if not self.must_sync:
            return ()
        if self.hard_state_sync:
            return self.messages
        return tuple(m for m in self.messages if not isinstance(m, LEADER_OUTPUT))

    def is_empty(self) -> bool:
        return (
            self.hard_state is None
            and not self.entries
            and self.snapshot is None
            and not self.messages
            and not self.committed
            and self.leader_change is None
            and self.snapshot_request is None
        )


def describe(message: Message) -> str:
    """A stable one-line rendering for traces and scenario output."""
    head = f"{message.source}->{message.target} {type(message).__name__} t{message.term}"
    match message:
        case VoteRequest():
            kind = "pre" if message.pre_vote else "vote"
            kind += " transfer" if message.transfer else ""
            return f"{head} {kind} last={message.last_term}/{message.last_index}"
        case VoteResponse():
            kind = "pre" if message.pre_vote else "vote"
            return f"{head} {kind} {'granted' if message.granted else 'rejected'}"
        case Append():
            entries = ",".join(e.describe() for e in message.entries)
            return (
                f"{head} prev={message.prev_term}/{message.prev_index} [{entries}]"
                f" commit={message.commit}"
            )
        case AppendResponse():
            if message.rejected:
                return (
                    f"{head} reject {message.index} hint={message.hint_term}/{message.hint_index}"
                    + (" lost" if message.lost else "")
                )
            return f"{head} ok {message.index}" + (" readers" if message.readers else "")
        case Heartbeat():
            return f"{head} commit={message.commit}" + (
                f" round={message.round}" if message.round else ""
            )
        case HeartbeatResponse():
            return head + (f" round={message.round}" if message.round else "")
        case SnapshotNeeded():
            return f"{head} snapshot={message.snapshot.term}/{message.snapshot.index}"
        case TimeoutNow():
            return head


LEADER_OUTPUT = (Append, Heartbeat, SnapshotNeeded, TimeoutNow)
"""Messages only a leader sends, none of which promises anything about the sender's disk."""
