"""RaftStore on real files: entries are chunks carrying term and Raft index, barriers are empty
chunks, divergent tails are cut, the hard state survives a torn slot, and a restart hands the
core what it needs."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import crc32c
from spate.core import frames
from spate.core.backend import OffsetSpec
from spate.core.ids import NodeId, Offset, PartitionId, StreamName, Term
from spate.core.streams import Retention
from spate.node.log import LogConfig
from spate.node.log import chunk as chunk_codec
from spate.node.replication import catchup, codec
from spate.node.replication.files import DirectoryFiles
from spate.node.replication.messages import Entry, HardState, Membership, Ready, SnapshotMeta
from spate.node.replication.storage import (
    SLOT2_AT,
    SLOT2_BYTES,
    SLOT_BYTES,
    HardStateFile,
    RaftStore,
)

CONFIG = LogConfig(segment_bytes=64 * 1024)


def entry(index: int, term: int, first: int, records: list[bytes]) -> Entry:
    return Entry(
        index, Term(term), chunk_codec.encode_chunk(records, Offset(first), 1000, term, index)
    )


def persist(store: RaftStore, ready: Ready) -> None:
    work = store.persist(ready)
    if work is not None:
        store.run_sync(work)
        store.finish_sync(work)


def test_entries_barriers_truncation_and_restart(tmp_path: Path) -> None:
    store = RaftStore(DirectoryFiles(tmp_path), CONFIG)
    assert store.fresh
    barrier = Entry(1, Term(1), b"")
    persist(
        store,
        Ready(
            entries=(barrier, entry(2, 1, 0, [b"a", b"b"]), entry(3, 1, 2, [b"c"])),
            hard_state=HardState(Term(1), NodeId("n1"), 2),
            must_sync=True,
        ),
    )
    assert store.log.last_raft_index == 3
    assert [len(v.records) for v in store.log.read(Offset(0), 1 << 20)] == [2, 1]
    # A new leader of term 2 overwrites index 3: the divergent chunk is cut, not re-encoded.
    replacement = entry(3, 2, 2, [b"C", b"D"])
    persist(store, Ready(entries=(replacement, Entry(4, Term(2), b"")), must_sync=True))
    assert store.log.last_raft_index == 4
    views = store.log.read(Offset(0), 1 << 20)
    assert [bytes(r) for v in views for r in v.records] == [b"a", b"b", b"C", b"D"]
    located = store.log.locate_index(3)
    assert located is not None and located[2].epoch == 2
    assert store.log.chunks_from_index(3, 1 << 20)[0] == replacement.payload  # byte for byte
    store.close()

    again = RaftStore(DirectoryFiles(tmp_path), CONFIG)
    assert not again.fresh
    hard, snapshot, entries, committed_end = again.initial()
    assert hard == HardState(Term(1), NodeId("n1"), 2)
    assert snapshot == SnapshotMeta(2, Term(1))
    assert [(e.index, e.term, bool(e.payload)) for e in entries] == [(3, 2, True), (4, 2, False)]
    assert committed_end == 2
    assert again.log.resolve(OffsetSpec.next(), end=committed_end) == 2
    again.close()


def test_a_torn_hard_state_slot_falls_back_to_the_other(tmp_path: Path) -> None:
    path = tmp_path / "raft.state"
    files = DirectoryFiles(tmp_path)
    first = HardStateFile(*files.open_state())
    assert first.state is None
    first.write(HardState(Term(5), NodeId("n2"), 10))
    first.sync()  # slot 0 holds the synced record; the next write goes to slot 1
    first.write(HardState(Term(6), None, 12))
    first.sync()
    first.close()
    assert HardStateFile(*files.open_state()).state == HardState(Term(6), None, 12)
    # Tear the newer slot (sequence 2 lives in slot 1).
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"\xff" * 20, SLOT2_AT + SLOT2_BYTES + 10)
    os.close(fd)
    assert os.path.getsize(path) == SLOT2_AT + 2 * SLOT2_BYTES
    assert HardStateFile(*files.open_state()).state == HardState(Term(5), NodeId("n2"), 10)


def test_the_hard_state_keeps_the_membership_and_reads_a_version_1_file(tmp_path: Path) -> None:
    """ADR 0022: the membership as of the commit point survives a restart; a replica written
    before it (64-byte slots, no membership) is read as it was."""
    (tmp_path / "new").mkdir()
    files = DirectoryFiles(tmp_path / "new")
    members = Membership.of([NodeId("n1"), NodeId("n2"), NodeId("n4")], [NodeId("n5")])
    state = HardStateFile(*files.open_state())
    state.write(HardState(Term(3), NodeId("n1"), 7, members))
    state.sync()
    state.close()
    loaded = HardStateFile(*files.open_state()).state
    assert loaded == HardState(Term(3), NodeId("n1"), 7)
    assert loaded is not None and loaded.membership == members

    old = tmp_path / "old"
    old.mkdir()
    body = struct.pack(">4sIQQQB31s", b"SPHS", 0, 1, 4, 9, 2, b"n2")
    record = body[:4] + struct.pack(">I", crc32c.crc32c(body[8:])) + body[8:]
    (old / "raft.state").write_bytes(record + bytes(SLOT_BYTES))
    from_v1 = HardStateFile(*DirectoryFiles(old).open_state()).state
    assert from_v1 == HardState(Term(4), NodeId("n2"), 9) and from_v1.membership is None


def test_segment_manifest_ends_at_the_requested_entry(tmp_path: Path) -> None:
    store = RaftStore(DirectoryFiles(tmp_path), CONFIG)
    entries = [entry(index, 1, index - 1, [b"x" * 3000]) for index in range(1, 60)]
    persist(store, Ready(entries=tuple(entries), must_sync=True))
    assert len(store.log.segments) > 2
    files = store.log.transfer_manifest(40)
    located = store.log.locate_index(40)
    assert located is not None
    segment_number, position, header = located
    manifest = [(name, size) for name, size in files if name.endswith(".segment")]
    # each segment after the first comes with its producer-state snapshot (ADR 0011)
    snapshots = [name for name, _ in files if name.endswith(".producers")]
    assert snapshots == [
        s.name.replace(".segment", ".producers") for s in store.log.segments[1 : segment_number + 1]
    ]
    assert len(manifest) == segment_number + 1
    assert manifest[-1] == (store.log.segments[segment_number].name, position + header.chunk_bytes)
    assert [size for _, size in manifest[:-1]] == [
        s.size for s in store.log.segments[:segment_number]
    ]
    store.close()


def test_unsynced_commit_writes_never_damage_the_synced_vote() -> None:
    """The synced record (term and vote) survives any crash, whatever became of the unsynced
    commit-only writes after it (each may be lost, torn or written). Found by the shell
    simulator (seed 15): alternating slots let two commit-only writes overwrite the vote."""
    import random

    from spate.sim.files import SimReplicaFiles

    for seed in range(200):
        files = SimReplicaFiles("r", random.Random(seed))
        hard = HardStateFile(*files.open_state())
        hard.write(HardState(Term(1), NodeId("n1"), 0))
        hard.sync()
        hard.write(HardState(Term(2), NodeId("n2"), 3))  # a vote: synced
        hard.sync()
        hard.write(HardState(Term(2), NodeId("n2"), 4), sync=False)  # commit-only
        hard.write(HardState(Term(2), NodeId("n2"), 5), sync=False)  # commit-only
        files.crash()
        state = HardStateFile(*files.open_state()).state
        assert state is not None and (state.term, state.vote) == (Term(2), NodeId("n2")), seed
        assert state.commit in (3, 4, 5), seed


def test_a_transfer_goes_on_when_the_leaders_retention_deletes_its_oldest_files(
    tmp_path: Path,
) -> None:
    """Retention at the leader deletes the manifest's oldest files mid-transfer: the follower
    drops them and installs the rest, tables included (the shell simulator found transfers
    that never finished: each new manifest's oldest file was gone before it was fetched)."""
    config = LogConfig(segment_bytes=4096, retention=Retention(max_messages=20))
    leader = RaftStore(DirectoryFiles(tmp_path / "leader"), config)
    entries, offset = [], 0
    for index in range(1, 41):
        if index == 3:  # a consumer's stored offset, in what retention deletes
            data = chunk_codec.encode_tracking([(b"c", 1)], Offset(offset), 1000, 1, index)
        else:
            data = chunk_codec.encode_chunk([b"x" * 500], Offset(offset), 1000, 1, index)
            offset += 1
        entries.append(Entry(index, Term(1), data))
    persist(leader, Ready(entries=tuple(entries), must_sync=True))
    follower = RaftStore(DirectoryFiles(tmp_path / "follower"), config)
    fetch = catchup.Fetch(follower, (StreamName("s"), PartitionId(0)), NodeId("n1"), 40, Term(1))

    def ask(request_id: int) -> None:
        request = memoryview(fetch.request(request_id))
        _, kind = frames.FRAME_HEAD.unpack_from(request)
        body = request[frames.FRAME_HEAD.size :]
        if kind == codec.KIND_FETCH_MANIFEST:
            reply = catchup.manifest_reply(leader, request_id, 40, 40)
        else:
            _, _, name, position, length = codec.decode_fetch_piece(body)
            reply = catchup.piece_reply(leader, request_id, name, position, length)
        _, reply_kind = frames.FRAME_HEAD.unpack_from(reply)
        fetch.on_reply(reply_kind, memoryview(reply)[frames.FRAME_HEAD.size :])

    ask(1)  # the manifest
    ask(2)  # the first segment
    assert fetch.manifest is not None
    named = len(fetch.manifest)
    assert leader.log.apply_retention(2000, index_floor=40) >= 2
    request_id = 3
    while not fetch.done:
        ask(request_id)
        request_id += 1
    assert len(fetch.manifest) < named
    assert catchup.install(follower, fetch.manifest, 40) == (40, Term(1))
    assert follower.log.first_raft_index() == leader.log.first_raft_index()
    assert follower.log.offsets.get(b"c") == leader.log.offsets.get(b"c") is not None
    first = leader.log.resolve(OffsetSpec.first(), end=Offset(offset))
    assert follower.log.read(first, 1 << 20, end=Offset(offset)) == leader.log.read(
        first, 1 << 20, end=Offset(offset)
    )
    leader.close()
    follower.close()


def test_a_membership_entry_is_stored_as_a_membership_chunk_and_read_back(
    tmp_path: Path,
) -> None:
    store = RaftStore(DirectoryFiles(tmp_path), CONFIG)
    members = Membership.of([NodeId("n1"), NodeId("n2"), NodeId("n3")], [NodeId("n4")])
    entries = (
        entry(1, 1, 0, [b"a"]),
        Entry(2, Term(1), members.encode()),
        entry(3, 1, 1, [b"b"]),
    )
    persist(store, Ready(entries=entries, hard_state=HardState(Term(1), None, 1), must_sync=True))
    header = store.log.header_at_index(2)
    assert header is not None and chunk_codec.is_membership(header)
    assert header.record_count == 0 and header.end_offset == 1  # moves no offset
    assert store.membership_between(0, 3) == members
    store.close()
    again = RaftStore(DirectoryFiles(tmp_path), CONFIG)
    _, _, tail, _ = again.initial()
    assert [e.index for e in tail] == [2, 3]
    assert Membership.decode(tail[0].payload) == members
    again.close()
