"""The metadata state machine: streams with their placement and leaders, super streams,
consumer group definitions, and the node registry.

`MetadataState.apply(command) -> Applied | Rejected` is deterministic: the same commands in the
same order give the same state and the same results on every replica. Time enters only as the
`now_ms` a command carries (stamped by the submitting node). Invalid commands are not exceptions:
they return a `Rejected` value carrying the BrokerError code and a message for a person, so nothing
ever raises across Raft (an exception inside pysyncobj's apply would retry the entry forever,
research §6).

Every command carries a request id. The result of each applied request id is remembered (the last
`limits.request_ids_remembered_max`, oldest dropped first), so a command retried after a leader
change or a timeout returns its first result instead of being applied twice. Heartbeat,
ReportLeader and ReportLeaders are idempotent by construction (they keep a maximum) and are not
remembered, so the steady heartbeat traffic does not push real commands out of that memory.

`version` counts configuration changes (streams, placement, endpoints, leaders); listeners run
when it moves. A heartbeat only refreshes a timestamp: it replaces the view but keeps the version.

State table (A = Applied(version after), R = Rejected(code); "v+1" = version increments):

| command | when | effect | result |
|---|---|---|---|
| any but Heartbeat, ReportLeader | request id seen | none | the first result |
| CreateStream | valid, name free, R live nodes | add, place (placement.py), v+1 | A |
| CreateStream | name in use | none | R(already-exists) |
| CreateStream | invalid config | none | R(invalid-argument) |
| CreateStream | < R registered or < R alive | none | R(invalid-argument) |
| CreateStream | no node ever registered | add unplaced (transitional), v+1 | A |
| CreateStream | name is a super stream | none | R(failed-precondition) |
| LegacyCreateStream (format 1) | as CreateStream | add unplaced (replicas ()), v+1 | A |
| DeleteStream | exists | remove with placement+leaders and its groups, v+1 | A |
| DeleteStream | unknown | none | R(not-found) |
| DeleteStream | a super stream's partition | none | R(failed-precondition) |
| CreateSuperStream | valid, names free, R live nodes | add streams + topology, v+1 | A |
| CreateSuperStream | name is a super stream | none | R(already-exists) |
| CreateSuperStream | name or a partition name is a stream | none | R(failed-precondition) |
| CreateSuperStream | bad topology or config, too few nodes | none | R(invalid-argument) |
| DeleteSuperStream | exists | remove topology, its streams and their groups, v+1 | A |
| DeleteSuperStream | unknown | none | R(not-found) |
| CreateConsumerGroup | valid, stream exists, name free | add (version = v+1), v+1 | A |
| CreateConsumerGroup | invalid name or settings | none | R(invalid-argument) |
| CreateConsumerGroup | stream unknown | none | R(not-found) |
| CreateConsumerGroup | stream is a super stream | none | R(failed-precondition) |
| CreateConsumerGroup | (stream, name) defined | none | R(already-exists) |
| CreateConsumerGroup | consumer_groups_max defined | none | R(resource-limit) |
| DeleteConsumerGroup | defined | remove, v+1 | A |
| DeleteConsumerGroup | not defined | none | R(not-found) |
| RegisterNode | new or other endpoints | record, heartbeat=max(old, now_ms), v+1 | A |
| RegisterNode | same endpoints | heartbeat=max(old, now_ms) | A |
| Heartbeat | registered | heartbeat=max(old, now_ms), version kept | A |
| Heartbeat | unknown node | none | R(not-found) |
| ReportLeader | epoch > recorded or none | leader=(node, epoch), v+1 | A |
| ReportLeader | epoch < recorded, or repeat | none (stale: ignored) | A |
| ReportLeader | same epoch, other node | none | R(invalid-argument) |
| ReportLeader | bad stream/partition/node/epoch | none | R(not-found/invalid-arg.) |
| ReportLeaders | any report as ReportLeader would apply | those recorded, v+1 once | A |
| ReportLeaders | none would (all stale, repeated or invalid) | none | A |
| Barrier | - | none | A |
| SetReplicas | valid, `expected` matches (or none) | replicas, learners set; leader kept, v+1 | A |
| SetReplicas | stream unknown / node not registered | none | R(not-found) |
| SetReplicas | bad partition, empty/overlapping sets, too many | none | R(invalid-argument) |
| SetReplicas | replicas not `expected` (changed meanwhile), unplaced | none | R(failed-prec.) |
| RecordOperation | revision > recorded, or new | kept (oldest dropped past the limit) | A |
| RecordOperation | revision <= recorded | none (stale: ignored) | A |
| RecordOperation | too long (log, fields) | none | R(invalid-argument) |

SetReplicas (ADR 0022) records where a partition lives while an operator's move changes its
Raft membership: `replicas` are the voters (preferred leader first), `learners` the nodes
catching up to join. The partition's Raft log is the authority on its membership; metadata
follows it (nodes open replicas for both sets and close the others).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple, NewType

from spate.cluster.metadata import limits
from spate.cluster.metadata.placement import ReplicaSet, place
from spate.core import limits as core_limits
from spate.core.errors import (
    AlreadyExists,
    BrokerError,
    ErrorCode,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceLimitExceeded,
)
from spate.core.groups import GroupDefinition, GroupKey
from spate.core.groups import validate as validate_group
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream, define

RequestId = NewType("RequestId", str)
"""Names one command submission; a retry of the same command reuses it (a uuid4 hex by default)."""

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ENDPOINT = re.compile(r"^[^\s:]+:\d{1,5}$|^\[[0-9a-fA-F:.]+\]:\d{1,5}$")
_FAILURE_DOMAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    """The highest-epoch leader reported for a partition."""

    node: NodeId
    epoch: LeaderEpoch


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """One partition of a stream: where it lives and who last reported leading it."""

    replicas: ReplicaSet  # preferred leader first; () for a stream created by a format-1 build
    leader: PartitionLeader | None = None  # None until the first report
    learners: ReplicaSet = ()
    """Nodes hosting a replica that catches up to join (ADR 0022), not yet voters."""


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """A stream definition as stored, with the state version at which it was created.

    `created_version` tells a recreated stream from the one deleted before it under the same name.
    `partitions` has one record per partition, in partition order.
    """

    config: StreamConfig
    created_version: int
    partitions: tuple[PartitionRecord, ...]

    @property
    def placed(self) -> bool:
        """False for streams created before placement existed (format-1 commands and dumps)."""
        return all(p.replicas for p in self.partitions)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node: NodeId
    amqp: str  # host:port of the node's AMQP listener (link redirects)
    admin: str  # host:port of the node's gRPC admin listener
    replication: str | None  # host:port of its partition-replication transport; None: format 1
    metadata: str | None  # host:port of its metadata voter; None: registered by a format-1 build
    heartbeat_ms: int  # the node's wall clock at its last heartbeat or registration
    failure_domain: str | None = None
    """The host (machine) the node runs on, shared by the shard processes of one node (ADR
    0032): placement spreads a partition's replicas over distinct ones. None: registered
    without one (earlier builds, unsharded nodes): the node is its own failure domain."""

    def heartbeat_age_ms(self, now_ms: int) -> int:
        """Milliseconds since the last heartbeat by the caller's clock (0 if it is ahead)."""
        return max(0, now_ms - self.heartbeat_ms)

    def alive(self, now_ms: int, alive_ms: int = limits.node_alive_ms) -> bool:
        return self.heartbeat_age_ms(now_ms) < alive_ms


@dataclass(frozen=True, slots=True)
class MetadataView:
    """An immutable picture of the state after `version` changes; safe to hold across threads."""

    version: int
    streams: Mapping[StreamName, StreamRecord]
    nodes: Mapping[NodeId, NodeRecord]
    super_streams: Mapping[StreamName, SuperStream] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """Super-stream topologies (ADR 0014); their partition streams are in `streams`."""
    groups: Mapping[GroupKey, GroupDefinition] = field(default_factory=lambda: MappingProxyType({}))
    """Consumer groups defined ahead (ADR 0015), by (stream, group name); each stream is in
    `streams`."""
    operations: Mapping[str, OperationRecord] = field(default_factory=lambda: MappingProxyType({}))
    """The last `operations_kept_max` cluster operations by id, oldest first (ADR 0025)."""

    def super_stream_of(self, stream: StreamName) -> SuperStream | None:
        """The super stream `stream` is a partition of, if any."""
        for topology in self.super_streams.values():
            if stream in topology.partitions:
                return topology
        return None


# Read models (pure functions of a view) ---------------------------------------------------------


class Assignment(NamedTuple):
    """A partition a node hosts: `for config, partition, replicas in assignments(view, node)`
    (the node is in `replicas`, or a learner of the partition: `PartitionRecord.learners`)."""

    config: StreamConfig
    partition: PartitionId
    replicas: ReplicaSet  # preferred leader first; () for an unplaced (format-1) stream


@dataclass(frozen=True, slots=True)
class PartitionPlacement:
    stream: StreamName
    partition: PartitionId
    replicas: ReplicaSet
    leader: PartitionLeader | None
    learners: ReplicaSet = ()


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A registered node with its liveness at `now_ms` and its share of the partitions."""

    record: NodeRecord
    alive: bool
    heartbeat_age_ms: int
    partitions_hosted: int  # replicas placed on it
    partitions_led: int  # partitions whose latest leader report names it


def assignments(view: MetadataView, node: NodeId) -> list[Assignment]:
    """The partitions placed on `node`, by stream name then partition. Unplaced (format-1)
    streams are hosted by every node, as before placement existed, with replicas ()."""
    found = []
    for name in sorted(view.streams):
        record = view.streams[name]
        for index, partition in enumerate(record.partitions):
            if not partition.replicas or node in partition.replicas + partition.learners:
                found.append(Assignment(record.config, PartitionId(index), partition.replicas))
    return found


def partition_placements(
    view: MetadataView, stream: StreamName | None = None
) -> list[PartitionPlacement]:
    """Every partition (of one stream, or all) by stream name then partition; NotFound for an
    unknown stream."""
    if stream is not None and stream not in view.streams:
        raise NotFound(f"stream {stream!r} does not exist")
    names = [stream] if stream is not None else sorted(view.streams)
    return [
        PartitionPlacement(name, PartitionId(index), p.replicas, p.leader, p.learners)
        for name in names
        for index, p in enumerate(view.streams[name].partitions)
    ]


def node_statuses(
    view: MetadataView, now_ms: int, alive_ms: int = limits.node_alive_ms
) -> list[NodeStatus]:
    """Every registered node, sorted by id, judged alive by the caller's clock."""
    hosted: dict[NodeId, int] = {}
    led: dict[NodeId, int] = {}
    for record in view.streams.values():
        for partition in record.partitions:
            for node in partition.replicas + partition.learners:
                hosted[node] = hosted.get(node, 0) + 1
            if partition.leader is not None:
                led[partition.leader.node] = led.get(partition.leader.node, 0) + 1
    return [
        NodeStatus(
            record=view.nodes[node],
            alive=view.nodes[node].alive(now_ms, alive_ms),
            heartbeat_age_ms=view.nodes[node].heartbeat_age_ms(now_ms),
            partitions_hosted=hosted.get(node, 0),
            partitions_led=led.get(node, 0),
        )
        for node in sorted(view.nodes)
    ]


# Commands ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateStream:
    request_id: RequestId
    config: StreamConfig
    now_ms: int  # the submitter's clock: nodes with a heartbeat within node_alive_ms are live
    default_replicas: bool = False  # replace config.replicas by min(3, registered nodes)


@dataclass(frozen=True, slots=True)
class LegacyCreateStream:
    """A format-1 CreateStream from an old journal: what it meant then (no placement)."""

    request_id: RequestId
    config: StreamConfig


@dataclass(frozen=True, slots=True)
class DeleteStream:
    request_id: RequestId
    name: StreamName


@dataclass(frozen=True, slots=True)
class CreateSuperStream:
    """A super stream and its partition streams, in one transition (ADR 0014)."""

    request_id: RequestId
    topology: SuperStream  # version 0; the state stamps the version that creates it
    config: StreamConfig
    """Each partition stream's definition but its name (`config.name` is the super stream's;
    `partitions` must be 1)."""
    now_ms: int
    default_replicas: bool = False


@dataclass(frozen=True, slots=True)
class DeleteSuperStream:
    """Removes the topology and its partition streams."""

    request_id: RequestId
    name: StreamName


@dataclass(frozen=True, slots=True)
class CreateConsumerGroup:
    """Define a consumer group ahead of its first attach (ADR 0015)."""

    request_id: RequestId
    group: GroupDefinition  # version 0; the state stamps the version that creates it


@dataclass(frozen=True, slots=True)
class DeleteConsumerGroup:
    """Forget a group's definition (its offsets and epochs stay in the partitions' logs)."""

    request_id: RequestId
    stream: StreamName
    name: str


@dataclass(frozen=True, slots=True)
class RegisterNode:
    request_id: RequestId
    node: NodeId
    amqp: str
    admin: str
    replication: str | None  # None only in format-1 records
    metadata: str | None  # None only in format-1 records
    now_ms: int
    failure_domain: str | None = None  # ADR 0032; None: the node is its own failure domain


@dataclass(frozen=True, slots=True)
class Heartbeat:
    request_id: RequestId
    node: NodeId
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReportLeader:
    """Sent by a partition's leader when it becomes leader; the highest epoch wins."""

    request_id: RequestId
    stream: StreamName
    partition: PartitionId
    leader: NodeId
    epoch: LeaderEpoch


@dataclass(frozen=True, slots=True)
class LeaderReport:
    """One partition's leadership claim inside a ReportLeaders batch."""

    stream: StreamName
    partition: PartitionId
    leader: NodeId
    epoch: LeaderEpoch


@dataclass(frozen=True, slots=True)
class ReportLeaders:
    """Many leadership claims in one command (a node coalesces the leader changes of a short
    window, issue 16): each report is judged as a ReportLeader would be, on its own; the
    invalid and stale ones are skipped, the others applied, and the version moves once."""

    request_id: RequestId
    reports: tuple[LeaderReport, ...]


@dataclass(frozen=True, slots=True)
class SetReplicas:
    """Record a partition's replica set during a move (ADR 0022)."""

    request_id: RequestId
    stream: StreamName
    partition: PartitionId
    replicas: ReplicaSet
    learners: ReplicaSet = ()
    expected: ReplicaSet | None = None
    """Compare-and-set: refused unless the partition's replicas are these (None: any)."""


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """A cluster operation as the node running it last published it (ADR 0025): kept in the
    metadata service so any node answers `GetOperation`, across restarts of that node."""

    id: str
    node: NodeId  # the node running it
    kind: str
    target: str
    state: str  # "running", "succeeded", "failed"
    step: str
    progress_permille: int  # 0..1000
    error: str
    error_code: str
    started_ms: int
    finished_ms: int
    log: tuple[str, ...]  # the last `operation_log_lines_max` steps
    revision: int  # increases with every publication by its node

    def validate(self) -> None:
        if not self.id or not self.node or len(self.id) > limits.operation_text_max:
            raise InvalidArgument("operation: id and node required, id at most 256 characters")
        if len(self.log) > limits.operation_log_lines_max or any(
            len(text) > limits.operation_text_max
            for text in (self.kind, self.target, self.step, self.error, *self.log)
        ):
            raise InvalidArgument(
                f"operation: at most {limits.operation_log_lines_max} log lines of "
                f"{limits.operation_text_max} characters"
            )
        if not 0 <= self.progress_permille <= 1000:
            raise InvalidArgument("operation: progress_permille must be 0..1000")


@dataclass(frozen=True, slots=True)
class RecordOperation:
    """Publish an operation's state (upsert by id, keeping the highest revision)."""

    request_id: RequestId
    operation: OperationRecord


@dataclass(frozen=True, slots=True)
class Barrier:
    """Changes nothing; once applied locally, every command committed before it is visible here."""

    request_id: RequestId


Command = (
    CreateStream
    | LegacyCreateStream
    | DeleteStream
    | CreateSuperStream
    | DeleteSuperStream
    | CreateConsumerGroup
    | DeleteConsumerGroup
    | RegisterNode
    | Heartbeat
    | ReportLeader
    | ReportLeaders
    | Barrier
    | SetReplicas
    | RecordOperation
)

_NOT_REMEMBERED = (Heartbeat, ReportLeader, ReportLeaders, RecordOperation)
"""Idempotent commands (they keep a maximum): applying one twice changes nothing."""

# Results ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    version: int  # the state version right after the command


@dataclass(frozen=True, slots=True)
class Rejected:
    code: ErrorCode
    message: str

    def error(self) -> BrokerError:
        """The BrokerError to raise in the shell that submitted the command."""
        return ERROR_TYPES.get(self.code, BrokerError)(self.message)

    @staticmethod
    def of(error: BrokerError) -> Rejected:
        return Rejected(error.code, error.message)


Result = Applied | Rejected

ERROR_TYPES: Mapping[ErrorCode, type[BrokerError]] = MappingProxyType(
    {
        ErrorCode.NOT_FOUND: NotFound,
        ErrorCode.ALREADY_EXISTS: AlreadyExists,
        ErrorCode.INVALID_ARGUMENT: InvalidArgument,
        ErrorCode.RESOURCE_LIMIT: ResourceLimitExceeded,
        ErrorCode.FAILED_PRECONDITION: FailedPrecondition,
    }
)
"""The error codes the state machine produces and the BrokerError each one becomes."""


@dataclass(frozen=True, slots=True)
class MetadataSnapshot:
    """Everything `MetadataState` holds, in a canonical order (what the full dump stores)."""

    version: int
    streams: tuple[StreamRecord, ...]  # sorted by name
    nodes: tuple[NodeRecord, ...]  # sorted by node id
    requests: tuple[tuple[RequestId, Result], ...]  # oldest first
    super_streams: tuple[SuperStream, ...] = ()  # sorted by name
    groups: tuple[GroupDefinition, ...] = ()  # sorted by (stream, name)
    operations: tuple[OperationRecord, ...] = ()  # oldest first


@dataclass(frozen=True, slots=True)
class StreamChanges:
    created: tuple[StreamConfig, ...]
    deleted: tuple[StreamName, ...]


def stream_changes(old: MetadataView, new: MetadataView) -> StreamChanges:
    """Streams that appeared and disappeared between two views (a recreated stream is both)."""
    deleted = tuple(
        name
        for name, record in old.streams.items()
        if name not in new.streams or new.streams[name].created_version != record.created_version
    )
    created = tuple(
        record.config
        for name, record in new.streams.items()
        if name not in old.streams or old.streams[name].created_version != record.created_version
    )
    return StreamChanges(created=created, deleted=deleted)


EMPTY_VIEW = MetadataView(version=0, streams=MappingProxyType({}), nodes=MappingProxyType({}))


class MetadataState:
    """The replicated state. Not thread-safe for writers; `view` may be read from any thread,
    because every change replaces it with a new immutable MetadataView."""

    def __init__(self, snapshot: MetadataSnapshot | None = None) -> None:
        self._requests: OrderedDict[RequestId, Result] = OrderedDict()
        self.view = EMPTY_VIEW
        if snapshot is not None:
            self.restore(snapshot)

    def restore(self, snapshot: MetadataSnapshot) -> None:
        """Replace the whole state with a snapshot's."""
        assert len(snapshot.requests) <= limits.request_ids_remembered_max
        for record in snapshot.streams:
            assert len(record.partitions) == record.config.partitions, record
        self._requests = OrderedDict(snapshot.requests)
        self.view = MetadataView(
            version=snapshot.version,
            streams=MappingProxyType({r.config.name: r for r in snapshot.streams}),
            nodes=MappingProxyType({n.node: n for n in snapshot.nodes}),
            super_streams=MappingProxyType({t.name: t for t in snapshot.super_streams}),
            groups=MappingProxyType({g.key: g for g in snapshot.groups}),
            operations=MappingProxyType({o.id: o for o in snapshot.operations}),
        )
        for topology in snapshot.super_streams:
            for name in topology.partitions:
                assert name in self.view.streams, (topology.name, name)
        for group in snapshot.groups:
            assert group.stream in self.view.streams, group

    def snapshot(self) -> MetadataSnapshot:
        view = self.view
        return MetadataSnapshot(
            version=view.version,
            streams=tuple(view.streams[name] for name in sorted(view.streams)),
            nodes=tuple(view.nodes[node] for node in sorted(view.nodes)),
            requests=tuple(self._requests.items()),
            super_streams=tuple(view.super_streams[name] for name in sorted(view.super_streams)),
            groups=tuple(view.groups[key] for key in sorted(view.groups)),
            operations=tuple(view.operations.values()),
        )

    def apply(self, command: Command) -> Result:
        remember = not isinstance(command, _NOT_REMEMBERED)
        if remember:
            seen = self._requests.get(command.request_id)
            if seen is not None:
                return seen
        try:
            result = self._decide(command)
        except BrokerError as error:
            result = Rejected.of(error)
        if remember:
            self._requests[command.request_id] = result
            while len(self._requests) > limits.request_ids_remembered_max:
                self._requests.popitem(last=False)
        return result

    def _decide(self, command: Command) -> Result:
        view = self.view
        version = view.version + 1
        if isinstance(command, CreateStream | LegacyCreateStream):
            if isinstance(command, CreateStream):
                config = self._placeable_config(command)
                partitions = tuple(
                    PartitionRecord(replicas)
                    for replicas in place(
                        config.partitions,
                        config.replicas,
                        self._live_nodes(command.now_ms),
                        start=sum(r.config.partitions for r in view.streams.values()),
                        hosts=self._failure_domains(),
                    )
                )
            else:  # format 1: unplaced
                config = command.config
                config.validate()
                self._check_new_stream(config)
                partitions = (PartitionRecord(()),) * config.partitions
            streams = dict(view.streams)
            streams[config.name] = StreamRecord(config, version, partitions)
            self.view = replace(view, version=version, streams=MappingProxyType(streams))
            return Applied(version)
        if isinstance(command, DeleteStream):
            if command.name not in view.streams:
                if command.name in view.super_streams:
                    raise FailedPrecondition(
                        f"{command.name!r} is a super stream, not a stream: delete it with "
                        f"`spate superstream delete {command.name}`"
                    )
                raise NotFound(f"stream {command.name!r} does not exist")
            owner = view.super_stream_of(command.name)
            if owner is not None:
                raise FailedPrecondition(
                    f"stream {command.name!r} is a partition of super stream {owner.name!r}: "
                    f"delete the super stream (`spate superstream delete {owner.name}`)"
                )
            streams = dict(view.streams)
            del streams[command.name]
            self.view = replace(
                view,
                version=version,
                streams=MappingProxyType(streams),
                groups=_groups_without(view.groups, {command.name}),
            )
            return Applied(version)
        if isinstance(command, CreateSuperStream):
            return self._create_super_stream(command)
        if isinstance(command, DeleteSuperStream):
            topology = view.super_streams.get(command.name)
            if topology is None:
                raise NotFound(f"super stream {command.name!r} does not exist")
            streams = dict(view.streams)
            for name in topology.partitions:
                streams.pop(name, None)
            supers = dict(view.super_streams)
            del supers[command.name]
            self.view = replace(
                view,
                version=version,
                streams=MappingProxyType(streams),
                super_streams=MappingProxyType(supers),
                groups=_groups_without(view.groups, set(topology.partitions)),
            )
            return Applied(version)
        if isinstance(command, CreateConsumerGroup):
            return self._create_group(command)
        if isinstance(command, DeleteConsumerGroup):
            key = (command.stream, command.name)
            if key not in view.groups:
                raise NotFound(
                    f"consumer group {command.name!r} is not defined on stream {command.stream!r}"
                )
            groups = dict(view.groups)
            del groups[key]
            self.view = replace(view, version=version, groups=MappingProxyType(groups))
            return Applied(version)
        if isinstance(command, RegisterNode):
            return self._register(command)
        if isinstance(command, Heartbeat):
            known = view.nodes.get(command.node)
            if known is None:
                raise NotFound(
                    f"node {command.node!r} is not registered (a node registers when it starts)"
                )
            if command.now_ms > known.heartbeat_ms:
                nodes = dict(view.nodes)
                nodes[command.node] = replace(known, heartbeat_ms=command.now_ms)
                self.view = replace(view, nodes=MappingProxyType(nodes))
            return Applied(view.version)
        if isinstance(command, ReportLeader):
            return self._report_leader(command)
        if isinstance(command, ReportLeaders):
            return self._report_leaders(command)
        if isinstance(command, SetReplicas):
            return self._set_replicas(command)
        if isinstance(command, RecordOperation):
            record = command.operation
            record.validate()
            published = view.operations.get(record.id)
            if published is not None and published.revision >= record.revision:
                return Applied(view.version)  # stale: a newer publication came first
            operations = dict(view.operations)
            operations.pop(record.id, None)
            operations[record.id] = record  # newest last
            while len(operations) > limits.operations_kept_max:
                del operations[next(iter(operations))]
            self.view = replace(view, operations=MappingProxyType(operations))
            return Applied(view.version)
        assert isinstance(command, Barrier), command
        return Applied(view.version)

    def _set_replicas(self, command: SetReplicas) -> Result:
        view = self.view
        record = view.streams.get(command.stream)
        if record is None:
            raise NotFound(f"stream {command.stream!r} does not exist")
        if not 0 <= command.partition < len(record.partitions):
            raise InvalidArgument(
                f"partition: {command.stream!r} has partitions 0 to {len(record.partitions) - 1}"
            )
        current = record.partitions[command.partition]
        if not current.replicas:
            raise FailedPrecondition(
                f"{command.stream!r} was created before placement existed: it has no replica set"
            )
        if command.expected is not None and current.replicas != command.expected:
            raise FailedPrecondition(
                f"{command.stream}/{command.partition} is on {','.join(current.replicas)} now, "
                f"not {','.join(command.expected)}: another change came first"
            )
        members = command.replicas + command.learners
        if not command.replicas or len(set(members)) != len(members):
            raise InvalidArgument(
                "replicas: need at least one, and no node twice across replicas and learners"
            )
        if len(command.replicas) > core_limits.replicas_max or len(members) > (
            core_limits.replicas_max + 2
        ):
            raise InvalidArgument(
                f"replicas: at most {core_limits.replicas_max} voters and 2 learners"
            )
        for node in members:
            if node not in view.nodes:
                raise NotFound(f"node {node!r} is not registered")
        partitions = list(record.partitions)
        partitions[command.partition] = PartitionRecord(
            command.replicas, current.leader, command.learners
        )
        streams = dict(view.streams)
        streams[command.stream] = replace(record, partitions=tuple(partitions))
        version = view.version + 1
        self.view = replace(view, version=version, streams=MappingProxyType(streams))
        return Applied(version)

    def _check_new_stream(self, config: StreamConfig) -> None:
        if config.name in self.view.streams:
            raise AlreadyExists(f"stream {config.name!r} already exists")
        if config.name in self.view.super_streams:
            raise FailedPrecondition(
                f"{config.name!r} is a super stream: streams and super streams share one "
                "namespace (the AMQP address); pick another name"
            )
        if len(self.view.streams) >= limits.streams_max:
            raise ResourceLimitExceeded(
                f"the cluster holds the most streams it may ({limits.streams_max}); "
                "delete one first"
            )

    def _failure_domains(self) -> dict[NodeId, str | None]:
        return {n: record.failure_domain for n, record in self.view.nodes.items()}

    def _live_nodes(self, now_ms: int) -> list[NodeId]:
        return sorted(n for n, record in self.view.nodes.items() if record.alive(now_ms))

    def _create_super_stream(self, command: CreateSuperStream) -> Result:
        view = self.view
        asked = command.topology
        # the same rules as `define` (the command may come from any submitter)
        topology = define(asked.name, binding_keys=asked.binding_keys, routing=asked.routing)
        if topology.partitions != asked.partitions:
            raise InvalidArgument(
                f"super stream {asked.name!r}: partition streams must be named NAME-KEY "
                f"({', '.join(topology.partitions[:3])}, ...)"
            )
        if command.config.partitions != 1:
            raise InvalidArgument(
                "partitions: each partition stream of a super stream has one partition, "
                f"not {command.config.partitions}"
            )
        if topology.name in view.super_streams:
            raise AlreadyExists(f"super stream {topology.name!r} already exists")
        if topology.name in view.streams:
            raise FailedPrecondition(
                f"a stream named {topology.name!r} exists: streams and super streams share one "
                "namespace (the AMQP address); delete it or pick another name"
            )
        taken = [name for name in topology.partitions if name in view.streams]
        if taken:
            raise FailedPrecondition(
                f"super stream {topology.name!r} needs the partition stream name"
                f"{'s' if len(taken) > 1 else ''} {', '.join(map(repr, taken[:5]))}, "
                f"already taken by {'streams' if len(taken) > 1 else 'a stream'}"
            )
        clash = [name for name in topology.partitions if name in view.super_streams]
        if clash:
            raise FailedPrecondition(
                f"super stream {topology.name!r} needs the partition stream name "
                f"{clash[0]!r}, which is a super stream"
            )
        if len(view.streams) + len(topology.partitions) > limits.streams_max:
            raise ResourceLimitExceeded(
                f"the cluster holds {len(view.streams)} streams; {len(topology.partitions)} "
                f"more would pass the limit ({limits.streams_max})"
            )
        version = view.version + 1
        template = replace(command.config, name=topology.partitions[0])
        template = self._placeable(template, command.default_replicas, command.now_ms)
        live = self._live_nodes(command.now_ms)
        start = sum(r.config.partitions for r in view.streams.values())
        streams = dict(view.streams)
        for index, name in enumerate(topology.partitions):
            config = replace(template, name=name)
            (replicas,) = place(
                1, config.replicas, live, start=start + index, hosts=self._failure_domains()
            )
            streams[name] = StreamRecord(config, version, (PartitionRecord(replicas),))
        supers = dict(view.super_streams)
        supers[topology.name] = replace(topology, version=version)
        self.view = replace(
            view,
            version=version,
            streams=MappingProxyType(streams),
            super_streams=MappingProxyType(supers),
        )
        return Applied(version)

    def _create_group(self, command: CreateConsumerGroup) -> Result:
        view = self.view
        group = validate_group(command.group)  # the command may come from any submitter
        if group.stream not in view.streams:
            if group.stream in view.super_streams:
                raise FailedPrecondition(
                    f"{group.stream!r} is a super stream: define the group on its partition "
                    "streams (consumers attach to those)"
                )
            raise NotFound(f"stream {group.stream!r} does not exist")
        if group.key in view.groups:
            raise AlreadyExists(
                f"consumer group {group.name!r} is already defined on stream {group.stream!r}"
            )
        if len(view.groups) >= limits.consumer_groups_max:
            raise ResourceLimitExceeded(
                f"the cluster holds the most consumer group definitions it may "
                f"({limits.consumer_groups_max}); delete one first"
            )
        version = view.version + 1
        groups = dict(view.groups)
        groups[group.key] = replace(group, version=version)
        self.view = replace(view, version=version, groups=MappingProxyType(groups))
        return Applied(version)

    def _placeable_config(self, command: CreateStream) -> StreamConfig:
        """The config to store (replicas defaulted), or InvalidArgument if it cannot be placed."""
        return self._placeable(command.config, command.default_replicas, command.now_ms)

    def _placeable(self, config: StreamConfig, default_replicas: bool, now_ms: int) -> StreamConfig:
        registered = len(self.view.nodes)
        if default_replicas:
            if registered == 0:
                raise InvalidArgument(
                    "the cluster has no registered nodes to place the stream on: start a node"
                )
            config = replace(config, replicas=min(limits.default_replicas_max, registered))
        config.validate()
        self._check_new_stream(config)
        wanted = config.replicas
        if registered < wanted:
            hint = f"use --replicas {registered}" if registered else "start a node first"
            raise InvalidArgument(
                f"stream needs {wanted} replica{'s' if wanted != 1 else ''} but the cluster has "
                f"{registered} registered node{'s' if registered != 1 else ''}: start more nodes "
                f"or {hint}"
            )
        live = self._live_nodes(now_ms)
        if len(live) < wanted:
            dead = sorted(set(self.view.nodes) - set(live))
            silent = ", ".join(
                f"{node} silent for {self.view.nodes[node].heartbeat_age_ms(now_ms) // 1000} s"
                for node in dead
            )
            hint = f" or use --replicas {len(live)}" if live else ""
            raise InvalidArgument(
                f"stream needs {wanted} replica{'s' if wanted != 1 else ''} but only {len(live)} "
                f"of the {registered} registered nodes are alive ({silent}): restart "
                f"{'it' if len(dead) == 1 else 'them'}{hint}"
            )
        return config

    def _register(self, command: RegisterNode) -> Result:
        view = self.view
        _validate_node(command)
        known = view.nodes.get(command.node)
        if known is None and len(view.nodes) >= limits.nodes_max:
            raise ResourceLimitExceeded(
                f"the cluster holds the most nodes it may ({limits.nodes_max})"
            )
        record = NodeRecord(
            node=command.node,
            amqp=command.amqp,
            admin=command.admin,
            replication=command.replication,
            metadata=command.metadata,
            failure_domain=command.failure_domain,
            # A registration applied late (retried after a leader change) never moves the
            # heartbeat back: the node would look dead (found by the metadata simulator).
            heartbeat_ms=command.now_ms
            if known is None
            else max(known.heartbeat_ms, command.now_ms),
        )
        nodes = dict(view.nodes)
        if known is not None and replace(known, heartbeat_ms=record.heartbeat_ms) == record:
            # Same endpoints: a restart on the same ports is only a heartbeat.
            nodes[command.node] = replace(
                known, heartbeat_ms=max(known.heartbeat_ms, command.now_ms)
            )
            self.view = replace(view, nodes=MappingProxyType(nodes))
            return Applied(view.version)
        version = view.version + 1
        nodes[command.node] = record
        self.view = replace(view, version=version, nodes=MappingProxyType(nodes))
        return Applied(version)

    def _report_leader(self, command: ReportLeader) -> Result:
        view = self.view
        report = LeaderReport(command.stream, command.partition, command.leader, command.epoch)
        stream = self._judge_report(report)
        if stream is None:
            return Applied(view.version)  # stale or repeated: ignored
        return self._record_leaders({command.stream: {command.partition: report}})

    def _report_leaders(self, command: ReportLeaders) -> Result:
        """Each report judged alone (`_judge_report`), the valid and new ones recorded at once:
        one copy per stream touched, not one per report."""
        wanted: dict[StreamName, dict[PartitionId, LeaderReport]] = {}
        for report in command.reports:
            try:
                if self._judge_report(report) is None:
                    continue
            except BrokerError:
                continue  # invalid here (e.g. the stream was deleted meanwhile): skipped
            earlier = wanted.setdefault(report.stream, {}).get(report.partition)
            if earlier is not None and (
                report.epoch < earlier.epoch
                or (report.epoch == earlier.epoch and report.leader != earlier.leader)
            ):
                continue  # a lower (or conflicting same-epoch) claim in the same batch
            wanted[report.stream][report.partition] = report
        if not wanted:
            return Applied(self.view.version)
        return self._record_leaders(wanted)

    def _judge_report(self, report: LeaderReport) -> StreamRecord | None:
        """The stream to record `report` in; None when stale or repeated; BrokerError when
        invalid (unknown stream, partition out of range, not a replica, conflicting epoch)."""
        stream = self.view.streams.get(report.stream)
        if stream is None:
            raise NotFound(f"stream {report.stream!r} does not exist")
        if not 0 <= report.partition < stream.config.partitions:
            raise InvalidArgument(
                f"stream {report.stream!r} has partitions 0-{stream.config.partitions - 1}, "
                f"not {report.partition}"
            )
        if report.epoch < 0:
            raise InvalidArgument(f"leader epoch must not be negative, got {report.epoch}")
        where = f"{report.stream}/{report.partition}"
        partition = stream.partitions[report.partition]
        if partition.replicas and report.leader not in partition.replicas + partition.learners:
            raise InvalidArgument(
                f"node {report.leader!r} is not a replica of {where} "
                f"(replicas {', '.join(partition.replicas)})"
            )
        if not _NODE_ID.match(report.leader):
            raise InvalidArgument(f"invalid node id {report.leader!r}")
        current = partition.leader
        if current is not None and report.epoch <= current.epoch:
            if report.epoch == current.epoch and report.leader != current.node:
                raise InvalidArgument(
                    f"conflicting leader report for {where}: epoch {report.epoch} is led by "
                    f"{current.node}, not {report.leader}"
                )
            return None
        return stream

    def _record_leaders(self, wanted: dict[StreamName, dict[PartitionId, LeaderReport]]) -> Result:
        view = self.view
        version = view.version + 1
        streams = dict(view.streams)
        for name in sorted(wanted):
            stream = streams[name]
            records = list(stream.partitions)
            for index, report in wanted[name].items():
                records[index] = replace(
                    records[index], leader=PartitionLeader(report.leader, report.epoch)
                )
            streams[name] = replace(stream, partitions=tuple(records))
        self.view = replace(view, version=version, streams=MappingProxyType(streams))
        return Applied(version)


def _groups_without(
    groups: Mapping[GroupKey, GroupDefinition], streams: set[StreamName]
) -> Mapping[GroupKey, GroupDefinition]:
    """The definitions but those on `streams` (deleted with their stream)."""
    if not any(stream in streams for stream, _ in groups):
        return groups
    return MappingProxyType({k: g for k, g in groups.items() if k[0] not in streams})


def _validate_node(command: RegisterNode) -> None:
    if not _NODE_ID.match(command.node):
        raise InvalidArgument(
            f"invalid node id {command.node!r}: use 1-64 letters, digits, "
            "'-' or '_', starting with a letter or digit"
        )
    for label, endpoint in (
        ("AMQP", command.amqp),
        ("admin", command.admin),
        ("replication", command.replication),
        ("metadata", command.metadata),
    ):
        if endpoint is None:
            continue  # format-1 registrations carry only AMQP and admin
        if not _ENDPOINT.match(endpoint) or not 0 < int(endpoint.rsplit(":", 1)[1]) < 65536:
            raise InvalidArgument(f"invalid {label} endpoint {endpoint!r}: expected HOST:PORT")
    if command.failure_domain is not None and not _FAILURE_DOMAIN.match(command.failure_domain):
        raise InvalidArgument(
            f"invalid failure domain {command.failure_domain!r}: use 1-253 letters, digits, "
            "'.', '-' or '_' (the host name is a good one)"
        )
    if command.now_ms < 0:
        raise InvalidArgument(f"heartbeat time must not be negative, got {command.now_ms}")
