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

Threads: pysyncobj runs every apply, the serializer, the deserializer and submit callbacks on its
own tick thread. This adapter only calls the `on_change` and `callback` functions it is given on
that thread; the service hands them to asyncio with `loop.call_soon_threadsafe`. `view()` and
`status()` may be called from any thread (they read an immutable view and plain attributes).
The SyncObj must be created on a thread that outlives it: pysyncobj stops ticking when the thread
that created it exits.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.node import TCPNode
from spate.cluster.metadata import limits
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

JOURNAL_FILE = "metadata.journal"
"""pysyncobj's log (its own record format; entries are our command bytes in its envelope)."""
DUMP_FILE = "metadata.dump"
"""The full dump in our codec's layout (magic b"SPMD")."""


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
            dynamicMembershipChange=False,
        )
        self._obj = _MetadataSyncObj(
            self,
            config.self_address if config.voter else None,
            list(config.peer_addresses),
            conf,
        )

    def stop(self) -> None:
        """Blocks until the tick thread has flushed the journal and exited."""
        if self._obj is not None:
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

    def status(self) -> RaftStatus:
        obj = self._obj
        assert obj is not None, "status before start"
        leader = obj._getLeader()
        return RaftStatus(
            self_address=self.config.self_address,
            voters=self.config.voters,
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
            voters=tuple(sorted(str(node.id) for node in cluster)),  # type: ignore[attr-defined]
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
        self._dump_read = True
        self._on_change(self.state.view)
        previous, last = checkpoint.entries
        voters = {TCPNode(address) for address in checkpoint.voters}
        return (
            (last.command, last.index, last.term),
            (previous.command, previous.index, previous.term),
            voters,
        )


class _MetadataSyncObj(SyncObj):  # type: ignore[misc]
    def __init__(
        self, adapter: MetadataRaft, self_address: str | None, peers: list[str], conf: SyncObjConf
    ) -> None:
        # Set before SyncObj.__init__: its tick thread may apply journal entries right away (§6.12).
        self._adapter = adapter
        super().__init__(self_address, peers, conf)

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, data: bytes) -> Result:
        return self._adapter._apply(data)


def _log_entry(entry: object) -> LogEntry:
    assert isinstance(entry, tuple) and len(entry) == 3, entry
    command, index, term = entry
    assert isinstance(command, bytes) and isinstance(index, int) and isinstance(term, int), entry
    return LogEntry(command, index, term)


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
