"""Core values <-> spate.api.v1 messages, for the admin server."""

from __future__ import annotations

from collections.abc import Sequence

from spate.api.v1 import admin_pb2 as pb
from spate.cluster.admin.providers import ProcessFacts
from spate.cluster.metadata.service import MetadataStatus
from spate.cluster.metadata.state import NodeRecord
from spate.core import limits
from spate.core.backend import PartitionInfo
from spate.core.ids import PartitionId, StreamName
from spate.core.streams import Retention, StreamConfig


def stream_config(message: pb.StreamConfig) -> StreamConfig:
    """A definition from a request; unset fields take the defaults (validated by the caller)."""
    r = message.retention
    return StreamConfig(
        name=StreamName(message.name),
        partitions=message.partitions if message.HasField("partitions") else 1,
        replicas=message.replicas if message.HasField("replicas") else 1,
        segment_bytes=(
            message.segment_bytes
            if message.HasField("segment_bytes")
            else limits.segment_bytes_default
        ),
        retention=Retention(
            max_age_ms=r.max_age_ms if r.HasField("max_age_ms") else None,
            max_bytes=r.max_bytes if r.HasField("max_bytes") else None,
            max_messages=r.max_messages if r.HasField("max_messages") else None,
        ),
    )


def stream_config_message(config: StreamConfig) -> pb.StreamConfig:
    r = config.retention
    return pb.StreamConfig(
        name=config.name,
        partitions=config.partitions,
        replicas=config.replicas,
        segment_bytes=config.segment_bytes,
        retention=pb.Retention(
            max_age_ms=r.max_age_ms, max_bytes=r.max_bytes, max_messages=r.max_messages
        ),
    )


def partition_stats(
    config: StreamConfig, infos: Sequence[PartitionInfo]
) -> list[pb.PartitionStats]:
    """One entry per partition of the stream, stats where this process has them."""
    by_partition = {info.partition: info for info in infos if info.stream == config.name}
    stats = []
    for index in range(config.partitions):
        info = by_partition.get(PartitionId(index))
        if info is None:
            stats.append(pb.PartitionStats(partition=index, available=False))
            continue
        stats.append(
            pb.PartitionStats(
                partition=index,
                available=True,
                first_offset=info.first_offset,
                last_offset=info.last_offset,
                end_offset=info.end_offset,
                first_timestamp_ms=info.first_timestamp_ms,
                last_timestamp_ms=info.last_timestamp_ms,
                messages=info.messages,
                bytes=info.bytes,
                segments=info.segments,
                leader=info.leader or "",
            )
        )
    return stats


def metadata_status_message(status: MetadataStatus) -> pb.MetadataStatus:
    return pb.MetadataStatus(
        node_id=status.node_id,
        self_address=status.self_address,
        voters=status.voters,
        leader=status.leader or "",
        is_leader=status.is_leader,
        ready=status.ready,
        has_quorum=status.has_quorum,
        connected_peers=status.connected_peers,
        term=status.term,
        commit_index=status.commit_index,
        last_applied=status.last_applied,
        version=status.version,
        streams=status.streams,
        nodes=status.nodes,
    )


def process_message(facts: ProcessFacts) -> pb.ProcessStatus:
    return pb.ProcessStatus(
        node_id=facts.node_id,
        role=facts.role,
        pid=facts.pid,
        endpoints=[
            pb.Endpoint(name=name, address=address)
            for name, address in sorted(facts.endpoints.items())
        ],
        partitions=facts.partitions,
        streams=facts.streams,
    )


def node_message(record: NodeRecord) -> pb.RegisteredNode:
    return pb.RegisteredNode(
        node_id=record.node, amqp=record.amqp, admin=record.admin, heartbeat_ms=record.heartbeat_ms
    )
