"""Raft persistence for one partition replica: the log is the PartitionLog, plus a hard-state file.

Directory of one replica (`<data_dir>/partitions/<stream>/<partition>/`):

```
log/           the PartitionLog's segment and index files (one Raft entry = one chunk)
raft.state     the hard state (term, vote, commit), two slots, see below
catchup/       segment files being fetched from the leader (catchup.py); absent otherwise
```

A Raft entry is one chunk: the chunk header's `epoch` is the entry's term and `raft_index` its
index. The leader encodes the chunk when it proposes (spate.node.replication.partition);
followers store the leader's bytes as they are. The barrier entry a new leader appends (an
empty payload in the core) is stored as a barrier chunk (no records) that each replica encodes
itself from (end offset of the previous chunk, its timestamp, term, index): deterministic, since
the logs agree up to it.

`raft.state`: two 64-byte slots at bytes 0 and 64, each written in place with one `pwrite`,
with one `fdatasync` in the batch when the term or vote changed (a commit-only change is not
synced). Every write goes to the slot that does NOT hold the last synced record (the scratch
slot); a sync makes the scratch slot the synced one. So a torn or lost write, synced or not,
can only damage the scratch slot, and the synced record (the term and vote this replica may
have promised in messages) always survives. (Alternating slots on every write, as this file
first did, lets two unsynced commit-only writes overwrite the synced slot; the simulator found
a replica that forgot its vote that way, two leaders in one term: `python -m spate.sim
--model shell --seed 15` before the fix.)

```
 0  4 magic "SPHS" | 4 4 crc32c of bytes 8..64 | 8 8 sequence u64 | 16 8 term u64
24  8 commit u64   | 32 1 vote length u8 | 33 31 vote (UTF-8 node id, zero padded)
```

On open the valid slot with the highest sequence wins. No valid slot (and no file) means a new
replica, which matters for voting (ADR 0005).

Since ADR 0022 the hard state also holds the group's membership as of its commit index, so a
restart that takes the commit point as its snapshot knows the replica set there (membership
entries after it are read back with the uncommitted tail). Those records use two 512-byte
slots at bytes 1024 and 1536 (version 2; the 64-byte slots above are only read, from a
replica written before it, and never overwritten, so an upgrade cannot tear them), with the
same scratch-slot rule; a valid version-2 slot wins over any version-1 slot:

```
 0  4 magic "SPH2" | 4 4 crc32c of bytes 8..512 | 8 8 sequence u64 | 16 8 term u64
24  8 commit u64   | 32 1 vote length u8 | 33 31 vote
64  2 membership length u16 (0: not known) | 66 .. membership (Membership.encode()), zeros
```

A membership entry is stored as a membership chunk (spate.node.log.chunk, ADR 0022) that each
replica encodes itself around the core's payload, like a barrier.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
from spate.core.errors import StorageFailure
from spate.core.ids import NodeId, Offset, Term
from spate.node.log import LogConfig, PartitionLog
from spate.node.log import chunk as chunk_codec
from spate.node.log.partition_log import SyncPlan
from spate.node.replication import limits
from spate.node.replication.files import ReplicaFiles, SlotFile
from spate.node.replication.messages import (
    SNAPSHOT_EMPTY,
    Entry,
    HardState,
    Membership,
    Ready,
    SnapshotMeta,
    is_membership,
)

_SLOT = struct.Struct(">4sIQQQB31s")
SLOT_BYTES = 64
_MAGIC = b"SPHS"
assert _SLOT.size == SLOT_BYTES
_SLOT2 = struct.Struct(">4sIQQQB31sH")
SLOT2_BYTES = 512
SLOT2_AT = 1024
_MAGIC2 = b"SPH2"
assert _SLOT2.size == 66 and SLOT2_AT >= 2 * SLOT_BYTES


class HardStateFile:
    """The hard state of one replica (see module docstring). Not thread-safe: `write` on the
    owner's thread, `sync` may run in the fsync thread."""

    def __init__(self, file: SlotFile, existed: bool) -> None:
        self._file = file
        self._sequence = 0
        self.state: HardState | None = None
        self._synced_slot = 1  # the slot holding the last synced record
        self._written_slot = 0  # the slot of the last write
        if existed:
            self.state, self._sequence, self._synced_slot = self._load()
        self.dirty = False
        file.release()

    def _load(self) -> tuple[HardState | None, int, int]:
        best: tuple[HardState | None, int, int] = (None, 0, 1)
        for slot in (0, 1):
            data = self._file.pread(SLOT2_AT + slot * SLOT2_BYTES, SLOT2_BYTES)
            if len(data) != SLOT2_BYTES:
                continue
            magic, crc, sequence, term, commit, vote_length, vote, members = _SLOT2.unpack_from(
                data
            )
            if (
                magic != _MAGIC2
                or crc != crc32c.crc32c(data[8:])
                or vote_length > 31
                or members > SLOT2_BYTES - _SLOT2.size
            ):
                continue
            if best[0] is None or sequence > best[1]:
                voted = NodeId(vote[:vote_length].decode()) if vote_length else None
                membership = (
                    Membership.decode(data[_SLOT2.size : _SLOT2.size + members])
                    if members
                    else None
                )
                best = (HardState(Term(term), voted, commit, membership), sequence, slot)
        if best[0] is not None:
            return best
        for slot in (0, 1):
            data = self._file.pread(slot * SLOT_BYTES, SLOT_BYTES)
            if len(data) != SLOT_BYTES:
                continue
            magic, crc, sequence, term, commit, vote_length, vote = _SLOT.unpack(data)
            if magic != _MAGIC or crc != crc32c.crc32c(data[8:]) or vote_length > 31:
                continue
            if best[0] is None or sequence > best[1]:
                voted = NodeId(vote[:vote_length].decode()) if vote_length else None
                best = (HardState(Term(term), voted, commit), sequence, slot)
        return best

    def write(self, state: HardState, *, sync: bool = True) -> None:
        """Write the new hard state into the scratch slot; `sync` marks the file dirty so the
        next batch fsyncs it (a term or vote change). A commit-only change is written without
        a sync: a commit point lost in a crash is learned again from the leader."""
        vote = (state.vote or "").encode()
        assert len(vote) <= 31, state.vote
        members = b"" if state.membership is None else state.membership.encode()
        self._sequence += 1
        body = _SLOT2.pack(
            _MAGIC2, 0, self._sequence, state.term, state.commit, len(vote), vote, len(members)
        ) + members.ljust(SLOT2_BYTES - _SLOT2.size, b"\0")
        assert len(body) == SLOT2_BYTES, len(body)
        data = body[:4] + struct.pack(">I", crc32c.crc32c(body[8:])) + body[8:]
        self._written_slot = 1 - self._synced_slot
        self._file.pwrite(SLOT2_AT + self._written_slot * SLOT2_BYTES, data)
        self.state = state
        self.dirty = self.dirty or sync
        if not self.dirty:
            self._file.release()  # nothing to sync: no descriptor held while idle (issue 16)

    def sync(self) -> None:
        """fdatasync; the last write's slot becomes the synced one. Runs in the fsync thread
        while no write can happen (one batch at a time per replica)."""
        written = self._written_slot
        self._file.sync()
        self._file.release()
        self._synced_slot = written

    def close(self) -> None:
        self._file.close()


@dataclass(slots=True)
class SyncWork:
    """What one Ready needs synced: run in the fsync thread, then `finish` on the loop."""

    plan: SyncPlan | None
    hard_state: bool


class RaftStore:
    """The log and hard state of one replica, and how a Ready is persisted into them."""

    def __init__(self, files: ReplicaFiles, config: LogConfig, *, defer_sync: bool = False) -> None:
        """`defer_sync=True`: the log's opening syncs are left to the caller, who runs
        `self.log.finish_open()` (and fsyncs the directories `DirectoryFiles(defer_syncs=True)`
        names) before the replica is used (ADR 0031)."""
        self.files = files
        self.config = config
        self.log = PartitionLog.open(files.log_storage(), config, defer_sync=defer_sync)
        try:
            self.hard = HardStateFile(*files.open_state())
        except BaseException:
            self.log.close()
            raise
        self.fresh = self.hard.state is None and self.log.last_raft_index == 0

    # -- restart

    def initial(self) -> tuple[HardState, SnapshotMeta, list[Entry], Offset]:
        """What to hand a new Raft core: hard state, snapshot marker (the commit point: all
        entries up to it stay on disk only), the uncommitted entries after it, and the end
        offset of the committed log."""
        state = self.hard.state or HardState()
        last = self.log.last_raft_index
        commit = min(state.commit, last)
        first = self.log.first_raft_index()
        if first is not None and first > 1 and commit < first:
            # Retention (floor: the applied commit point) removed everything below `first`,
            # so `first` was committed even if the commit-only hard-state write was lost.
            # (Not when `first` is 1: nothing was removed, and index 1 may be a deposed
            # leader's uncommitted barrier; the shell simulator found a replica that took it
            # for committed.)
            commit = first
        snapshot = SNAPSHOT_EMPTY
        committed_end = self.log.start_offset
        if commit > 0:
            header = self.log.header_at_index(commit)
            if header is None:
                raise StorageFailure(f"the chunk of committed Raft index {commit} is missing")
            snapshot = SnapshotMeta(commit, Term(header.epoch), state.membership)
            committed_end = header.end_offset
        entries = []
        for data in self.log.chunks_from_index(commit + 1, limits.restart_window_bytes_max):
            header = chunk_codec.decode_header(data)
            entries.append(Entry(header.raft_index, Term(header.epoch), core_payload(data)))
        if entries and entries[-1].index != last:
            raise StorageFailure(
                f"more than {limits.restart_window_bytes_max} bytes of uncommitted entries"
            )
        return (
            HardState(state.term, state.vote, commit, state.membership),
            snapshot,
            entries,
            committed_end,
        )

    def membership_between(self, low: int, high: int) -> Membership | None:
        """The last membership entry at an index in (low, high] of the stored log, if any:
        what a segment install that went past the snapshot it was asked for brought in."""
        found = None
        first = self.log.first_raft_index()
        if first is None:
            return None
        index = max(low + 1, first)  # an install may start above `low` (retention)
        while index <= high:
            chunks = self.log.chunks_from_index(index, limits.restart_window_bytes_max)
            if not chunks:
                break
            for data in chunks:
                header = chunk_codec.decode_header(data)
                if header.raft_index > high:
                    return found
                if chunk_codec.is_membership(header):
                    found = Membership.decode(core_payload(data))
                index = header.raft_index + 1
        return found

    # -- Ready

    def persist(self, ready: Ready) -> SyncWork | None:
        """Step 1 of a Ready: write its snapshot marker, entries and hard state (no fsync).
        Returns what must be synced before its messages go out."""
        log = self.log
        if ready.snapshot is not None:
            # The data was installed by the catch-up (catchup.py) before restore() was called.
            assert log.last_raft_index >= ready.snapshot.index, (
                ready.snapshot,
                log.last_raft_index,
            )
            if log.last_raft_index > ready.snapshot.index:
                log.truncate_from_index(ready.snapshot.index + 1)
        if ready.entries:
            first = ready.entries[0].index
            if log.last_raft_index >= first:
                log.truncate_from_index(first)
            assert log.last_raft_index == first - 1 or log.last_raft_index == 0, (
                first,
                log.last_raft_index,
            )
            for entry in ready.entries:
                data: bytes | memoryview
                if is_membership(entry.payload):
                    data = chunk_codec.encode_membership(
                        log.end_offset,
                        log.last_timestamp_ms or 0,
                        entry.term,
                        entry.index,
                        bytes(entry.payload),
                    )
                elif entry.payload:
                    data = entry.payload
                else:
                    data = chunk_codec.encode_barrier(
                        log.end_offset, log.last_timestamp_ms or 0, entry.term, entry.index
                    )
                header = log.append_chunk_bytes(data)
                assert header.raft_index == entry.index and header.epoch == entry.term, (
                    header,
                    entry.describe(),
                )
        if ready.hard_state is not None:
            old = self.hard.state
            voted = old is None or (old.term, old.vote) != (
                ready.hard_state.term,
                ready.hard_state.vote,
            )
            # A commit that passes a membership entry is synced too (ADR 0022): retention may
            # delete that entry once applied, and a restart whose unsynced commit was lost
            # would otherwise start below the retained log with the membership before it.
            moved = old is not None and old.membership != ready.hard_state.membership
            self.hard.write(ready.hard_state, sync=voted or moved)
        plan = log.begin_sync()
        if plan is None and not self.hard.dirty:
            return None
        return SyncWork(plan, self.hard.dirty)

    def run_sync(self, work: SyncWork) -> None:
        """The fsync thread's part. Raises OSError."""
        if work.plan is not None:
            self.log.run_sync(work.plan)
        if work.hard_state:
            self.hard.sync()

    def finish_sync(self, work: SyncWork) -> None:
        if work.plan is not None:
            self.log.finish_sync(work.plan)
        if work.hard_state:
            self.hard.dirty = False

    def write_commit_only(self, state: HardState) -> None:
        """Write a hard state whose term and vote are the ones on disk and whose commit point
        moved (no sync: a commit point lost in a crash is learned again from the leader); a
        closing replica's last one (ADR 0043). Not while a sync may run."""
        old = self.hard.state
        if old is None or (old.term, old.vote) != (state.term, state.vote):
            return
        if state.commit > old.commit and state.membership == old.membership:
            self.hard.write(state, sync=False)

    def write_commit(self, commit: int) -> None:
        """Record (and sync) a commit point reached by installing the leader's segments."""
        state = self.hard.state or HardState()
        self.hard.write(HardState(state.term, state.vote, max(state.commit, commit)))
        self.hard.sync()
        self.hard.dirty = False

    def close(self) -> None:
        self.log.close()
        self.hard.close()


def core_payload(data: bytes) -> bytes:
    """The Raft core's payload of a stored chunk: empty for a barrier, the membership entry
    for a membership chunk, else the chunk itself."""
    header = chunk_codec.decode_header(data)
    if chunk_codec.is_barrier(header):
        return b""
    if chunk_codec.is_membership(header):
        start = chunk_codec.HEADER_BYTES
        return bytes(data[start : start + header.payload_length])
    return data
