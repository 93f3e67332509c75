"""The gRPC admin server in-process, called with a real grpc.aio client over 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc
from spate.cluster.admin.errors import ERROR_CODE_KEY, GRPC_STATUS
from spate.cluster.admin.providers import ProcessFacts
from spate.cluster.admin.server import AdminServer
from spate.cluster.metadata.service import MetadataService
from spate.core.backend import PartitionInfo
from spate.core.errors import BrokerError, ErrorCode, NotFound
from spate.core.ids import LeaderEpoch, NodeId, Offset, PartitionId, StreamName

Scenario = Callable[[pb_grpc.AdminStub, grpc.aio.Channel, MetadataService], Awaitable[None]]


def info(stream: StreamName, partition: int, messages: int) -> PartitionInfo:
    return PartitionInfo(
        stream=stream,
        partition=PartitionId(partition),
        first_offset=None,
        last_offset=None,
        end_offset=Offset(messages),
        first_timestamp_ms=None,
        last_timestamp_ms=None,
        messages=messages,
        bytes=0,
        segments=1,
        leader=NodeId("n1"),
    )


async def async_stats(stream: StreamName) -> Sequence[PartitionInfo]:
    """An awaitable provider; `hidden-*` streams are not served here (NotFound)."""
    await asyncio.sleep(0)
    if stream.startswith("hidden"):
        raise NotFound(f"stream {stream!r} is not served here")
    return [info(stream, 1, 7)]


def status() -> list[ProcessFacts]:
    return [
        ProcessFacts(
            node_id="n1",
            role="node",
            pid=os.getpid(),
            endpoints={"amqp": "127.0.0.1:5672"},
            partitions=3,
            streams=1,
        )
    ]


def serve(
    tmp_path: Path,
    port: int,
    scenario: Scenario,
    peers: Sequence[int] = (),
    command_timeout_ms: int = 5000,
) -> None:
    async def main() -> None:
        metadata = MetadataService(
            node_id="n1",
            data_dir=tmp_path,
            self_address=f"127.0.0.1:{port}",
            peer_addresses=[f"127.0.0.1:{p}" for p in peers],
            password="pw",
            command_timeout_ms=command_timeout_ms,
        )
        await metadata.start()
        server = AdminServer(metadata, stats=async_stats, status=status)
        try:
            if not peers:
                await metadata.wait_ready()
                for node in ("n1", "n2", "n3"):  # n2, n3: registry entries only
                    await metadata.register_node(
                        NodeId(node),
                        amqp=f"{node}.example:5672",
                        admin=f"{node}.example:7600",
                        replication=f"{node}.example:7700",
                        metadata=f"{node}.example:7800",
                    )
            admin_port = await server.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{admin_port}") as channel:
                await scenario(pb_grpc.AdminStub(channel), channel, metadata)
        finally:
            await server.stop()
            await metadata.stop()

    asyncio.run(main())


async def expect_error(
    call: Awaitable[object], status: grpc.StatusCode, code: ErrorCode, details: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    error = caught.value
    assert error.code() == status
    assert details in (error.details() or "")
    trailing = dict(error.trailing_metadata() or ())
    assert trailing[ERROR_CODE_KEY] == code.value


def test_admin_rpcs_health_reflection_and_error_statuses(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    async def scenario(
        stub: pb_grpc.AdminStub, channel: grpc.aio.Channel, metadata: MetadataService
    ) -> None:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "spate.api.v1.Admin"):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        services = [s.name async for r in responses for s in r.list_services_response.service]
        assert "spate.api.v1.Admin" in services and "grpc.health.v1.Health" in services

        created = await stub.CreateStream(
            pb.CreateStreamRequest(
                stream=pb.StreamConfig(
                    name="orders", partitions=3, retention=pb.Retention(max_age_ms=60_000)
                )
            )
        )
        # replicas unset: min(3, registered nodes) = 3
        assert created.stream.partitions == 3 and created.stream.replicas == 3
        assert created.stream.segment_bytes == 64 * 1024 * 1024  # default filled in
        assert not created.stream.retention.HasField("max_bytes")
        assert [s.name for s in (await stub.ListStreams(pb.ListStreamsRequest())).streams] == [
            "orders"
        ]

        described = await stub.DescribeStream(pb.DescribeStreamRequest(name="orders"))
        assert [(p.partition, p.available) for p in described.partitions] == [
            (0, False),
            (1, True),
            (2, False),
        ]
        assert described.partitions[1].messages == 7
        assert not described.partitions[1].HasField("first_offset")
        assert [list(p.replicas) for p in described.partitions] == [
            ["n1", "n2", "n3"],
            ["n2", "n3", "n1"],
            ["n3", "n1", "n2"],
        ]
        # No report yet: the stats provider's leader (n1) for partition 1, no epoch.
        assert [(p.leader, p.HasField("leader_epoch")) for p in described.partitions] == [
            ("", False),
            ("n1", False),
            ("", False),
        ]
        await metadata.report_leader(
            StreamName("orders"), PartitionId(1), NodeId("n3"), LeaderEpoch(4)
        )
        await metadata.report_leader(
            StreamName("orders"), PartitionId(1), NodeId("n2"), LeaderEpoch(2)
        )
        described = await stub.DescribeStream(pb.DescribeStreamRequest(name="orders"))
        assert (described.partitions[1].leader, described.partitions[1].leader_epoch) == ("n3", 4)
        listed = await stub.ListPartitions(pb.ListPartitionsRequest(stream="orders"))
        assert [(p.stream, p.partition, p.leader, p.leader_alive) for p in listed.partitions] == [
            ("orders", 0, "", False),
            ("orders", 1, "n3", True),
            ("orders", 2, "", False),
        ]
        assert listed.partitions[1].leader_epoch == 4
        assert not listed.partitions[0].HasField("leader_epoch")
        await expect_error(
            stub.ListPartitions(pb.ListPartitionsRequest(stream="ghost")),
            grpc.StatusCode.NOT_FOUND,
            ErrorCode.NOT_FOUND,
            "stream 'ghost' does not exist",
        )
        await expect_error(
            stub.CreateStream(
                pb.CreateStreamRequest(stream=pb.StreamConfig(name="big", replicas=4))
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            ErrorCode.INVALID_ARGUMENT,
            "stream needs 4 replicas but the cluster has 3 registered nodes: start more nodes "
            "or use --replicas 3",
        )
        await stub.CreateStream(pb.CreateStreamRequest(stream=pb.StreamConfig(name="hidden-1")))
        hidden = await stub.DescribeStream(pb.DescribeStreamRequest(name="hidden-1"))
        assert [p.available for p in hidden.partitions] == [False]

        # One request id, two calls: the second returns the first outcome (no ALREADY_EXISTS).
        retry = pb.CreateStreamRequest(stream=pb.StreamConfig(name="retried"), request_id="r-1")
        await stub.CreateStream(retry)
        await stub.CreateStream(retry)

        await expect_error(
            stub.CreateStream(pb.CreateStreamRequest(stream=pb.StreamConfig(name="orders"))),
            grpc.StatusCode.ALREADY_EXISTS,
            ErrorCode.ALREADY_EXISTS,
            "stream 'orders' already exists",
        )
        await expect_error(
            stub.CreateStream(
                pb.CreateStreamRequest(stream=pb.StreamConfig(name="x", partitions=-2))
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            ErrorCode.INVALID_ARGUMENT,
            "partitions must be between 1 and 1024, got -2",
        )
        await expect_error(
            stub.CreateStream(pb.CreateStreamRequest()),
            grpc.StatusCode.INVALID_ARGUMENT,
            ErrorCode.INVALID_ARGUMENT,
            "invalid stream name ''",
        )
        await expect_error(
            stub.DescribeStream(pb.DescribeStreamRequest(name="ghost")),
            grpc.StatusCode.NOT_FOUND,
            ErrorCode.NOT_FOUND,
            "stream 'ghost' does not exist",
        )
        await expect_error(
            stub.DeleteStream(pb.DeleteStreamRequest(name="ghost")),
            grpc.StatusCode.NOT_FOUND,
            ErrorCode.NOT_FOUND,
            "ghost",
        )

        await stub.DeleteStream(pb.DeleteStreamRequest(name="orders"))
        assert "orders" not in [c.name for c in metadata.streams()]

        cluster = await stub.ClusterStatus(pb.ClusterStatusRequest())
        assert cluster.metadata.is_leader and cluster.metadata.ready
        assert cluster.metadata.leader == cluster.metadata.self_address
        assert cluster.metadata.streams == 2
        assert [(p.node_id, p.pid, p.partitions) for p in cluster.processes] == [
            ("n1", os.getpid(), 3)
        ]
        assert [(e.name, e.address) for e in cluster.processes[0].endpoints] == [
            ("amqp", "127.0.0.1:5672")
        ]
        nodes = [
            (n.node_id, n.alive, n.partitions_hosted, n.partitions_led, n.replication)
            for n in cluster.nodes
        ]
        # "orders" (and its leader report) is gone; hidden-1 and retried (3 replicas) remain.
        assert nodes == [(f"n{i}", True, 2, 0, f"n{i}.example:7700") for i in (1, 2, 3)]
        assert all(n.heartbeat_age_ms < 60_000 for n in cluster.nodes)

    serve(tmp_path, free_port(), scenario)


def test_no_metadata_leader_is_unavailable(tmp_path: Path, free_port: Callable[[], int]) -> None:
    async def scenario(
        stub: pb_grpc.AdminStub, channel: grpc.aio.Channel, metadata: MetadataService
    ) -> None:
        await expect_error(
            stub.CreateStream(pb.CreateStreamRequest(stream=pb.StreamConfig(name="orders"))),
            grpc.StatusCode.UNAVAILABLE,
            ErrorCode.UNAVAILABLE,
            "metadata service has no leader",
        )
        # Definitions are not read from a replica that cannot reach a quorum: its copy may
        # be stale (chaos: a deleted stream listed again). Health still is.
        for read in (
            stub.ListStreams(pb.ListStreamsRequest()),
            stub.DescribeStream(pb.DescribeStreamRequest(name="orders")),
            stub.ListSuperStreams(pb.ListSuperStreamsRequest()),
            stub.ListPartitions(pb.ListPartitionsRequest()),
        ):
            await expect_error(
                read, grpc.StatusCode.UNAVAILABLE, ErrorCode.UNAVAILABLE, "no metadata quorum"
            )
        cluster = await stub.ClusterStatus(pb.ClusterStatusRequest())
        assert cluster.metadata.leader == "" and not cluster.metadata.has_quorum
        assert len(cluster.metadata.voters) == 3

    serve(
        tmp_path, free_port(), scenario, peers=(free_port(), free_port()), command_timeout_ms=2500
    )


def test_the_status_table_covers_every_error_code() -> None:
    assert set(GRPC_STATUS) == set(ErrorCode)
    assert GRPC_STATUS[ErrorCode.RESOURCE_LIMIT] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert GRPC_STATUS[ErrorCode.NOT_IMPLEMENTED] is grpc.StatusCode.UNIMPLEMENTED
    assert GRPC_STATUS[ErrorCode.INTERNAL] is grpc.StatusCode.INTERNAL


def test_nodes_send_their_admin_token_to_each_other(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """With tokens required (ADR 0023), the node running a cluster operation calls the other
    nodes' admin APIs with its `admin_token` (ADR 0025): accepted; a wrong one is refused."""
    from spate.cluster.admin.auth import AdminAuth
    from spate.cluster.admin.operations import Operations
    from spate.core.permissions import UserStore, token_hash

    store = UserStore.parse({"users": {"node": {"token_sha256": token_hash("node-tok")}}}, "f")

    async def main() -> None:
        port = free_port()
        metadata = MetadataService(
            node_id="n1", data_dir=tmp_path, self_address=f"127.0.0.1:{port}", password="pw"
        )
        await metadata.start()
        server = AdminServer(
            metadata,
            stats=async_stats,
            status=status,
            auth=AdminAuth(store, require_token=True),
            peer_token="node-tok",
        )
        try:
            await metadata.wait_ready()
            admin_port = await server.start()
            address = f"127.0.0.1:{admin_port}"
            await metadata.register_node(
                NodeId("n1"), amqp=address, admin=address, replication=address, metadata=None
            )
            peers = server._servicer.operations.peers  # what its operations call others with
            answer = await peers.call_any("n1", "ClusterStatus", pb.ClusterStatusRequest())
            assert isinstance(answer, pb.ClusterStatusResponse) and answer.metadata.ready
            wrong = Operations(metadata, "n1", "not-the-token")
            try:
                with pytest.raises(BrokerError, match="unknown admin token"):
                    await wrong.peers.call_any("n1", "ClusterStatus", pb.ClusterStatusRequest())
            finally:
                await wrong.close()
        finally:
            await server.stop()
            await metadata.stop()

    asyncio.run(main())


def test_a_nodes_admin_token_comes_from_its_file_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spate.cli.node import _admin_token

    monkeypatch.delenv("SPATE_ADMIN_TOKEN", raising=False)
    assert _admin_token(None) is None  # the config file's admin_token then
    monkeypatch.setenv("SPATE_ADMIN_TOKEN", "from-env")
    assert _admin_token(None) == "from-env"
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert _admin_token(token_file) == "from-file"
    token_file.write_text("\n")
    with pytest.raises(SystemExit, match="is empty"):
        _admin_token(token_file)


def test_operations_are_answered_from_metadata_and_interrupted_ones_marked(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """ADR 0025 §7: another node's (or a previous life's) operation is described from the
    metadata service; at start a node marks the ones it was running as failed (interrupted)."""
    from spate.cluster.admin.operations import Operations
    from spate.cluster.metadata.state import OperationRecord

    async def main() -> None:
        port = free_port()
        metadata = MetadataService(
            node_id="n1", data_dir=tmp_path, self_address=f"127.0.0.1:{port}", password="pw"
        )
        await metadata.start()
        operations = Operations(metadata, "n1")
        try:
            await metadata.wait_ready()
            for op_id, node in (("n1-7-abc", "n1"), ("n2-1-def", "n2")):
                await metadata.record_operation(
                    OperationRecord(
                        id=op_id,
                        node=NodeId(node),
                        kind="drain",
                        target="node n3",
                        state="running",
                        step="orders/0: n4 catching up",
                        progress_permille=400,
                        error="",
                        error_code="",
                        started_ms=1,
                        finished_ms=0,
                        log=("1 replica(s) to move off n3",),
                        revision=3,
                    )
                )
            await operations.recover()  # what a node does at start
            mine = operations.describe("n1-7-abc")
            assert mine.state == "failed" and mine.error_code == "unavailable", mine
            assert "interrupted: n1 restarted" in mine.error and mine.finished_ms > 0
            assert mine.log[-1].startswith("failed: interrupted") and mine.progress == 0.4
            other = operations.describe("n2-1-def")  # n2's: still running, as n2 published it
            assert other.state == "running" and other.step == "orders/0: n4 catching up"
            with pytest.raises(NotFound, match="keeps the last 256"):
                operations.describe("nope")
        finally:
            await operations.close()
            await metadata.stop()

    asyncio.run(main())
