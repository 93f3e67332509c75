"""A leader's Appends do not wait for its running fsync (issue 16, ADR 0033).

Three production `ReplicationDriver`s with production `Replica`s over the simulator's in-memory
files, frames carried by hand, and an fsync "running" on the leader: its batch begun
(`begin_batch`) and not yet finished. Before the change a follower got the entries proposed
meanwhile, and learned the commit its own ack made, only after that fsync (the leader's next
batch); here both leave at once, so a consumer on a follower sees the records while the
leader's disk is still busy.
"""

from __future__ import annotations

import random

import pytest
from replication.drivers import IDS, Nodes, outcomes
from spate.core.errors import StorageFailure
from spate.core.ids import NodeId, Offset
from spate.node.replication import codec
from spate.node.replication import raft as raft_module
from spate.node.replication.messages import Append, AppendResponse


def test_entries_proposed_during_the_leaders_fsync_leave_before_it_ends() -> None:
    nodes = Nodes()
    n1, n2, n3 = nodes.elect()
    leader = nodes.replicas[n1]
    got, done = outcomes()
    leader.propose([b"a"], done)  # type: ignore[arg-type]
    running = nodes.batch(n1)  # written, Append sent, fsync running
    assert running is not None and running.syncs
    nodes.deliver(to=[n2, n3])
    leader.propose([b"b"], done)  # type: ignore[arg-type]
    nodes.drivers[n1].send_early()  # the host calls this when woken during the fsync
    appends = nodes.raft_frames(n1)
    assert {m.target for m in appends} == {n2, n3}, appends  # type: ignore[attr-defined]
    assert all(m.entries for m in appends), appends  # type: ignore[attr-defined]
    nodes.finish(n1, running)
    nodes.settle()
    assert got == [Offset(0), Offset(1)]


def test_a_follower_learns_a_commit_while_the_leaders_fsync_runs() -> None:
    nodes = Nodes()
    n1, n2, n3 = nodes.elect()
    leader = nodes.replicas[n1]
    got, done = outcomes()
    leader.propose([b"a", b"b"], done)  # type: ignore[arg-type]
    running = nodes.batch(n1)  # the leader's fsync runs until the end of the test
    assert running is not None
    nodes.deliver(to=[n2, n3])
    for follower in (n2, n3):
        nodes.run(follower)  # written and synced: each acks
    nodes.deliver(to=[n1])  # the acks: a quorum without the leader's disk; commit advances
    assert got == [Offset(0)]  # the producer's confirm, applied at once (take_committed)
    nodes.deliver(to=[n2, n3])  # what the leader sent on those acks: the new commit
    for follower in (n2, n3):
        nodes.run(follower)
        assert nodes.replicas[follower].end_offset() == Offset(2), follower
    nodes.finish(n1, running)
    nodes.settle()
    assert all(nodes.replicas[n].end_offset() == Offset(2) for n in IDS)


def test_a_follower_answers_the_appends_it_took_during_its_fsync_with_one_ack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ADR 0035: Appends a follower takes while its fsync runs are answered, after its next
    sync, by one ack for the last (acks are cumulative; a leader stepped one ack per Append
    before), and the leader commits them all from it. The counters say how many Appends and
    entries went each way."""
    monkeypatch.setattr(raft_module, "FOLD_ACKS", True)  # whatever the switch says
    nodes = Nodes(readers=False)  # no commit-with updates (ADR 0050) among the Appends counted
    n1, n2, n3 = nodes.elect()
    leader = nodes.replicas[n1]
    got, done = outcomes()
    sent = nodes.drivers[n1].appends_sent
    received = nodes.drivers[n2].appends_received
    entries = nodes.drivers[n2].entries_received
    coalesced = nodes.replicas[n2].raft.acks_coalesced
    for record in (b"a", b"b", b"c"):
        leader.propose([record], done)  # type: ignore[arg-type]
        nodes.run(n1)  # one batch each: each entry leaves in its own Append
    appends = [m for m in nodes.raft_frames(n1) if isinstance(m, Append) and m.target == n2]
    assert [len(m.entries) for m in appends] == [1, 1, 1]
    assert nodes.drivers[n1].appends_sent - sent == 6  # three to each follower
    running = nodes.batch(n2)  # n2's fsync runs (a batch with nothing to write is None)
    nodes.deliver(to=[n2, n3])
    assert nodes.drivers[n2].appends_received - received == 3
    assert nodes.drivers[n2].entries_received - entries == 3
    nodes.finish(n2, running)
    nodes.run(n2)
    nodes.run(n3)
    acks = [m for m in nodes.raft_frames(n2) if isinstance(m, AppendResponse)]
    assert [(m.index, m.rejected) for m in acks] == [(appends[-1].entries[-1].index, False)]
    assert nodes.replicas[n2].raft.acks_coalesced - coalesced == 2
    nodes.deliver(to=[n1])
    nodes.run(n1)  # applies the commit the ack made
    assert got == [Offset(0), Offset(1), Offset(2)]
    nodes.settle()


def _chunk_frames(nodes: Nodes, source: NodeId, target: NodeId) -> list[int]:
    """Positions in `nodes.frames` of the Appends with entries from `source` to `target`."""
    found = []
    for i, (s, t, frame) in enumerate(nodes.frames):
        if (s, t) == (source, target) and frame[4] == codec.KIND_RAFT:
            message = codec.decode_raft(memoryview(frame)[5:])[1]
            if isinstance(message, Append) and any(e.payload for e in message.entries):
                found.append(i)
    return found


def test_a_follower_stores_the_leaders_chunk_bytes_as_they_came() -> None:
    """ADR 0037: a follower's entries are views of the Append frame, written as they are; what
    each replica stores and serves is the leader's chunk byte for byte, a 1 MiB record and
    records of every size between, and the CRC its reads check still holds."""
    nodes = Nodes()
    n1, _, _ = nodes.elect()
    rng = random.Random(37)
    records = [rng.randbytes(n) for n in (1 << 20, 1, 16_384, 16_385, 70_000, 0, 3)]
    got, done = outcomes()
    nodes.replicas[n1].propose(records, done)  # type: ignore[arg-type]
    nodes.settle()
    assert got == [Offset(0)]
    for node in IDS:
        replica = nodes.replicas[node]
        stored = [bytes(r) for v in replica.read(Offset(0), 2 << 20) for r in v.records]
        assert stored == records, node
        assert replica.store.log.chunks_from_index(1, 4 << 20)  # every chunk's CRC checked


def test_a_chunk_corrupted_on_its_way_is_refused_by_the_follower_s_reads() -> None:
    """A follower never re-encodes a chunk and does not recompute its CRC on the way in (the
    leader computed it once, ADR 0037); a chunk whose bytes changed in flight is stored as it
    came, and the follower's reads refuse it by its CRC: a storage failure, never wrong data."""
    nodes = Nodes()
    n1, n2, n3 = nodes.elect()
    got, done = outcomes()
    nodes.replicas[n1].propose([b"a" * 5000, b"b" * 5000], done)  # type: ignore[arg-type]
    batch = nodes.batch(n1)
    assert batch is not None
    (at,) = _chunk_frames(nodes, n1, n2)
    source, target, frame = nodes.frames[at]
    flipped = bytearray(frame)
    flipped[-100] ^= 0x01  # inside the last record of the chunk
    nodes.frames[at] = (source, target, bytes(flipped))
    nodes.finish(n1, batch)
    nodes.settle()
    assert got == [Offset(0)]  # n1 and n3 hold it intact: a majority
    assert nodes.replicas[n3].read(Offset(0), 1 << 20)
    with pytest.raises(StorageFailure, match="CRC mismatch"):
        nodes.replicas[n2].read(Offset(0), 1 << 20)
