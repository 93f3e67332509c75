"""Replicated state machines under simulation: the metadata service's state machine first.

The production metadata service runs `MetadataState.apply` on commands encoded by
`spate.cluster.metadata.codec`, replicated by pysyncobj. Here the same state machine and codec
run on every voter of a simulated replicated log: the Raft core under the core model's
reference shell and store (cluster.py), with its faults (loss, duplication, reordering,
partitions, crashes with lost and torn writes). Each voter decodes every committed entry with
the production codec and applies it to its own `MetadataState`; a restarted voter rebuilds its
state by replaying its log, and every so often a voter's state is round-tripped through the
production full-dump codec (what pysyncobj's `fullDumpFile` stores) so that the dump meets
the same checks.

Pluggable: a `SimPlugin` gives the replicas' state machine (`SimStateMachine`), the workload
(the next command's bytes) and the cross-replica invariants. Later features (consumer-group
epochs, stored offsets) add a plugin to `PLUGINS`; the loop, the faults
and the Raft-level checker are shared. `python -m spate.sim --model metadata`.

Invariants (after every applied entry), on top of the Raft ones of checker.py:

- `metadata-determinism`: replicas that applied the same number of entries hold byte-identical
  states (the canonical dump);
- `request-once`: the result of a remembered request id is the same on every replica and on
  every retry (a retry never applies twice);
- `epoch-monotonic`: a partition's recorded leader epoch never decreases on any replica;
- `version-monotonic` and `heartbeat-monotonic`: the state version and each node's heartbeat
  never go backwards on a replica (within an incarnation);
- `placement-valid`: every placed partition has `replicas` distinct registered nodes;
- `super-stream-partitions`: every super stream's partition streams exist, with one partition,
  created with it (same version), and no stream has a super stream's name.

The workload creates and deletes streams and super streams over shared names (so the
super-stream clash refusals happen too); determinism and the dump round trip cover the
super-stream topology (ADR 0014).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from spate.cluster.metadata import codec
from spate.cluster.metadata.state import (
    Applied,
    Barrier,
    Command,
    CreateStream,
    CreateSuperStream,
    DeleteStream,
    DeleteSuperStream,
    Heartbeat,
    LeaderReport,
    MetadataState,
    RegisterNode,
    ReportLeader,
    ReportLeaders,
    RequestId,
    Result,
)
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import define
from spate.node.replication.messages import Entry
from spate.sim.checker import InvariantViolation
from spate.sim.cluster import SimCluster, SimOptions, SimResult
from spate.sim.cluster import _Node as SimNode

dump_every_applied = 25
"""A replica round-trips its state through the full-dump codec after this many entries."""
retry_probability = 0.2
"""Share of client submissions that resend an earlier command with its request id."""


class SimStateMachine(Protocol):
    """One replica's state machine, fed committed entries in order."""

    def apply(self, payload: bytes) -> None:
        """One committed entry (empty: a new leader's barrier, nothing to apply)."""
        ...

    def digest(self) -> bytes:
        """A canonical digest: equal states, equal digests."""
        ...

    def check(self) -> None:
        """Invariants of this replica alone; raise InvariantViolation."""
        ...


class SimPlugin(Protocol):
    @property
    def name(self) -> str: ...

    def new_replica(self, node: NodeId) -> SimStateMachine: ...

    def next_command(self, rng: random.Random, now_ms: int) -> bytes:
        """The workload: the bytes of the next command a client submits."""
        ...

    def committed(self, payload: bytes) -> None:
        """Each committed entry once, in log order (what clients can observe)."""
        ...


@dataclass(frozen=True, slots=True)
class MetadataBugs:
    """Deliberate state-machine bugs, to prove the checker can fail."""

    forget_requests: bool = False
    """apply() ignores the request-id memory: a retried command is applied again."""
    stale_epochs: bool = False
    """ReportLeader accepts an epoch below the recorded one."""
    local_clock: bool = False
    """Heartbeats record the applying replica's clock instead of the command's `now_ms`."""
    orphan_partitions: bool = False
    """DeleteStream deletes a super stream's partition stream, leaving the topology dangling."""


class _BuggyState(MetadataState):
    def __init__(self, bugs: MetadataBugs, skew_ms: int) -> None:
        super().__init__()
        self._bugs = bugs
        self._skew_ms = skew_ms

    def apply(self, command: Command) -> Result:
        if self._bugs.forget_requests:
            self._requests.clear()
        if self._bugs.local_clock and isinstance(command, Heartbeat):
            command = replace(command, now_ms=command.now_ms + self._skew_ms)
        if self._bugs.stale_epochs and isinstance(command, ReportLeader):
            stream = self.view.streams.get(command.stream)
            if stream is not None and 0 <= command.partition < len(stream.partitions):
                current = stream.partitions[command.partition].leader
                if current is not None and command.epoch < current.epoch:
                    records = list(stream.partitions)
                    records[command.partition] = replace(records[command.partition], leader=None)
                    streams = dict(self.view.streams)
                    streams[command.stream] = replace(stream, partitions=tuple(records))
                    self.view = replace(self.view, streams=streams)
        if (
            self._bugs.orphan_partitions
            and isinstance(command, DeleteStream)
            and self.view.super_stream_of(command.name) is not None
        ):
            streams = dict(self.view.streams)
            del streams[command.name]
            self.view = replace(self.view, streams=streams)
            return Applied(self.view.version)
        return super().apply(command)


_DUMMY_RAFT = codec.RaftCheckpoint(
    (codec.LogEntry(b"", 0, 0), codec.LogEntry(b"", 0, 0)), voters=()
)


class MetadataReplica:
    """One voter's MetadataState with its per-replica invariants."""

    def __init__(self, node: NodeId, plugin: MetadataPlugin) -> None:
        self.node = node
        self.plugin = plugin
        self.state: MetadataState = plugin.make_state(node)
        self.applied = 0  # commands applied
        self._epochs: dict[tuple[StreamName, PartitionId, int], LeaderEpoch] = {}
        self._heartbeats: dict[NodeId, int] = {}

    def apply(self, payload: bytes) -> None:
        if not payload:
            return  # a new leader's barrier entry
        command = codec.decode_command(payload)
        result = self.state.apply(command)
        self.check_super_streams()  # before a dump round trip, which refuses a dangling one
        self.applied += 1
        if not isinstance(command, Heartbeat | ReportLeader | ReportLeaders):
            self.plugin.result(self.node, command, result)
        if self.applied % dump_every_applied == 0:
            # What pysyncobj's full dump stores and a restart reads back.
            _, snapshot = codec.decode_dump(codec.encode_dump(_DUMMY_RAFT, self.state.snapshot()))
            state = self.plugin.make_state(self.node)
            state.restore(snapshot)
            self.state = state

    def digest(self) -> bytes:
        dump = codec.encode_dump(_DUMMY_RAFT, self.state.snapshot())
        return hashlib.blake2b(dump, digest_size=16).digest()

    def check_super_streams(self) -> None:
        view = self.state.view
        for name, topology in view.super_streams.items():
            if name in view.streams:
                raise InvariantViolation(
                    "super-stream-partitions", f"{self.node}: {name} is a stream and a super stream"
                )
            for stream in topology.partitions:
                record = view.streams.get(stream)
                if (
                    record is None
                    or record.config.partitions != 1
                    or record.created_version != topology.version
                ):
                    raise InvariantViolation(
                        "super-stream-partitions",
                        f"{self.node}: super stream {name} (version {topology.version}) lists "
                        f"{stream}, which is {record}",
                    )

    def check(self) -> None:
        view = self.state.view
        for name, record in view.streams.items():
            for number, partition in enumerate(record.partitions):
                if partition.replicas:
                    replicas = set(partition.replicas)
                    if len(replicas) != record.config.replicas or not replicas <= set(view.nodes):
                        raise InvariantViolation(
                            "placement-valid",
                            f"{self.node}: {name}/{number} placed on {partition.replicas} "
                            f"({record.config.replicas} replicas, nodes {sorted(view.nodes)})",
                        )
                if partition.leader is not None:
                    key = (name, PartitionId(number), record.created_version)
                    seen = self._epochs.get(key, LeaderEpoch(0))
                    if partition.leader.epoch < seen:
                        raise InvariantViolation(
                            "epoch-monotonic",
                            f"{self.node}: {name}/{number} leader epoch {seen} -> "
                            f"{partition.leader.epoch}",
                        )
                    self._epochs[key] = partition.leader.epoch
        for node, known in view.nodes.items():
            if known.heartbeat_ms < self._heartbeats.get(node, 0):
                raise InvariantViolation(
                    "heartbeat-monotonic",
                    f"{self.node}: {node} heartbeat {self._heartbeats[node]} -> "
                    f"{known.heartbeat_ms}",
                )
            self._heartbeats[node] = known.heartbeat_ms


_STREAMS = tuple(StreamName(f"s{i}") for i in range(4))
_NODES = tuple(NodeId(f"m{i}") for i in range(1, 6))


class MetadataPlugin:
    """The metadata service's state machine, its clients' workload and cross-replica checks."""

    name = "metadata"

    def __init__(self, bugs: MetadataBugs) -> None:
        self.bugs = bugs
        self._sent: list[bytes] = []
        self._requests = 0
        self._epochs: dict[tuple[StreamName, int], int] = {}
        self._results: dict[RequestId, tuple[NodeId, Result]] = {}
        self._skews = {node: 0 for node in _NODES}
        self.reference = MetadataState()
        """The committed state as the clients see it (fed each index once, in order)."""

    def make_state(self, node: NodeId) -> MetadataState:
        if self.bugs == MetadataBugs():
            return MetadataState()
        return _BuggyState(self.bugs, skew_ms=int(node.removeprefix("n")))

    def new_replica(self, node: NodeId) -> MetadataReplica:
        return MetadataReplica(node, self)

    def committed(self, payload: bytes) -> None:
        if payload:
            self.reference.apply(codec.decode_command(payload))

    def result(self, node: NodeId, command: Command, result: Result) -> None:
        """`request-once`: a remembered request id has one result, everywhere, on every retry."""
        first = self._results.get(command.request_id)
        if first is None:
            self._results[command.request_id] = (node, result)
        elif first[1] != result:
            raise InvariantViolation(
                "request-once",
                f"request {command.request_id} ({type(command).__name__}) gave {first[1]} on "
                f"{first[0]} but {result} on {node}",
            )

    def next_command(self, rng: random.Random, now_ms: int) -> bytes:
        if self._sent and rng.random() < retry_probability:
            return self._sent[rng.randrange(len(self._sent))]  # a retry: same request id
        self._requests += 1
        request = RequestId(f"r{self._requests}")
        node = rng.choice(_NODES)
        skew = self._skews[node] = self._skews[node] + rng.randint(-5, 50)
        now = max(0, now_ms + skew)
        kind = rng.choices(
            ("register", "heartbeat", "create", "delete", "leader", "barrier", "super", "unsuper"),
            (2, 4, 2, 1, 5, 1, 1, 1),
        )[0]
        command: Command
        if kind == "register":
            port = 5000 + _NODES.index(node) + rng.choice((0, 0, 100))  # sometimes moved
            # a moved node also names a failure domain (ADR 0032; derived, so that no seed's
            # draws shift): placement then spreads over hosts of two nodes
            domain = None if port < 5100 else f"host{_NODES.index(node) % 2}"
            command = RegisterNode(
                request,
                node,
                f"h:{port}",
                f"h:{port + 1}",
                f"h:{port + 2}",
                f"h:{port + 3}",
                now,
                failure_domain=domain,
            )
        elif kind == "heartbeat":
            command = Heartbeat(request, node, now)
        elif kind == "create":
            config = StreamConfig(
                rng.choice(_STREAMS), partitions=rng.randint(1, 4), replicas=rng.randint(1, 3)
            )
            command = CreateStream(request, config, now, default_replicas=rng.random() < 0.2)
        elif kind == "delete":
            # sometimes a super stream's partition stream (refused: delete the super stream)
            partitions = [
                name for t in self.reference.view.super_streams.values() for name in t.partitions
            ]
            command = DeleteStream(request, rng.choice(_STREAMS + tuple(partitions)))
        elif kind == "leader":
            # A partition's leader reports itself; the client knows the placement it reads.
            placed = [
                (name, number, partition.replicas)
                for name, record in sorted(self.reference.view.streams.items())
                for number, partition in enumerate(record.partitions)
                if partition.replicas
            ]
            stream, partition, replicas = (
                rng.choice(placed)
                if placed and rng.random() < 0.9
                else (rng.choice(_STREAMS), 0, _NODES)
            )
            reports = []
            for _ in range(1 if rng.random() < 0.5 else rng.randint(1, 4)):
                epoch = self._epochs.get((stream, partition), 0)
                if rng.random() < 0.7:
                    epoch += 1  # a new leader; otherwise a late or repeated report
                    self._epochs[(stream, partition)] = epoch
                reports.append(
                    LeaderReport(
                        stream,
                        PartitionId(partition),
                        rng.choice(replicas),
                        LeaderEpoch(max(0, epoch - rng.choice((0, 0, 0, 1, 2)))),
                    )
                )
                if placed and rng.random() < 0.7:  # the next one: another partition
                    stream, partition, replicas = rng.choice(placed)
            if len(reports) == 1 and rng.random() < 0.5:
                report = reports[0]
                command = ReportLeader(
                    request, report.stream, report.partition, report.leader, report.epoch
                )
            else:  # a node's coalesced reports (issue 16)
                command = ReportLeaders(request, tuple(reports))
        elif kind == "super":
            # names shared with plain streams, so clashes (failed-precondition) happen too
            name = rng.choice(_STREAMS)
            topology = (
                define(name, partitions=rng.randint(1, 3))
                if rng.random() < 0.5
                else define(name, binding_keys=("a", "b"))
            )
            config = StreamConfig(name, replicas=rng.randint(1, 3))
            command = CreateSuperStream(
                request, topology, config, now, default_replicas=rng.random() < 0.2
            )
        elif kind == "unsuper":
            command = DeleteSuperStream(request, rng.choice(_STREAMS))
        else:
            command = Barrier(request)
        payload = codec.encode_command(command)
        self._sent.append(payload)
        return payload


PLUGINS: dict[str, Callable[[MetadataBugs], SimPlugin]] = {"metadata": MetadataPlugin}
"""Replicated state machines the simulator knows; `--model` names one."""


class StateMachineCluster(SimCluster):
    """The core model's cluster (one Raft group) whose entries feed a plugin's replicas."""

    def __init__(self, seed: int, options: SimOptions, plugin: SimPlugin, **kw: bool) -> None:
        self.plugin = plugin
        self.machines: dict[NodeId, SimStateMachine] = {}
        self._digests: dict[int, tuple[NodeId, bytes]] = {}
        self._workload = random.Random(f"workload/{seed}")
        super().__init__(seed, replace(options, groups=1), **kw)

    def _start(self, node: SimNode) -> None:
        self.machines[node.id] = self.plugin.new_replica(node.id)
        super()._start(node)

    def _apply(self, node: SimNode, group: int, entry: Entry) -> None:
        super()._apply(node, group, entry)
        node_id = node.id
        machine = self.machines[node_id]
        machine.apply(bytes(entry.payload))
        machine.check()
        digest = machine.digest()
        if entry.index not in self._digests:
            self.plugin.committed(bytes(entry.payload))
        first = self._digests.setdefault(entry.index, (node_id, digest))
        if first[1] != digest:
            raise InvariantViolation(
                "metadata-determinism",
                f"{node_id} and {first[0]} applied the same {entry.index} entries but hold "
                f"different states",
            )

    def _next_payload(self, group: int) -> bytes:
        return self.plugin.next_command(self._workload, self.now_ms)


def run_state_machine_seed(
    seed: int,
    *,
    model: str = "metadata",
    nodes: int | None = None,
    steps: int = 2000,
    bugs: MetadataBugs | None = None,
    keep_trace: bool = False,
) -> tuple[SimResult, StateMachineCluster]:
    options = replace(SimOptions.draw(seed, nodes=nodes, steps=steps), membership_ms=0)
    plugin = PLUGINS[model](bugs or MetadataBugs())
    cluster = StateMachineCluster(seed, options, plugin, keep_trace=keep_trace)
    return cluster.run(), cluster
