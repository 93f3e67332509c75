"""Random schedules over three real metadata voters (`_MetadataSyncObj`, pysyncobj 0.3.17 with
the adapter's overrides, our dump codec, log compaction every few entries) wired in memory:
per-link FIFO queues, delivered one message at a time in a seeded order; paused voters (their
inbound messages wait, as in a stopped process's socket buffers); connection resets (a link's
queued messages lost); elections forced at random voters; writes and read barriers submitted
anywhere. pysyncobj's clock is replaced by the schedule's, so a seed replays exactly.

The deterministic simulator (spate.sim) checks the metadata state machine over our own Raft
core, not over pysyncobj; this is the tier that runs pysyncobj's replication itself. It found
both halves of the chaos suite's ci seed 49255 (docs/reliability.md): a snapshot piece
committing a deposed leader's tail, and a snapshot installed over a log that already held it
(losing acknowledged entries). Checked after every step:

| invariant             | meaning                                                             |
|-----------------------|---------------------------------------------------------------------|
| barrier-stale         | a barrier that completes at a voter sees every write acknowledged   |
|                       | (anywhere) before the barrier was submitted                         |
| applied-diverged      | no log index is applied with different commands on two voters      |
| acknowledged-lost     | after the schedule, healed and quiet, every voter holds every       |
|                       | acknowledged write                                                  |

`SPATE_METADATA_SCHEDULES=N` runs N seeds instead of the default.
"""

from __future__ import annotations

import os
import random
from collections import deque
from pathlib import Path
from typing import Any

import pysyncobj.syncobj
import pytest
from pysyncobj import SyncObjConf
from spate.cluster.metadata.codec import encode_command
from spate.cluster.metadata.raft import MetadataRaft, RaftConfig, _MetadataSyncObj
from spate.cluster.metadata.state import Barrier, RegisterNode, RequestId
from spate.core.ids import NodeId
from support.syncobj_wire import MemoryWire

VOTERS = ("127.0.0.1:7401", "127.0.0.1:7402", "127.0.0.1:7403")
STEPS = 3000
COMPACT_AFTER = 8
"""Entries in a voter's log before it compacts (production: limits.compaction_min_entries)."""
SEEDS = int(os.environ.get("SPATE_METADATA_SCHEDULES", "40"))
CLOCK = [1000.0]
"""pysyncobj's clock while a schedule runs (seconds); each step moves it on."""


class Schedule:
    def __init__(self, seed: int, tmp: Path) -> None:
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
        self.writes = self.barriers = 0
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
            obj = _MetadataSyncObj(adapter, address, list(peers), conf, transport=wire)
            adapter._obj = obj
            self.voters[address], self.adapters[address], self.wires[address] = obj, adapter, wire
        for address, wire in self.wires.items():
            assert wire.on_connected is not None
            for node in self.voters[address].otherNodes:
                wire.on_connected(node)

    def registered(self, address: str) -> set[str]:
        return set(self.adapters[address].view().nodes)

    def deliver(self, source: str, target: str) -> None:
        message = self.links[(source, target)].popleft()
        self.trace.append(
            f"{source[-1]}->{target[-1]} {message.get('type')} term {message.get('term')}"
        )
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
        self.trace.append(f"write {name} at {address[-1]}")

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
        self.trace.append(f"barrier {number} at {address[-1]}")

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
            self.trace.append(f"election at {address[-1]}")
        elif roll < 0.995:
            if self.paused is None:
                leaders = [a for a in VOTERS if self.voters[a]._isLeader()]
                pick = leaders[0] if leaders and rng.random() < 0.8 else rng.choice(VOTERS)
                self.paused = pick
                self.trace.append(f"pause {pick[-1]}")
            else:
                self.trace.append(f"resume {self.paused[-1]}")
                self.paused = None
        else:
            link = rng.choice(list(self.links))
            self.links[link].clear()
            self.trace.append(f"reset {link[0][-1]}->{link[1][-1]}")

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
        raise AssertionError(f"seed {self.seed}: the voters did not settle")

    def close(self) -> None:
        for obj in self.voters.values():
            obj.destroy()


def run(seed: int, tmp: Path, steps: int = STEPS) -> Schedule:
    """One schedule (pysyncobj's clock must be `CLOCK`'s: the `schedule_clock` fixture)."""
    CLOCK[0] = 1000.0
    schedule = Schedule(seed, tmp)
    try:
        schedule.voters[VOTERS[0]]._SyncObj__raftElectionDeadline = 0
        for _ in range(steps):
            schedule.step()
            if schedule.problems:
                return schedule
        schedule.settle()
        for address in VOTERS:
            lost = sorted(set(schedule.acknowledged) - schedule.registered(address))
            if lost:
                schedule.problems.append(f"acknowledged-lost: {address} lacks {lost}")
        return schedule
    finally:
        schedule.close()


@pytest.fixture
def schedule_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """pysyncobj reads its clock through `pysyncobj.syncobj.monotonicTime`: the schedule's,
    moved on a millisecond by each read (pysyncobj's send loop runs until its clock moves)."""
    monkeypatch.setattr(pysyncobj.syncobj, "monotonicTime", _read_clock)


def _read_clock() -> float:
    CLOCK[0] += 1e-3
    return CLOCK[0]


@pytest.mark.parametrize("seed", range(1, SEEDS + 1))
def test_random_schedules_keep_reads_linearizable_and_acknowledged_writes(
    seed: int, tmp_path: Path, schedule_clock: None
) -> None:
    schedule = run(seed, tmp_path)
    assert not schedule.problems, f"seed {seed}: {schedule.problems[0]}\nlast steps:\n" + "\n".join(
        schedule.trace
    )
    assert len(schedule.acknowledged) > 10, "the schedule acknowledged almost nothing"
