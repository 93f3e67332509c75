"""The partitions this node hosts, kept in step with the placement it is given.

`PartitionManager.apply` receives every stream definition and this node's assignments (from the
metadata service, wired by spate.server) and opens, keeps or closes-and-deletes replicas to match.
Every partition, even one with a single replica, is a Raft group driven by the node's one
`ReplicationHost`, so a one-node cluster and a three-node cluster run the same data path.

`LocalBroker` is the spate.core.backend.Broker the AMQP listener consumes: producers are served by
the partition's leader, consumers by any local replica up to its commit index, and everything
else is a NotLeader naming where to go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from spate.core.backend import ConsumerOffset, PartitionInfo, ProducerInfo
from spate.core.coordination import Coordinators
from spate.core.errors import NotFound, NotLeader, Unavailable
from spate.core.groups import GroupDefinition
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.node.log import LogConfig
from spate.node.replication.host import OpenRequest, ReplicationHost
from spate.node.replication.partition import ReplicatedPartition

log = logging.getLogger(__name__)

PartitionKey = tuple[StreamName, PartitionId]


@dataclass(frozen=True, slots=True)
class Assignment:
    """A partition this node hosts; `replicas` lists the group's voters and `learners` the
    replicas catching up to join (ADR 0022); this node is in one of them. They seed a new
    replica's Raft membership only: an existing replica's log knows better."""

    config: StreamConfig
    partition: PartitionId
    replicas: tuple[NodeId, ...]
    learners: tuple[NodeId, ...] = ()


class PartitionManager:
    """Owns this node's replicas through the ReplicationHost."""

    def __init__(self, host: ReplicationHost) -> None:
        self.host = host
        self._configs: dict[StreamName, StreamConfig] = {}
        self._open: dict[PartitionKey, Assignment] = {}
        self._lock = asyncio.Lock()

    @property
    def node_id(self) -> NodeId:
        return self.host.node_id

    @property
    def configs(self) -> dict[StreamName, StreamConfig]:
        """Every stream of the cluster, hosted here or not."""
        return self._configs

    def replica(self, stream: StreamName, partition: PartitionId) -> ReplicatedPartition | None:
        if (stream, partition) not in self._open:
            return None
        return self.host.partition(stream, partition)

    def hosted(self) -> list[Assignment]:
        return list(self._open.values())

    async def apply(
        self, streams: Iterable[StreamConfig], assignments: Iterable[Assignment]
    ) -> None:
        """Open new assignments; close and delete replicas no longer assigned here."""
        async with self._lock:
            self._configs = {s.name: s for s in streams}
            wanted = {(a.config.name, a.partition): a for a in assignments}
            for key in [k for k in self._open if k not in wanted]:
                del self._open[key]
                await self.host.close_partition(*key, delete=True)
                log.info(
                    "no longer hosting %s/%d: replica closed and deleted",
                    *key,
                    extra={"stream": key[0], "partition": key[1]},
                )
            # Opened in batches (ADR 0031); each batch is served as soon as it is open.
            requests = {
                key: OpenRequest(
                    a.config.name,
                    a.partition,
                    a.replicas,
                    LogConfig.from_stream(a.config),
                    a.learners,
                )
                for key, a in wanted.items()
                if key not in self._open
            }
            failed: BaseException | None = None
            async for batch in self.host.open_partitions(list(requests.values())):
                for request, outcome in batch:
                    key = (request.stream, request.partition)
                    if isinstance(outcome, BaseException):
                        log.error(
                            "cannot open %s/%d: %s",
                            *key,
                            outcome,
                            extra={"stream": key[0], "partition": key[1]},
                        )
                        failed = failed or outcome
                        continue
                    assignment = wanted[key]
                    self._open[key] = assignment
                    log.info(
                        "hosting %s/%d with replicas %s",
                        *key,
                        ",".join(assignment.replicas),
                        extra={"stream": key[0], "partition": key[1]},
                    )
            if failed is not None:
                raise failed  # the others are open; the next apply retries the failed ones

    async def close(self) -> None:
        async with self._lock:
            for key in list(self._open):
                await self.host.close_partition(*key, delete=False)
            self._open.clear()

    def producers(self, stream: StreamName) -> dict[PartitionId, list[ProducerInfo]]:
        """Producer names of the partitions of `stream` hosted here (deduplication state)."""
        if stream not in self._configs:
            raise NotFound(f"stream {stream!r} does not exist")
        return {
            pid: self.host.partition(name, pid).producers()
            for (name, pid) in sorted(self._open)
            if name == stream
        }

    def consumer_offsets(self, stream: StreamName) -> dict[PartitionId, list[ConsumerOffset]]:
        """Consumer names of the partitions of `stream` hosted here (offset tracking)."""
        if stream not in self._configs:
            raise NotFound(f"stream {stream!r} does not exist")
        return {
            pid: self.host.partition(name, pid).consumer_offsets()
            for (name, pid) in sorted(self._open)
            if name == stream
        }

    def stats(self, stream: StreamName) -> list[PartitionInfo]:
        """Runtime facts of the partitions of `stream` hosted here (for describe / $info)."""
        if stream not in self._configs:
            raise NotFound(f"stream {stream!r} does not exist")
        return [
            self.host.partition(name, pid).info()
            for (name, pid) in sorted(self._open)
            if name == stream
        ]


Locate = Callable[[StreamName, PartitionId], Sequence[NodeId]]
"""Nodes to send a client to for a partition not served here, best first (the reported leader,
then the other replicas)."""
AmqpAddress = Callable[[NodeId], tuple[str, int] | None]
"""The AMQP listener of a node, from the node registry."""
FindGroup = Callable[[StreamName, str], GroupDefinition | None]
"""A consumer group's definition, from this node's metadata replica (ADR 0015)."""


class LocalBroker:
    """spate.core.backend.Broker over the replicas this node hosts."""

    def __init__(
        self,
        manager: PartitionManager,
        locate: Locate,
        amqp_address: AmqpAddress,
        *,
        find_group: FindGroup = lambda _stream, _group: None,
        groups_required: bool = False,
    ) -> None:
        self._manager = manager
        self._locate = locate
        self._amqp_address = amqp_address
        self._find_group = find_group
        self.groups_required = groups_required
        """`--require-defined-groups`: only groups defined ahead may attach (ADR 0015)."""

    async def consumer_group(self, stream: StreamName, group: str) -> GroupDefinition | None:
        """From this node's metadata replica: a group defined a moment ago on another node is
        known here once this replica applied it (a retried attach finds it)."""
        return self._find_group(stream, group)

    async def lookup(self, name: StreamName) -> StreamConfig:
        return self.stream(name)

    def stream(self, name: StreamName) -> StreamConfig:
        config = self._manager.configs.get(name)
        if config is None:
            raise NotFound(
                f"stream {name!r} does not exist; create it with `spate stream create {name}`"
            )
        return config

    def consumer_offsets(self, stream: StreamName) -> dict[PartitionId, list[ConsumerOffset]]:
        """Consumer names of the partitions of `stream` hosted here (offset tracking)."""
        return self._manager.consumer_offsets(stream)

    def group_coordinator(self, stream: StreamName) -> Coordinators:
        """The stream's consumer-group coordinators (ADR 0015) when this node leads its
        partition 0 (their home); else NotLeader naming that leader, like a producer's
        partition, or Unavailable during an election."""
        home = self.partition(stream, PartitionId(0), write=True)
        return home.group_coordinators(self.stream(stream).partitions)

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool, relay: bool = False
    ) -> ReplicatedPartition:
        """The local replica (see spate.core.backend.Broker; a node relays through
        spate.server.node_process.NodeFront, which wraps this)."""
        config = self.stream(name)
        if not 0 <= partition < config.partitions:
            raise NotFound(
                f"stream {name!r} has partitions 0..{config.partitions - 1}; "
                f"there is no partition {partition}"
            )
        local = self._manager.replica(name, partition)
        if local is not None and (local.is_leader or not write):
            return local
        if local is not None:
            candidates: Sequence[NodeId] = [local.leader] if local.leader is not None else []
        else:
            candidates = self._locate(name, partition)
        me = self._manager.node_id
        for node in candidates:
            if node == me:
                continue
            address = self._amqp_address(node)
            if address is not None:
                role = "led" if write or local is not None else "served"
                raise NotLeader(
                    f"partition {partition} of {name!r} is {role} by node {node}",
                    leader_node=node,
                    leader_host=address[0],
                    leader_port=address[1],
                )
        raise Unavailable(
            f"partition {partition} of {name!r} has no leader right now (an election is in "
            "progress or a majority of its replicas is down); retry shortly"
        )
