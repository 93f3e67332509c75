"""Core values <-> spate.api.v1 messages, for the admin server."""

from __future__ import annotations

from collections.abc import Sequence

from spate.api.v1 import admin_pb2 as pb
from spate.cluster.admin.group_stats import GroupPartition, GroupStats
from spate.cluster.admin.providers import ProcessFacts
from spate.cluster.metadata.service import MetadataStatus
from spate.cluster.metadata.state import NodeStatus, PartitionPlacement, StreamRecord
from spate.core import filtering, limits
from spate.core.backend import PartitionInfo
from spate.core.groups import GroupDefinition, Strategy
from spate.core.ids import PartitionId, StreamName
from spate.core.streams import Retention, StreamConfig
from spate.core.superstreams import Routing, SuperStream


def stream_config(message: pb.StreamConfig) -> StreamConfig:
    """A definition from a request; unset fields take the defaults (validated by the caller).
    An unset `replicas` reads as 1 here; the caller asks the metadata service for its default
    (min(3, registered nodes)) when `replicas_given` is False."""
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
        filter_size_bytes=(
            message.filter_size_bytes
            if message.HasField("filter_size_bytes")
            else filtering.SIZE_BYTES_DEFAULT
        ),
        retention=Retention(
            max_age_ms=r.max_age_ms if r.HasField("max_age_ms") else None,
            max_bytes=r.max_bytes if r.HasField("max_bytes") else None,
            max_messages=r.max_messages if r.HasField("max_messages") else None,
        ),
    )


def replicas_given(message: pb.StreamConfig) -> bool:
    return message.HasField("replicas")


def stream_config_message(config: StreamConfig) -> pb.StreamConfig:
    r = config.retention
    return pb.StreamConfig(
        name=config.name,
        partitions=config.partitions,
        replicas=config.replicas,
        segment_bytes=config.segment_bytes,
        filter_size_bytes=config.filter_size_bytes,
        retention=pb.Retention(
            max_age_ms=r.max_age_ms, max_bytes=r.max_bytes, max_messages=r.max_messages
        ),
    )


def partition_stats(
    record: StreamRecord, infos: Sequence[PartitionInfo]
) -> list[pb.PartitionStats]:
    """One entry per partition of the stream: placement and reported leader from the metadata,
    runtime stats where this process has them."""
    config = record.config
    by_partition = {info.partition: info for info in infos if info.stream == config.name}
    stats = []
    for index, placed in enumerate(record.partitions):
        reported = placed.leader
        info = by_partition.get(PartitionId(index))
        if info is None:
            entry = pb.PartitionStats(partition=index, available=False)
        else:
            entry = pb.PartitionStats(
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
        entry.replicas.extend(placed.replicas)
        if reported is not None:
            entry.leader = reported.node
            entry.leader_epoch = reported.epoch
        stats.append(entry)
    return stats


def partition_placement_message(
    placement: PartitionPlacement, alive: bool
) -> pb.PartitionPlacement:
    leader = placement.leader
    return pb.PartitionPlacement(
        stream=placement.stream,
        partition=placement.partition,
        replicas=placement.replicas,
        leader="" if leader is None else leader.node,
        leader_epoch=None if leader is None else leader.epoch,
        leader_alive=alive,
    )


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


def node_message(status: NodeStatus, voters: Sequence[str] = ()) -> pb.RegisteredNode:
    """`voters`: the metadata voters' Raft addresses, to say whether the node is one."""
    record = status.record
    return pb.RegisteredNode(
        node_id=record.node,
        amqp=record.amqp,
        admin=record.admin,
        heartbeat_ms=record.heartbeat_ms,
        replication=record.replication or "",
        metadata=record.metadata or "",
        alive=status.alive,
        heartbeat_age_ms=status.heartbeat_age_ms,
        partitions_hosted=status.partitions_hosted,
        partitions_led=status.partitions_led,
        metadata_voter=record.metadata is not None and record.metadata in voters,
        failure_domain=record.failure_domain or "",
    )


def super_stream_message(topology: SuperStream) -> pb.SuperStream:
    return pb.SuperStream(
        name=topology.name,
        partitions=topology.partitions,
        binding_keys=topology.binding_keys,
        routing=topology.routing.value,
        version=topology.version,
    )


def super_stream(message: pb.SuperStream) -> SuperStream:
    """A topology as the admin API describes it (a gateway's routes)."""
    return SuperStream(
        name=StreamName(message.name),
        partitions=tuple(StreamName(p) for p in message.partitions),
        binding_keys=tuple(message.binding_keys),
        routing=Routing(message.routing),
        version=message.version,
    )


def consumer_group_message(group: GroupDefinition) -> pb.ConsumerGroup:
    return pb.ConsumerGroup(
        stream=group.stream,
        name=group.name,
        strategy=group.strategy.value,
        session_timeout_ms=group.session_timeout_ms,
        rebalance_delay_ms=group.rebalance_delay_ms,
        version=group.version,
        pending_max=group.pending_max,
    )


def consumer_group(message: pb.ConsumerGroup) -> GroupDefinition:
    """A definition as the admin API describes it (a gateway's routes)."""
    return GroupDefinition(
        stream=StreamName(message.stream),
        name=message.name,
        strategy=Strategy(message.strategy),
        session_timeout_ms=message.session_timeout_ms,
        rebalance_delay_ms=message.rebalance_delay_ms,
        version=message.version,
        pending_max=message.pending_max,
    )


def group_summary_message(stats: GroupStats) -> pb.ConsumerGroupSummary:
    message = pb.ConsumerGroupSummary(
        stream=stats.stream,
        name=stats.name,
        links_attached=stats.links_attached,
        lag=stats.lag,
        members=len(stats.members),
        state=stats.state or "",
        coordinator_unavailable=stats.coordinator_unavailable or "",
    )
    if stats.definition is not None:
        message.definition.CopyFrom(consumer_group_message(stats.definition))
    if stats.generation is not None:
        message.generation = stats.generation
    return message


def group_describe_message(
    stats: GroupStats, partitions_here: Sequence[int]
) -> pb.DescribeConsumerGroupResponse:
    message = pb.DescribeConsumerGroupResponse(
        stream=stats.stream,
        name=stats.name,
        partitions=[group_partition_message(p) for p in stats.partitions],
        links_attached=stats.links_attached,
        lag=stats.lag,
        partitions_here=partitions_here,
        state=stats.state or "",
        members=[
            pb.ConsumerGroupMember(
                member=m.member,
                partitions=m.partitions,
                releasing=m.releasing,
                heartbeat_age_ms=m.heartbeat_age_ms,
                session_timeout_ms=m.session_timeout_ms,
            )
            for m in stats.members
        ],
        coordinator_unavailable=stats.coordinator_unavailable or "",
    )
    if stats.definition is not None:
        message.definition.CopyFrom(consumer_group_message(stats.definition))
    if stats.generation is not None:
        message.generation = stats.generation
    return message


def group_partition_message(row: GroupPartition) -> pb.ConsumerGroupPartition:
    message = pb.ConsumerGroupPartition(
        partition=row.partition,
        available=row.available,
        owner_attached=row.owner_attached,
        end_offset=row.end_offset or 0,
        lag=row.lag or 0,
    )
    if row.epoch is not None:
        message.epoch = row.epoch
    if row.committed is not None:
        message.committed_offset = row.committed
    if row.member is not None:
        message.member = row.member
    return message
