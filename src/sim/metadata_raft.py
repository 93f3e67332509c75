"""Random schedules over pysyncobj itself: three real metadata voters (`_MetadataSyncObj`,
pysyncobj 0.3.17 with the adapter's overrides, our dump codec, log compaction every few
entries) wired in memory. Per-link FIFO queues delivered one message at a time in a seeded
order; paused voters (their inbound messages wait, as in a stopped process's socket buffers);
connection resets (a link's queued messages lost); elections forced at random voters; writes
and read barriers submitted anywhere. pysyncobj's clock is replaced by the schedule's (a
millisecond per read), so a seed replays exactly under the same PYTHONHASHSEED (pysyncobj
iterates sets of nodes, so runs under different hash seeds differ; the other models do not
depend on it): `python -m spate.sim` pins it (`__main__.HASH_SEED`) unless one is set.
`python -m spate.sim --model pysyncobj`.

The `metadata` model checks the state machine over our own Raft core, never over pysyncobj;
this one runs pysyncobj's replication. It found both halves of the chaos suite's ci seed
49255 (docs/reliability.md, ADR 0025's second addendum): a snapshot piece committing a deposed
leader's tail, and a snapshot installed over a log that already held it. Invariants:

| invariant             | meaning                                                             |
|-----------------------|---------------------------------------------------------------------|
| barrier-stale         | a barrier that completes at a voter sees every write acknowledged   |
|                       | (anywhere) before the barrier was submitted                         |
| applied-diverged      | no log index is applied with different commands on two voters      |
| acknowledged-lost     | after the schedule, healed and quiet, every voter holds every       |
|                       | acknowledged write                                                  |

Planted bugs (`--bug`): `pysyncobj-snapshots`, the voters handle snapshots as pysyncobj alone
does; `pysyncobj-resets`, they answer a conflict's resets as pysyncobj alone does;
`pysyncobj-append`, followers take a leader's entries as pysyncobj alone does.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pysyncobj.syncobj
from pysyncobj import SyncObj, SyncObjConf
from spate.cluster.metadata.codec import encode_command
from spate.cluster.metadata.raft import MetadataRaft, RaftConfig, _MetadataSyncObj
from spate.cluster.metadata.state import Barrier, RegisterNode, RequestId
from spate.core.ids import NodeId

VOTERS = ("127.0.0.1:7401", "127.0.0.1:7402", "127.0.0.1:7403")
STEPS = 3000
COMPACT_AFTER = 8
"""Entries in a voter's log before it compacts (production: limits.compaction_min_entries)."""
APPEND_BYTES = 512
"""pysyncobj's `appendEntriesBatchSizeBytes` here: a few entries per message, so a follower's
tail goes in several pipelined messages (production: one message up to 64 KiB), which is where
the reset floor (raft.py `_defer`) and ADR 0025's first addendum matter."""
CLOCK = [1000.0]
"""pysyncobj's clock while a schedule runs (seconds): `schedule_clock`."""


def _read_clock() -> float:
    CLOCK[0] += 1e-3
    return CLOCK[0]


@contextmanager
def schedule_clock() -> Iterator[None]:
    """pysyncobj reads its clock through `pysyncobj.syncobj.monotonicTime`: the schedule's,
    moved on a millisecond by each read (pysyncobj's send loop runs until its clock moves)."""
    original = pysyncobj.syncobj.monotonicTime
    pysyncobj.syncobj.monotonicTime = _read_clock
    try:
        yield
    finally:
        pysyncobj.syncobj.monotonicTime = original


Post = Callable[[str, str, dict[str, Any]], None]


class MemoryWire:
    """pysyncobj's transport interface (pysyncobj/transport.py) in memory: what a voter sends
    goes to `post(source, target, message)` (a copy through pickle, as a real wire hands over);
    whoever wires the voters delivers it through `on_message` when it likes."""

    ready = True

    def __init__(self, address: str, post: Post) -> None:
        self.address, self.post = address, post
        self.on_message: Callable[[object, dict[str, Any]], None] | None = None
        self.on_connected: Callable[[object], None] | None = None

    def setOnMessageReceivedCallback(self, callback: Any) -> None:
        self.on_message = callback

    def setOnNodeConnectedCallback(self, callback: Any) -> None:
        self.on_connected = callback

    def setOnNodeDisconnectedCallback(self, callback: Any) -> None:
        pass

    def setOnReadonlyNodeConnectedCallback(self, callback: Any) -> None:
        pass

    def setOnReadonlyNodeDisconnectedCallback(self, callback: Any) -> None:
        pass

    def setOnUtilityMessageCallback(self, message: str, callback: Any) -> None:
        pass

    def tryGetReady(self) -> None:
        pass

    def waitReady(self) -> None:
        pass

    def addNode(self, node: object) -> None:
        pass

    def dropNode(self, node: object) -> None:
        pass

    def destroy(self) -> None:
        pass

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        self.post(self.address, str(node.id), pickle.loads(pickle.dumps(message)))
        return True


class _PysyncobjSnapshots(_MetadataSyncObj):
    """Planted bug `pysyncobj-snapshots`: snapshots handled as pysyncobj alone does."""

    def _snapshot_piece(self, node: object, message: dict[str, Any]) -> None:
        SyncObj._SyncObj__onMessageReceived(self, node, message)


class _PysyncobjResets(_MetadataSyncObj):
    """Planted bug `pysyncobj-resets`: a conflict's reset answered as pysyncobj alone does (no
    reset floor): a follower whose tail conflicts never catches up (unsettled)."""

    def _defer(self, node: object, message: dict[str, Any], term_at: Any) -> None:
        SyncObj._SyncObj__onMessageReceived(self, node, message)


class _PysyncobjAppend(_MetadataSyncObj):
    """Planted bug `pysyncobj-append`: a follower takes a leader's entries as pysyncobj alone
    does (ADR 0025's first addendum: a late or stale append cuts the tail it already acked,
    and commits up to the leader's index over entries the message does not prove)."""

    def _SyncObj__onMessageReceived(self, node: object, message: dict[str, Any]) -> None:
        if message.get("type") == "append_entries" and "prevLogIdx" not in message:
            self._snapshot_piece(node, message)
            return
        SyncObj._SyncObj__onMessageReceived(self, node, message)


BUGS: dict[str, type[_MetadataSyncObj]] = {
    "pysyncobj-snapshots": _PysyncobjSnapshots,
    "pysyncobj-resets": _PysyncobjResets,
    "pysyncobj-append": _PysyncobjAppend,
}


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    ok: bool
    failure: str | None
    digest: str
    steps: int
    acknowledged: int
    barriers: int
    elections: int
    pauses: int
    trace: list[str]


class Schedule:
    """One seed's voters, links and workload; `run_pysyncobj_seed` drives it."""

    def __init__(self, seed: int, tmp: Path, *, bug: str | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.links: dict[tuple[str, str], deque[dict[str, Any]]] = {
            (a, b): deque() for a in VOTERS for b in VOTERS if a != b
        }
        self.voters: dict[str, Any] = {}
        self.adapters: dict[str, MetadataRaft] = {}
        self.wires: dict[str, MemoryWire] = {}
        self.applied: dict[int, tuple[str, bytes]] = {}
        self.acknowledged: list[str] = []
        self.paused: str | None = None
        self.problems: list[str] = []
        self.trace: deque[str] = deque(maxlen=80)
        self._digest = hashlib.blake2b(digest_size=16)
        self.writes = self.barriers = self.elections = self.pauses = 0
        kind = BUGS[bug] if bug is not None else _MetadataSyncObj
        for address in VOTERS:
            peers = tuple(p for p in VOTERS if p != address)
            config = RaftConfig(address, peers, tmp / address, password="x", sync_journal=False)
            adapter = MetadataRaft(config, on_change=lambda _view: None)
            config.data_dir.mkdir(parents=True)
            apply = adapter._apply

            def recording(data: bytes, address: str = address, apply: Any = apply) -> Any:
                index = self.voters[address].raftLastApplied + 1
                first = self.applied.setdefault(index, (address, data))
                if first[1] != data:
                    self.problems.append(
                        f"applied-diverged: entry {index} differs on {first[0]} and {address}"
                    )
                return apply(data)

            adapter._apply = recording  # type: ignore[method-assign]
            wire = MemoryWire(address, lambda s, t, m: self.links[(s, t)].append(m))
            conf = SyncObjConf(
                autoTick=False,
                appendEntriesUseBatch=False,
                appendEntriesPeriod=0.05,
                appendEntriesBatchSizeBytes=APPEND_BYTES,
                raftMinTimeout=1000.0,  # elections only when the schedule forces one
                raftMaxTimeout=1001.0,
                connectionTimeout=1001.0,
                leaderFallbackTimeout=1000.0,
                dynamicMembershipChange=True,
                fullDumpFile=str(adapter.dump_path),
                serializer=adapter._write_dump,
                deserializer=adapter._read_dump,
                logCompactionMinEntries=COMPACT_AFTER,
            )
            obj = kind(adapter, address, list(peers), conf, transport=wire)
            adapter._obj = obj
            self.voters[address], self.adapters[address], self.wires[address] = obj, adapter, wire
        for address, wire in self.wires.items():
            assert wire.on_connected is not None
            for node in self.voters[address].otherNodes:
                wire.on_connected(node)

    def note(self, line: str) -> None:
        self.trace.append(line)
        self._digest.update(line.encode() + b"\n")

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()

    def registered(self, address: str) -> set[str]:
        return set(self.adapters[address].view().nodes)

    def deliver(self, source: str, target: str) -> None:
        message = self.links[(source, target)].popleft()
        self.note(f"{source[-1]}->{target[-1]} {message.get('type')} term {message.get('term')}")
        node = next(n for n in self.voters[target].otherNodes if n.id == source)
        wire = self.wires[target]
        assert wire.on_message is not None
        wire.on_message(node, message)

    def tick(self, address: str) -> None:
        self.voters[address].doTick(0)

    def write(self, address: str) -> None:
        self.writes += 1
        name = f"w{self.writes}"
        address_ = f"{name}.example:5672"
        command = RegisterNode(
            RequestId(name), NodeId(name), address_, address_, address_, address_, 1
        )

        def done(_result: object, error: int) -> None:
            if error == 0:
                self.acknowledged.append(name)

        self.voters[address].apply_command(encode_command(command), callback=done)
        self.note(f"write {name} at {address[-1]}")

    def barrier(self, address: str) -> None:
        self.barriers += 1
        number, required = self.barriers, list(self.acknowledged)

        def done(_result: object, error: int) -> None:
            if error != 0:
                return
            missing = sorted(set(required) - self.registered(address))
            if missing:
                self.problems.append(
                    f"barrier-stale: barrier {number} completed at {address} without {missing}"
                )

        self.voters[address].apply_command(
            encode_command(Barrier(RequestId(f"b{number}"))), callback=done
        )
        self.note(f"barrier {number} at {address[-1]}")

    def step(self) -> None:
        rng = self.rng
        CLOCK[0] += rng.uniform(0.001, 0.02)
        live = [a for a in VOTERS if a != self.paused]
        roll = rng.random()
        if roll < 0.50:
            ready = [k for k, q in self.links.items() if q and k[1] != self.paused]
            if ready:
                self.deliver(*rng.choice(ready))
        elif roll < 0.85:
            self.tick(rng.choice(live))
        elif roll < 0.915:
            self.write(rng.choice(live))
        elif roll < 0.98:
            self.barrier(rng.choice(live))
        elif roll < 0.985:
            address = rng.choice(live)
            self.voters[address]._SyncObj__raftElectionDeadline = 0
            self.elections += 1
            self.note(f"election at {address[-1]}")
        elif roll < 0.995:
            if self.paused is None:
                leaders = [a for a in VOTERS if self.voters[a]._isLeader()]
                pick = leaders[0] if leaders and rng.random() < 0.8 else rng.choice(VOTERS)
                self.paused = pick
                self.pauses += 1
                self.note(f"pause {pick[-1]}")
            else:
                self.note(f"resume {self.paused[-1]}")
                self.paused = None
        else:
            link = rng.choice(list(self.links))
            self.links[link].clear()
            self.note(f"reset {link[0][-1]}->{link[1][-1]}")

    def settle(self) -> None:
        """Heal, then deliver and tick in turn until one voter leads and every voter applied
        its whole log (a voter campaigns every 20 rounds until then: a deposed leader whose
        term the others passed would otherwise lead on alone, its messages ignored)."""
        self.paused = None
        for _round in range(400):
            CLOCK[0] += 0.06
            for link, queue in self.links.items():
                while queue:
                    self.deliver(*link)
            for address in VOTERS:
                self.tick(address)
            leaders = [a for a in VOTERS if self.voters[a]._isLeader()]
            if _round % 20 == 19:  # election timeouts are off: campaign by hand now and then
                candidate = VOTERS[_round // 20 % 3]
                if candidate not in leaders:
                    self.voters[candidate]._SyncObj__raftElectionDeadline = 0
            if len(leaders) == 1:
                leader = self.voters[leaders[0]]
                end = leader._SyncObj__raftLog[-1][1]
                if all(v.raftLastApplied == end for v in self.voters.values()):
                    return
        self.problems.append("unsettled: no single leader with every voter applied to its end")

    def close(self) -> None:
        for obj in self.voters.values():
            obj.destroy()


def run_pysyncobj_seed(seed: int, *, steps: int = STEPS, bug: str | None = None) -> ScheduleResult:
    """One schedule: `steps` random steps (stopping at the first problem), then healed and
    settled, then every voter checked for every acknowledged write."""
    CLOCK[0] = 1000.0
    with schedule_clock(), tempfile.TemporaryDirectory(prefix="spate-sim-pysyncobj-") as tmp:
        schedule = Schedule(seed, Path(tmp), bug=bug)
        done = 0
        try:
            schedule.voters[VOTERS[0]]._SyncObj__raftElectionDeadline = 0
            while done < steps and not schedule.problems:
                schedule.step()
                done += 1
            if not schedule.problems:
                schedule.settle()
        except Exception as error:  # pysyncobj's tick raised: the voter would log and retry
            schedule.problems.append(f"crash: {type(error).__name__}: {error}")
        try:
            if not schedule.problems:
                for address in VOTERS:
                    lost = sorted(set(schedule.acknowledged) - schedule.registered(address))
                    if lost:
                        schedule.problems.append(f"acknowledged-lost: {address} lacks {lost}")
        finally:
            schedule.close()
    return ScheduleResult(
        not schedule.problems,
        schedule.problems[0] if schedule.problems else None,
        schedule.digest,
        done,
        len(schedule.acknowledged),
        schedule.barriers,
        schedule.elections,
        schedule.pauses,
        list(schedule.trace),
    )
