"""Consumer group statistics over gRPC from a node's real replicas (003 "Consumer Group
Statistics", ADR 0015): the committed offset and lag DescribeConsumerGroup answers follow the
offsets stored under `$group/<g>` — by an operator's reset (SetConsumerOffset, the path of
`spate consumer offset --set`; a link's store is fenced by ownership) —
and the epoch follows `$epoch/<g>`; ListConsumers does not show those names."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from asyncio.subprocess import PIPE
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc
from spate.cluster.admin.providers import ProcessFacts
from spate.cluster.admin.server import AdminServer
from spate.cluster.metadata.service import MetadataService
from spate.core.backend import ConsumerOffset, Partition
from spate.core.coordinator import GroupCoordinator, GroupSettings
from spate.core.ids import MemberId, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from support.node_broker import NodeBroker


class Consumers:
    """What NodeFront provides the admin server, over one node's replicas."""

    def __init__(self, node: NodeBroker) -> None:
        self.node = node

    def list(self, stream: StreamName) -> dict[PartitionId, list[ConsumerOffset]]:
        return self.node.manager.consumer_offsets(stream)

    async def reset(
        self, stream: StreamName, partition: PartitionId, name: bytes, offset: int
    ) -> None:
        target = self.node.partition(stream, partition, write=True)
        try:
            await target.reset_offset(name, offset)
        finally:
            target.detach()


def test_describe_follows_the_offsets_stored_under_the_group_name(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    async def main() -> None:
        metadata = MetadataService(
            node_id="n1",
            data_dir=tmp_path / "metadata",
            self_address=f"127.0.0.1:{free_port()}",
            peer_addresses=[],
            password="pw",
        )
        node = NodeBroker(tmp_path / "node")
        await metadata.start()
        server = AdminServer(
            metadata,
            stats=node.manager.stats,
            status=lambda: [ProcessFacts("n1", "node", os.getpid())],
            consumers=Consumers(node),
        )
        try:
            await metadata.wait_ready()
            await metadata.register_node(
                NodeId("n1"), amqp="n1:5672", admin="n1:7600", replication="n1:7700",
                metadata="n1:7800",
            )  # fmt: skip
            config = StreamConfig(StreamName("orders"), partitions=2)
            await metadata.create_stream(config)
            await node.create_stream(config)
            p0 = node.partition(config.name, PartitionId(0), write=True)
            p1 = node.partition(config.name, PartitionId(1), write=True)
            await p0.append([b"m%d" % i for i in range(10)])
            await p1.append([b"n%d" % i for i in range(4)])
            port = await server.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await scenario(pb_grpc.AdminStub(channel), metadata, p0, p1)
            p0.detach()
            p1.detach()
        finally:
            await server.stop()
            await metadata.stop()
            await node.close()

    async def scenario(
        stub: pb_grpc.AdminStub, metadata: MetadataService, p0: Partition, p1: Partition
    ) -> None:
        describe = pb.DescribeConsumerGroupRequest(stream="orders", name="billing")
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # neither defined nor seen
            await stub.DescribeConsumerGroup(describe)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        # seen: an operator's reset of the group's committed offset on partition 0
        await stub.SetConsumerOffset(
            pb.SetConsumerOffsetRequest(stream="orders", name="$group/billing", offset=3)
        )
        answer = await stub.DescribeConsumerGroup(describe)
        assert not answer.HasField("definition")
        first, second = answer.partitions
        assert (first.available, first.committed_offset, first.end_offset, first.lag) == (
            True,
            3,
            10,
            6,
        )
        assert not first.HasField("epoch") and not first.owner_attached
        assert not second.HasField("committed_offset")
        assert (second.end_offset, second.lag) == (4, 4)  # nothing committed: all retained
        assert (answer.lag, answer.links_attached, list(answer.partitions_here)) == (10, 0, [0, 1])
        # stores at the leader (an owner's commits are fenced by ownership; an operator's
        # reset is not, with no link attached), and an epoch grant
        await p0.reset_offset(b"$group/billing", 8)
        await p1.reset_offset(b"$group/billing", 3)
        await p1.store_offset(b"$epoch/billing", 2)
        answer = await stub.DescribeConsumerGroup(describe)
        first, second = answer.partitions
        assert (first.committed_offset, first.lag) == (8, 1)
        assert (second.committed_offset, second.lag, second.epoch) == (3, 0, 2)
        assert answer.lag == 1
        # an owner link attached at the leader is its owner
        attached = await p0.consumer_attach(b"$group/billing")
        assert attached.stored is not None and attached.stored.offset == 8
        answer = await stub.DescribeConsumerGroup(describe)
        assert [p.owner_attached for p in answer.partitions] == [True, False]
        assert answer.links_attached == 1
        await p0.consumer_detach(b"$group/billing", None)
        # defined ahead: the definition joins the statistics; list shows both groups
        await stub.CreateConsumerGroup(
            pb.CreateConsumerGroupRequest(stream="orders", name="audit", strategy="sticky")
        )
        answer = await stub.DescribeConsumerGroup(
            pb.DescribeConsumerGroupRequest(stream="orders", name="audit")
        )
        assert answer.definition.strategy == "sticky"
        assert [p.lag for p in answer.partitions] == [10, 4]
        listed = await stub.ListConsumerGroups(pb.ListConsumerGroupsRequest(stream="orders"))
        summary = {g.name: (g.HasField("definition"), g.lag) for g in listed.groups}
        assert summary == {"audit": (True, 14), "billing": (False, 1)}
        # plain consumers are listed; the group's reserved names are not
        await p0.store_offset(b"app", 5)
        consumers = await stub.ListConsumers(pb.ListConsumersRequest(stream="orders"))
        assert [c.name for c in consumers.consumers] == ["app"]

    asyncio.run(main())


SPATE = str(Path(sys.executable).with_name("spate"))
STAY = GroupSettings(rebalance_delay_ms=0, session_timeout_ms=60_000)
"""Rebalance at once; a member stays through the CLI's start-up without polling."""


async def spate_json(*args: str) -> Any:
    """The real console script (run without blocking the loop that serves it)."""
    proc = await asyncio.create_subprocess_exec(
        SPATE, *args, "--output", "json", stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0 and not err, (proc.returncode, err)
    return json.loads(out)


async def settled(coordinator: GroupCoordinator, member: MemberId, want: set[int]) -> None:
    """Poll as a member does until it holds `want` (a liveness bound, not a timing one)."""
    known = None
    for _ in range(50):
        known = await coordinator.sync("g", member, known, 0.2)
        if known.partitions == frozenset(want) and not known.release:
            return
        if known.release:
            await coordinator.released("g", member, known.release, known.generation)
    raise AssertionError(f"member {member} still has {known}")


def test_describe_shows_the_coordinators_members_and_holders(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """Two members joined through the node's broker (as member links join): `spate group
    describe --output json` and `group list` show both, the generation, state Stable and
    every partition's holder, and gRPC the same; after one leaves, one member holds all."""

    async def main() -> None:
        metadata = MetadataService(
            node_id="n1",
            data_dir=tmp_path / "metadata",
            self_address=f"127.0.0.1:{free_port()}",
            peer_addresses=[],
            password="pw",
        )
        node = NodeBroker(tmp_path / "node")
        await metadata.start()
        server = AdminServer(
            metadata,
            stats=node.manager.stats,
            status=lambda: [ProcessFacts("n1", "node", os.getpid())],
            consumers=Consumers(node),
            coordinators=node,
        )
        try:
            await metadata.wait_ready()
            await metadata.register_node(
                NodeId("n1"), amqp="n1:5672", admin="n1:7600", replication="n1:7700",
                metadata="n1:7800",
            )  # fmt: skip
            config = StreamConfig(StreamName("events"), partitions=4)
            await metadata.create_stream(config)
            await node.create_stream(config)
            port = await server.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                coordinator = node.group_coordinator(config.name)
                await scenario(f"127.0.0.1:{port}", pb_grpc.AdminStub(channel), coordinator)
        finally:
            await server.stop()
            await metadata.stop()
            await node.close()

    async def scenario(admin: str, stub: pb_grpc.AdminStub, coordinator: GroupCoordinator) -> None:
        first = await coordinator.join("g", STAY)
        await settled(coordinator, first, {0, 1, 2, 3})
        second = await coordinator.join("g", STAY)
        await settled(coordinator, first, {0, 2})
        await settled(coordinator, second, {1, 3})

        described = await spate_json("group", "describe", "events", "g", "--admin", admin)
        assert described["defined"] is False  # known to its coordinator only
        assert (described["state"], described["generation"]) == ("Stable", 2)
        assert described["coordinator_unavailable"] is None
        assert [
            (m["member"], m["partitions"], m["releasing"], m["session_timeout_ms"])
            for m in described["members"]
        ] == [(first, [0, 2], [], 60_000), (second, [1, 3], [], 60_000)]
        assert all(0 <= m["heartbeat_age_ms"] < 60_000 for m in described["members"])
        assert [p["member"] for p in described["partitions"]] == [first, second, first, second]
        listed = await spate_json("group", "list", "events", "--admin", admin)
        assert [
            (g["name"], g["state"], g["members"], g["generation"]) for g in listed["groups"]
        ] == [("g", "Stable", 2, 2)]
        answer = await stub.DescribeConsumerGroup(
            pb.DescribeConsumerGroupRequest(stream="events", name="g")
        )
        assert (answer.state, answer.generation, len(answer.members)) == ("Stable", 2, 2)
        assert [list(m.partitions) for m in answer.members] == [[0, 2], [1, 3]]
        assert [p.member for p in answer.partitions] == [first, second, first, second]

        await coordinator.leave("g", second)
        await settled(coordinator, first, {0, 1, 2, 3})
        described = await spate_json("group", "describe", "events", "g", "--admin", admin)
        assert (described["state"], described["generation"]) == ("Stable", 3)
        assert [(m["member"], m["partitions"]) for m in described["members"]] == [
            (first, [0, 1, 2, 3])
        ]
        assert [p["member"] for p in described["partitions"]] == [first] * 4

        await coordinator.leave("g", first)  # Empty: the stored generation remains
        for _ in range(50):
            answer = await stub.DescribeConsumerGroup(
                pb.DescribeConsumerGroupRequest(stream="events", name="g")
            )
            if answer.state == "Empty":
                break
            await asyncio.sleep(0.05)
        assert (answer.state, answer.generation, list(answer.members)) == ("Empty", 4, [])
        assert not any(p.HasField("member") for p in answer.partitions)

    asyncio.run(main())
