"""Catch-up by segment transfer: how a replica that needs entries its leader no longer keeps in
memory (or a wiped replica) gets the leader's segment files.

Follower side (`Fetch`, a state machine: no I/O of its own beyond the replica's staging
Storage, no clock; the ReplicationDriver sends its requests, matches replies by request id and
times requests out): ask the leader for a manifest of the segment files that hold every chunk
up to the snapshot index (the last file cut right after that chunk), then fetch each file in
pieces of `limits.catchup_piece_bytes` into the replica's staging place (`catchup/`), one
request in flight. The transfer is resumable: a staged file is continued from its current size
(the leader's committed bytes never change, and the chunk bytes are identical on every
replica), so a transfer broken by a timeout, a leader change or a restart goes on where it
stopped instead of starting from zero (pysyncobj's behaviour, research/pysyncobj.md).

```
state              request sent                      on the reply
MANIFEST           FETCH_MANIFEST(index)             MANIFEST: drop stale staged files -> PIECES
                                                     FETCH_ERROR: Unavailable (abandoned)
PIECES             FETCH_PIECE(first unfinished      PIECE: append to the staged file; all
                   file, its staged size, <= 1 MiB)  staged -> DONE; PIECE_GONE: drop that
                                                     file and the older ones, go on (below);
                                                     FETCH_ERROR or empty: Unavailable
                                                     (abandoned)
DONE               -                                 the driver installs between batches
```

PIECE_GONE: the leader's retention deleted the file since it sent the manifest. Retention
deletes oldest first, so every older file is gone too; the transfer goes on without them, as
a log that ran that retention itself (Kafka's follower likewise moves to the new log start).
Without this a transfer slower than the leader's retention never finished: each attempt
started from a new manifest whose oldest file was deleted before it was fetched (found by the
shell simulator under sustained appends with 1 KiB segments). It needs the first file kept to
be a segment whose partition-state snapshot is kept too (the tables before it); otherwise, or
when nothing up to the transfer's point is left, the transfer is abandoned as before.

`install` (on the owner's thread, between Ready batches): fsync the staged files, close the
log, replace its segment files by the staged ones (ReplicaFiles.install_staged), reopen
(recovery rebuilds the indexes, which are caches), and record the commit point in the hard
state. Then the driver calls `Raft.restore(index, term)`.

Leader side (`manifest_reply`, `piece_reply`): read-only, from durable, committed data.
"""

from __future__ import annotations

from spate.core import frames
from spate.core.errors import StorageFailure, Unavailable
from spate.core.ids import NodeId, Term
from spate.node.log.partition_log import PartitionLog
from spate.node.log.segment import PRODUCERS_SUFFIX, SEGMENT_SUFFIX, parse_name
from spate.node.replication import codec, limits
from spate.node.replication.storage import RaftStore


def _base(name: str) -> int:
    meaning = parse_name(name)
    assert meaning is not None  # checked when the manifest arrived (_stage)
    return meaning[0]


class ShortInstall(Unavailable):
    """The installed files end before the transfer's point (a reply that answered another
    request): what was installed is a committed prefix, and a later transfer goes on."""


Manifest = list[tuple[str, int]]
"""Segment files (name, bytes) of a transfer, oldest first."""


class Fetch:
    """One transfer of the leader's files up to `raft_index` into the staging place."""

    def __init__(
        self, store: RaftStore, key: frames.GroupKey, leader: NodeId, raft_index: int, term: Term
    ) -> None:
        self.key = key
        self.leader = leader
        self.raft_index = raft_index
        self.term = term
        self._staging = store.files.staging()
        self.manifest: Manifest | None = None
        self._asked: tuple[str, int, int] | None = None  # the piece in flight

    @property
    def done(self) -> bool:
        return self.manifest is not None and self._next_piece() is None

    def request(self, request_id: int) -> bytes:
        """The frame of the next request (only while not `done`)."""
        if self.manifest is None:
            return codec.encode_fetch_manifest(self.key, request_id, self.raft_index)
        piece = self._next_piece()
        assert piece is not None, "the transfer is done"
        self._asked = piece
        name, position, length = piece
        return codec.encode_fetch_piece(self.key, request_id, name, position, length)

    def _next_piece(self) -> tuple[str, int, int] | None:
        assert self.manifest is not None
        for name, size in self.manifest:
            have = self._staging.size(name)
            if have < size:
                return name, have, min(limits.catchup_piece_bytes, size - have)
        return None

    def on_reply(self, kind: int, body: memoryview) -> None:
        """The reply to the last request. Raises Unavailable when the leader refused (the
        driver abandons the transfer; a later one resumes from the staged bytes)."""
        if self.manifest is None:
            if kind != codec.KIND_MANIFEST:
                reason = bytes(codec.decode_reply(body)[1]).decode(errors="replace")
                raise Unavailable(f"leader refused the manifest: {reason}")
            _, manifest = codec.decode_manifest(body)
            self._stage(manifest)
            self.manifest = manifest
            return
        assert self._asked is not None
        name, position, length = self._asked
        self._asked = None
        if kind == codec.KIND_PIECE_GONE:
            self._drop_through(name)
            return
        _, data = codec.decode_reply(body)
        if kind != codec.KIND_PIECE or len(data) == 0:
            reason = bytes(data).decode(errors="replace")
            raise Unavailable(f"leader refused segment {name} at {position}: {reason}")
        assert self._staging.size(name) == position, "one request in flight"
        self._staging.append(name, data[:length])

    def _drop_through(self, gone: str) -> None:
        """Retention deleted `gone` at the leader: go on with the files after it."""
        assert self.manifest is not None
        meaning = parse_name(gone)
        assert meaning is not None
        kept = [(n, s) for n, s in self.manifest if _base(n) > meaning[0]]
        names = {n for n, _ in kept}
        first = next((n for n, _ in kept if n.endswith(SEGMENT_SUFFIX)), None)
        if first is None or first.replace(SEGMENT_SUFFIX, PRODUCERS_SUFFIX) not in names:
            raise Unavailable(f"leader's retention deleted {gone} and left no whole suffix")
        staged = set(self._staging.list())
        for name, _ in self.manifest:
            if name not in names and name in staged:
                self._staging.delete(name)
        self.manifest = kept

    def _stage(self, manifest: Manifest) -> None:
        names = {name for name, _ in manifest}
        for name, _ in manifest:
            meaning = parse_name(name)
            if meaning is None or meaning[1] not in (SEGMENT_SUFFIX, PRODUCERS_SUFFIX):
                raise Unavailable(f"leader sent a manifest with a strange file name {name!r}")
        staged = self._staging.list()
        for stale in staged:
            if stale not in names:
                self._staging.delete(stale)
        for name, size in manifest:
            if name not in staged:
                self._staging.create(name)
            elif self._staging.size(name) > size:
                # The committed prefix is identical everywhere: keep what fits.
                self._staging.truncate(name, size)

    def close(self) -> None:
        self._staging.close()


def install(store: RaftStore, manifest: Manifest, raft_index: int) -> tuple[int, Term]:
    """Replace the replica's log by the staged files (see module docstring). Returns the Raft
    index and term of the last installed entry: `raft_index`, or a later committed one when
    the leader had no longer retained `raft_index` (see `manifest_reply`)."""
    staging = store.files.staging()
    try:
        for name, size in manifest:
            if staging.size(name) != size:
                raise StorageFailure(f"staged segment {name} is not {size} bytes")
            staging.fsync(name)
    finally:
        staging.close()
    store.log.close()
    store.files.install_staged([name for name, _ in manifest])
    store.log = PartitionLog.open(store.files.log_storage(), store.config)
    last = store.log.last_raft_index
    header = store.log.header_at_index(last)
    if last < raft_index or header is None:
        raise StorageFailure(f"installed segments end at Raft index {last}, before {raft_index}")
    store.write_commit(last)
    return last, Term(header.epoch)


def manifest_reply(store: RaftStore, request_id: int, raft_index: int, applied: int) -> bytes:
    """The files up to `raft_index`; when retention has deleted it since the core named it
    (the core's snapshot marker is where the replica restarted, and retention moves on), the
    files up to `applied` instead, which retention always keeps (its floor) and which is
    committed: the follower installs and restores to whatever the files end at."""
    first = store.log.first_raft_index()
    if first is not None and raft_index < first <= applied:
        raft_index = applied
    try:
        return codec.encode_manifest(request_id, store.log.transfer_manifest(raft_index))
    except StorageFailure as error:
        return codec.encode_fetch_error(request_id, error.message)


def piece_reply(store: RaftStore, request_id: int, name: str, position: int, length: int) -> bytes:
    length = min(length, limits.catchup_piece_bytes)
    if not store.log.retains_file(name):
        return codec.encode_piece_gone(request_id)
    try:
        return codec.encode_piece(request_id, store.log.read_file(name, position, length))
    except (StorageFailure, OSError) as error:
        return codec.encode_fetch_error(request_id, str(error))
