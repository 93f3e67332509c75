"""The metadata follower's append, the Raft way (Raft §5.3; docs/adr/0025 addendum;
src/cluster/metadata/append_plan.py): a follower keeps the entries a leader's message matches,
cuts only from the first conflict, never at or below its committed index, and acknowledges and
commits only what the message proves.

pysyncobj 0.3.17's follower deletes its whole tail after `prevLogIdx` and appends the message's
entries. `test_a_stale_reset_cannot_shrink_a_followers_log_and_lose_committed_entries` plays
benchmarks/RESULTS.md §29's case on three real `SyncObj`s (the adapter's subclass) wired in
memory, every message delivered by hand, elections started by hand: deterministic. Without the
adapter's override it fails at the first check (the follower's log ends at 3 of the 10 entries
it applied) and, past that, the new leader has lost five acknowledged registrations.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import FAIL_REASON, SyncObjConf
from spate.cluster.metadata.append_plan import Append, Defer, Keep, Refuse, plan_append
from spate.cluster.metadata.codec import encode_command
from spate.cluster.metadata.raft import MetadataRaft, RaftConfig, _MetadataSyncObj
from spate.cluster.metadata.state import Barrier, RegisterNode, RequestId
from spate.core.errors import StorageFailure
from spate.core.ids import NodeId
from spate.sim.metadata_raft import MemoryWire

NO_OP = b"\x01"
"""pysyncobj's no-op entry (`_COMMAND_TYPE.NO_OP`): applied as nothing."""
LEADER = "127.0.0.1:7202"
"""The leader the crafted messages come from."""
SETTLE_S = 20.0
"""Bound on waiting for the in-memory cluster to do something (heartbeats are timed, 0.1 s)."""


# -- the plan, pure ------------------------------------------------------------------------------


def log_of(*terms: int, first: int = 1) -> Callable[[int], int | None]:
    """A log holding entries first, first+1, ... with these terms."""
    return lambda i: terms[i - first] if first <= i < first + len(terms) else None


@pytest.mark.parametrize(
    ("terms", "prev", "entries", "committed", "plan"),
    [
        # a stale re-send of entries the follower holds, fewer than its tail: keep everything
        ((0, 1, 1, 1, 1, 1), 1, [(2, 1), (3, 1)], 6, Keep(3)),
        # a heartbeat from below the end: keep the tail, prove only prev
        ((0, 1, 1, 1), 2, [], 2, Keep(2)),
        # the usual case: new entries after the end
        ((0, 1, 1), 3, [(4, 1), (5, 1)], 3, Append(3, 1, 0, 5)),
        # some held, then new ones: skip the held ones
        ((0, 1, 1), 2, [(3, 1), (4, 1)], 2, Append(3, 1, 1, 4)),
        # a conflict above the committed index: cut there
        ((0, 1, 1, 1, 1), 2, [(3, 1), (4, 2), (5, 2)], 3, Append(3, 1, 1, 5)),
        # a conflict at a committed index: never cut
        ((0, 1, 1, 1, 1), 2, [(3, 1), (4, 2)], 4, Refuse(4, 1, 2)),
        # prev missing or of another term: pysyncobj's own answer (go back)
        ((0, 1, 1), 5, [(6, 1)], 3, Defer()),
        ((0, 1, 1), 2, [(3, 2)], 1, Defer()),
        ((0, 1, 2), 3, [], 1, Defer()),
    ],
)
def test_the_plan_keeps_what_matches_and_cuts_only_at_a_conflict(
    terms: tuple[int, ...], prev: int, entries: list[tuple[int, int]], committed: int, plan: object
) -> None:
    log = log_of(*terms)
    assert plan_append(log, prev, log(prev) if plan != Defer() else 9, entries, committed) == plan


def test_the_plan_after_compaction_starts_at_the_logs_first_entry() -> None:
    log = log_of(3, 3, 4, first=40)  # entries 40..42
    assert plan_append(log, 39, 3, [(40, 3)], 41) == Defer()  # below the log: pysyncobj's
    assert plan_append(log, 41, 3, [(42, 4), (43, 4)], 41) == Append(42, 4, 1, 43)


# -- three real SyncObjs, wired in memory --------------------------------------------------------


@dataclass
class Sent:
    source: str
    target: str
    message: dict[str, Any]


@dataclass(eq=False)
class Voter:
    address: str
    adapter: MetadataRaft
    obj: Any
    wire: MemoryWire

    def last_index(self) -> int:
        return int(self.obj._getRaftLogSize())  # no compaction here: entries 1..N

    def registered(self) -> set[str]:
        return set(self.adapter.view().nodes)


@dataclass
class Net:
    voters: dict[str, Voter] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    cut: set[str] = field(default_factory=set)
    """Voters whose messages, both ways, are lost."""

    def add(
        self,
        address: str,
        peers: list[str],
        tmp_path: Path,
        batch_bytes: int,
        compact_after: int | None = None,
    ) -> Voter:
        """`compact_after`: take a full dump (our codec's, as in production) and drop the log
        before it whenever the log holds more entries than this; None: never."""
        config = RaftConfig(
            address, tuple(peers), tmp_path / address, password="x", sync_journal=False
        )
        adapter = MetadataRaft(config, on_change=lambda _view: None)
        wire = MemoryWire(address, lambda s, t, m: self.sent.append(Sent(s, t, m)))
        dumps: dict[str, Any] = {}
        if compact_after is not None:
            config.data_dir.mkdir(parents=True, exist_ok=True)
            dumps = {
                "fullDumpFile": str(adapter.dump_path),
                "serializer": adapter._write_dump,
                "deserializer": adapter._read_dump,
                "logCompactionMinEntries": compact_after,
            }
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesBatchSizeBytes=batch_bytes,
            raftMinTimeout=1000.0,  # elections only when the test starts one
            raftMaxTimeout=1001.0,
            connectionTimeout=1001.0,
            dynamicMembershipChange=True,
            **dumps,
        )
        obj = _MetadataSyncObj(adapter, address, peers, conf, transport=wire)
        adapter._obj = obj
        voter = Voter(address, adapter, obj, wire)
        self.voters[address] = voter
        return voter

    def connect_all(self) -> None:
        for voter in self.voters.values():
            assert voter.wire.on_connected is not None
            for node in voter.obj.otherNodes:
                voter.wire.on_connected(node)

    def deliver(self, sent: Sent) -> None:
        target = self.voters[sent.target]
        node = next(n for n in target.obj.otherNodes if n.id == sent.source)
        assert target.wire.on_message is not None
        target.wire.on_message(node, sent.message)

    def pump(self, until: Callable[[], bool], hold: Callable[[Sent], bool] | None = None) -> None:
        """Deliver what is sent (lost to and from cut voters; kept aside when `hold` says) and
        tick every voter, until `until()` holds."""
        deadline = time.monotonic() + SETTLE_S
        while not until():
            assert time.monotonic() < deadline, "the in-memory cluster did not get there"
            while self.sent:
                sent = self.sent.pop(0)
                if sent.source in self.cut or sent.target in self.cut:
                    continue
                if hold is None or not hold(sent):
                    self.deliver(sent)
            for voter in self.voters.values():
                if voter.address not in self.cut:
                    voter.obj.doTick(0)
            time.sleep(0.005)

    def register(self, leader: Voter, names: list[str], acknowledged: list[str]) -> None:
        """Submit node registrations through `leader`; pump until each is acknowledged (its
        name appended to `acknowledged`)."""
        for name in names:
            leader.obj.apply_command(
                registration(name),
                callback=lambda result, error, name=name: error == 0 and acknowledged.append(name),
            )
        self.pump(lambda: set(names) <= set(acknowledged))

    def elect(self, voter: Voter) -> None:
        """Start an election at `voter` now (pysyncobj campaigns when its deadline has passed)."""
        voter.obj._SyncObj__raftElectionDeadline = 0
        voter.obj.doTick(0)

    def leader(self) -> Voter | None:
        leaders = [
            v for v in self.voters.values() if v.address not in self.cut and v.obj._isLeader()
        ]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None

    def close(self) -> None:
        for voter in self.voters.values():
            voter.obj.destroy()


def compacting_trio(addresses: tuple[str, str, str], tmp_path: Path) -> Net:
    """Three connected voters that compact (a full dump) past four entries."""
    net = Net()
    for me in addresses:
        net.add(me, [p for p in addresses if p != me], tmp_path, 1 << 16, compact_after=4)
    net.connect_all()
    return net


def registration(name: str) -> bytes:
    address = f"{name}.example:5672"
    command = RegisterNode(
        RequestId(f"register-{name}"), NodeId(name), address, address, address, address, 1
    )
    return encode_command(command)


def test_a_stale_reset_cannot_shrink_a_followers_log_and_lose_committed_entries(
    tmp_path: Path,
) -> None:
    a, f, g = "127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"
    # One append message carries entries up to this many bytes: a few registrations, not all.
    batch_bytes = 3 * len(registration("n10")) // 2 + 64
    net = Net()
    for me in (a, f, g):
        net.add(me, [p for p in (a, f, g) if p != me], tmp_path, batch_bytes)
    net.connect_all()
    leader, follower, other = net.voters[a], net.voters[f], net.voters[g]
    acknowledged: list[str] = []

    def register(names: list[str]) -> None:
        net.register(leader, names, acknowledged)

    try:
        # a leads, with g; f is cut off: n3..n5 are committed by a and g alone.
        net.cut = {f}
        net.elect(leader)
        net.pump(lambda: net.leader() is leader)
        register(["n3", "n4", "n5"])
        # Now g is cut off and f back: a's heartbeat finds f's log empty, and f answers
        # "reset: my next index is 2". The first such answer is held (processed late, as under
        # starvation); later ones bring f up to date, and n6..n10 commit on a and f.
        net.cut = {g}
        held: list[Sent] = []

        def first_reset(sent: Sent) -> bool:
            stale = sent.message.get("type") == "next_node_idx" and sent.message["reset"]
            if stale and sent.source == f and not held:
                held.append(sent)
                return True
            return False

        net.pump(lambda: follower.obj.raftLastApplied >= 5, hold=first_reset)
        register(["n6", "n7", "n8", "n9", "n10"])
        net.pump(lambda: follower.obj.raftLastApplied == leader.obj.raftCommitIndex)
        assert held and held[0].message["next_node_idx"] == 2
        applied, committed = follower.obj.raftLastApplied, follower.obj.raftCommitIndex
        assert follower.last_index() == applied == committed == 10  # no-ops at 1 and 2
        assert {f"n{i}" for i in range(3, 11)} <= follower.registered()

        # The stale answer reaches a: it sends f everything from index 2 again, in several
        # messages; only the first arrives before a dies.
        net.deliver(held[0])
        net.sent.clear()
        net.pump(lambda: any(s.target == f for s in net.sent))
        first = next(s for s in net.sent if s.target == f)  # prev 1, entries 2, 3, ...
        assert first.message["prevLogIdx"] == 1
        assert 0 < len(first.message["entries"]) < follower.last_index() - 1, "fewer than f's tail"
        net.sent.clear()
        net.cut = {a}
        net.deliver(first)

        # pysyncobj alone: f's log now ends where that message did, below the 10 entries it
        # applied and acknowledged; a quorum (a and f) had them.
        assert follower.last_index() == applied, "f's log lost entries it had applied"
        assert follower.obj.raftCommitIndex == committed
        answer = next(s.message for s in net.sent if s.source == f)
        assert answer["success"] and answer["next_node_idx"] <= first.message["entries"][-1][1] + 1

        # a is gone. g (holding n3..n5 only) stands first; f must refuse it, then win itself.
        net.cut = {a}
        net.sent.clear()
        net.elect(other)
        net.pump(lambda: not net.sent)
        if net.leader() is None:
            net.elect(follower)
        net.pump(lambda: net.leader() is not None)
        new = net.leader()
        assert new is not None
        rest = other if new is follower else follower
        net.pump(
            lambda: (
                rest.obj.raftLastApplied >= new.obj.raftCommitIndex > applied
                and new.obj.raftLastApplied == new.obj.raftCommitIndex
            )
        )
        assert set(acknowledged) == {f"n{i}" for i in range(3, 11)}
        for voter in (new, rest):
            lost = set(acknowledged) - voter.registered()
            assert not lost, f"{voter.address} lost acknowledged registrations {sorted(lost)}"
        assert follower.registered() == other.registered()
        assert follower.adapter.view().version == other.adapter.view().version
    finally:
        net.close()


def test_a_deposed_leaders_barrier_is_not_committed_by_a_snapshot_piece(tmp_path: Path) -> None:
    """The chaos suite's ci seed 49255 (docs/reliability.md): `stream list` through the
    metadata leader, paused (SIGSTOP) while the others elected a new leader and deleted a
    stream, answered from its stale state right after it resumed, although the read commits a
    barrier first. The resumed leader appends the barrier to its own log (in its eyes it still
    leads), learns the new term, and, being behind a compacted log, is sent a snapshot; the
    snapshot comes in pieces, and pysyncobj's follower takes every piece's commit index as its
    own, capped only by its log's end: it commits its deposed tail (a registration nobody else
    holds, then the barrier) and applies it before the snapshot replaces its state. A read
    through it then misses the delete. The adapter commits nothing on a snapshot piece, and a
    command waiting on an index the installed snapshot covers fails (outcome unknown: the
    service resubmits it) instead of waiting for ever."""
    a, f, _g = addresses = ("127.0.0.1:7301", "127.0.0.1:7302", "127.0.0.1:7303")
    net = compacting_trio(addresses, tmp_path)
    old, new = net.voters[a], net.voters[f]
    acknowledged: list[str] = []
    applied: dict[str, list[bytes]] = {v.address: [] for v in net.voters.values()}
    for voter in net.voters.values():
        apply = voter.adapter._apply

        def recording(data: bytes, address: str = voter.address, apply: Any = apply) -> Any:
            applied[address].append(data)
            return apply(data)

        voter.adapter._apply = recording  # type: ignore[method-assign]

    try:
        net.elect(old)
        net.pump(lambda: net.leader() is old)
        net.register(old, ["n1", "n2"], acknowledged)
        voters = list(net.voters.values())
        net.pump(lambda: all(v.obj.raftLastApplied == old.obj.raftCommitIndex for v in voters))

        # `a` is paused: what it appends now reaches nobody.
        net.cut = {a}
        old.obj.apply_command(registration("stale"), callback=lambda result, error: None)
        old.obj.doTick(0)
        assert old.last_index() > old.obj.raftCommitIndex, "an uncommitted tail"

        # f leads with g, registers more (the delete of the chaos run) and compacts its log
        # past a's end, so a can only catch up from a snapshot.
        net.elect(new)
        net.pump(lambda: net.leader() is new)
        net.register(new, [f"d{i}" for i in range(1, 9)], acknowledged)
        net.pump(lambda: new.obj._SyncObj__raftLog[0][1] > old.last_index())

        # a resumes and serves a read: the barrier goes into its own log first.
        outcome: list[tuple[int, set[str]]] = []
        old.obj.apply_command(
            encode_command(Barrier(RequestId("read"))),
            callback=lambda result, error: outcome.append((error, old.registered())),
        )
        old.obj.doTick(0)
        net.cut = set()
        # Messages one at a time, a tick after each (pieces of a large snapshot arrive in
        # separate reads; the follower ticks between them).
        deadline = time.monotonic() + SETTLE_S
        while not (outcome and old.obj._SyncObj__raftLog[0][1] > 1):
            assert time.monotonic() < deadline, "a did not catch up from the snapshot"
            if net.sent:
                net.deliver(net.sent.pop(0))
            else:
                time.sleep(0.005)  # heartbeats are timed
            for voter in net.voters.values():
                voter.obj.doTick(0)
        error, seen = outcome[0]
        if error == 0:
            missing = set(acknowledged) - seen
            assert not missing, f"the barrier completed on a state without {sorted(missing)}"
        else:
            assert error == FAIL_REASON.UNKNOWN_OUTCOME
        assert registration("stale") not in applied[a], "a applied an entry no quorum held"
        assert set(acknowledged) <= old.registered()
        assert "stale" not in old.registered()
    finally:
        net.close()


def test_a_declined_snapshot_leaves_no_file_open_or_on_disk(tmp_path: Path) -> None:
    """A snapshot whose last entry the follower's log holds is declined (the log is kept,
    above); pysyncobj's serializer had written its first pieces to `<dump>.1.tmp` and keeps
    that file open until a last piece it never sees: the adapter closes and removes it."""
    a, f, _g = addresses = ("127.0.0.1:7311", "127.0.0.1:7312", "127.0.0.1:7313")
    net = compacting_trio(addresses, tmp_path)
    leader, follower = net.voters[a], net.voters[f]
    try:
        net.elect(leader)
        net.pump(lambda: net.leader() is leader)
        net.register(leader, [f"n{i}" for i in range(1, 9)], [])
        voters = list(net.voters.values())
        net.pump(lambda: all(v.obj.raftLastApplied == leader.obj.raftCommitIndex for v in voters))
        net.pump(leader.adapter.dump_path.exists)
        dump = leader.adapter.dump_path.read_bytes()
        last = follower.last_index()
        term = leader.obj.raftCurrentTerm
        serializer = follower.obj._SyncObj__serializer
        for i, piece in enumerate([dump[:10], dump[10:20], dump[20:]]):
            snapshot = (piece, i == 0, i == 2)
            message = {
                "type": "append_entries",
                "term": term,
                "commit_index": leader.obj.raftCommitIndex,
                "serialized": snapshot,
            }
            net.deliver(Sent(a, f, message))
            if i == 0:
                opened = serializer._Serializer__incomingTransmissionFile
                assert opened is not None and not opened.closed
        assert follower.last_index() == last, "the log was kept"
        assert opened.closed, "the declined snapshot's file is still open"
        assert serializer._Serializer__incomingTransmissionFile is None
        assert not Path(f"{follower.adapter.dump_path}.1.tmp").exists()
        net.register(leader, ["after"], [])  # and the follower goes on as before
        net.pump(lambda: "after" in follower.registered())
    finally:
        net.close()


# -- one follower, messages crafted by hand ------------------------------------------------------


@pytest.fixture
def follower(tmp_path: Path) -> Any:
    """A voter of three (the other two never answer: the test plays their leader)."""
    net = Net()
    voter = net.add("127.0.0.1:7201", [LEADER, "127.0.0.1:7203"], tmp_path, 1 << 16)
    yield net, voter
    net.close()


def append(
    prev: int, prev_term: int, entries: list[tuple[int, int]], commit: int, term: int = 1
) -> dict[str, Any]:
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
        "entries": [(NO_OP, index, t) for index, t in entries],
    }


def answers(net: Net) -> list[dict[str, Any]]:
    out = [s.message for s in net.sent if s.message.get("type") == "next_node_idx"]
    net.sent.clear()
    return out


def test_a_resend_below_the_end_keeps_the_tail_and_proves_only_what_it_carries(
    follower: tuple[Net, Voter],
) -> None:
    net, voter = follower
    leader = LEADER
    net.deliver(Sent(leader, voter.address, append(1, 0, [(i, 1) for i in range(2, 7)], 3)))
    voter.obj.doTick(0)
    assert voter.last_index() == 6 and voter.obj.raftCommitIndex == 3
    assert answers(net)[-1] == {"type": "next_node_idx", "next_node_idx": 7, "reset": False,
                                "success": True}  # fmt: skip
    # The same leader's earlier message, arriving late: entries 2..3 again, commit index 6.
    net.deliver(Sent(leader, voter.address, append(1, 0, [(2, 1), (3, 1)], 6)))
    assert voter.last_index() == 6, "pysyncobj alone cuts 4..6"
    assert answers(net)[-1]["next_node_idx"] == 4, "acknowledges only what the message proves"
    assert voter.obj.raftCommitIndex == 3, "commits only what the message proves"


def test_a_conflict_above_the_commit_index_is_cut_from_there(
    follower: tuple[Net, Voter],
) -> None:
    net, voter = follower
    leader = LEADER
    net.deliver(Sent(leader, voter.address, append(1, 0, [(i, 1) for i in range(2, 7)], 3)))
    # a new leader (term 2) whose log differs from index 5 on
    net.deliver(Sent(leader, voter.address, append(3, 1, [(4, 1), (5, 2)], 3, term=2)))
    assert voter.last_index() == 5
    assert voter.obj._SyncObj__raftLog[-1][2] == 2
    assert answers(net)[-1] == {"type": "next_node_idx", "next_node_idx": 6, "reset": False,
                                "success": True}  # fmt: skip


def test_a_conflict_at_a_committed_index_is_refused_and_the_replica_stops_serving(
    follower: tuple[Net, Voter],
) -> None:
    net, voter = follower
    leader = LEADER
    net.deliver(Sent(leader, voter.address, append(1, 0, [(i, 1) for i in range(2, 7)], 5)))
    assert voter.obj.raftCommitIndex == 5
    net.deliver(Sent(leader, voter.address, append(3, 1, [(4, 1), (5, 2)], 5, term=2)))
    assert voter.last_index() == 6 and voter.obj.raftCommitIndex == 5, "nothing cut"
    assert answers(net)[-1] == {"type": "next_node_idx", "next_node_idx": 5, "reset": True,
                                "success": False}  # fmt: skip
    assert isinstance(voter.adapter.failure, StorageFailure)
    assert "diverged" in voter.adapter.failure.message


def test_after_a_conflict_no_reset_answer_goes_above_it(follower: tuple[Net, Voter]) -> None:
    """A leader pipelines a tail in several messages and takes each answer as it comes.
    pysyncobj answers a conflict at prevLogIdx with "send from prevLogIdx", and the next
    message (prevLogIdx past this log's end) with "send from my end + 1", which undid the
    first every round (the `pysyncobj` simulator model: a follower that never caught up). After
    the conflict, no reset goes above it until an append is accepted."""
    net, voter = follower
    leader = LEADER
    net.deliver(Sent(leader, voter.address, append(1, 0, [(i, 1) for i in range(2, 7)], 3)))
    answers(net)
    # A new leader (term 2) whose entry 5 differs: two pipelined messages.
    net.deliver(Sent(leader, voter.address, append(5, 2, [(6, 2), (7, 2)], 3, term=2)))
    net.deliver(Sent(leader, voter.address, append(7, 2, [(8, 2)], 3, term=2)))
    first, second = answers(net)
    assert (first["next_node_idx"], first["reset"], first["success"]) == (5, True, False)
    assert (second["next_node_idx"], second["reset"]) == (5, True), "pysyncobj alone: 7"
    # The leader backs off; the append from 4 matches and is accepted; the floor is gone.
    net.deliver(Sent(leader, voter.address, append(4, 1, [(5, 2), (6, 2), (7, 2)], 3, term=2)))
    assert answers(net)[-1]["success"] and voter.last_index() == 7
    net.deliver(Sent(leader, voter.address, append(9, 2, [(10, 2)], 3, term=2)))
    assert answers(net)[-1]["next_node_idx"] == 8, "past the end again: from the end + 1"


def test_the_adapter_refuses_another_pysyncobj_version() -> None:
    """It overrides pysyncobj's private methods: an upgrade must fail loudly, not run them."""
    code = (
        "import pysyncobj.version as v; v.VERSION = '0.3.18'\nimport spate.cluster.metadata.raft\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "pysyncobj 0.3.18 is installed: install pysyncobj==0.3.17" in done.stderr
