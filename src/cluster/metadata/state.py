"""The metadata state machine: stream definitions and the node registry, decided without I/O.

`MetadataState.apply(command)` is deterministic: the same commands in the same order give the same
state and the same results on every replica. Invalid commands are not exceptions: they return a
`Rejected` value carrying the BrokerError code and a message for a person, so nothing ever raises
across Raft (an exception inside pysyncobj's apply would retry the entry forever, research §6).

Every command carries a request id. The result of each applied request id is remembered (the last
`limits.request_ids_remembered_max`, oldest dropped first), so a command retried after a leader
change or a timeout returns its first result instead of being applied twice.

State table (version counts state changes; results are values):

| command | precondition | effect | result |
|---|---|---|---|
| any, request id seen before | - | none | the first result |
| CreateStream(config) | config valid, name unused | stream added, version+1 | Applied(version) |
| CreateStream(config) | name in use | none | Rejected(already-exists) |
| CreateStream(config) | config invalid | none | Rejected(invalid-argument) |
| DeleteStream(name) | stream exists | stream removed, version+1 | Applied(version) |
| DeleteStream(name) | no such stream | none | Rejected(not-found) |
| RegisterNode(node, ...) | fields valid | node record set, version+1 | Applied(version) |
| Barrier | - | none | Applied(version) |
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NewType

from spate.cluster.metadata import limits
from spate.core.errors import (
    AlreadyExists,
    BrokerError,
    ErrorCode,
    InvalidArgument,
    NotFound,
    ResourceLimitExceeded,
)
from spate.core.ids import NodeId, StreamName
from spate.core.streams import StreamConfig

RequestId = NewType("RequestId", str)
"""Names one command submission; a retry of the same command reuses it (a uuid4 hex by default)."""

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ENDPOINT = re.compile(r"^[^\s:]+:\d{1,5}$|^\[[0-9a-fA-F:.]+\]:\d{1,5}$")


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """A stream definition as stored, with the state version at which it was created.

    `created_version` tells a recreated stream from the one deleted before it under the same name.
    """

    config: StreamConfig
    created_version: int


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node: NodeId
    amqp: str  # host:port of the node's AMQP listener
    admin: str  # host:port of the node's gRPC admin listener
    heartbeat_ms: int  # wall clock of the submitting node at its last registration


@dataclass(frozen=True, slots=True)
class MetadataView:
    """An immutable picture of the state after `version` changes; safe to hold across threads."""

    version: int
    streams: Mapping[StreamName, StreamRecord]
    nodes: Mapping[NodeId, NodeRecord]


# Commands ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateStream:
    request_id: RequestId
    config: StreamConfig


@dataclass(frozen=True, slots=True)
class DeleteStream:
    request_id: RequestId
    name: StreamName


@dataclass(frozen=True, slots=True)
class RegisterNode:
    request_id: RequestId
    node: NodeId
    amqp: str
    admin: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class Barrier:
    """Changes nothing; once applied locally, every command committed before it is visible here."""

    request_id: RequestId


Command = CreateStream | DeleteStream | RegisterNode | Barrier

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
        self._requests = OrderedDict(snapshot.requests)
        self.view = MetadataView(
            version=snapshot.version,
            streams=MappingProxyType({r.config.name: r for r in snapshot.streams}),
            nodes=MappingProxyType({n.node: n for n in snapshot.nodes}),
        )

    def snapshot(self) -> MetadataSnapshot:
        view = self.view
        return MetadataSnapshot(
            version=view.version,
            streams=tuple(view.streams[name] for name in sorted(view.streams)),
            nodes=tuple(view.nodes[node] for node in sorted(view.nodes)),
            requests=tuple(self._requests.items()),
        )

    def apply(self, command: Command) -> Result:
        seen = self._requests.get(command.request_id)
        if seen is not None:
            return seen
        try:
            result = self._decide(command)
        except BrokerError as error:
            result = Rejected.of(error)
        self._requests[command.request_id] = result
        while len(self._requests) > limits.request_ids_remembered_max:
            self._requests.popitem(last=False)
        return result

    def _decide(self, command: Command) -> Result:
        view = self.view
        version = view.version + 1
        if isinstance(command, CreateStream):
            config = command.config
            config.validate()
            if config.name in view.streams:
                raise AlreadyExists(f"stream {config.name!r} already exists")
            if len(view.streams) >= limits.streams_max:
                raise ResourceLimitExceeded(
                    f"the cluster holds the most streams it may ({limits.streams_max}); "
                    "delete one first"
                )
            streams = dict(view.streams)
            streams[config.name] = StreamRecord(config, created_version=version)
            self.view = MetadataView(version, MappingProxyType(streams), view.nodes)
            return Applied(version)
        if isinstance(command, DeleteStream):
            if command.name not in view.streams:
                raise NotFound(f"stream {command.name!r} does not exist")
            streams = dict(view.streams)
            del streams[command.name]
            self.view = MetadataView(version, MappingProxyType(streams), view.nodes)
            return Applied(version)
        if isinstance(command, RegisterNode):
            _validate_node(command)
            if command.node not in view.nodes and len(view.nodes) >= limits.nodes_max:
                raise ResourceLimitExceeded(
                    f"the cluster holds the most nodes it may ({limits.nodes_max})"
                )
            nodes = dict(view.nodes)
            nodes[command.node] = NodeRecord(
                command.node, command.amqp, command.admin, command.now_ms
            )
            self.view = MetadataView(version, view.streams, MappingProxyType(nodes))
            return Applied(version)
        assert isinstance(command, Barrier), command
        return Applied(view.version)


def _validate_node(command: RegisterNode) -> None:
    if not _NODE_ID.match(command.node):
        raise InvalidArgument(
            f"invalid node id {command.node!r}: use 1-64 letters, digits, "
            "'-' or '_', starting with a letter or digit"
        )
    for label, endpoint in (("AMQP", command.amqp), ("admin", command.admin)):
        if not _ENDPOINT.match(endpoint) or not 0 < int(endpoint.rsplit(":", 1)[1]) < 65536:
            raise InvalidArgument(f"invalid {label} endpoint {endpoint!r}: expected HOST:PORT")
    if command.now_ms < 0:
        raise InvalidArgument(f"heartbeat time must not be negative, got {command.now_ms}")
