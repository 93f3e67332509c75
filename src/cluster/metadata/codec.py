"""Bytes for metadata commands, results and the full dump: our format, never pickle.

Why this format, and what else was considered: docs/adr/0003-metadata-codec.md.

Record (a command in the Raft log, or a result):

    offset  size  field
    0       1     format version: 0x02 written; 0x01 (earlier builds) still read
    1       1     tag (below)
    2       n     body: canonical JSON object (UTF-8, ASCII only, keys sorted, no whitespace)

    Format 2 (written by this build):
    tag   record         body
    0x01  CreateStream   {"config": CONFIG, "default_replicas": bool, "now_ms": int,
                          "request_id": str}
    0x02  DeleteStream   {"name": str, "request_id": str}
    0x03  RegisterNode   {"admin": str, "amqp": str, "metadata": str|null, "node": str,
                          "now_ms": int, "replication": str|null, "request_id": str,
                          "failure_domain": str}   (failure_domain: ADR 0032, written only
                          when the node names one, so an unsharded node's record is what
                          earlier builds wrote and read; read with or without it)
    0x04  Barrier        {"request_id": str}
    0x05  Heartbeat      {"node": str, "now_ms": int, "request_id": str}
    0x06  ReportLeader   {"epoch": int, "leader": str, "partition": int, "request_id": str,
                          "stream": str}
    0x07  CreateSuperStream {"config": CONFIG, "default_replicas": bool, "now_ms": int,
                          "request_id": str, "super_stream": SUPER}   (SUPER's version 0)
    0x08  DeleteSuperStream {"name": str, "request_id": str}
    0x09  CreateConsumerGroup {"group": GROUP, "request_id": str}   (GROUP's version 0)
    0x0a  DeleteConsumerGroup {"name": str, "request_id": str, "stream": str}
    0x0b  SetReplicas    {"expected": [str...]|null, "learners": [str...], "partition": int,
                          "replicas": [str...], "request_id": str, "stream": str}  (ADR 0022)
    0x0c  RecordOperation {"operation": OPERATION, "request_id": str}  (ADR 0025)
    0x0d  ReportLeaders  {"reports": [[stream str, partition int, leader str, epoch int]...],
                          "request_id": str}   (issue 16; a build without it rejects it)
    0x41  Applied        {"version": int}
    0x42  Rejected       {"code": ErrorCode value e.g. "not-found", "message": str}

    Format 1 (read only; what earlier journals hold):
    0x01  CreateStream   {"config": CONFIG, "request_id": str}  -> LegacyCreateStream (unplaced)
    0x02  DeleteStream, 0x04 Barrier, 0x41 Applied, 0x42 Rejected: as in format 2
    0x03  RegisterNode   {"admin": str, "amqp": str, "node": str, "now_ms": int,
                          "request_id": str}                     -> replication, metadata None
    (0x05-0x0a do not exist in format 1 and are refused there.)

    NODE      = {"admin": str, "amqp": str, "heartbeat_ms": int, "metadata": str|null,
                 "node": str, "replication": str|null, "failure_domain": str}  (in the dump's
                 "nodes"; failure_domain as in RegisterNode: only when set)
    CONFIG    = {"name": str, "partitions": int, "replicas": int, "retention": RETENTION,
                 "segment_bytes": int, "filter_size_bytes": int}   (filter_size_bytes:
                 written only when not the default, 16)
    RETENTION = {"max_age_ms": int|null, "max_bytes": int|null, "max_messages": int|null}
    SUPER     = {"binding_keys": [str...], "name": str, "partitions": [str...],
                 "routing": "hash"|"key", "version": int}
    GROUP     = {"name": str, "rebalance_delay_ms": int, "session_timeout_ms": int,
                 "stream": str, "strategy": "round-robin"|"range"|"sticky", "version": int,
                 "pending_max": int}   (pending_max: absent in dumps written before it; 16)

Full dump (pysyncobj's `fullDumpFile`, written through its serializer hook):

    offset  size  field
    0       4     magic b"SPMD"
    4       1     format version: 0x02 written; 0x01 still read
    5       4     body length L, uint32 big-endian
    9       L     body: canonical JSON {"raft": RAFT, "state": STATE}
    9+L     4     CRC-32 (zlib) of the body, uint32 big-endian

    RAFT  = {"entries": [ENTRY, ENTRY], "voters": [str, ...]}   (what pysyncobj needs back)
    ENTRY = {"command": base64 str, "index": int, "term": int}  (pysyncobj's own log entry)
    STATE = {"consumer_groups": [GROUP...], "nodes": [NODE...], "requests": [[str, RESULT]...],
             "streams": [STREAM...], "super_streams": [SUPER...], "version": int}
    NODE  = {"admin": str, "amqp": str, "heartbeat_ms": int, "metadata": str|null, "node": str,
             "replication": str|null}
    STREAM = {"config": CONFIG, "created_version": int, "partitions": [PARTITION...]}
    PARTITION = {"leader": {"epoch": int, "node": str}|null, "replicas": [str...],
                 "learners": [str...]}   (learners: written only when not empty; ADR 0022)
    RESULT = {"applied": {"version": int}} | {"rejected": {"code": str, "message": str}}
    OPERATION = {"error": str, "error_code": str, "finished_ms": int, "id": str, "kind": str,
                 "log": [str...], "node": str, "progress_permille": int, "revision": int,
                 "started_ms": int, "state": str, "step": str, "target": str}
    STATE may hold "operations": [OPERATION...] (oldest first; written only when not empty,
    absent in dumps written before ADR 0025: read as []).

    Format 1 dumps: NODE without "metadata" and "replication" (read as null), STREAM without
    "partitions" (read as unplaced: `config.partitions` records with replicas [] and no leader).
    Format 2 dumps written before super streams existed have no "super_streams" (read as []),
    and those written before consumer groups none of "consumer_groups" (read as []). A group
    whose stream the dump does not hold is refused.

Objects must have exactly the listed keys; anything else is refused with CodecError. A reader that
meets a format version it does not know refuses the bytes rather than guessing. Voters of one
group must run builds that read each other's format: a format-1 build refuses format-2 records
(deterministically, as Rejected), so upgrade all voters together (docs/adr/0003).
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from spate.cluster.metadata.state import (
    Applied,
    Barrier,
    Command,
    CreateConsumerGroup,
    CreateStream,
    CreateSuperStream,
    DeleteConsumerGroup,
    DeleteStream,
    DeleteSuperStream,
    Heartbeat,
    LeaderReport,
    LegacyCreateStream,
    MetadataSnapshot,
    NodeRecord,
    OperationRecord,
    PartitionLeader,
    PartitionRecord,
    RecordOperation,
    RegisterNode,
    Rejected,
    ReportLeader,
    ReportLeaders,
    RequestId,
    Result,
    SetReplicas,
    StreamRecord,
)
from spate.core import filtering, limits
from spate.core.errors import Blame, BrokerError, ErrorCode
from spate.core.groups import GroupDefinition, Strategy
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import Retention, StreamConfig
from spate.core.superstreams import Routing, SuperStream

FORMAT_VERSION = 0x02
"""Written by this build."""
FORMAT_VERSIONS_READ = (0x01, 0x02)
DUMP_MAGIC = b"SPMD"
_DUMP_HEADER = struct.Struct(">4sBI")
_DUMP_CRC = struct.Struct(">I")

TAG_CREATE_STREAM = 0x01
TAG_DELETE_STREAM = 0x02
TAG_REGISTER_NODE = 0x03
TAG_BARRIER = 0x04
TAG_HEARTBEAT = 0x05
TAG_REPORT_LEADER = 0x06
TAG_CREATE_SUPER_STREAM = 0x07
TAG_DELETE_SUPER_STREAM = 0x08
TAG_CREATE_CONSUMER_GROUP = 0x09
TAG_DELETE_CONSUMER_GROUP = 0x0A
TAG_SET_REPLICAS = 0x0B
TAG_RECORD_OPERATION = 0x0C
TAG_REPORT_LEADERS = 0x0D
TAG_APPLIED = 0x41
TAG_REJECTED = 0x42


class CodecError(BrokerError):
    """Bytes that are not a metadata record or dump of a format this build reads."""

    code, blame = ErrorCode.INTERNAL, Blame.SERVER


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One of pysyncobj's log entries, kept opaque: (command bytes, Raft index, Raft term)."""

    command: bytes
    index: int
    term: int


@dataclass(frozen=True, slots=True)
class RaftCheckpoint:
    """What pysyncobj hands its serializer besides our state and wants back from the dump."""

    entries: tuple[LogEntry, LogEntry]  # (entry before the last applied one, last applied one)
    voters: tuple[str, ...]  # host:port of every voter, sorted


# Public API -------------------------------------------------------------------------------------


def encode_command(command: Command) -> bytes:
    """Format 2. A LegacyCreateStream is format 1's CreateStream and is encoded as such (only
    tests re-encode one; the service never submits it)."""
    if isinstance(command, CreateStream):
        return _record(
            TAG_CREATE_STREAM,
            {
                "request_id": command.request_id,
                "config": _config_json(command.config),
                "now_ms": command.now_ms,
                "default_replicas": command.default_replicas,
            },
        )
    if isinstance(command, LegacyCreateStream):
        return _record(
            TAG_CREATE_STREAM,
            {"request_id": command.request_id, "config": _config_json(command.config)},
            version=0x01,
        )
    if isinstance(command, DeleteStream):
        return _record(TAG_DELETE_STREAM, {"request_id": command.request_id, "name": command.name})
    if isinstance(command, CreateSuperStream):
        return _record(
            TAG_CREATE_SUPER_STREAM,
            {
                "request_id": command.request_id,
                "super_stream": _super_json(command.topology),
                "config": _config_json(command.config),
                "now_ms": command.now_ms,
                "default_replicas": command.default_replicas,
            },
        )
    if isinstance(command, DeleteSuperStream):
        return _record(
            TAG_DELETE_SUPER_STREAM, {"request_id": command.request_id, "name": command.name}
        )
    if isinstance(command, CreateConsumerGroup):
        return _record(
            TAG_CREATE_CONSUMER_GROUP,
            {"request_id": command.request_id, "group": _group_json(command.group)},
        )
    if isinstance(command, DeleteConsumerGroup):
        return _record(
            TAG_DELETE_CONSUMER_GROUP,
            {"request_id": command.request_id, "stream": command.stream, "name": command.name},
        )
    if isinstance(command, RegisterNode):
        return _record(
            TAG_REGISTER_NODE,
            {
                "request_id": command.request_id,
                "node": command.node,
                "amqp": command.amqp,
                "admin": command.admin,
                "replication": command.replication,
                "metadata": command.metadata,
                "now_ms": command.now_ms,
            }
            | _failure_domain_json(command.failure_domain),
        )
    if isinstance(command, Heartbeat):
        return _record(
            TAG_HEARTBEAT,
            {"request_id": command.request_id, "node": command.node, "now_ms": command.now_ms},
        )
    if isinstance(command, ReportLeader):
        return _record(
            TAG_REPORT_LEADER,
            {
                "request_id": command.request_id,
                "stream": command.stream,
                "partition": command.partition,
                "leader": command.leader,
                "epoch": command.epoch,
            },
        )
    if isinstance(command, ReportLeaders):
        return _record(
            TAG_REPORT_LEADERS,
            {
                "request_id": command.request_id,
                "reports": [[r.stream, r.partition, r.leader, r.epoch] for r in command.reports],
            },
        )
    if isinstance(command, SetReplicas):
        return _record(
            TAG_SET_REPLICAS,
            {
                "request_id": command.request_id,
                "stream": command.stream,
                "partition": command.partition,
                "replicas": list(command.replicas),
                "learners": list(command.learners),
                "expected": None if command.expected is None else list(command.expected),
            },
        )
    if isinstance(command, RecordOperation):
        return _record(
            TAG_RECORD_OPERATION,
            {"request_id": command.request_id, "operation": _operation_json(command.operation)},
        )
    assert isinstance(command, Barrier), command
    return _record(TAG_BARRIER, {"request_id": command.request_id})


def decode_command(data: bytes) -> Command:
    version, tag, body = _parse_record(data)
    if tag == TAG_CREATE_STREAM:
        if version == 0x01:
            fields = _fields(body, "command", {"request_id", "config"})
            return LegacyCreateStream(
                RequestId(_str(fields["request_id"])), _config(fields["config"])
            )
        fields = _fields(body, "command", {"request_id", "config", "now_ms", "default_replicas"})
        return CreateStream(
            RequestId(_str(fields["request_id"])),
            _config(fields["config"]),
            now_ms=_int(fields["now_ms"]),
            default_replicas=_bool(fields["default_replicas"]),
        )
    if tag == TAG_DELETE_STREAM:
        fields = _fields(body, "command", {"request_id", "name"})
        return DeleteStream(RequestId(_str(fields["request_id"])), StreamName(_str(fields["name"])))
    if tag == TAG_REGISTER_NODE:
        keys = {"request_id", "node", "amqp", "admin", "now_ms"}
        if version != 0x01:
            keys |= {"replication", "metadata"} | _late_keys(body, "failure_domain")
        fields = _fields(body, "command", keys)
        return RegisterNode(
            RequestId(_str(fields["request_id"])),
            NodeId(_str(fields["node"])),
            amqp=_str(fields["amqp"]),
            admin=_str(fields["admin"]),
            replication=_optional(fields.get("replication"), _str),
            metadata=_optional(fields.get("metadata"), _str),
            now_ms=_int(fields["now_ms"]),
            failure_domain=_optional(fields.get("failure_domain"), _str),
        )
    if tag == TAG_BARRIER:
        fields = _fields(body, "command", {"request_id"})
        return Barrier(RequestId(_str(fields["request_id"])))
    if tag == TAG_HEARTBEAT and version >= 0x02:
        fields = _fields(body, "command", {"request_id", "node", "now_ms"})
        return Heartbeat(
            RequestId(_str(fields["request_id"])),
            NodeId(_str(fields["node"])),
            _int(fields["now_ms"]),
        )
    if tag == TAG_REPORT_LEADER and version >= 0x02:
        fields = _fields(body, "command", {"request_id", "stream", "partition", "leader", "epoch"})
        return ReportLeader(
            RequestId(_str(fields["request_id"])),
            StreamName(_str(fields["stream"])),
            PartitionId(_int(fields["partition"])),
            NodeId(_str(fields["leader"])),
            LeaderEpoch(_int(fields["epoch"])),
        )
    if tag == TAG_CREATE_SUPER_STREAM and version >= 0x02:
        fields = _fields(
            body,
            "command",
            {"request_id", "super_stream", "config", "now_ms", "default_replicas"},
        )
        return CreateSuperStream(
            RequestId(_str(fields["request_id"])),
            _super(fields["super_stream"]),
            _config(fields["config"]),
            now_ms=_int(fields["now_ms"]),
            default_replicas=_bool(fields["default_replicas"]),
        )
    if tag == TAG_DELETE_SUPER_STREAM and version >= 0x02:
        fields = _fields(body, "command", {"request_id", "name"})
        return DeleteSuperStream(
            RequestId(_str(fields["request_id"])), StreamName(_str(fields["name"]))
        )
    if tag == TAG_CREATE_CONSUMER_GROUP and version >= 0x02:
        fields = _fields(body, "command", {"request_id", "group"})
        return CreateConsumerGroup(RequestId(_str(fields["request_id"])), _group(fields["group"]))
    if tag == TAG_DELETE_CONSUMER_GROUP and version >= 0x02:
        fields = _fields(body, "command", {"request_id", "stream", "name"})
        return DeleteConsumerGroup(
            RequestId(_str(fields["request_id"])),
            StreamName(_str(fields["stream"])),
            _str(fields["name"]),
        )
    if tag == TAG_SET_REPLICAS and version >= 0x02:
        fields = _fields(
            body,
            "command",
            {"request_id", "stream", "partition", "replicas", "learners", "expected"},
        )
        expected = fields["expected"]
        return SetReplicas(
            RequestId(_str(fields["request_id"])),
            StreamName(_str(fields["stream"])),
            PartitionId(_int(fields["partition"])),
            _nodes(fields["replicas"]),
            _nodes(fields["learners"]),
            None if expected is None else _nodes(expected),
        )
    if tag == TAG_RECORD_OPERATION and version >= 0x02:
        fields = _fields(body, "command", {"request_id", "operation"})
        return RecordOperation(
            RequestId(_str(fields["request_id"])), _operation(fields["operation"])
        )
    if tag == TAG_REPORT_LEADERS and version >= 0x02:
        fields = _fields(body, "command", {"request_id", "reports"})
        return ReportLeaders(
            RequestId(_str(fields["request_id"])),
            tuple(_leader_report(item) for item in _list(fields["reports"])),
        )
    raise CodecError(f"unknown metadata command tag 0x{tag:02x} in format {version}")


_OPERATION_KEYS = {
    "id",
    "node",
    "kind",
    "target",
    "state",
    "step",
    "progress_permille",
    "error",
    "error_code",
    "started_ms",
    "finished_ms",
    "log",
    "revision",
}


def _operation_json(record: OperationRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "node": record.node,
        "kind": record.kind,
        "target": record.target,
        "state": record.state,
        "step": record.step,
        "progress_permille": record.progress_permille,
        "error": record.error,
        "error_code": record.error_code,
        "started_ms": record.started_ms,
        "finished_ms": record.finished_ms,
        "log": list(record.log),
        "revision": record.revision,
    }


def _operation(value: object) -> OperationRecord:
    fields = _fields(value, "operation", _OPERATION_KEYS)
    return OperationRecord(
        id=_str(fields["id"]),
        node=NodeId(_str(fields["node"])),
        kind=_str(fields["kind"]),
        target=_str(fields["target"]),
        state=_str(fields["state"]),
        step=_str(fields["step"]),
        progress_permille=_int(fields["progress_permille"]),
        error=_str(fields["error"]),
        error_code=_str(fields["error_code"]),
        started_ms=_int(fields["started_ms"]),
        finished_ms=_int(fields["finished_ms"]),
        log=tuple(_str(line) for line in _list(fields["log"])),
        revision=_int(fields["revision"]),
    )


def _leader_report(value: object) -> LeaderReport:
    item = _list(value)
    if len(item) != 4:
        raise CodecError(f"a leader report is [stream, partition, leader, epoch], got {item!r}")
    return LeaderReport(
        StreamName(_str(item[0])),
        PartitionId(_int(item[1])),
        NodeId(_str(item[2])),
        LeaderEpoch(_int(item[3])),
    )


def _nodes(value: object) -> tuple[NodeId, ...]:
    return tuple(NodeId(_str(n)) for n in _list(value))


def encode_result(result: Result) -> bytes:
    if isinstance(result, Applied):
        return _record(TAG_APPLIED, {"version": result.version})
    return _record(TAG_REJECTED, {"code": result.code.value, "message": result.message})


def decode_result(data: bytes) -> Result:
    _, tag, body = _parse_record(data)
    if tag == TAG_APPLIED:
        return Applied(_int(_fields(body, "result", {"version"})["version"]))
    if tag == TAG_REJECTED:
        fields = _fields(body, "result", {"code", "message"})
        return Rejected(_error_code(fields["code"]), _str(fields["message"]))
    raise CodecError(f"unknown metadata result tag 0x{tag:02x}")


def encode_dump(raft: RaftCheckpoint, snapshot: MetadataSnapshot) -> bytes:
    body = _canonical({"raft": _raft_json(raft), "state": _snapshot_json(snapshot)})
    return (
        _DUMP_HEADER.pack(DUMP_MAGIC, FORMAT_VERSION, len(body))
        + body
        + _DUMP_CRC.pack(zlib.crc32(body))
    )


def decode_dump(data: bytes) -> tuple[RaftCheckpoint, MetadataSnapshot]:
    if len(data) < _DUMP_HEADER.size + _DUMP_CRC.size:
        raise CodecError(f"metadata dump too short ({len(data)} bytes)")
    magic, version, length = _DUMP_HEADER.unpack_from(data)
    if magic != DUMP_MAGIC:
        raise CodecError(f"not a Spate metadata dump (magic {magic!r})")
    if version not in FORMAT_VERSIONS_READ:
        raise CodecError(
            f"metadata dump format {version} is not readable by this build "
            f"(reads {', '.join(map(str, FORMAT_VERSIONS_READ))})"
        )
    if len(data) != _DUMP_HEADER.size + length + _DUMP_CRC.size:
        raise CodecError(
            f"metadata dump is {len(data)} bytes, its header says "
            f"{_DUMP_HEADER.size + length + _DUMP_CRC.size}"
        )
    body = data[_DUMP_HEADER.size : _DUMP_HEADER.size + length]
    (crc,) = _DUMP_CRC.unpack_from(data, _DUMP_HEADER.size + length)
    if zlib.crc32(body) != crc:
        raise CodecError("metadata dump checksum mismatch (torn or corrupted file)")
    fields = _fields(_json(body), "dump", {"raft", "state"})
    return _raft(fields["raft"]), _snapshot(fields["state"], version)


# JSON shapes ------------------------------------------------------------------------------------


def _config_json(config: StreamConfig) -> dict[str, Any]:
    r = config.retention
    fields: dict[str, Any] = {
        "name": config.name,
        "partitions": config.partitions,
        "replicas": config.replicas,
        "segment_bytes": config.segment_bytes,
        "retention": {
            "max_age_ms": r.max_age_ms,
            "max_bytes": r.max_bytes,
            "max_messages": r.max_messages,
        },
    }
    if config.filter_size_bytes != filtering.SIZE_BYTES_DEFAULT:
        fields["filter_size_bytes"] = config.filter_size_bytes  # older readers: the default
    return fields


def _config(value: object) -> StreamConfig:
    keys = {"name", "partitions", "replicas", "segment_bytes", "retention"}
    if isinstance(value, dict) and "filter_size_bytes" in value:  # written since it came
        keys = keys | {"filter_size_bytes"}
    fields = _fields(value, "stream config", keys)
    retention = _fields(
        fields["retention"], "retention", {"max_age_ms", "max_bytes", "max_messages"}
    )
    return StreamConfig(
        name=StreamName(_str(fields["name"])),
        partitions=_int(fields["partitions"]),
        replicas=_int(fields["replicas"]),
        segment_bytes=_int(fields["segment_bytes"]),
        filter_size_bytes=_int(fields.get("filter_size_bytes", filtering.SIZE_BYTES_DEFAULT)),
        retention=Retention(
            max_age_ms=_optional(retention["max_age_ms"], _int),
            max_bytes=_optional(retention["max_bytes"], _int),
            max_messages=_optional(retention["max_messages"], _int),
        ),
    )


def _super_json(topology: SuperStream) -> dict[str, Any]:
    return {
        "name": topology.name,
        "partitions": list(topology.partitions),
        "binding_keys": list(topology.binding_keys),
        "routing": topology.routing.value,
        "version": topology.version,
    }


def _super(value: object) -> SuperStream:
    fields = _fields(
        value, "super stream", {"name", "partitions", "binding_keys", "routing", "version"}
    )
    partitions = tuple(StreamName(_str(p)) for p in _list(fields["partitions"]))
    keys = tuple(_str(k) for k in _list(fields["binding_keys"]))
    if len(partitions) != len(keys):
        raise CodecError(
            f"super stream has {len(partitions)} partitions but {len(keys)} binding keys"
        )
    try:
        routing = Routing(_str(fields["routing"]))
    except ValueError as error:
        raise CodecError(f"unknown super-stream routing {fields['routing']!r}") from error
    return SuperStream(
        StreamName(_str(fields["name"])), partitions, keys, routing, _int(fields["version"])
    )


def _group_json(group: GroupDefinition) -> dict[str, Any]:
    return {
        "stream": group.stream,
        "name": group.name,
        "strategy": group.strategy.value,
        "session_timeout_ms": group.session_timeout_ms,
        "rebalance_delay_ms": group.rebalance_delay_ms,
        "version": group.version,
        "pending_max": group.pending_max,
    }


def _group(value: object) -> GroupDefinition:
    keys = {"stream", "name", "strategy", "session_timeout_ms", "rebalance_delay_ms", "version"}
    if isinstance(value, dict) and "pending_max" in value:  # written since pending_max came
        keys = keys | {"pending_max"}
    fields = _fields(value, "consumer group", keys)
    try:
        strategy = Strategy(_str(fields["strategy"]))
    except ValueError as error:
        raise CodecError(f"unknown consumer group strategy {fields['strategy']!r}") from error
    return GroupDefinition(
        StreamName(_str(fields["stream"])),
        _str(fields["name"]),
        strategy,
        _int(fields["session_timeout_ms"]),
        _int(fields["rebalance_delay_ms"]),
        _int(fields["version"]),
        _int(fields.get("pending_max", limits.group_pending_max_default)),
    )


def _result_json(result: Result) -> dict[str, Any]:
    if isinstance(result, Applied):
        return {"applied": {"version": result.version}}
    return {"rejected": {"code": result.code.value, "message": result.message}}


def _result(value: object) -> Result:
    if isinstance(value, dict) and set(value) == {"applied"}:
        return Applied(_int(_fields(value["applied"], "result", {"version"})["version"]))
    fields = _fields(
        _fields(value, "result", {"rejected"})["rejected"], "result", {"code", "message"}
    )
    return Rejected(_error_code(fields["code"]), _str(fields["message"]))


def _partition_json(record: PartitionRecord) -> dict[str, Any]:
    leader = record.leader
    out: dict[str, Any] = {
        "replicas": list(record.replicas),
        "leader": None if leader is None else {"node": leader.node, "epoch": leader.epoch},
    }
    if record.learners:
        out["learners"] = list(record.learners)
    return out


def _partition(value: object) -> PartitionRecord:
    keys = {"replicas", "leader"}
    if isinstance(value, dict) and "learners" in value:
        keys.add("learners")
    fields = _fields(value, "partition", keys)
    leader = None
    if fields["leader"] is not None:
        found = _fields(fields["leader"], "leader", {"node", "epoch"})
        leader = PartitionLeader(NodeId(_str(found["node"])), LeaderEpoch(_int(found["epoch"])))
    return PartitionRecord(_nodes(fields["replicas"]), leader, _nodes(fields.get("learners", [])))


def _snapshot_json(snapshot: MetadataSnapshot) -> dict[str, Any]:
    return {
        "version": snapshot.version,
        "streams": [
            {
                "config": _config_json(s.config),
                "created_version": s.created_version,
                "partitions": [_partition_json(p) for p in s.partitions],
            }
            for s in snapshot.streams
        ],
        "nodes": [
            {
                "node": n.node,
                "amqp": n.amqp,
                "admin": n.admin,
                "replication": n.replication,
                "metadata": n.metadata,
                "heartbeat_ms": n.heartbeat_ms,
            }
            | _failure_domain_json(n.failure_domain)
            for n in snapshot.nodes
        ],
        "requests": [
            [request_id, _result_json(result)] for request_id, result in snapshot.requests
        ],
        "super_streams": [_super_json(t) for t in snapshot.super_streams],
        "consumer_groups": [_group_json(g) for g in snapshot.groups],
    } | (
        {"operations": [_operation_json(o) for o in snapshot.operations]}
        if snapshot.operations
        else {}
    )


def _snapshot(value: object, version: int) -> MetadataSnapshot:
    legacy = version == 0x01
    keys = {"version", "streams", "nodes", "requests"}
    for late_key in ("super_streams", "consumer_groups", "operations"):  # absent in older dumps
        if isinstance(value, dict) and late_key in value:
            keys.add(late_key)
    fields = _fields(value, "state", keys)
    streams = []
    for item in _list(fields["streams"]):
        keys = {"config", "created_version"} | (set() if legacy else {"partitions"})
        stream = _fields(item, "stream", keys)
        config = _config(stream["config"])
        if legacy:
            partitions = (PartitionRecord(()),) * max(0, config.partitions)
        else:
            partitions = tuple(_partition(p) for p in _list(stream["partitions"]))
            if len(partitions) != config.partitions:
                raise CodecError(
                    f"stream {config.name!r} has {config.partitions} partitions but the dump "
                    f"places {len(partitions)}"
                )
        streams.append(StreamRecord(config, _int(stream["created_version"]), partitions))
    nodes = []
    for item in _list(fields["nodes"]):
        keys = {"node", "amqp", "admin", "heartbeat_ms"}
        if not legacy:
            keys |= {"replication", "metadata"} | _late_keys(item, "failure_domain")
        node = _fields(item, "node", keys)
        nodes.append(
            NodeRecord(
                node=NodeId(_str(node["node"])),
                amqp=_str(node["amqp"]),
                admin=_str(node["admin"]),
                replication=_optional(node.get("replication"), _str),
                metadata=_optional(node.get("metadata"), _str),
                heartbeat_ms=_int(node["heartbeat_ms"]),
                failure_domain=_optional(node.get("failure_domain"), _str),
            )
        )
    requests = []
    for item in _list(fields["requests"]):
        pair = _list(item)
        if len(pair) != 2:
            raise CodecError("a remembered request must be [request id, result]")
        requests.append((RequestId(_str(pair[0])), _result(pair[1])))
    supers = tuple(_super(t) for t in _list(fields.get("super_streams", [])))
    known = {s.config.name for s in streams}
    for topology in supers:
        missing = [p for p in topology.partitions if p not in known]
        if missing:
            raise CodecError(
                f"super stream {topology.name!r} lists partition streams the dump does not "
                f"hold: {', '.join(missing[:5])}"
            )
    groups = tuple(_group(g) for g in _list(fields.get("consumer_groups", [])))
    for group in groups:
        if group.stream not in known:
            raise CodecError(
                f"consumer group {group.name!r} is defined on stream {group.stream!r}, which "
                "the dump does not hold"
            )
    if len({g.key for g in groups}) != len(groups):
        raise CodecError("the dump defines a consumer group twice")
    return MetadataSnapshot(
        _int(fields["version"]),
        tuple(streams),
        tuple(nodes),
        tuple(requests),
        supers,
        tuple(sorted(groups, key=lambda g: g.key)),
        tuple(_operation(o) for o in _list(fields.get("operations", []))),
    )


def _raft_json(raft: RaftCheckpoint) -> dict[str, Any]:
    return {
        "entries": [
            {
                "command": base64.b64encode(e.command).decode("ascii"),
                "index": e.index,
                "term": e.term,
            }
            for e in raft.entries
        ],
        "voters": list(raft.voters),
    }


def _raft(value: object) -> RaftCheckpoint:
    fields = _fields(value, "raft checkpoint", {"entries", "voters"})
    entries = []
    for item in _list(fields["entries"]):
        entry = _fields(item, "log entry", {"command", "index", "term"})
        try:
            command = base64.b64decode(_str(entry["command"]), validate=True)
        except binascii.Error as error:
            raise CodecError(f"log entry command is not base64: {error}") from error
        entries.append(LogEntry(command, _int(entry["index"]), _int(entry["term"])))
    if len(entries) != 2:
        raise CodecError(f"a raft checkpoint holds 2 log entries, got {len(entries)}")
    return RaftCheckpoint((entries[0], entries[1]), tuple(_str(v) for v in _list(fields["voters"])))


# Primitives -------------------------------------------------------------------------------------


def _canonical(value: dict[str, Any]) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def _record(tag: int, body: dict[str, Any], version: int = FORMAT_VERSION) -> bytes:
    return bytes((version, tag)) + _canonical(body)


def _parse_record(data: bytes) -> tuple[int, int, object]:
    """(format version, tag, JSON body)."""
    if len(data) < 2:
        raise CodecError(f"metadata record too short ({len(data)} bytes)")
    if data[0] not in FORMAT_VERSIONS_READ:
        raise CodecError(
            f"metadata record format {data[0]} is not readable by this build "
            f"(reads {', '.join(map(str, FORMAT_VERSIONS_READ))})"
        )
    return data[0], data[1], _json(data[2:])


def _json(body: bytes) -> object:
    try:
        return json.loads(
            body.decode("ascii"), parse_constant=_reject_constant, object_pairs_hook=_unique_keys
        )
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise CodecError(f"metadata body is not canonical JSON: {error}") from error


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not allowed")


def _failure_domain_json(domain: str | None) -> dict[str, Any]:
    """The optional `failure_domain` key (ADR 0032): absent when None, so records of nodes
    that name none are byte for byte what earlier builds wrote."""
    return {} if domain is None else {"failure_domain": domain}


def _late_keys(value: object, *names: str) -> set[str]:
    """Those of `names` that `value` (a JSON object) holds: keys added after a record's
    first format, present only when set."""
    return {n for n in names if isinstance(value, dict) and n in value}


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError("duplicate key in object")
    return value


def _fields(value: object, what: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CodecError(f"{what} must be a JSON object, got {type(value).__name__}")
    if set(value) != keys:
        raise CodecError(f"{what} must have the keys {sorted(keys)}, got {sorted(value)}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise CodecError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise CodecError(f"expected an integer, got {type(value).__name__}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise CodecError(f"expected a boolean, got {type(value).__name__}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise CodecError(f"expected a list, got {type(value).__name__}")
    return value


_T = TypeVar("_T")


def _optional(value: object, read: Callable[[object], _T]) -> _T | None:
    return None if value is None else read(value)


def _error_code(value: object) -> ErrorCode:
    try:
        return ErrorCode(_str(value))
    except ValueError as error:
        raise CodecError(f"unknown error code {value!r}") from error
