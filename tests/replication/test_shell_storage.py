"""RaftStore on real files: entries are chunks carrying term and Raft index, barriers are empty
chunks, divergent tails are cut, the hard state survives a torn slot, and a restart hands the
core what it needs."""

from __future__ import annotations

import os
from pathlib import Path

from spate.core.backend import OffsetSpec
from spate.core.ids import NodeId, Offset, Term
from spate.node.log import LogConfig
from spate.node.log import chunk as chunk_codec
from spate.node.replication.files import DirectoryFiles
from spate.node.replication.messages import Entry, HardState, Ready, SnapshotMeta
from spate.node.replication.storage import SLOT_BYTES, HardStateFile, RaftStore

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
    first.write(HardState(Term(6), None, 12))
    first.sync()
    first.close()
    assert HardStateFile(*files.open_state()).state == HardState(Term(6), None, 12)
    # Tear the newer slot (sequence 2 lives in slot 0).
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"\xff" * 20, 10)
    os.close(fd)
    assert os.path.getsize(path) == 2 * SLOT_BYTES
    assert HardStateFile(*files.open_state()).state == HardState(Term(5), NodeId("n2"), 10)


def test_segment_manifest_ends_at_the_requested_entry(tmp_path: Path) -> None:
    store = RaftStore(DirectoryFiles(tmp_path), CONFIG)
    entries = [entry(index, 1, index - 1, [b"x" * 3000]) for index in range(1, 60)]
    persist(store, Ready(entries=tuple(entries), must_sync=True))
    assert len(store.log.segments) > 2
    manifest = store.log.transfer_manifest(40)
    located = store.log.locate_index(40)
    assert located is not None
    segment_number, position, header = located
    assert len(manifest) == segment_number + 1
    assert manifest[-1] == (store.log.segments[segment_number].name, position + header.chunk_bytes)
    assert [size for _, size in manifest[:-1]] == [
        s.size for s in store.log.segments[:segment_number]
    ]
    store.close()
