"""The pysyncobj adapter: the only module that imports pysyncobj.

One `SyncObj` whose single `@replicated` method takes our encoded command bytes, applies them to a
`MetadataState` and returns the `Result` value. Configured after research/pysyncobj.md:

- `password` always (peers' messages are unpickled by pysyncobj; Fernet authenticates them first,
  §6.10), `bindAddress` always (otherwise it binds 0.0.0.0).
- `journalFile` and `fullDumpFile` always, both in the data directory: a journal without a dump
  silently loses the state after compaction and a full restart (§2).
- The full dump is written by our serializer hook in our codec (spate.cluster.metadata.codec),
  never pickled; setting a serializer also stops pysyncobj from forking to write it (§3).
- `appendEntriesUseBatch=False` for sub-millisecond commits (§1.4), election timeouts 1-2 s and
  reconnects every 1 s (§1.2, §6.11).
- pysyncobj never fsyncs its journal (§2). With `sync_journal` (the default) the leader fsyncs
  the journal file in the apply hook, before pysyncobj runs the submitter's callback, so an
  acknowledged command is on the leader's disk, not only in page caches. Followers do not (their
  acknowledgements stay page-cache only); what that does and does not survive: ADR 0006.
- `dynamicMembershipChange=True` (ADR 0025): voters are added and removed one at a time with
  pysyncobj's membership entries, which take effect when appended (leader and followers) and are
  undone on truncation. pysyncobj keeps the membership only in memory and in its dump, and does
  not re-read membership entries from its journal on restart, so this adapter hooks every
  change and writes the voter set to `metadata.voters` (fsynced, replaced atomically); the
  service starts from that file rather than from its configured peers.

- The follower's append (`_MetadataSyncObj._SyncObj__onMessageReceived`, ADR 0025 addendum):
  pysyncobj's follower deletes its whole tail after `prevLogIdx` and appends what the message
  carries, without comparing; a stale re-send carrying fewer entries than that tail left the
  log shorter than what the replica had applied and acknowledged (benchmarks/RESULTS.md §29),
  and such a replica could win an election without committed entries. The subclass plans each
  append the Raft way first (`append_plan`: keep what matches, cut only from the first
  conflict, never at or below the committed index) and hands pysyncobj the message rewritten
  to that plan. It overrides pysyncobj's private, name-mangled methods, so the module refuses
  to load with any pysyncobj but the one it was read against (`PYSYNCOBJ_VERSION`).

- Snapshot pieces (`_MetadataSyncObj._snapshot_piece`): a leader sends a follower whose next
  entry it has compacted away its full dump, in pieces (at least two: the data, then an empty
  last piece). pysyncobj's follower takes every piece's commit index as its own, capped only
  by the end of its log, which the piece proves nothing about: a deposed leader's uncommitted
  tail was committed and applied before the snapshot replaced it (chaos ci seed 49255: a
  paused metadata leader resumed, appended a read's barrier, was sent a snapshot and answered
  the read without a delete acknowledged meanwhile). The subclass commits nothing on a piece;
  once the snapshot is installed, commands waiting on an index it covers (pysyncobj never
  answers them) fail with UNKNOWN_OUTCOME, and the service resubmits them (request ids make
  that safe).

- Reset floor (`_MetadataSyncObj._defer`): a leader pipelines a follower's tail in several
  messages and takes each "reset: send from N" answer as it comes. pysyncobj's follower
  answers a term conflict at prevLogIdx with N = prevLogIdx but a prevLogIdx past its end with
  N = end + 1, so the later messages' answers undid the conflict's every round and a follower
  whose tail conflicted never caught up (found by the `pysyncobj` simulator model with small
  append batches; in production, a tail longer than one 64 KiB message). After a conflict at
  N the follower answers no reset above N until it accepts an append from that leader.

- Stuck connections (`_close_stuck_connections`): pysyncobj closes a connection that has read
  nothing for its `connectionTimeout` only when that socket has an event. A connection whose
  handshake bytes were lost (accepted by a middlebox that dropped them: a Toxiproxy `timeout`
  toxic, a load balancer) or that holds a partial message whose rest was lost never has one, and
  pysyncobj neither sends on it nor dials again: the chaos run of seed 94520 left all three
  voters "reaching 1 of 3" for good. Each tick, a connection not yet identified as a connected
  voter, or holding a partial message with nothing read, for `limits.connection_stuck_s`, is
  closed; pysyncobj then dials again.

Threads: pysyncobj runs every apply, the serializer, the deserializer and submit callbacks on its
own tick thread. This adapter only calls the `on_change` and `callback` functions it is given on
that thread; the service hands them to asyncio with `loop.call_soon_threadsafe`. `view()` and
`status()` may be called from any thread (they read an immutable view and plain attributes).
The SyncObj must be created on a thread that outlives it: pysyncobj stops ticking when the thread
that created it exits.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj import pickle as syncobj_pickle
from pysyncobj.journal import MetaStorer
from pysyncobj.node import TCPNode
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.version import VERSION as _INSTALLED_PYSYNCOBJ
from spate.cluster.metadata import limits
from spate.cluster.metadata.append_plan import Append, Defer, Keep, Refuse, plan_append
from spate.cluster.metadata.codec import (
    CodecError,
    LogEntry,
    RaftCheckpoint,
    decode_command,
    decode_dump,
    encode_dump,
)
from spate.cluster.metadata.state import MetadataState, MetadataView, Rejected, Result
from spate.core.errors import InvalidArgument, StorageFailure, Unavailable

log = logging.getLogger(__name__)

PYSYNCOBJ_VERSION = "0.3.17"
"""The pysyncobj whose private code `_MetadataSyncObj` overrides and reads (name-mangled
`SyncObj.__onMessageReceived`, `__sendNextNodeIdx`, `__doChangeCluster`,
`__updateClusterConfiguration`; attributes `__raftLog`, `__raftCommitIndex`,
`__raftLastApplied`, `__raftCurrentTerm`, `__recvTransmission`, `__transport`,
`__commandsWaitingCommit`). pyproject.toml
pins the same version; an upgrade must re-read those and change both."""
if _INSTALLED_PYSYNCOBJ != PYSYNCOBJ_VERSION:
    raise ImportError(
        f"spate.cluster.metadata.raft overrides pysyncobj {PYSYNCOBJ_VERSION}'s private "
        f"methods, but pysyncobj {_INSTALLED_PYSYNCOBJ} is installed: install "
        f"pysyncobj=={PYSYNCOBJ_VERSION} (or re-check the overrides in raft.py against the new "
        "version and move the pin)"
    )

JOURNAL_FILE = "metadata.journal"
"""pysyncobj's log (its own record format; entries are our command bytes in its envelope)."""
DUMP_FILE = "metadata.dump"
"""The full dump in our codec's layout (magic b"SPMD")."""
VOTERS_FILE = "metadata.voters"
"""The voter set as this replica last applied it, JSON `{"voters": ["host:port", ...]}`."""


def read_voters(data_dir: Path) -> tuple[str, ...] | None:
    """The voter set recorded in `data_dir` (None: never recorded; a fresh or older node)."""
    path = Path(data_dir) / VOTERS_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise StorageFailure(f"cannot read the metadata voter set {path}: {error}") from error
    voters = document.get("voters") if isinstance(document, dict) else None
    if not isinstance(voters, list) or not voters or not all(isinstance(v, str) for v in voters):
        raise StorageFailure(f'{path}: expected {{"voters": ["host:port", ...]}}')
    return tuple(sorted(voters))


def write_voters(data_dir: Path, voters: tuple[str, ...]) -> None:
    """Record the voter set: written to a temporary file, fsynced, renamed, directory synced."""
    path = Path(data_dir) / VOTERS_FILE
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as out:
        out.write(json.dumps({"voters": sorted(voters)}) + "\n")
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SubmitFailure(Enum):
    """Why pysyncobj did not apply a submitted command (it may still be applied later)."""

    QUEUE_FULL = FAIL_REASON.QUEUE_FULL
    MISSING_LEADER = FAIL_REASON.MISSING_LEADER
    DISCARDED = FAIL_REASON.DISCARDED
    NOT_LEADER = FAIL_REASON.NOT_LEADER
    LEADER_CHANGED = FAIL_REASON.LEADER_CHANGED
    REQUEST_DENIED = FAIL_REASON.REQUEST_DENIED
    UNKNOWN_OUTCOME = FAIL_REASON.UNKNOWN_OUTCOME


SubmitCallback = Callable[[Result | None, SubmitFailure | None], None]


@dataclass(frozen=True, slots=True)
class RaftConfig:
    self_address: str  # host:port this voter listens on and peers dial
    peer_addresses: tuple[str, ...]  # host:port of the other voters (empty: single voter)
    data_dir: Path
    password: str = field(repr=False)
    bind_address: str | None = None  # defaults to self_address
    compaction_min_entries: int = limits.compaction_min_entries
    compaction_min_time_s: float = limits.compaction_min_time_s
    sync_journal: bool = True  # the leader fsyncs the journal before acknowledging (ADR 0006)
    voter: bool = True
    """False: a non-voting replica (pysyncobj's read-only node, `selfNode=None`) that dials
    the voters in `peer_addresses`, receives the whole log and submits commands through
    them; it binds nothing (ADR 0022)."""

    @property
    def voters(self) -> tuple[str, ...]:
        if not self.voter:
            return tuple(sorted(self.peer_addresses))
        return tuple(sorted((self.self_address, *self.peer_addresses)))


@dataclass(frozen=True, slots=True)
class RaftStatus:
    self_address: str
    voters: tuple[str, ...]
    leader: str | None  # last known leader's address; None during an election
    is_leader: bool
    ready: bool  # caught up with the leader's commit index at least once since start
    has_quorum: bool  # this replica is connected to a majority of voters (itself included)
    connected_peers: tuple[str, ...]
    term: int
    commit_index: int
    last_applied: int


class MetadataRaft:
    """One metadata voter. `start()` binds and starts pysyncobj's tick thread; `stop()` joins it."""

    def __init__(self, config: RaftConfig, on_change: Callable[[MetadataView], None]) -> None:
        if not config.password:
            raise InvalidArgument("the metadata service needs a password shared by its voters")
        assert config.self_address not in config.peer_addresses, config
        self.config = config
        self.state = MetadataState()
        self.failure: StorageFailure | None = None
        """Set when the full dump could not be read; the replica must not serve then."""
        self._on_change = on_change
        self._obj: _MetadataSyncObj | None = None
        self._dump_expected = False
        self._dump_read = False
        self._dumps_loaded = 0
        """Full dumps restored (ours at start, or a leader's snapshot): `_snapshot_piece`."""
        self._voters: tuple[str, ...] = config.voters
        self._last_status: RaftStatus | None = None
        self._on_tick: collections.deque[Callable[[], None]] = collections.deque()
        self._next_connection_check = 0.0
        self._stuck_since: dict[int, float] = {}
        """id(connection) -> when it was first seen stuck (tick thread)."""
        """Calls to make on the tick thread (pysyncobj's state is not thread-safe)."""

    @property
    def journal_path(self) -> Path:
        return self.config.data_dir / JOURNAL_FILE

    @property
    def dump_path(self) -> Path:
        return self.config.data_dir / DUMP_FILE

    def start(self) -> None:
        config = self.config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        bind = config.bind_address or config.self_address
        if config.voter:
            _check_bindable(bind)
        self._dump_expected = self.dump_path.exists()
        if not config.voter:
            _forget_term(self.journal_path)
        conf = SyncObjConf(
            password=config.password,
            bindAddress=bind if config.voter else None,
            journalFile=str(self.journal_path),
            fullDumpFile=str(self.dump_path),
            serializer=self._write_dump,
            deserializer=self._read_dump,
            appendEntriesUseBatch=False,
            raftMinTimeout=limits.raft_min_timeout_s,
            raftMaxTimeout=limits.raft_max_timeout_s,
            connectionRetryTime=limits.connection_retry_s,
            logCompactionMinEntries=config.compaction_min_entries,
            logCompactionMinTime=config.compaction_min_time_s,
            dynamicMembershipChange=True,
        )
        self._obj = _MetadataSyncObj(
            self,
            config.self_address if config.voter else None,
            list(config.peer_addresses),
            conf,
        )
        self._obj.addOnTickCallback(self._run_on_tick)

    def stop(self) -> None:
        """Blocks until the tick thread has flushed the journal and exited. `status()` answers
        the last status afterwards."""
        if self._obj is not None:
            self._last_status = self.status()
            self._obj.destroy_synchronous()
            self._obj = None

    def view(self) -> MetadataView:
        return self.state.view

    def dump_loaded(self) -> bool:
        """False until the full dump that existed at start has been read (first tick)."""
        return self._dump_read or not self._dump_expected or self.failure is not None

    def submit(self, command: bytes, callback: SubmitCallback) -> None:
        """Queue encoded command bytes; `callback` runs on the tick thread once they are applied
        here (result, None) or have failed (None, reason). It may never run if no leader appears."""
        assert self._obj is not None, "submit before start"
        assert len(command) <= limits.command_bytes_max, len(command)

        def done(result: Result | None, reason: int) -> None:
            if reason == FAIL_REASON.SUCCESS:
                callback(result, None)
            else:
                callback(None, SubmitFailure(reason))

        self._obj.apply_command(command, callback=done)

    def change_voters(self, action: str, address: str, callback: SubmitCallback) -> None:
        """Add (`action` "add") or remove ("remove") one voter; `callback(None, None)` once the
        change is applied here, or (None, reason): REQUEST_DENIED while another change is not
        committed, before the leader's first entry is, for a voter already in (or not in) the
        set, or to remove the leader itself. Submitted through the leader, like a command."""
        assert self._obj is not None, "change before start"
        assert action in ("add", "remove"), action

        def done(_result: object, reason: int) -> None:
            callback(None, None if reason == FAIL_REASON.SUCCESS else SubmitFailure(reason))

        if action == "add":
            self._obj.addNodeToCluster(address, callback=done)
        else:
            self._obj.removeNodeFromCluster(address, callback=done)

    def transfer_leadership(self, callback: SubmitCallback) -> None:
        """On the leader: hand leadership to the most caught-up connected voter (Raft
        TimeoutNow). `callback(None, None)` when asked (not done: watch `status().leader`)."""
        obj = self._obj
        assert obj is not None, "transfer before start"

        def done(_result: object, reason: int) -> None:
            callback(None, None if reason == FAIL_REASON.SUCCESS else SubmitFailure(reason))

        self._on_tick.append(lambda: obj.transferLeadership(None, callback=done))

    def _run_on_tick(self) -> None:
        while self._on_tick:
            self._on_tick.popleft()()
        now = time.monotonic()
        if now >= self._next_connection_check:
            self._next_connection_check = now + limits.connection_stuck_s / 5
            assert self._obj is not None
            self._close_stuck_connections(self._obj, now)

    def _close_stuck_connections(self, obj: SyncObj, now: float) -> None:
        """Tick thread (module docstring, "Stuck connections")."""
        transport = obj._SyncObj__transport
        seen: dict[int, float] = {}
        candidates = list(transport._connections.items())
        candidates += [(None, conn) for conn in list(transport._unknownConnections)]
        for node, conn in candidates:
            if conn.state == CONNECTION_STATE.DISCONNECTED:
                continue
            partial = bool(conn._TcpConnection__readBuffer)
            silent_s = now - conn._TcpConnection__lastReadTime
            waiting = node is None or (isinstance(node, TCPNode) and not obj.isNodeConnected(node))
            if not waiting and not (partial and silent_s > limits.connection_stuck_s):
                continue
            since = self._stuck_since.get(id(conn), now)
            seen[id(conn)] = since
            if now - since >= limits.connection_stuck_s or partial:
                log.warning(
                    "metadata connection %s stuck for %.1f s (%s): closing it to dial again",
                    node if node is not None else "(unidentified)",
                    max(now - since, silent_s),
                    "part of a message, nothing more read" if partial else "no handshake",
                )
                conn.disconnect()
                transport._unknownConnections.discard(conn)
                seen.pop(id(conn), None)
        self._stuck_since = seen

    def status(self) -> RaftStatus:
        obj = self._obj
        if obj is None:
            assert self._last_status is not None, "status before start"
            return self._last_status
        leader = obj._getLeader()
        return RaftStatus(
            self_address=self.config.self_address,
            voters=self._voters,
            leader=None if leader is None else str(leader.id),
            is_leader=bool(obj._isLeader()),
            ready=bool(obj.isReady()),
            has_quorum=bool(obj.hasQuorum),
            connected_peers=tuple(sorted(n.id for n in obj.otherNodes if obj.isNodeConnected(n))),
            term=int(obj.raftCurrentTerm),
            commit_index=int(obj.raftCommitIndex),
            last_applied=int(obj.raftLastApplied),
        )

    # Tick-thread side ---------------------------------------------------------------------------

    def _membership_changed(self, obj: SyncObj) -> None:
        """After pysyncobj changed its voter set (an appended or truncated membership entry, a
        dump loaded): remember it, and record it on disk before pysyncobj goes on."""
        others = {str(node.id) for node in obj.otherNodes}
        if self.config.voter:
            others.add(self.config.self_address)
        voters = tuple(sorted(others))
        if voters == self._voters:
            return
        log.info("metadata voters: %s (were %s)", ", ".join(voters), ", ".join(self._voters))
        self._voters = voters
        try:
            write_voters(self.config.data_dir, voters)
        except OSError as error:  # never raise on the tick thread: stop serving instead
            self.failure = StorageFailure(f"cannot record the metadata voter set: {error}")
            log.error("%s", self.failure.message)

    def _apply(self, data: bytes) -> Result:
        try:
            command = decode_command(data)
        except CodecError as error:  # deterministic: every replica rejects the same bytes
            return Rejected.of(error)
        before = self.state.view.version
        result = self.state.apply(command)
        obj = self._obj
        if self.config.sync_journal and obj is not None and obj._isLeader():
            self._sync_journal()
        if self.state.view.version != before:  # heartbeats refresh the view without a change
            self._on_change(self.state.view)
        return result

    def _sync_journal(self) -> None:
        """fsync the journal's inode (pysyncobj writes it through an mmap, which fsync covers)."""
        try:
            fd = os.open(self.journal_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as error:
            # Never raise in apply (pysyncobj would retry the entry forever): stop serving instead.
            self.failure = StorageFailure(
                f"cannot sync the metadata journal {self.journal_path}: {error}"
            )
            log.error("%s", self.failure.message)

    def _write_dump(self, path: str, raft_data: tuple[object, object, object]) -> None:
        """pysyncobj serializer hook; raft_data = (last applied entry, the one before, voters)."""
        last, previous, cluster = raft_data
        checkpoint = RaftCheckpoint(
            entries=(_log_entry(previous), _log_entry(last)),
            voters=tuple(
                sorted(str(node.id) for node in cluster if node is not None)  # type: ignore[attr-defined]
            ),
        )
        data = encode_dump(checkpoint, self.state.snapshot())
        with open(path, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # pysyncobj renames it next, without syncing (§2)

    def _read_dump(self, path: str) -> tuple[object, object, object]:
        """pysyncobj's deserializer hook: restore our state, hand back its checkpoint."""
        try:
            checkpoint, snapshot = decode_dump(Path(path).read_bytes())
        except (OSError, CodecError) as error:
            self.failure = StorageFailure(f"cannot read the metadata dump {path}: {error}")
            log.error("%s", self.failure.message)
            raise
        self.state.restore(snapshot)
        self._dumps_loaded += 1
        installed = self._dump_read or not self._dump_expected  # else: our own, at start
        self._dump_read = True
        self._on_change(self.state.view)
        previous, last = checkpoint.entries
        # pysyncobj resets its voters to the dump's. Our own dump is older than the membership
        # entries after it in the journal (which pysyncobj does not re-read), so at start the
        # voters are those recorded last (`metadata.voters`, or the configuration); a dump the
        # leader sent carries the leader's voters, and the entries after it follow.
        voters = {TCPNode(a) for a in (checkpoint.voters if installed else self._voters)}
        return (
            (last.command, last.index, last.term),
            (previous.command, previous.index, previous.term),
            voters,
        )


class _MetadataSyncObj(SyncObj):  # type: ignore[misc]
    # pysyncobj's private attributes this class writes as well as reads (SyncObj.__init__ sets
    # them; PYSYNCOBJ_VERSION lists every private name used here).
    _SyncObj__raftCommitIndex: int
    _SyncObj__recvTransmission: bytes | str

    def __init__(
        self,
        adapter: MetadataRaft,
        self_address: str | None,
        peers: list[str],
        conf: SyncObjConf,
        transport: object | None = None,
    ) -> None:
        """`transport`: pysyncobj's TCP transport when None (tests pass an in-memory one)."""
        # Set before SyncObj.__init__: its tick thread may apply journal entries right away (§6.12).
        self._adapter = adapter
        self._acknowledge_max: int | None = None
        """While an append is handled: the highest index the follower may acknowledge."""
        self._reset_floor: tuple[tuple[object, int], int] | None = None
        """((leader, term), N): this leader's message conflicted with the log at N; no reset
        answer above N until an append is accepted (`_defer`)."""
        self._reset_cap: int | None = None
        """While `_defer` hands a message to pysyncobj: the highest reset answer allowed."""
        self._incoming: bytearray | None = None
        """The snapshot pieces received so far (pysyncobj keeps its own copy in a file)."""
        super().__init__(self_address, peers, conf, transport=transport)

    # The follower's append, the Raft way (module docstring; append_plan). pysyncobj calls both
    # methods through `self`, so these overrides replace its own; the tick thread runs them.
    def _SyncObj__onMessageReceived(self, node: object, message: dict[str, Any]) -> None:
        if message.get("type") == "append_entries" and "prevLogIdx" not in message:
            self._snapshot_piece(node, message)
            return
        if (
            message.get("type") != "append_entries"
            or message.get("transmission") in ("start", "process")
            or int(message["term"]) < self._SyncObj__raftCurrentTerm
        ):
            super()._SyncObj__onMessageReceived(node, message)
            return
        if message.get("transmission") == "finish":  # one large entry, sent in pieces
            whole = self._SyncObj__recvTransmission + message["data"]
            self._SyncObj__recvTransmission = ""
            message = {
                k: v for k, v in message.items() if k not in ("transmission", "data", "entries")
            }
            message["entries"] = [syncobj_pickle.loads(whole)]
        raft_log = self._SyncObj__raftLog
        first, last = raft_log[0][1], raft_log[-1][1]

        def term_at(index: int) -> int | None:
            return int(raft_log[index - first][2]) if first <= index <= last else None

        entries = list(message.get("entries", []))
        committed = max(self._SyncObj__raftCommitIndex, self._SyncObj__raftLastApplied)
        plan = plan_append(
            term_at,
            int(message["prevLogIdx"]),
            int(message["prevLogTerm"]),
            [(int(e[1]), int(e[2])) for e in entries],
            committed,
        )
        match plan:
            case Defer():
                self._defer(node, message, term_at)
                return
            case Refuse(index, local_term, leader_term):
                # Raft's safety says this cannot happen: a committed entry is in every later
                # leader's log. Cut nothing (pysyncobj would) and stop serving; pysyncobj
                # still hears its leader (no election) and answers "no match at `index`".
                if self._adapter.failure is None:
                    failure = StorageFailure(
                        f"the metadata leader {getattr(node, 'id', node)} has term "
                        f"{leader_term} at index {index}, committed here with term "
                        f"{local_term}: the replicas have diverged; this replica stops "
                        "serving (replace its metadata directory from a healthy voter)"
                    )
                    self._adapter.failure = failure
                    log.critical("%s", failure.message)
                message = {**message, "prevLogIdx": index, "prevLogTerm": leader_term}
                message["entries"] = []
                super()._SyncObj__onMessageReceived(node, message)
                return
            case Append(prev_index, prev_term, start, matched):
                message = {**message, "prevLogIdx": prev_index, "prevLogTerm": prev_term}
                message["entries"] = entries[start:]
            case Keep(matched):
                # Pointing pysyncobj at our own last entry makes it delete and add nothing.
                message = {**message, "prevLogIdx": last, "prevLogTerm": term_at(last)}
                message["entries"] = []
        commit_before = self._SyncObj__raftCommitIndex
        self._acknowledge_max = matched
        self._reset_floor = None  # the log matches the leader's up to `matched` now
        try:
            super()._SyncObj__onMessageReceived(node, message)
        finally:
            self._acknowledge_max = None
        # it took the leader's commit index, capped only by our end
        self._restore_commit(max(commit_before, min(int(message["commit_index"]), matched)))

    def _defer(
        self, node: object, message: dict[str, Any], term_at: Callable[[int], int | None]
    ) -> None:
        """The log has no entry (prevLogIdx, prevLogTerm): pysyncobj answers "reset: send from
        N", N = prevLogIdx on a term conflict, or the log's end + 1 when prevLogIdx lies past
        it. A leader pipelines several messages to a follower (its tail in
        appendEntriesBatchSizeBytes pieces) and takes each answer as it comes, so the second
        message's "from my end + 1" undid the first's "from prevLogIdx" every round: a
        follower whose tail conflicted never caught up (the `pysyncobj` simulator model, with
        small append batches). After a conflict at N, this replica answers no reset above N
        until an append is accepted (module docstring, "Reset floor")."""
        key = (getattr(node, "id", node), int(message["term"]))
        if self._reset_floor is not None and self._reset_floor[0] != key:
            self._reset_floor = None
        prev = int(message["prevLogIdx"])
        conflict = term_at(prev) is not None  # present with another term
        self._reset_cap = self._reset_floor[1] if self._reset_floor is not None else None
        try:
            super()._SyncObj__onMessageReceived(node, message)
        finally:
            self._reset_cap = None
        if conflict:
            floor = prev if self._reset_floor is None else min(prev, self._reset_floor[1])
            self._reset_floor = (key, floor)

    def _snapshot_piece(self, node: object, message: dict[str, Any]) -> None:
        """A piece of a leader's snapshot (module docstring, "Snapshots"). pysyncobj's follower
        (1) takes each piece's commit index as its own, capped only by its log's end, which a
        piece proves nothing about, and (2) installs every complete snapshot, clearing its log,
        even one its log already holds. Here (1) a piece commits nothing, (2) a snapshot whose
        last entry this replica holds (or has committed) is not installed: the replica keeps
        its log, commits as far as the snapshot proves, and acknowledges the snapshot's end.
        After an install, what waited on an index it covers fails (UNKNOWN_OUTCOME: pysyncobj
        would never answer it) and the service resubmits."""
        piece = message.get("serialized")
        current = int(message["term"]) >= self._SyncObj__raftCurrentTerm
        if current and isinstance(piece, tuple) and len(piece) == 3:
            data, first, last = piece
            if first:
                self._incoming = bytearray()
            if self._incoming is not None and isinstance(data, bytes | bytearray):
                self._incoming += data
            if last and self._incoming is not None:
                whole, self._incoming = bytes(self._incoming), None
                end = _snapshot_end(whole)
                if end is not None and self._holds(*end):
                    self._keep_log(node, message, *end)
                    return
        commit_before = self._SyncObj__raftCommitIndex
        loads_before = self._adapter._dumps_loaded
        super()._SyncObj__onMessageReceived(node, message)
        if self._adapter._dumps_loaded == loads_before:
            self._restore_commit(commit_before)
            return
        self._reset_floor = None  # the log is the snapshot's now
        installed = self._SyncObj__raftLastApplied
        waiting = self._SyncObj__commandsWaitingCommit
        for index in sorted(i for i in waiting if i <= installed):
            for _term, callback in waiting.pop(index):
                callback(None, FAIL_REASON.UNKNOWN_OUTCOME)

    def _holds(self, index: int, term: int) -> bool:
        """Whether this replica's log already holds entry (index, term): it has that entry, or
        has committed past it (a committed prefix is every leader's)."""
        raft_log = self._SyncObj__raftLog
        committed = max(self._SyncObj__raftCommitIndex, self._SyncObj__raftLastApplied)
        if index <= committed:
            return True
        first, last = raft_log[0][1], raft_log[-1][1]
        return first <= index <= last and int(raft_log[index - first][2]) == term

    def _keep_log(self, node: object, message: dict[str, Any], index: int, term: int) -> None:
        """A snapshot ending at entry (index, term), which this log holds: pysyncobj's follower
        bookkeeping (term, leader, election deadline) without the install, then commit what
        the snapshot proves and acknowledge its end (Raft's InstallSnapshot, "retain log
        entries following it and reply")."""
        commit_before = self._SyncObj__raftCommitIndex
        super()._SyncObj__onMessageReceived(node, {**message, "serialized": None})
        self._drop_transmission()
        self._set_commit(max(commit_before, min(int(message["commit_index"]), index)))
        log.info(
            "metadata snapshot from %s ends at entry %d (term %d), which this log holds: "
            "kept the log",
            getattr(node, "id", node),
            index,
            term,
        )
        self._reset_floor = None  # the log matches the leader's up to the snapshot's end
        super()._SyncObj__sendNextNodeIdx(node, nextNodeIdx=index + 1, success=True)

    def _drop_transmission(self) -> None:
        """pysyncobj's serializer holds the pieces of a snapshot it was sent in a temporary
        file, open until the last piece; the last piece of a declined snapshot never reaches
        it, so close and remove that file here (else it stays open, on disk, until the next
        snapshot starts)."""
        serializer = self._SyncObj__serializer
        incoming = serializer._Serializer__incomingTransmissionFile
        serializer._Serializer__incomingTransmissionFile = None
        if hasattr(incoming, "close"):
            incoming.close()
        name = serializer._Serializer__fileName
        if name is not None:
            Path(f"{name}.1.tmp").unlink(missing_ok=True)

    def _restore_commit(self, commit: int) -> None:
        """Take back what pysyncobj committed above `commit`."""
        if self._SyncObj__raftCommitIndex > commit:
            self._set_commit(commit)

    def _set_commit(self, commit: int) -> None:
        self._SyncObj__raftCommitIndex = commit
        self._SyncObj__raftLog.setRaftCommitIndex(commit)

    def _SyncObj__sendNextNodeIdx(
        self,
        node: object,
        reset: bool = False,
        nextNodeIdx: int | None = None,
        success: bool = False,
    ) -> None:
        cap = self._acknowledge_max
        if cap is not None and success and nextNodeIdx is not None:
            nextNodeIdx = min(nextNodeIdx, cap + 1)
        floor = self._reset_cap
        if floor is not None and reset and not success:
            end = self._SyncObj__raftLog[-1][1] + 1
            nextNodeIdx = min(end if nextNodeIdx is None else nextNodeIdx, floor)
        super()._SyncObj__sendNextNodeIdx(
            node, reset=reset, nextNodeIdx=nextNodeIdx, success=success
        )

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, data: bytes) -> Result:
        return self._adapter._apply(data)

    # pysyncobj's private (name-mangled) membership hooks: every change of its voter set goes
    # through one of these two, on the tick thread.
    def _SyncObj__doChangeCluster(self, request: object, reverse: bool = False) -> bool:
        changed = bool(super()._SyncObj__doChangeCluster(request, reverse))
        if changed:
            self._adapter._membership_changed(self)
        return changed

    def _SyncObj__updateClusterConfiguration(self, nodes: object) -> None:
        # pysyncobj calls this on every dump it loads (its own at start, each snapshot a
        # leader installs) and replaces its node objects and their transport state even when
        # the set is the same. Only a different set is a change: with no voter change ever
        # made, dynamic membership then behaves exactly as with it off.
        assert isinstance(nodes, list), nodes
        wanted = {str(getattr(node, "id", node)) for node in nodes}
        if wanted == {str(node.id) for node in self.otherNodes}:
            return
        log.warning(
            "metadata voters from a loaded dump: %s (this replica had %s)",
            ", ".join(sorted(wanted)),
            ", ".join(sorted(str(node.id) for node in self.otherNodes)),
        )
        super()._SyncObj__updateClusterConfiguration(nodes)
        self._adapter._membership_changed(self)


def _snapshot_end(data: bytes) -> tuple[int, int] | None:
    """The (index, term) of a full dump's last entry; None if it does not decode (pysyncobj
    then fails to load it and logs why)."""
    try:
        checkpoint, _snapshot = decode_dump(data)
    except CodecError:
        return None
    last = checkpoint.entries[1]
    return last.index, last.term


def _log_entry(entry: object) -> LogEntry:
    assert isinstance(entry, tuple) and len(entry) == 3, entry
    command, index, term = entry
    assert isinstance(command, bytes) and isinstance(index, int) and isinstance(term, int), entry
    return LogEntry(command, index, term)


def _forget_term(journal: Path) -> None:
    """A non-voting replica never campaigns and only takes entries from a leader whose term is
    at least its own (pysyncobj ignores lower terms, silently). A former voter may have counted
    its term up in elections the others never saw (cut off by its removal, or down while it was
    removed): start from the last entry's term, which a real leader wrote, instead."""
    meta_path = Path(f"{journal}.meta")
    if not meta_path.exists():
        return
    storer = MetaStorer(str(meta_path))
    meta = storer.getMeta()
    if meta.get("currentTerm") or meta.get("votedForNodeId") is not None:
        meta["currentTerm"] = 0
        meta["votedForNodeId"] = None
        storer.storeMeta(meta)


def _check_bindable(address: str) -> None:
    """Fail with a clear message now rather than have pysyncobj retry the bind forever."""
    host, port = address.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError as error:
            raise Unavailable(
                f"the metadata voter cannot listen on {address}: {error.strerror or error}"
            ) from error
