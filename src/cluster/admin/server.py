"""The gRPC admin listener (grpc.aio): spate.api.v1.Admin plus health checking and reflection.

Every BrokerError raised while serving a call becomes the status in spate.cluster.admin.errors,
with its message as details; anything else is a bug and reaches the client as UNKNOWN.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection
from spate.api.tls import AdminTls
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc
from spate.cluster.admin import convert, group_stats
from spate.cluster.admin.auth import AdminAuth
from spate.cluster.admin.errors import ERROR_CODE_KEY, grpc_status
from spate.cluster.admin.operations import Operations
from spate.cluster.admin.providers import (
    ConsumersProvider,
    CoordinatorsProvider,
    ProducersProvider,
    ReplicaControl,
    ReplicaFacts,
    StatsProvider,
    StatusProvider,
)
from spate.cluster.metadata.service import MetadataService
from spate.cluster.metadata.state import RequestId, StreamRecord
from spate.core import groups, limits
from spate.core.backend import ConsumerOffset, PartitionInfo
from spate.core.errors import (
    BrokerError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from spate.core.ids import PartitionId, StreamName
from spate.core.streams import validate_stream_name
from spate.core.superstreams import Routing, define

log = logging.getLogger(__name__)

ADMIN_SERVICE = pb.DESCRIPTOR.services_by_name["Admin"].full_name  # "spate.api.v1.Admin"

stop_grace_s = 1.0
"""Time in-flight admin calls get to finish when the server stops."""
coordinator_wait_s = 5.0
"""How long group statistics wait for a group's coordinator (a local call, or one GROUP
request over the gateway wire, normally ~1 ms) before reporting it unavailable."""

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_T = TypeVar("_T")


class AdminServer:
    """Serves the admin API on host:port (port 0 picks a free one)."""

    def __init__(
        self,
        metadata: MetadataService,
        stats: StatsProvider,
        status: StatusProvider,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        producers: ProducersProvider | None = None,
        consumers: ConsumersProvider | None = None,
        coordinators: CoordinatorsProvider | None = None,
        auth: AdminAuth | None = None,
        replicas: ReplicaControl | None = None,
        peer_token: str | None = None,
        tls: AdminTls | None = None,
    ) -> None:
        """`peer_token`: sent to other nodes' admin APIs during cluster operations (a user's
        token with configure on `$cluster`; default `$SPATE_ADMIN_TOKEN`). `tls`: serve over
        TLS (mTLS with its `client_auth`), and call the other nodes with its CA and
        certificate (spate.api.tls)."""
        self.metadata = metadata
        self.auth = auth or AdminAuth(allow_remote_anonymous=True)
        """Who may call and what they may do (ADR 0023; default: open, as before)."""
        self.host = host
        self.port = port
        self._servicer = _AdminServicer(metadata, stats, status, producers, consumers, coordinators)
        self._servicer.replicas = replicas
        self._servicer.operations = Operations(metadata, metadata.node_id, peer_token, tls)
        self.tls = tls
        self._health = health_aio.HealthServicer()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Listen and serve; returns the bound port. Raises Unavailable if it cannot listen."""
        assert self._server is None, "started twice"
        server = grpc.aio.server(interceptors=[self.auth.interceptor()])
        pb_grpc.add_AdminServicer_to_server(self._servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (
                ADMIN_SERVICE,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        address = f"{self.host}:{self.port}"
        try:
            if self.tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, self.tls.server_credentials())
        except RuntimeError as error:
            raise Unavailable(f"the admin API cannot listen on {address}: {error}") from error
        if port == 0:  # older grpc reports a failed bind this way
            raise Unavailable(f"the admin API cannot listen on {address}")
        await server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(ADMIN_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self.port = port
        log.info(
            "admin API listening on %s:%d (%s)",
            self.host,
            port,
            "plaintext" if self.tls is None else "mutual TLS" if self.tls.client_auth else "TLS",
        )
        return port

    async def recover_operations(self) -> None:
        """Mark the operations this node ran before it restarted as interrupted (ADR 0025)."""
        await self._servicer.operations.recover()

    async def stop(self) -> None:
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(stop_grace_s)
        self._server = None
        await self._servicer.operations.close()


class _AdminServicer(pb_grpc.AdminServicer):
    def __init__(  # noqa: PLR0917 - the providers, positional since the first ones
        self,
        metadata: MetadataService,
        stats: StatsProvider,
        status: StatusProvider,
        producers: ProducersProvider | None,
        consumers: ConsumersProvider | None = None,
        coordinators: CoordinatorsProvider | None = None,
        auth: AdminAuth | None = None,
    ) -> None:
        self.metadata = metadata
        self.auth = auth or AdminAuth(allow_remote_anonymous=True)
        """Who may call and what they may do (ADR 0023; default: open, as before)."""
        self.stats = stats
        self.status = status
        self.producers = producers
        self.consumers = consumers
        self.coordinators = coordinators
        self.replicas: ReplicaControl | None = None
        self.operations: Operations = Operations(metadata)

    async def _hosted(
        self, stream: str, per_partition: Callable[[StreamName], Mapping[PartitionId, _T]] | None
    ) -> Mapping[PartitionId, _T]:
        """What `per_partition` says of the stream's partitions hosted here (none when this
        process hosts none yet); NotFound for a stream the metadata does not know."""
        name = StreamName(stream)
        validate_stream_name(name)
        await self._catch_up()
        self.metadata.stream_record(name)  # NotFound for an unknown stream
        try:
            return {} if per_partition is None else per_partition(name)
        except NotFound:
            return {}  # defined in the metadata, not (yet) opened by this process

    async def ListConsumers(
        self,
        request: pb.ListConsumersRequest,
        context: grpc.aio.ServicerContext[pb.ListConsumersRequest, pb.ListConsumersResponse],
    ) -> pb.ListConsumersResponse:
        async def call() -> pb.ListConsumersResponse:
            consumers = self.consumers
            held = await self._hosted(request.stream, None if consumers is None else consumers.list)
            return pb.ListConsumersResponse(
                consumers=[
                    pb.ConsumerEntry(
                        partition=pid,
                        name=c.name,
                        offset=c.offset,
                        timestamp_ms=c.timestamp_ms,
                        attached=c.attached,
                        group=c.group,
                    )
                    for pid, entries in sorted(held.items())
                    for c in entries
                    if not groups.is_reserved(c.name)  # a group's: `spate group describe`
                ],
                partitions_here=sorted(held),
            )

        return await _answer(context, call)

    async def SetConsumerOffset(
        self,
        request: pb.SetConsumerOffsetRequest,
        context: grpc.aio.ServicerContext[
            pb.SetConsumerOffsetRequest, pb.SetConsumerOffsetResponse
        ],
    ) -> pb.SetConsumerOffsetResponse:
        async def call() -> pb.SetConsumerOffsetResponse:
            name = StreamName(request.stream)
            validate_stream_name(name)
            consumer = request.name.encode()
            if not 0 < len(consumer) <= limits.consumer_name_bytes_max:
                raise InvalidArgument(
                    f"a consumer name is 1..{limits.consumer_name_bytes_max} bytes of UTF-8"
                )
            if request.offset < -1:
                raise InvalidArgument(
                    f"offset {request.offset}: use -1 (from the start) or an offset >= 0"
                )
            await self._catch_up()
            record = self.metadata.stream_record(name)  # NotFound for an unknown stream
            partitions = record.config.partitions
            if not 0 <= request.partition < partitions:
                raise NotFound(
                    f"stream {name!r} has partitions 0..{partitions - 1}; there is no "
                    f"partition {request.partition}"
                )
            if self.consumers is None:
                raise Unavailable("this process does not serve partitions")
            await self.consumers.reset(
                name, PartitionId(request.partition), consumer, request.offset
            )
            return pb.SetConsumerOffsetResponse()

        return await _answer(context, call)

    async def ListProducers(
        self,
        request: pb.ListProducersRequest,
        context: grpc.aio.ServicerContext[pb.ListProducersRequest, pb.ListProducersResponse],
    ) -> pb.ListProducersResponse:
        async def call() -> pb.ListProducersResponse:
            held = await self._hosted(request.stream, self.producers)
            return pb.ListProducersResponse(
                producers=[
                    pb.ProducerEntry(
                        partition=pid,
                        name=p.name,
                        last_publishing_id=p.last_publishing_id,
                        last_offset=p.last_offset,
                        timestamp_ms=p.timestamp_ms,
                    )
                    for pid, infos in sorted(held.items())
                    for p in infos
                ],
                partitions_here=sorted(held),
            )

        return await _answer(context, call)

    async def CreateStream(
        self,
        request: pb.CreateStreamRequest,
        context: grpc.aio.ServicerContext[pb.CreateStreamRequest, pb.CreateStreamResponse],
    ) -> pb.CreateStreamResponse:
        async def call() -> pb.CreateStreamResponse:
            config = convert.stream_config(request.stream)
            stored = await self.metadata.create_stream(
                config,
                request_id=_request_id(request.request_id),
                default_replicas=not convert.replicas_given(request.stream),
            )
            return pb.CreateStreamResponse(stream=convert.stream_config_message(stored))

        return await _answer(context, call)

    async def ListStreams(
        self,
        request: pb.ListStreamsRequest,
        context: grpc.aio.ServicerContext[pb.ListStreamsRequest, pb.ListStreamsResponse],
    ) -> pb.ListStreamsResponse:
        async def call() -> pb.ListStreamsResponse:
            await self._catch_up()
            return pb.ListStreamsResponse(
                streams=[convert.stream_config_message(c) for c in self.metadata.streams()]
            )

        return await _answer(context, call)

    async def DescribeStream(
        self,
        request: pb.DescribeStreamRequest,
        context: grpc.aio.ServicerContext[pb.DescribeStreamRequest, pb.DescribeStreamResponse],
    ) -> pb.DescribeStreamResponse:
        async def call() -> pb.DescribeStreamResponse:
            name = StreamName(request.name)
            validate_stream_name(name)
            await self._catch_up()
            record = self.metadata.stream_record(name)
            infos = await self._stats(name)
            partitions = convert.partition_stats(record, infos)
            if not request.local_only:
                await self._fill_from_hosts(record, partitions)
            return pb.DescribeStreamResponse(
                stream=convert.stream_config_message(record.config), partitions=partitions
            )

        return await _answer(context, call)

    async def DeleteStream(
        self,
        request: pb.DeleteStreamRequest,
        context: grpc.aio.ServicerContext[pb.DeleteStreamRequest, pb.DeleteStreamResponse],
    ) -> pb.DeleteStreamResponse:
        async def call() -> pb.DeleteStreamResponse:
            name = StreamName(request.name)
            validate_stream_name(name)
            await self.metadata.delete_stream(name, request_id=_request_id(request.request_id))
            return pb.DeleteStreamResponse()

        return await _answer(context, call)

    async def CreateSuperStream(
        self,
        request: pb.CreateSuperStreamRequest,
        context: grpc.aio.ServicerContext[
            pb.CreateSuperStreamRequest, pb.CreateSuperStreamResponse
        ],
    ) -> pb.CreateSuperStreamResponse:
        async def call() -> pb.CreateSuperStreamResponse:
            routing = None
            if request.routing:
                try:
                    routing = Routing(request.routing)
                except ValueError:
                    raise InvalidArgument(
                        f"routing must be 'hash' or 'key', got {request.routing!r}"
                    ) from None
            topology = define(
                request.name,
                partitions=request.partitions if request.HasField("partitions") else None,
                binding_keys=tuple(request.binding_keys) or None,
                routing=routing,
            )
            template = convert.stream_config(request.stream)
            if template.partitions != 1:
                raise InvalidArgument(
                    "stream.partitions: each partition stream of a super stream has one "
                    f"partition, not {template.partitions} (use partitions for the count)"
                )
            stored = await self.metadata.create_super_stream(
                topology,
                replace(template, name=topology.name),
                request_id=_request_id(request.request_id),
                default_replicas=not convert.replicas_given(request.stream),
            )
            return pb.CreateSuperStreamResponse(super_stream=convert.super_stream_message(stored))

        return await _answer(context, call)

    async def ListSuperStreams(
        self,
        request: pb.ListSuperStreamsRequest,
        context: grpc.aio.ServicerContext[pb.ListSuperStreamsRequest, pb.ListSuperStreamsResponse],
    ) -> pb.ListSuperStreamsResponse:
        async def call() -> pb.ListSuperStreamsResponse:
            await self._catch_up()
            return pb.ListSuperStreamsResponse(
                super_streams=[
                    convert.super_stream_message(t) for t in self.metadata.super_streams()
                ]
            )

        return await _answer(context, call)

    async def DescribeSuperStream(
        self,
        request: pb.DescribeSuperStreamRequest,
        context: grpc.aio.ServicerContext[
            pb.DescribeSuperStreamRequest, pb.DescribeSuperStreamResponse
        ],
    ) -> pb.DescribeSuperStreamResponse:
        async def call() -> pb.DescribeSuperStreamResponse:
            name = StreamName(request.name)
            validate_stream_name(name)
            await self._catch_up()
            topology = self.metadata.super_stream(name)
            answer = pb.DescribeSuperStreamResponse(
                super_stream=convert.super_stream_message(topology)
            )
            for index, stream in enumerate(topology.partitions):
                record = self.metadata.stream_record(stream)
                if index == 0:
                    answer.stream.CopyFrom(convert.stream_config_message(record.config))
                (stats,) = convert.partition_stats(record, await self._stats(stream))
                answer.partitions.append(
                    pb.SuperStreamPartition(
                        stream=stream, binding_key=topology.binding_keys[index], stats=stats
                    )
                )
            return answer

        return await _answer(context, call)

    async def DeleteSuperStream(
        self,
        request: pb.DeleteSuperStreamRequest,
        context: grpc.aio.ServicerContext[
            pb.DeleteSuperStreamRequest, pb.DeleteSuperStreamResponse
        ],
    ) -> pb.DeleteSuperStreamResponse:
        async def call() -> pb.DeleteSuperStreamResponse:
            name = StreamName(request.name)
            validate_stream_name(name)
            await self.metadata.delete_super_stream(
                name, request_id=_request_id(request.request_id)
            )
            return pb.DeleteSuperStreamResponse()

        return await _answer(context, call)

    async def CreateConsumerGroup(
        self,
        request: pb.CreateConsumerGroupRequest,
        context: grpc.aio.ServicerContext[
            pb.CreateConsumerGroupRequest, pb.CreateConsumerGroupResponse
        ],
    ) -> pb.CreateConsumerGroupResponse:
        async def call() -> pb.CreateConsumerGroupResponse:
            group = groups.define(
                request.stream,
                request.name,
                strategy=request.strategy or None,
                session_timeout_ms=request.session_timeout_ms
                if request.HasField("session_timeout_ms")
                else None,
                rebalance_delay_ms=request.rebalance_delay_ms
                if request.HasField("rebalance_delay_ms")
                else None,
                pending_max=request.pending_max if request.HasField("pending_max") else None,
            )
            stored = await self.metadata.create_consumer_group(
                group, request_id=_request_id(request.request_id)
            )
            return pb.CreateConsumerGroupResponse(group=convert.consumer_group_message(stored))

        return await _answer(context, call)

    async def DeleteConsumerGroup(
        self,
        request: pb.DeleteConsumerGroupRequest,
        context: grpc.aio.ServicerContext[
            pb.DeleteConsumerGroupRequest, pb.DeleteConsumerGroupResponse
        ],
    ) -> pb.DeleteConsumerGroupResponse:
        async def call() -> pb.DeleteConsumerGroupResponse:
            name = StreamName(request.stream)
            validate_stream_name(name)
            await self.metadata.delete_consumer_group(
                name, request.name, request_id=_request_id(request.request_id)
            )
            return pb.DeleteConsumerGroupResponse()

        return await _answer(context, call)

    async def ListConsumerGroups(
        self,
        request: pb.ListConsumerGroupsRequest,
        context: grpc.aio.ServicerContext[
            pb.ListConsumerGroupsRequest, pb.ListConsumerGroupsResponse
        ],
    ) -> pb.ListConsumerGroupsResponse:
        async def call() -> pb.ListConsumerGroupsResponse:
            if not request.stream:  # every definition (a gateway's routes), no statistics
                await self._catch_up()
                return pb.ListConsumerGroupsResponse(
                    groups=[
                        pb.ConsumerGroupSummary(
                            stream=g.stream,
                            name=g.name,
                            definition=convert.consumer_group_message(g),
                        )
                        for g in self.metadata.consumer_groups()
                    ]
                )
            name, partitions, held, infos = await self._group_sources(request.stream)
            definitions = self.metadata.consumer_groups(name)
            coordination = await self._coordination(
                name, group_stats.names(name, definitions, held)
            )
            found = group_stats.summaries(name, definitions, partitions, held, infos, coordination)
            return pb.ListConsumerGroupsResponse(
                groups=[convert.group_summary_message(g) for g in found],
                partitions_here=sorted(held),
            )

        return await _answer(context, call)

    async def DescribeConsumerGroup(
        self,
        request: pb.DescribeConsumerGroupRequest,
        context: grpc.aio.ServicerContext[
            pb.DescribeConsumerGroupRequest, pb.DescribeConsumerGroupResponse
        ],
    ) -> pb.DescribeConsumerGroupResponse:
        async def call() -> pb.DescribeConsumerGroupResponse:
            groups.validate_group_name(request.name)
            name, partitions, held, infos = await self._group_sources(request.stream)
            definition = self.metadata.consumer_group(name, request.name)
            coordination = (await self._coordination(name, [request.name]))[request.name]
            if (
                definition is None
                and coordination.view is None
                and request.name not in group_stats.seen(held)
            ):
                if held:
                    where = f"on its partitions hosted here ({', '.join(map(str, sorted(held)))})"
                else:
                    where = "here: this node hosts none of its partitions (ask one with --admin)"
                raise NotFound(
                    f"consumer group {request.name!r} is not defined on stream {name!r} and has "
                    f"no committed offset {where}, and its coordinator "
                    + (
                        "does not know it"
                        if coordination.unavailable is None
                        else f"could not be asked ({coordination.unavailable})"
                    )
                )
            stats = group_stats.describe(
                name, request.name, definition, partitions, held, infos, coordination
            )
            return convert.group_describe_message(stats, sorted(held))

        return await _answer(context, call)

    async def _group_sources(
        self, stream: str
    ) -> tuple[
        StreamName,
        int,
        Mapping[PartitionId, Sequence[ConsumerOffset]],
        Mapping[PartitionId, PartitionInfo],
    ]:
        """(stream, its partition count, the stored offsets and figures of its partitions
        hosted here) — what `spate consumer list` reads, for group statistics."""
        consumers = self.consumers
        held = await self._hosted(stream, None if consumers is None else consumers.list)
        name = StreamName(stream)
        partitions = self.metadata.stream_record(name).config.partitions
        infos = {info.partition: info for info in await self._stats(name)}
        return name, partitions, held, infos

    async def _coordination(
        self, stream: StreamName, names: Sequence[str]
    ) -> dict[str, group_stats.Coordination]:
        """What the coordinator of `stream`'s groups says of each of `names` (asked at once);
        when it cannot be reached, why — the statistics are reported without it."""
        if self.coordinators is None:
            unreachable = group_stats.Coordination(
                None, "this process does not reach consumer-group coordinators"
            )
            return dict.fromkeys(names, unreachable)
        try:
            coordinator = self.coordinators.group_coordinator(stream)
        except BrokerError as error:
            return dict.fromkeys(names, group_stats.Coordination(None, error.message))

        async def ask(group: str) -> group_stats.Coordination:
            try:
                async with asyncio.timeout(coordinator_wait_s):
                    return group_stats.Coordination(await coordinator.describe(group))
            except BrokerError as error:
                return group_stats.Coordination(None, error.message)
            except TimeoutError:
                return group_stats.Coordination(
                    None, f"the coordinator did not answer within {coordinator_wait_s:g} s"
                )

        async with asyncio.TaskGroup() as tasks:
            asked = {group: tasks.create_task(ask(group)) for group in names}
        return {group: task.result() for group, task in asked.items()}

    async def ClusterStatus(
        self,
        request: pb.ClusterStatusRequest,
        context: grpc.aio.ServicerContext[pb.ClusterStatusRequest, pb.ClusterStatusResponse],
    ) -> pb.ClusterStatusResponse:
        async def call() -> pb.ClusterStatusResponse:
            status = self.metadata.status()
            return pb.ClusterStatusResponse(
                metadata=convert.metadata_status_message(status),
                processes=[convert.process_message(p) for p in self.status()],
                nodes=[
                    convert.node_message(n, status.voters) for n in self.metadata.node_statuses()
                ],
            )

        return await _answer(context, call)

    async def ListPartitions(
        self,
        request: pb.ListPartitionsRequest,
        context: grpc.aio.ServicerContext[pb.ListPartitionsRequest, pb.ListPartitionsResponse],
    ) -> pb.ListPartitionsResponse:
        async def call() -> pb.ListPartitionsResponse:
            stream = None
            if request.stream:
                validate_stream_name(request.stream)
                stream = StreamName(request.stream)
            await self._catch_up()
            alive = {s.record.node for s in self.metadata.node_statuses() if s.alive}
            return pb.ListPartitionsResponse(
                partitions=[
                    convert.partition_placement_message(
                        p, p.leader is not None and p.leader.node in alive
                    )
                    for p in self.metadata.partitions(stream)
                ]
            )

        return await _answer(context, call)

    async def _catch_up(self) -> None:
        """Reads are linearizable: a read after a write acknowledged by any node sees it. A
        barrier makes every change committed before it visible here (one metadata round trip,
        ~0.3 ms). Without a quorum the read fails with UNAVAILABLE rather than answer from this
        replica's state, which may be stale (the chaos suite found a stream listed 25 s after
        its delete was acknowledged, by a replica cut off meanwhile). `spate cluster status`
        still answers without a quorum: it reports health, not definitions."""
        try:
            await self.metadata.barrier()
        except Unavailable as error:
            raise Unavailable(
                f"no metadata quorum reachable from this node, so its copy of the definitions "
                f"may be stale; try another node or retry ({error.message})"
            ) from None

    async def _fill_from_hosts(
        self, record: StreamRecord, partitions: list[pb.PartitionStats]
    ) -> None:
        """The runtime figures of the partitions this node does not host (a cluster of more
        nodes than replicas), asked of a node hosting each: the reported leader first, then
        the other replicas; one call per node asked per round. A partition no host answers for
        stays `available` false."""
        missing = {e.partition: e for e in partitions if not e.available}
        tried: dict[int, set[str]] = {index: {self.metadata.node_id} for index in missing}
        request = pb.DescribeStreamRequest(name=record.config.name, local_only=True)
        while missing:
            asks: dict[str, list[int]] = {}
            for index in missing:
                placed = record.partitions[index]
                hosts = [placed.leader.node] if placed.leader is not None else []
                hosts += [n for n in placed.replicas if n not in hosts]
                candidates = [n for n in hosts if n not in tried[index]]
                if candidates:
                    asks.setdefault(candidates[0], []).append(index)
            if not asks:
                return
            peers = self.operations.peers
            answers = await asyncio.gather(
                *(peers.call_any(n, "DescribeStream", request, REMOTE_STATS_S) for n in asks),
                return_exceptions=True,
            )
            for (node, indexes), answer in zip(asks.items(), answers, strict=True):
                remote = (
                    {e.partition: e for e in answer.partitions if e.available}
                    if isinstance(answer, pb.DescribeStreamResponse)
                    else {}
                )
                for index in indexes:
                    tried[index].add(node)
                    if index in remote:
                        _copy_figures(remote[index], missing.pop(index))

    async def _stats(self, name: StreamName) -> Sequence[PartitionInfo]:
        try:
            answer = self.stats(name)
            if inspect.isawaitable(answer):
                return await answer
            assert isinstance(answer, Sequence), answer
            return answer
        except NotFound:
            return []  # defined in the metadata, not (yet) opened by this process

    # Cluster operations (issue 14, ADR 0022) ---------------------------------------------

    async def MovePartition(
        self,
        request: pb.MovePartitionRequest,
        context: grpc.aio.ServicerContext[pb.MovePartitionRequest, pb.Operation],
    ) -> pb.Operation:
        async def call() -> pb.Operation:
            await self._catch_up()
            return self.operations.move(
                request.stream, request.partition, request.from_node, request.to_node
            ).message()

        return await _answer(context, call)

    async def TransferLeader(
        self,
        request: pb.TransferLeaderRequest,
        context: grpc.aio.ServicerContext[pb.TransferLeaderRequest, pb.Operation],
    ) -> pb.Operation:
        async def call() -> pb.Operation:
            await self._catch_up()
            return self.operations.transfer_leader(
                request.stream, request.partition, request.to_node
            ).message()

        return await _answer(context, call)

    async def RebalanceLeaders(
        self,
        request: pb.RebalanceLeadersRequest,
        context: grpc.aio.ServicerContext[pb.RebalanceLeadersRequest, pb.Operation],
    ) -> pb.Operation:
        async def call() -> pb.Operation:
            await self._catch_up()
            return self.operations.rebalance().message()

        return await _answer(context, call)

    async def DrainNode(
        self,
        request: pb.DrainNodeRequest,
        context: grpc.aio.ServicerContext[pb.DrainNodeRequest, pb.Operation],
    ) -> pb.Operation:
        async def call() -> pb.Operation:
            await self._catch_up()
            return self.operations.drain(request.node).message()

        return await _answer(context, call)

    async def RemoveNode(
        self,
        request: pb.RemoveNodeRequest,
        context: grpc.aio.ServicerContext[pb.RemoveNodeRequest, pb.Operation],
    ) -> pb.Operation:
        async def call() -> pb.Operation:
            await self._catch_up()
            return self.operations.remove(request.node).message()

        return await _answer(context, call)

    async def AddMetadataVoter(
        self,
        request: pb.MetadataVoterRequest,
        context: grpc.aio.ServicerContext[pb.MetadataVoterRequest, pb.Operation],
    ) -> pb.Operation:
        async def call() -> pb.Operation:
            await self._catch_up()
            return self.operations.add_voter(request.node).message()

        return await _answer(context, call)

    async def RemoveMetadataVoter(
        self,
        request: pb.MetadataVoterRequest,
        context: grpc.aio.ServicerContext[pb.MetadataVoterRequest, pb.Operation],
    ) -> pb.Operation:
        async def call() -> pb.Operation:
            await self._catch_up()
            return self.operations.remove_voter(request.node).message()

        return await _answer(context, call)

    async def LocalMetadataChange(
        self,
        request: pb.LocalMetadataChangeRequest,
        context: grpc.aio.ServicerContext[pb.LocalMetadataChangeRequest, pb.MetadataStatus],
    ) -> pb.MetadataStatus:
        async def call() -> pb.MetadataStatus:
            if request.action == "transfer-leadership":
                await self.metadata.transfer_leadership()
            elif request.action in ("add", "remove"):
                if not request.address:
                    raise InvalidArgument("address: required")
                await self.metadata.change_voters(request.action, request.address)
            else:
                raise InvalidArgument(
                    f"action: 'add', 'remove' or 'transfer-leadership', not {request.action!r}"
                )
            return convert.metadata_status_message(self.metadata.status())

        return await _answer(context, call)

    async def LocalSetMetadataRole(
        self,
        request: pb.LocalSetMetadataRoleRequest,
        context: grpc.aio.ServicerContext[pb.LocalSetMetadataRoleRequest, pb.MetadataStatus],
    ) -> pb.MetadataStatus:
        async def call() -> pb.MetadataStatus:
            await self.metadata.set_role(request.voter, list(request.voters))
            return convert.metadata_status_message(self.metadata.status())

        return await _answer(context, call)

    async def GetOperation(
        self,
        request: pb.GetOperationRequest,
        context: grpc.aio.ServicerContext[pb.GetOperationRequest, pb.Operation],
    ) -> pb.Operation:
        async def call() -> pb.Operation:
            if not request.id:
                raise InvalidArgument("id: required")
            return self.operations.describe(request.id)

        return await _answer(context, call)

    async def ListReplicas(
        self,
        request: pb.ListReplicasRequest,
        context: grpc.aio.ServicerContext[pb.ListReplicasRequest, pb.ListReplicasResponse],
    ) -> pb.ListReplicasResponse:
        async def call() -> pb.ListReplicasResponse:
            stream = None
            if request.stream:
                validate_stream_name(request.stream)
                stream = StreamName(request.stream)
            await self._catch_up()
            placements = [p for p in self.metadata.partitions(stream) if p.replicas]
            states = await asyncio.gather(
                *(self.operations.replica_states(p.stream, p.partition) for p in placements)
            )
            return pb.ListReplicasResponse(
                partitions=[
                    pb.PartitionReplicas(
                        stream=p.stream,
                        partition=p.partition,
                        replicas=p.replicas,
                        learners=p.learners,
                        leader=p.leader.node if p.leader is not None else "",
                        leader_epoch=p.leader.epoch if p.leader is not None else None,
                        states=found,
                    )
                    for p, found in zip(placements, states, strict=True)
                ]
            )

        return await _answer(context, call)

    async def SetLeaderBalancer(
        self,
        request: pb.SetLeaderBalancerRequest,
        context: grpc.aio.ServicerContext[pb.SetLeaderBalancerRequest, pb.LeaderBalancerStatus],
    ) -> pb.LeaderBalancerStatus:
        async def call() -> pb.LeaderBalancerStatus:
            self.operations.set_balancer(request.enabled, request.interval_s)
            return pb.LeaderBalancerStatus(
                enabled=request.enabled,
                interval_s=self.operations.balancer_interval_s,
                operations=self.operations.balancer_operations,
            )

        return await _answer(context, call)

    def _control(self) -> ReplicaControl:
        if self.replicas is None:
            raise FailedPrecondition("this process hosts no partition replicas (not a node)")
        return self.replicas

    async def GetLocalReplica(
        self,
        request: pb.GetLocalReplicaRequest,
        context: grpc.aio.ServicerContext[pb.GetLocalReplicaRequest, pb.ReplicaState],
    ) -> pb.ReplicaState:
        async def call() -> pb.ReplicaState:
            facts = self._control().facts(
                StreamName(request.stream), PartitionId(request.partition)
            )
            return _replica_state(facts)

        return await _answer(context, call)

    async def LocalTransferLeader(
        self,
        request: pb.TransferLeaderRequest,
        context: grpc.aio.ServicerContext[pb.TransferLeaderRequest, pb.ReplicaState],
    ) -> pb.ReplicaState:
        async def call() -> pb.ReplicaState:
            facts = self._control().transfer_leader(
                StreamName(request.stream), PartitionId(request.partition), request.to_node
            )
            return _replica_state(facts)

        return await _answer(context, call)

    async def LocalChangeMembership(
        self,
        request: pb.LocalChangeMembershipRequest,
        context: grpc.aio.ServicerContext[pb.LocalChangeMembershipRequest, pb.ReplicaState],
    ) -> pb.ReplicaState:
        async def call() -> pb.ReplicaState:
            facts = self._control().change_membership(
                StreamName(request.stream),
                PartitionId(request.partition),
                list(request.voters),
                list(request.learners),
            )
            return _replica_state(facts)

        return await _answer(context, call)


def _replica_state(facts: ReplicaFacts) -> pb.ReplicaState:
    return pb.ReplicaState(
        stream=facts.stream,
        partition=facts.partition,
        node=facts.node,
        available=True,
        role=facts.role,
        term=facts.term,
        leader=facts.leader or "",
        leader_epoch=facts.leader_epoch,
        commit_index=facts.commit_index,
        applied_index=facts.applied_index,
        last_index=facts.last_index,
        voters=facts.voters,
        learners=facts.learners,
        membership_index=facts.membership_index,
        progress=[
            pb.ReplicaProgress(node=node, match_index=match, lag=max(0, facts.last_index - match))
            for node, match in sorted(facts.progress.items())
        ],
        transferring_to=facts.transferring_to or "",
    )


async def _answer(
    context: grpc.aio.ServicerContext[_Request, _Response], call: Callable[[], Awaitable[_Response]]
) -> _Response:
    try:
        return await call()
    except BrokerError as error:
        context.set_trailing_metadata(((ERROR_CODE_KEY, error.code.value),))
        await context.abort(grpc_status(error), error.message)
        raise AssertionError("abort returned") from error


def _request_id(text: str) -> RequestId | None:
    return RequestId(text) if text else None


REMOTE_STATS_S = 2.0
"""How long DescribeStream waits for a node hosting a partition this node does not host."""


def _copy_figures(source: pb.PartitionStats, into: pb.PartitionStats) -> None:
    """A hosting node's runtime figures into this node's entry (placement and the reported
    leader stay this node's metadata view)."""
    into.available = True
    for field in ("first_offset", "last_offset", "first_timestamp_ms", "last_timestamp_ms"):
        if source.HasField(field):
            setattr(into, field, getattr(source, field))
    into.end_offset, into.messages = source.end_offset, source.messages
    into.bytes, into.segments = source.bytes, source.segments
    if not into.leader:
        into.leader = source.leader
