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
from dataclasses import dataclass, field, replace
from typing import Any, cast

import grpc
from spate.api.tls import AdminTls, aio_channel, explain
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc
from spate.cluster.admin.errors import ERROR_CODE_KEY
from spate.cluster.metadata import limits as metadata_limits
from spate.cluster.metadata.placement import best_target, better_hosts_than, host_of
from spate.cluster.metadata.service import MetadataService
from spate.cluster.metadata.state import ERROR_TYPES, OperationRecord
from spate.core.errors import (
    BrokerError,
    ErrorCode,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unauthorized,
    Unavailable,
)
from spate.core.ids import NodeId, PartitionId, StreamName

log = logging.getLogger(__name__)

operations_kept_max = 256
"""Finished operations remembered here for GetOperation (oldest forgotten first); the metadata
service keeps the last `metadata.limits.operations_kept_max` of the cluster's (ADR 0025)."""
publish_interval_s = 0.5
"""How often a running operation's changes are published to the metadata service."""
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
voters_min = 3
"""A metadata voter is not removed below this many voters (one failure must be survivable)."""
role_switch_timeout_s = 45.0
"""A node's switch between metadata voter and non-voting replica (stop, start, catch up)."""


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

    def record(self, node: str, revision: int) -> OperationRecord:
        """As published in the metadata service (the last steps, texts cut to its limits)."""
        cut = metadata_limits.operation_text_max

        return OperationRecord(
            id=self.id,
            node=NodeId(node),
            kind=self.kind[:cut],
            target=self.target[:cut],
            state=self.state,
            step=self.step[:cut],
            progress_permille=round(self.progress * 1000),
            error=self.error[:cut],
            error_code=self.error_code,
            started_ms=self.started_ms,
            finished_ms=self.finished_ms,
            log=tuple(line[:cut] for line in self.log[-metadata_limits.operation_log_lines_max :]),
            revision=revision,
        )

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
    CLI's variable) is sent as `authorization: Bearer`; it needs `configure` on `$cluster`.
    With `tls` (the node's admin TLS), calls verify the other nodes' admin certificates against
    its CA and present its own certificate (mTLS: the certificate's common name is a user, or a
    token is sent too)."""

    def __init__(
        self, metadata: MetadataService, token: str | None = None, tls: AdminTls | None = None
    ) -> None:
        self._metadata = metadata
        self._tls = tls
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
            known = (address, aio_channel(address, self._tls))
            self._channels[node] = known
        return pb_grpc.AdminStub(known[1])

    async def call(self, node: str, method: str, request: object) -> pb.ReplicaState:
        """One call of an Admin method returning a ReplicaState at `node`; its failure as the
        BrokerError the other node raised (Unavailable when it could not be reached)."""
        return cast(pb.ReplicaState, await self.call_any(node, method, request))

    async def metadata_call(
        self, node: str, method: str, request: object, timeout_s: float = call_timeout_s
    ) -> pb.MetadataStatus:
        """As `call`, for the methods answering the node's MetadataStatus."""
        return cast(pb.MetadataStatus, await self.call_any(node, method, request, timeout_s))

    async def call_any(
        self, node: str, method: str, request: object, timeout_s: float = call_timeout_s
    ) -> object:
        try:
            call = getattr(self.stub(node), method)
            pending = cast(Awaitable[object], call(request, metadata=self._call_metadata))
            return await asyncio.wait_for(pending, timeout_s)
        except grpc.aio.AioRpcError as error:
            trailing: Any = error.trailing_metadata() or ()
            code = dict(trailing).get(ERROR_CODE_KEY)
            details = error.details() or str(error.code())
            status = error.code()
            address = self._channels[node][0] if node in self._channels else node
            tls_failure = explain(details, address, self._tls, probe=False)
            if status == grpc.StatusCode.UNAVAILABLE and tls_failure is not None:
                raise Unavailable(f"node {node}: {tls_failure}") from error
            if status in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                # Not retried: the operation fails at once, saying what to configure.
                refusal = (
                    Unauthenticated if status == grpc.StatusCode.UNAUTHENTICATED else Unauthorized
                )
                raise refusal(
                    f"node {node} refused this node's call ({details}): give every node "
                    "admin_token (or --admin-token-file, $SPATE_ADMIN_TOKEN) of a user with "
                    "configure on $cluster, or, under admin mutual TLS, an admin certificate "
                    "whose common name is such a user"
                ) from error
            if isinstance(code, str):
                try:
                    kind = ERROR_TYPES.get(ErrorCode(code), Unavailable)
                except ValueError:
                    kind = Unavailable
                raise kind(details) from error
            raise Unavailable(f"node {node} did not answer: {details}") from error
        except TimeoutError as error:
            raise Unavailable(f"node {node} did not answer within {timeout_s} s") from error

    async def close(self) -> None:
        for _, channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()


class Operations:
    """Starts, runs and remembers the cluster operations of one admin server."""

    def __init__(
        self,
        metadata: MetadataService,
        node_id: str = "",
        peer_token: str | None = None,
        tls: AdminTls | None = None,
    ) -> None:
        self.metadata = metadata
        self.peers = Peers(metadata, peer_token, tls)
        self.node_id = node_id
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
            raise NotFound(f"operation {operation_id!r} is unknown here")
        return found

    def describe(self, operation_id: str) -> pb.Operation:
        """An operation started here (its live state), else as the node running it last
        published it in the metadata service; NotFound beyond the last ones kept."""
        found = self._operations.get(operation_id)
        if found is not None:
            return found.message()
        record = self.metadata.view().operations.get(operation_id)
        if record is None:
            raise NotFound(
                f"operation {operation_id!r} is unknown (the cluster keeps the last "
                f"{metadata_limits.operations_kept_max} operations)"
            )
        return pb.Operation(
            id=record.id,
            kind=record.kind,
            target=record.target,
            state=record.state,
            step=record.step,
            progress=record.progress_permille / 1000,
            error=record.error,
            error_code=record.error_code,
            started_ms=record.started_ms,
            finished_ms=record.finished_ms,
            log=record.log,
        )

    async def recover(self) -> None:
        """At start: the operations this node was running when it stopped are failed now (the
        partitions stay consistent; the same command resumes the work)."""
        if not self.node_id:
            return
        for record in list(self.metadata.view().operations.values()):
            if record.node != self.node_id or record.state != "running":
                continue
            message = (
                f"interrupted: {self.node_id} restarted while it ran; run the same command "
                "again to resume it"
            )
            await self.metadata.record_operation(
                replace(
                    record,
                    state="failed",
                    error=message,
                    error_code=ErrorCode.UNAVAILABLE.value,
                    finished_ms=time.time_ns() // 1_000_000,
                    log=(*record.log, f"failed: {message}")[
                        -metadata_limits.operation_log_lines_max :
                    ],
                    revision=record.revision + 1,
                )
            )

    async def _publish(self, operation: Operation) -> None:
        """Publish the operation's state whenever it changed, until it has finished."""
        if not self.node_id:
            return
        published: tuple[object, ...] | None = None
        revision = 0
        while True:
            seen = (operation.state, operation.step, operation.progress, len(operation.log))
            if seen != published:
                revision += 1
                try:
                    await self.metadata.record_operation(operation.record(self.node_id, revision))
                    published = seen
                except BrokerError as error:
                    log.warning("operation %s not published: %s", operation.id, error.message)
                continue_publishing = True
            else:
                continue_publishing = operation.state == "running"
            if not continue_publishing:
                return
            await asyncio.sleep(publish_interval_s)

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

        loop = asyncio.get_running_loop()
        for task in (
            loop.create_task(run(), name=f"operation-{operation.id}"),
            loop.create_task(self._publish(operation), name=f"publish-{operation.id}"),
        ):
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
        statuses = self.metadata.node_statuses()
        domains = {s.record.node: s.record.failure_domain for s in statuses}
        keep = [n for n in record.replicas if n != source]
        live = [s.record.node for s in statuses if s.alive and s.record.node != source]
        better = better_hosts_than(to, keep, live, domains)
        if better:
            raise FailedPrecondition(
                f"{to} runs on host {host_of(to, domains)}, which holds a replica of {name}/{pid} "
                f"already: move it to a node of another host ({', '.join(sorted(better)[:5])}; "
                "ADR 0032)"
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

    # -- metadata voters (ADR 0025)

    def _voter_change_running(self) -> None:
        for other in self._operations.values():
            if other.kind in ("add-voter", "remove-voter") and other.state == "running":
                raise FailedPrecondition(
                    f"a metadata voter change is already in progress ({other.id}: "
                    f"{other.kind} {other.target}); wait for it (`spate operation wait {other.id}`)"
                )

    def _voter_liveness(self) -> tuple[tuple[str, ...], set[str]]:
        """(voter addresses, addresses of the voters this node's metadata replica is connected
        to, itself included: a stopped voter drops out at once, unlike a heartbeat)."""
        status = self.metadata.status()
        reached = {*status.connected_peers, status.self_address}
        return status.voters, {a for a in status.voters if a in reached}

    def add_voter(self, node: str) -> Operation:
        target = self._live_node(node, "node")
        address = self.metadata.node(target).metadata
        if not address:
            raise FailedPrecondition(
                f"node {node} registered no metadata address (an older version): restart it"
            )
        voters, alive = self._voter_liveness()
        if address in voters:
            raise FailedPrecondition(f"node {node} is a metadata voter already")
        majority = (len(voters) + 1) // 2 + 1
        if len(alive) < majority:
            raise FailedPrecondition(
                f"only {len(alive)} of {len(voters)} metadata voters are alive: with {node} "
                f"there would be {len(voters) + 1}, needing {majority} until {node} catches up "
                "(a voter restarted moments ago counts once this node's metadata replica has "
                "reconnected to it, within seconds: retry shortly)"
            )
        self._voter_change_running()
        return self._start(
            "add-voter", f"node {node}", lambda op: self._add_voter(op, target, address)
        )

    def remove_voter(self, node: str) -> Operation:
        if not node:
            raise InvalidArgument("node: required")
        address = self.metadata.node(NodeId(node)).metadata  # NotFound
        voters, alive = self._voter_liveness()
        if not address or address not in voters:
            raise FailedPrecondition(f"node {node} is not a metadata voter")
        remaining = [a for a in voters if a != address]
        if len(remaining) < voters_min:
            raise FailedPrecondition(
                f"removing {node} would leave {len(remaining)} metadata voters; keep at least "
                f"{voters_min} (add one first: `spate cluster add-voter NODE`)"
            )
        majority = len(remaining) // 2 + 1
        live = [a for a in remaining if a in alive]
        if len(live) < majority:
            raise FailedPrecondition(
                f"removing {node} would leave {len(live)} live metadata voters of "
                f"{len(remaining)}, fewer than the {majority} a quorum needs"
            )
        self._voter_change_running()
        return self._start(
            "remove-voter",
            f"node {node}",
            lambda op: self._remove_voter(op, NodeId(node), address),
        )

    async def _metadata_leader(self) -> tuple[str, pb.MetadataStatus]:
        """The metadata leader's node id and its own status (Unavailable while electing)."""
        leader = self.metadata.status().leader
        by_address = {r.metadata: r.node for r in self.metadata.nodes() if r.metadata}
        if leader is None or leader not in by_address:
            raise Unavailable("the metadata service has no known leader right now")
        node = by_address[leader]
        status = cast(
            pb.ClusterStatusResponse,
            await self.peers.call_any(node, "ClusterStatus", pb.ClusterStatusRequest()),
        ).metadata
        if not status.is_leader:
            raise Unavailable(f"{node} does not lead the metadata service any more")
        return node, status

    async def _change_voters(self, op: Operation, action: str, address: str) -> list[str]:
        """Have the metadata leader add or remove the voter at `address`, committed; returns
        the voter set afterwards. The leader hands over first when it is the one removed."""
        asked_at = 0.0
        result: list[str] = []

        async def done() -> bool:
            nonlocal asked_at
            leader, status = await self._metadata_leader()
            if (address in status.voters) == (action == "add"):
                result[:] = status.voters
                return True
            if time.monotonic() - asked_at < transfer_retry_s:
                return False
            asked_at = time.monotonic()
            if action == "remove" and status.self_address == address:
                op.at(f"{leader} leads the metadata service: handing leadership over")
                request = pb.LocalMetadataChangeRequest(action="transfer-leadership")
            else:
                request = pb.LocalMetadataChangeRequest(action=action, address=address)
            try:
                await self.peers.metadata_call(leader, "LocalMetadataChange", request)
            except FailedPrecondition as error:  # a change not committed yet: ask again
                op.at(error.message)
            return False

        await self._until(f"metadata voter {action} {address}", done)
        return result

    async def _add_voter(self, op: Operation, node: NodeId, address: str) -> None:
        op.at(f"adding {node} ({address}) to the metadata voters", 0.1)
        voters = await self._change_voters(op, "add", address)
        op.at(f"voters {', '.join(voters)}; {node} switches to voter", 0.5)
        request = pb.LocalSetMetadataRoleRequest(voter=True, voters=voters)
        await self.peers.metadata_call(node, "LocalSetMetadataRole", request, role_switch_timeout_s)

        async def connected() -> bool:
            _, status = await self._metadata_leader()
            return status.self_address == address or address in status.connected_peers

        await self._until(f"the metadata leader reaching {node}", connected)
        op.at(f"{node} votes in the metadata service ({len(voters)} voters)", 1.0)

    async def _remove_voter(self, op: Operation, node: NodeId, address: str) -> None:
        op.at(f"removing {node} ({address}) from the metadata voters", 0.1)
        voters = await self._change_voters(op, "remove", address)
        op.at(f"voters {', '.join(voters)}; {node} switches to a non-voting replica", 0.6)
        request = pb.LocalSetMetadataRoleRequest(voter=False, voters=voters)
        try:
            await self.peers.metadata_call(
                node, "LocalSetMetadataRole", request, role_switch_timeout_s
            )
        except Unavailable as error:
            # Down (or unreachable): the other voters refuse it now, and when it starts again
            # it asks them and goes on as a non-voting replica (NodeProcess._metadata_ready).
            op.at(
                f"{node} is not reachable ({error.message}); it will follow as a "
                "non-voting replica when it starts again",
                1.0,
            )
            return
        op.at(f"{node} follows the metadata service without a vote", 1.0)

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
            except (Unauthenticated, Unauthorized):
                raise  # a configuration error: the operation fails, it does not wait
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
        """Drain or remove: move every replica `node` holds to a live node on a host (failure
        domain) the partition's other replicas are not on, holding fewest (ADR 0032)."""
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
            domains = {r.node: r.failure_domain for r in self.metadata.nodes()}
            keep = [n for n in placement.replicas if n != node]
            target = best_target(candidates, keep, hosted, domains)
            low, high = i / len(todo), (i + 1) / len(todo)
            await self._move(op, placement.stream, placement.partition, node, target, low, high)
        op.at(f"{node} hosts no replica now", 1.0)
