"""Cluster operations (issue 14, ADR 0022): move a partition's replica, transfer its
leadership, rebalance leaders, drain a node, remove a dead node.

An operation runs as an asyncio task on the node whose admin API started it and is watched
by id (`Operations.get`). Each step is a Raft action at the partition's leader, reached
through that node's admin API (`GetLocalReplica`, `LocalTransferLeader`,
`LocalChangeMembership`), or a metadata command (`SetReplicas`), and every step is checked
by reading the leader's state back, so a step that got lost (a leader change, a dropped
proposal) is simply done again. The Raft log is the authority on a partition's members;
metadata follows it so that nodes open a replica before it joins and close it after it left.

A move of `orders/0` from n1 to n4 (voters n1 n2 n3):

```
step                                   Raft membership              metadata replicas/learners
1 record the learner                   n1 n2 n3                     n1 n2 n3 / n4   (n4 opens)
2 add n4 as a learner                  n1 n2 n3 + learner n4
3 wait until n4 has the leader's commit index
4 promote n4                           n1 n2 n3 n4                  n1 n2 n3 n4 /
5 if n1 leads: transfer to n4 (or another voter)
6 remove n1                            n2 n3 n4
7 record the new set                                                n4 n2 n3 / (n1 closes)
```

Writes go on throughout: only the leadership transfer (step 5) pauses them, for one election
round trip at most (the leader refuses proposals while it hands over; clients retry).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc
from spate.cluster.admin.errors import ERROR_CODE_KEY
from spate.cluster.metadata.service import MetadataService
from spate.cluster.metadata.state import ERROR_TYPES
from spate.core.errors import (
    BrokerError,
    ErrorCode,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from spate.core.ids import NodeId, PartitionId, StreamName

log = logging.getLogger(__name__)

operations_kept_max = 256
"""Finished operations remembered for GetOperation (oldest forgotten first)."""
step_timeout_s = 60.0
"""A membership change or a leadership transfer that has not taken effect after this long
fails the operation (a partition that lost its majority cannot change)."""
catchup_timeout_s = 600.0
"""How long a new replica may take to catch up before the move fails."""
poll_s = 0.1
"""Between two reads of a leader's state while waiting for a step to take effect."""
call_timeout_s = 3.0
"""One call to another node's admin API."""
transfer_retry_s = 2.0
"""A leadership transfer not done after this long is asked for again."""
balancer_interval_s_default = 30.0
balancer_interval_s_min = 0.5
balancer_operations_kept_max = 64


@dataclass
class Operation:
    id: str
    kind: str
    target: str
    state: str = "running"
    step: str = "starting"
    progress: float = 0.0
    error: str = ""
    error_code: str = ""
    started_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    finished_ms: int = 0
    log: list[str] = field(default_factory=list)

    def at(self, step: str, progress: float | None = None) -> None:
        self.step = step
        if progress is not None:
            self.progress = max(0.0, min(1.0, progress))
        self.log.append(step)
        log.info("operation %s (%s %s): %s", self.id, self.kind, self.target, step)

    def message(self) -> pb.Operation:
        return pb.Operation(
            id=self.id,
            kind=self.kind,
            target=self.target,
            state=self.state,
            step=self.step,
            progress=self.progress,
            error=self.error,
            error_code=self.error_code,
            started_ms=self.started_ms,
            finished_ms=self.finished_ms,
            log=self.log,
        )


class Peers:
    """Admin API stubs of the cluster's nodes, by node id (addresses from metadata). Where the
    nodes' admin API requires a token (ADR 0023), `token` (default `$SPATE_ADMIN_TOKEN`, the
    CLI's variable) is sent as `authorization: Bearer`; it needs `configure` on `$cluster`."""

    def __init__(self, metadata: MetadataService, token: str | None = None) -> None:
        self._metadata = metadata
        self._channels: dict[str, tuple[str, grpc.aio.Channel]] = {}
        token = os.environ.get("SPATE_ADMIN_TOKEN", "") if token is None else token
        self._call_metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._closing: set[asyncio.Task[None]] = set()

    def stub(self, node: str) -> pb_grpc.AdminStub:
        address = self._metadata.node(NodeId(node)).admin
        known = self._channels.get(node)
        if known is None or known[0] != address:
            if known is not None:
                self._closing.add(asyncio.get_running_loop().create_task(known[1].close(None)))
            known = (address, grpc.aio.insecure_channel(address))
            self._channels[node] = known
        return pb_grpc.AdminStub(known[1])

    async def call(self, node: str, method: str, request: object) -> pb.ReplicaState:
        """One call of an Admin method returning a ReplicaState at `node`; its failure as the
        BrokerError the other node raised (Unavailable when it could not be reached)."""
        try:
            call = getattr(self.stub(node), method)
            pending = cast(Awaitable[pb.ReplicaState], call(request, metadata=self._call_metadata))
            return await asyncio.wait_for(pending, call_timeout_s)
        except grpc.aio.AioRpcError as error:
            trailing: Any = error.trailing_metadata() or ()
            code = dict(trailing).get(ERROR_CODE_KEY)
            details = error.details() or str(error.code())
            if isinstance(code, str):
                try:
                    kind = ERROR_TYPES.get(ErrorCode(code), Unavailable)
                except ValueError:
                    kind = Unavailable
                raise kind(details) from error
            raise Unavailable(f"node {node} did not answer: {details}") from error
        except TimeoutError as error:
            raise Unavailable(f"node {node} did not answer within {call_timeout_s} s") from error

    async def close(self) -> None:
        for _, channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()


class Operations:
    """Starts, runs and remembers the cluster operations of one admin server."""

    def __init__(self, metadata: MetadataService, node_id: str = "") -> None:
        self.metadata = metadata
        self.peers = Peers(metadata)
        self._prefix = node_id or "op"
        self._ids = itertools.count(1)
        self._operations: OrderedDict[str, Operation] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._balancer: asyncio.Task[None] | None = None
        self.balancer_interval_s = 0.0
        self.balancer_operations: list[str] = []

    # -- the automatic leader balancer

    def set_balancer(self, enabled: bool, interval_s: float) -> None:
        """Switch the automatic leader balancer on (every `interval_s`) or off."""
        if enabled:
            interval_s = interval_s or balancer_interval_s_default
            if interval_s < balancer_interval_s_min:
                raise InvalidArgument(
                    f"interval_s: at least {balancer_interval_s_min} s, not {interval_s:g}"
                )
        if self._balancer is not None:
            self._balancer.cancel()
            self._balancer = None
        self.balancer_interval_s = interval_s if enabled else 0.0
        if enabled:
            self._balancer = asyncio.get_running_loop().create_task(
                self._balance(interval_s), name="leader-balancer"
            )
            self._balancer.add_done_callback(self._tasks.discard)
            self._tasks.add(self._balancer)

    def _imbalanced(self) -> bool:
        alive = {s.record.node for s in self.metadata.node_statuses() if s.alive}
        return any(
            p.replicas
            and p.replicas[0] in alive
            and (p.leader is None or p.leader.node != p.replicas[0])
            for p in self.metadata.partitions()
        )

    async def _balance(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            running = any(
                o.kind == "rebalance" and o.state == "running" for o in self._operations.values()
            )
            if not running and self._imbalanced():
                operation = self.rebalance()
                self.balancer_operations.append(operation.id)
                del self.balancer_operations[:-balancer_operations_kept_max]
                log.info("leader balancer: started %s", operation.id)

    # -- registry

    def get(self, operation_id: str) -> Operation:
        found = self._operations.get(operation_id)
        if found is None:
            raise NotFound(
                f"operation {operation_id!r} is unknown here (operations are kept by the node "
                "that started them, until it restarts)"
            )
        return found

    def _start(
        self, kind: str, target: str, body: Callable[[Operation], Awaitable[None]]
    ) -> Operation:
        operation = Operation(
            f"{self._prefix}-{next(self._ids)}-{uuid.uuid4().hex[:6]}", kind, target
        )
        self._operations[operation.id] = operation
        finished = [o for o in self._operations.values() if o.state != "running"]
        for old in finished[: max(0, len(self._operations) - operations_kept_max)]:
            del self._operations[old.id]

        async def run() -> None:
            try:
                await body(operation)
            except BrokerError as error:
                operation.state = "failed"
                operation.error = error.message
                operation.error_code = error.code.value
                operation.log.append(f"failed: {error.message}")
                log.warning("operation %s failed: %s", operation.id, error.message)
            else:
                operation.state = "succeeded"
                operation.progress = 1.0
            operation.finished_ms = time.time_ns() // 1_000_000

        task = asyncio.get_running_loop().create_task(run(), name=f"operation-{operation.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return operation

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.peers.close()

    # -- validation (raises at once, before an operation id exists)

    def _partition(self, stream: str, partition: int) -> tuple[StreamName, PartitionId]:
        if not stream:
            raise InvalidArgument("stream: required")
        record = self.metadata.stream_record(StreamName(stream))  # NotFound
        if not 0 <= partition < len(record.partitions):
            raise InvalidArgument(
                f"partition: {stream!r} has partitions 0 to {len(record.partitions) - 1}, "
                f"not {partition}"
            )
        if not record.partitions[partition].replicas:
            raise FailedPrecondition(
                f"{stream!r} was created before placement existed and cannot be moved"
            )
        return StreamName(stream), PartitionId(partition)

    def _live_node(self, node: str, field_name: str) -> NodeId:
        if not node:
            raise InvalidArgument(f"{field_name}: required")
        self.metadata.node(NodeId(node))  # NotFound
        alive = {s.record.node for s in self.metadata.node_statuses() if s.alive}
        if node not in alive:
            raise FailedPrecondition(f"node {node} is not alive (no heartbeat within 10 s)")
        return NodeId(node)

    # -- starting operations

    def move(self, stream: str, partition: int, source: str, target: str) -> Operation:
        name, pid = self._partition(stream, partition)
        if not source:
            raise InvalidArgument("from_node: required")
        self.metadata.node(NodeId(source))  # NotFound
        to = self._live_node(target, "to_node")
        record = self.metadata.stream_record(name).partitions[pid]
        if source not in record.replicas:
            raise FailedPrecondition(
                f"{name}/{pid} is not on {source} (replicas {','.join(record.replicas)})"
            )
        if to in record.replicas:
            raise FailedPrecondition(f"{name}/{pid} is on {to} already")
        if record.learners and record.learners != (to,):
            raise FailedPrecondition(
                f"{name}/{pid} is already being moved to {','.join(record.learners)}"
            )
        return self._start(
            "move",
            f"{name}/{pid} {source}->{to}",
            lambda op: self._move(op, name, pid, NodeId(source), to, 0.0, 1.0),
        )

    def transfer_leader(self, stream: str, partition: int, target: str) -> Operation:
        name, pid = self._partition(stream, partition)
        to = self._live_node(target, "to_node")
        record = self.metadata.stream_record(name).partitions[pid]
        if to not in record.replicas:
            raise FailedPrecondition(
                f"{to} is not a voter of {name}/{pid} (replicas {','.join(record.replicas)})"
            )
        return self._start(
            "transfer-leader",
            f"{name}/{pid} ->{to}",
            lambda op: self._transfer(op, name, pid, to),
        )

    def rebalance(self) -> Operation:
        return self._start("rebalance", "preferred leaders", self._rebalance)

    def drain(self, node: str) -> Operation:
        if not node:
            raise InvalidArgument("node: required")
        self.metadata.node(NodeId(node))  # NotFound
        return self._start("drain", f"node {node}", lambda op: self._evacuate(op, NodeId(node)))

    def remove(self, node: str) -> Operation:
        if not node:
            raise InvalidArgument("node: required")
        self.metadata.node(NodeId(node))  # NotFound
        alive = {s.record.node for s in self.metadata.node_statuses() if s.alive}
        if node in alive:
            raise FailedPrecondition(
                f"node {node} is alive: drain it (`spate node drain {node}`) and stop it first"
            )
        return self._start("remove", f"node {node}", lambda op: self._evacuate(op, NodeId(node)))

    # -- reading replicas

    async def replica_state(
        self, node: str, stream: StreamName, partition: PartitionId
    ) -> pb.ReplicaState:
        request = pb.GetLocalReplicaRequest(stream=stream, partition=partition)
        return await self.peers.call(node, "GetLocalReplica", request)

    async def replica_states(
        self, stream: StreamName, partition: PartitionId
    ) -> list[pb.ReplicaState]:
        """Every replica and learner of the partition that metadata knows, as each node
        reports it (available=False with the reason when it cannot)."""
        record = self.metadata.stream_record(stream).partitions[partition]
        nodes = list(dict.fromkeys((*record.replicas, *record.learners)))

        async def one(node: str) -> pb.ReplicaState:
            try:
                return await self.replica_state(node, stream, partition)
            except BrokerError as error:
                return pb.ReplicaState(
                    stream=stream,
                    partition=partition,
                    node=node,
                    available=False,
                    unavailable_reason=error.message,
                )

        return list(await asyncio.gather(*(one(n) for n in nodes)))

    async def leader_state(self, stream: StreamName, partition: PartitionId) -> pb.ReplicaState:
        """The partition's leader's own state (the highest term's leader among the replicas
        metadata lists); Unavailable when none answers as leader."""
        leaders = [
            s
            for s in await self.replica_states(stream, partition)
            if s.available and s.role == "leader"
        ]
        if not leaders:
            raise Unavailable(f"{stream}/{partition} has no leader right now")
        return max(leaders, key=lambda s: s.term)

    async def _until(
        self,
        what: str,
        check: Callable[[], Awaitable[bool]],
        timeout_s: float = step_timeout_s,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        last: BrokerError | None = None
        while time.monotonic() < deadline:
            try:
                if await check():
                    return
                last = None
            except (Unavailable, FailedPrecondition) as error:
                last = error  # a leader change, a change not committed yet: try again
            await asyncio.sleep(poll_s)
        reason = f" (last: {last.message})" if last is not None else ""
        raise Unavailable(f"{what} did not happen within {timeout_s:.0f} s{reason}")

    # -- steps

    async def _membership(
        self,
        op: Operation,
        stream: StreamName,
        partition: PartitionId,
        voters: Sequence[str],
        learners: Sequence[str],
    ) -> None:
        """Make the partition's Raft membership this one, committed (one change at a time:
        the caller changes one voter per call)."""
        want = (sorted(voters), sorted(learners))

        async def done() -> bool:
            leader = await self.leader_state(stream, partition)
            have = (sorted(leader.voters), sorted(leader.learners))
            if have == want:
                return leader.membership_index <= leader.commit_index
            request = pb.LocalChangeMembershipRequest(
                stream=stream, partition=partition, voters=voters, learners=learners
            )
            await self.peers.call(leader.node, "LocalChangeMembership", request)
            return False

        await self._until(
            f"membership {','.join(voters)}"
            + (f" learners {','.join(learners)}" if learners else "")
            + f" of {stream}/{partition}",
            done,
        )

    async def _transfer(
        self, op: Operation, stream: StreamName, partition: PartitionId, to: NodeId
    ) -> None:
        op.at(f"transferring the leadership of {stream}/{partition} to {to}")
        asked_at = 0.0

        async def done() -> bool:
            nonlocal asked_at
            leader = await self.leader_state(stream, partition)
            if leader.node == to:
                return True
            if to not in leader.voters:
                raise FailedPrecondition(f"{to} is not a voter of {stream}/{partition}")
            if time.monotonic() - asked_at >= transfer_retry_s:
                asked_at = time.monotonic()
                request = pb.TransferLeaderRequest(stream=stream, partition=partition, to_node=to)
                await self.peers.call(leader.node, "LocalTransferLeader", request)
            return False

        await self._until(f"leadership of {stream}/{partition} moving to {to}", done)
        op.at(f"{to} leads {stream}/{partition}")

    async def _move(  # noqa: PLR0917 - one step of drain and remove too
        self,
        op: Operation,
        stream: StreamName,
        partition: PartitionId,
        source: NodeId,
        to: NodeId,
        low: float,
        high: float,
    ) -> None:
        where = f"{stream}/{partition}"
        span = high - low
        leader = await self._leader_eventually(stream, partition)
        voters = [v for v in leader.voters]
        if source not in voters and to in voters:
            op.at(f"{where}: already moved", high)
            return
        record = self.metadata.stream_record(stream).partitions[partition]
        replicas = tuple(record.replicas)
        op.at(f"{where}: {to} joins as a learner", low + 0.05 * span)
        await self.metadata.set_replicas(stream, partition, replicas, (to,))
        if to not in voters:
            await self._membership(op, stream, partition, voters, [to])

            start = time.monotonic()

            async def caught_up() -> bool:
                state = await self.leader_state(stream, partition)
                match = next((p.match_index for p in state.progress if p.node == to), 0)
                if state.commit_index:
                    fraction = min(1.0, match / state.commit_index)
                    op.progress = low + span * (0.1 + 0.6 * fraction)
                    op.step = (
                        f"{where}: {to} catching up, index {match} of {state.commit_index} "
                        f"({time.monotonic() - start:.1f} s)"
                    )
                return match >= state.commit_index

            await self._until(f"{to} catching up with {where}", caught_up, catchup_timeout_s)
            op.at(f"{where}: {to} caught up; promoting it to voter", low + 0.7 * span)
            await self._membership(op, stream, partition, [*voters, to], [])
            voters = [*voters, to]
        await self.metadata.set_replicas(
            stream, partition, (*[r for r in replicas if r != to], to), ()
        )
        leader = await self._leader_eventually(stream, partition)
        if leader.node == source:
            await self._transfer(op, stream, partition, to)
        op.at(f"{where}: removing {source}", low + 0.85 * span)
        remaining = [v for v in voters if v != source]
        await self._membership(op, stream, partition, remaining, [])
        new = tuple(to if r == source else r for r in replicas if r != to)
        if to not in new:
            new = (*new, to)
        await self.metadata.set_replicas(stream, partition, new, ())
        op.at(f"{where}: on {','.join(new)} ({source} closes its replica)", high)

    async def _leader_eventually(
        self, stream: StreamName, partition: PartitionId
    ) -> pb.ReplicaState:
        found: list[pb.ReplicaState] = []

        async def check() -> bool:
            found.append(await self.leader_state(stream, partition))
            return True

        await self._until(f"a leader of {stream}/{partition}", check)
        return found[-1]

    async def _rebalance(self, op: Operation) -> None:
        alive = {s.record.node for s in self.metadata.node_statuses() if s.alive}
        todo = [
            p
            for p in self.metadata.partitions()
            if p.replicas
            and p.replicas[0] in alive
            and (p.leader is None or p.leader.node != p.replicas[0])
        ]
        op.at(f"{len(todo)} partition(s) led elsewhere than their preferred leader", 0.0)
        failed: list[str] = []
        for i, placement in enumerate(todo):
            try:
                await self._transfer(
                    op, placement.stream, placement.partition, placement.replicas[0]
                )
            except BrokerError as error:
                failed.append(f"{placement.stream}/{placement.partition}: {error.message}")
                op.at(f"{placement.stream}/{placement.partition}: {error.message}")
            op.progress = (i + 1) / max(1, len(todo))
        led: dict[str, int] = {}
        for placement in self.metadata.partitions():
            if placement.leader is not None:
                led[placement.leader.node] = led.get(placement.leader.node, 0) + 1
        op.at("leaders per node: " + ", ".join(f"{n}={c}" for n, c in sorted(led.items())))
        if failed:
            raise Unavailable(f"{len(failed)} transfer(s) failed: " + "; ".join(failed))

    async def _evacuate(self, op: Operation, node: NodeId) -> None:
        """Drain or remove: move every replica `node` holds to the live node holding fewest."""
        todo = [p for p in self.metadata.partitions() if node in p.replicas]
        op.at(f"{len(todo)} replica(s) to move off {node}", 0.0)
        for i, placement in enumerate(todo):
            alive = sorted(
                s.record.node
                for s in self.metadata.node_statuses()
                if s.alive and s.record.node != node
            )
            hosted = {s.record.node: s.partitions_hosted for s in self.metadata.node_statuses()}
            candidates = [n for n in alive if n not in placement.replicas]
            if not candidates:
                raise FailedPrecondition(
                    f"no live node to move {placement.stream}/{placement.partition} to: it is "
                    f"on {','.join(placement.replicas)} already; add a node first"
                )
            target = min(candidates, key=lambda n: (hosted.get(n, 0), n))
            low, high = i / len(todo), (i + 1) / len(todo)
            await self._move(op, placement.stream, placement.partition, node, target, low, high)
        op.at(f"{node} hosts no replica now", 1.0)
