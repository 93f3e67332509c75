"""`MetadataService`: the asyncio face of the metadata voter hosted by a node process.

Writes go through Raft and resolve once applied on this replica (so a read right after a write on
the same node sees it). Reads (`streams()`, `stream()`, `view()`) return this replica's state
without a Raft round trip; `barrier()` first makes every previously committed change visible.
Commands that pysyncobj drops during a leader change are resubmitted with the same request id,
which the state machine deduplicates, until `command_timeout_ms` runs out; then the caller gets
Unavailable with what this voter knows about the group.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from spate.cluster.metadata import limits
from spate.cluster.metadata.codec import encode_command
from spate.cluster.metadata.raft import (
    MetadataRaft,
    RaftConfig,
    RaftStatus,
    SubmitFailure,
    read_voters,
    write_voters,
)
from spate.cluster.metadata.state import (
    Applied,
    Assignment,
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
    MetadataView,
    NodeRecord,
    NodeStatus,
    OperationRecord,
    PartitionLeader,
    PartitionPlacement,
    RecordOperation,
    RegisterNode,
    Rejected,
    ReportLeader,
    ReportLeaders,
    RequestId,
    Result,
    SetReplicas,
    StreamRecord,
    assignments,
    node_statuses,
    partition_placements,
)
from spate.core import groups
from spate.core.errors import (
    BrokerError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceLimitExceeded,
    Unavailable,
)
from spate.core.groups import GroupDefinition
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream

log = logging.getLogger(__name__)

Listener = Callable[[MetadataView], None]

_RETRY_DELAY_S = 0.1
"""Pause before resubmitting a command pysyncobj dropped during a leader change."""


@dataclass(frozen=True, slots=True)
class MetadataStatus:
    node_id: str
    self_address: str
    voters: tuple[str, ...]
    leader: str | None  # address of the last known leader, None while electing
    is_leader: bool
    ready: bool  # this replica caught up with a leader since it started
    has_quorum: bool  # this replica reaches a majority of the voters (itself included)
    connected_peers: tuple[str, ...]
    term: int
    commit_index: int
    last_applied: int
    version: int  # state version (count of changes) of this replica
    streams: int
    nodes: int


class MetadataService:
    def __init__(
        self,
        *,
        node_id: str,
        data_dir: Path,
        self_address: str,
        peer_addresses: Sequence[str] = (),
        password: str,
        bind_address: str | None = None,
        command_timeout_ms: int = limits.command_timeout_ms,
        ready_timeout_ms: int = limits.ready_timeout_ms,
        compaction_min_entries: int = limits.compaction_min_entries,
        sync_journal: bool = True,
        voter: bool = True,
    ) -> None:
        self.node_id = node_id
        self.command_timeout_ms = command_timeout_ms
        self.ready_timeout_ms = ready_timeout_ms
        recorded = read_voters(Path(data_dir))
        if recorded is not None:
            # The voter set this replica applied last wins over the configured one: voters
            # are added and removed at run time (ADR 0025).
            voter = self_address in recorded
            peer_addresses = recorded
            log.info(
                "metadata voters recorded in %s: %s; this node is %s",
                data_dir,
                ", ".join(recorded),
                "a voter" if voter else "a non-voting replica",
            )
        self._config = RaftConfig(
            self_address=self_address,
            peer_addresses=tuple(a for a in peer_addresses if a != self_address),
            data_dir=Path(data_dir),
            password=password,
            bind_address=bind_address,
            compaction_min_entries=compaction_min_entries,
            sync_journal=sync_journal,
            voter=voter,
        )
        self._raft = MetadataRaft(self._config, self._on_change_threadsafe)
        self._listeners: list[Listener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._role_lock = asyncio.Lock()
        self._switching: asyncio.Event | None = None
        """Set (and cleared when done) while this replica changes between voter and not."""

    # Life cycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the voter and replay the local journal; does not wait for a leader.

        After it returns, `streams()` shows what this replica knew to be committed when it
        stopped: pysyncobj persists its commit index about once a second, so the last second
        of changes may reappear only once a leader exists (listeners are told then). Use
        `wait_ready()` to wait for a leader (a majority of voters must be running).
        """
        assert not self._started, "started twice"
        self._loop = asyncio.get_running_loop()
        # On this thread: pysyncobj stops ticking when the thread that created it exits.
        self._raft.start()
        self._started = True
        deadline = time.monotonic() + self.ready_timeout_ms / 1000
        while time.monotonic() < deadline:
            self._raise_if_failed()
            status = self._raft.status()
            if status.last_applied >= status.commit_index and self._raft.dump_loaded():
                return
            await asyncio.sleep(0.02)
        raise Unavailable(
            f"the metadata voter {self.node_id} did not replay its journal within "
            f"{self.ready_timeout_ms / 1000:.0f} s"
        )

    async def wait_ready(self, timeout_ms: int | None = None) -> None:
        """Wait until a leader exists and this replica has caught up with it."""
        limit_ms = self.ready_timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + limit_ms / 1000
        while True:
            self._raise_if_failed()
            if self._raft.status().ready:
                return
            if time.monotonic() >= deadline:
                raise self._no_leader(f"not ready after {limit_ms / 1000:.1f} s")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        await asyncio.to_thread(self._raft.stop)

    @property
    def is_voter(self) -> bool:
        return self._raft.config.voter

    @property
    def self_address(self) -> str:
        return self._config.self_address

    # Voters (ADR 0025) --------------------------------------------------------------------------

    async def change_voters(self, action: str, address: str) -> None:
        """Add ("add") or remove ("remove") one metadata voter by its Raft address, through the
        leader; returns once the change is applied on this replica. Raises FailedPrecondition
        when pysyncobj refuses it (another change not committed yet, the leader's first entry
        not committed, already in / not in the set, the leader itself), Unavailable."""
        await self._await_switch()
        future = self._callback_future()
        self._raft.change_voters(action, address, self._settle_callback(future))
        try:
            async with asyncio.timeout(self.command_timeout_ms / 1000):
                _, failure = await future
        except TimeoutError:
            raise self._no_leader("the voter change did not commit; it may still") from None
        if failure is SubmitFailure.REQUEST_DENIED:
            raise FailedPrecondition(
                f"the metadata leader refused to {action} voter {address}: another voter "
                "change is not committed yet, or the voter set already is that way, or it is "
                "the leader itself"
            )
        if failure is not None:
            raise Unavailable(f"the voter change was not applied ({failure.name}); retry")

    async def transfer_leadership(self) -> None:
        """On the metadata leader: ask the most caught-up connected voter to take over (it
        campaigns at once). Raises FailedPrecondition (not the leader, no caught-up voter)."""
        future = self._callback_future()
        self._raft.transfer_leadership(self._settle_callback(future))
        _, failure = await asyncio.wait_for(future, self.command_timeout_ms / 1000)
        if failure is SubmitFailure.NOT_LEADER:
            raise FailedPrecondition(f"{self.self_address} does not lead the metadata service")
        if failure is not None:
            raise FailedPrecondition(
                f"no voter is caught up with the metadata leader to take over ({failure.name})"
            )

    async def set_role(self, voter: bool, voters: Sequence[str]) -> None:
        """Become a metadata voter (`voter`) or a non-voting replica of `voters` (the whole
        voter set, Raft addresses), in this process: record the set, stop this replica's
        pysyncobj and start it again in the other role on the same journal and dump. Reads
        answer from the old replica's state until the new one has caught up with the leader;
        writes wait. Raises Unavailable if it does not catch up within `ready_timeout_ms`."""
        async with self._role_lock:  # two switches at once would share one journal
            if voter != self.is_voter:
                await self._switch_role(voter, voters)

    async def _switch_role(self, voter: bool, voters: Sequence[str]) -> None:
        voter_set = tuple(sorted(set(voters)))
        if voter != (self.self_address in voter_set):
            raise InvalidArgument(
                f"voters: {self.self_address} must {'' if voter else 'not '}be among them"
            )
        assert self._loop is not None and self._started
        switching = asyncio.Event()
        self._switching = switching
        old = self._raft
        try:
            config = replace(
                self._config,
                peer_addresses=tuple(a for a in voter_set if a != self.self_address),
                voter=voter,
            )
            await asyncio.to_thread(old.stop)
            write_voters(config.data_dir, voter_set)
            fresh: list[MetadataRaft] = []

            def changed(view: MetadataView) -> None:  # tick thread; silent until swapped in
                if fresh and self._raft is fresh[0]:
                    self._on_change_threadsafe(view)

            new = MetadataRaft(config, changed)
            fresh.append(new)
            try:
                new.start()  # on the loop's thread, which outlives it
            except BrokerError:  # e.g. its metadata port is taken: go on in the old role
                write_voters(config.data_dir, old.status().voters)
                self._raft = MetadataRaft(self._config, self._on_change_threadsafe)
                self._raft.start()
                raise
            deadline = time.monotonic() + self.ready_timeout_ms / 1000
            while not (
                new.failure is None
                and new.dump_loaded()
                and new.status().ready
                and new.view().version >= old.view().version
            ):
                if new.failure is not None or time.monotonic() >= deadline:
                    self._raft = new
                    raise new.failure or self._no_leader(
                        f"did not catch up as a {'voter' if voter else 'non-voting replica'}"
                    )
                await asyncio.sleep(0.05)
            self._config = config
            self._raft = new
            log.info(
                "metadata: %s is now %s (voters %s)",
                self.node_id,
                "a voter" if voter else "a non-voting replica",
                ", ".join(voter_set),
            )
            self._notify(new.view())
        finally:
            self._switching = None
            switching.set()
        if NodeId(self.node_id) in self.view().nodes:  # heartbeats waited during the switch
            try:
                await self.heartbeat(NodeId(self.node_id))
            except BrokerError as error:  # the node's own heartbeat loop tries again
                log.warning("heartbeat after the metadata role switch: %s", error.message)

    async def _await_switch(self) -> None:
        switching = self._switching
        if switching is not None:
            async with asyncio.timeout(self.ready_timeout_ms / 1000):
                await switching.wait()

    def _callback_future(self) -> asyncio.Future[tuple[Result | None, SubmitFailure | None]]:
        assert self._loop is not None
        return self._loop.create_future()

    def _settle_callback(
        self, future: asyncio.Future[tuple[Result | None, SubmitFailure | None]]
    ) -> Callable[[Result | None, SubmitFailure | None], None]:
        loop = self._loop
        assert loop is not None

        def done(result: Result | None, failure: SubmitFailure | None) -> None:  # tick thread
            _call_soon(loop, _settle, future, (result, failure))

        return done

    # Writes -------------------------------------------------------------------------------------

    async def create_stream(
        self,
        config: StreamConfig,
        *,
        request_id: RequestId | None = None,
        default_replicas: bool = False,
        now_ms: int | None = None,
    ) -> StreamConfig:
        """Store a new stream definition and place its partitions on the live registered nodes.

        `default_replicas`: ignore `config.replicas` and use min(3, registered nodes). `now_ms`
        (default: this host's wall clock) judges which nodes are alive. Returns the stored
        config. Raises InvalidArgument (bad config, too few nodes), AlreadyExists, Unavailable.
        """
        config.validate()
        stamp = _wall_clock_ms() if now_ms is None else now_ms
        command = CreateStream(request_id or _new_request_id(), config, stamp, default_replicas)
        await self._submit(command)
        return self.stream(config.name)

    async def delete_stream(self, name: StreamName, *, request_id: RequestId | None = None) -> None:
        """Remove a stream definition; raises NotFound, Unavailable."""
        await self._submit(DeleteStream(request_id or _new_request_id(), name))

    async def create_super_stream(
        self,
        topology: SuperStream,
        config: StreamConfig,
        *,
        request_id: RequestId | None = None,
        default_replicas: bool = False,
        now_ms: int | None = None,
    ) -> SuperStream:
        """Store a super stream (`spate.core.superstreams.define`) and create its partition
        streams, each defined by `config` but its name (one partition; ADR 0014), in one
        command. Returns the stored topology (with its version). Raises InvalidArgument,
        AlreadyExists, FailedPrecondition (a name clash with a stream), Unavailable."""
        stamp = _wall_clock_ms() if now_ms is None else now_ms
        command = CreateSuperStream(
            request_id or _new_request_id(), topology, config, stamp, default_replicas
        )
        await self._submit(command)
        return self.super_stream(topology.name)

    async def delete_super_stream(
        self, name: StreamName, *, request_id: RequestId | None = None
    ) -> None:
        """Remove a super stream and its partition streams; raises NotFound, Unavailable."""
        await self._submit(DeleteSuperStream(request_id or _new_request_id(), name))

    async def create_consumer_group(
        self, group: GroupDefinition, *, request_id: RequestId | None = None
    ) -> GroupDefinition:
        """Define a consumer group (`spate.core.groups.define`) on an existing stream. Returns
        the stored definition (with its version). Raises InvalidArgument, NotFound (no such
        stream), AlreadyExists, FailedPrecondition (a super stream), Unavailable."""
        checked = groups.validate(group)
        result = await self._submit(CreateConsumerGroup(request_id or _new_request_id(), checked))
        assert isinstance(result, Applied), result
        stored = self.consumer_group(group.stream, group.name)
        return stored if stored is not None else replace(checked, version=result.version)

    async def delete_consumer_group(
        self, stream: StreamName, name: str, *, request_id: RequestId | None = None
    ) -> None:
        """Forget a group's definition; raises NotFound, Unavailable."""
        await self._submit(DeleteConsumerGroup(request_id or _new_request_id(), stream, name))

    async def register_node(
        self,
        node: NodeId,
        *,
        amqp: str,
        admin: str,
        replication: str,
        metadata: str | None,
        now_ms: int | None = None,
        failure_domain: str | None = None,
    ) -> None:
        """Record (or refresh) a node's endpoints (each HOST:PORT) and heartbeat time;
        `metadata` None for a non-voting node (no metadata voter to reach; ADR 0022);
        `failure_domain` the host it runs on, shared by a node's shards (ADR 0032).

        Call once when the node starts, before serving; then `heartbeat` every
        `limits.heartbeat_interval_ms`. Raises InvalidArgument for a bad id or endpoint.
        """
        stamp = _wall_clock_ms() if now_ms is None else now_ms
        await self._submit(
            RegisterNode(
                _new_request_id(), node, amqp, admin, replication, metadata, stamp, failure_domain
            )
        )

    async def heartbeat(self, node_id: NodeId, now_ms: int | None = None) -> bool:
        """Tell the cluster `node_id` is alive at `now_ms` (default: wall clock).

        Skips the Raft command (returns False) when this replica already shows a heartbeat of
        the node younger than `limits.heartbeat_min_interval_ms`; True when one was committed.
        Raises NotFound if the node is not registered (register it again), Unavailable.
        """
        stamp = _wall_clock_ms() if now_ms is None else now_ms
        known = self.view().nodes.get(node_id)
        if known is not None and stamp - known.heartbeat_ms < limits.heartbeat_min_interval_ms:
            return False
        await self._submit(Heartbeat(_new_request_id(), node_id, stamp))
        return True

    async def report_leader(
        self,
        stream: StreamName,
        partition: PartitionId,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        *,
        request_id: RequestId | None = None,
    ) -> PartitionLeader | None:
        """Record that `leader` leads the partition at `leader_epoch` (sent by the new leader).

        A report with a lower epoch than the recorded one is ignored, a repeat changes nothing.
        Returns the partition's recorded leader afterwards (another node's if this report was
        stale). Raises NotFound (stream), InvalidArgument (partition out of range, leader not a
        replica, same epoch claimed by another node), Unavailable.
        """
        await self._submit(
            ReportLeader(request_id or _new_request_id(), stream, partition, leader, leader_epoch)
        )
        record = self.view().streams.get(stream)
        if record is None or not 0 <= partition < len(record.partitions):
            return None  # deleted (or recreated smaller) right after the report
        return record.partitions[partition].leader

    async def report_leaders(
        self, reports: Sequence[LeaderReport], *, request_id: RequestId | None = None
    ) -> None:
        """Record many leader changes in one command (a node's coalesced reports, issue 16).
        Each report is judged on its own as `report_leader` would (stale, repeated and invalid
        ones are skipped); at most `limits.leader_reports_max` per call. Raises Unavailable."""
        if len(reports) > limits.leader_reports_max:
            raise InvalidArgument(
                f"at most {limits.leader_reports_max} leader reports per command, "
                f"got {len(reports)}"
            )
        await self._submit(ReportLeaders(request_id or _new_request_id(), tuple(reports)))

    async def set_replicas(
        self,
        stream: StreamName,
        partition: PartitionId,
        replicas: Sequence[NodeId],
        learners: Sequence[NodeId] = (),
        *,
        expected: Sequence[NodeId] | None = None,
        request_id: RequestId | None = None,
    ) -> None:
        """Record a partition's voters (preferred leader first) and learners (ADR 0022); with
        `expected`, only if its replicas are still those. Raises NotFound, InvalidArgument,
        FailedPrecondition, Unavailable."""
        await self._submit(
            SetReplicas(
                request_id or _new_request_id(),
                stream,
                partition,
                tuple(replicas),
                tuple(learners),
                None if expected is None else tuple(expected),
            )
        )

    async def record_operation(self, operation: OperationRecord) -> None:
        """Publish a cluster operation's state (ADR 0025); a revision not above the recorded
        one is ignored. Raises InvalidArgument (too long), Unavailable."""
        await self._submit(RecordOperation(_new_request_id(), operation))

    async def barrier(self) -> MetadataView:
        """Commit a no-op; afterwards this replica shows every change committed before the call."""
        await self._submit(Barrier(_new_request_id()))
        return self.view()

    # Reads (this replica's state) ---------------------------------------------------------------

    def view(self) -> MetadataView:
        return self._raft.view()

    def streams(self) -> list[StreamConfig]:
        """Every stream definition, sorted by name."""
        view = self.view()
        return [view.streams[name].config for name in sorted(view.streams)]

    def stream(self, name: StreamName) -> StreamConfig:
        """Raises NotFound for an unknown stream."""
        record = self.view().streams.get(name)
        if record is None:
            raise NotFound(f"stream {name!r} does not exist")
        return record.config

    def stream_record(self, name: StreamName) -> StreamRecord:
        """The stream with its per-partition replica sets and leaders; raises NotFound."""
        record = self.view().streams.get(name)
        if record is None:
            raise NotFound(f"stream {name!r} does not exist")
        return record

    def super_streams(self) -> list[SuperStream]:
        """Every super stream's topology, sorted by name."""
        view = self.view()
        return [view.super_streams[name] for name in sorted(view.super_streams)]

    def super_stream(self, name: StreamName) -> SuperStream:
        """One super stream's topology; raises NotFound."""
        topology = self.view().super_streams.get(name)
        if topology is None:
            raise NotFound(f"super stream {name!r} does not exist")
        return topology

    def consumer_groups(self, stream: StreamName | None = None) -> list[GroupDefinition]:
        """The consumer groups defined (on one stream, or all), by stream then name."""
        defined = self.view().groups
        return [defined[key] for key in sorted(defined) if stream is None or key[0] == stream]

    def consumer_group(self, stream: StreamName, name: str) -> GroupDefinition | None:
        """One group's definition (None: not defined)."""
        return groups.find(self.view().groups, stream, name)

    def nodes(self) -> list[NodeRecord]:
        """The node registry, sorted by id (endpoints: amqp, admin, replication, metadata)."""
        view = self.view()
        return [view.nodes[node] for node in sorted(view.nodes)]

    def node(self, node_id: NodeId) -> NodeRecord:
        """One registered node (map node id -> AMQP or replication address); raises NotFound."""
        record = self.view().nodes.get(node_id)
        if record is None:
            raise NotFound(f"node {node_id!r} is not registered")
        return record

    def node_statuses(self, now_ms: int | None = None) -> list[NodeStatus]:
        """Every registered node with liveness judged at `now_ms` (default: wall clock)."""
        stamp = _wall_clock_ms() if now_ms is None else now_ms
        return node_statuses(self.view(), stamp)

    def assignments(self, node_id: NodeId) -> list[Assignment]:
        """The partitions placed on `node_id`: [(StreamConfig, PartitionId, replicas), ...]
        sorted by stream and partition; replicas are preferred leader first."""
        return assignments(self.view(), node_id)

    def partitions(self, stream: StreamName | None = None) -> list[PartitionPlacement]:
        """Placement and latest leader of every partition (of one stream; NotFound if unknown)."""
        return partition_placements(self.view(), stream)

    def status(self) -> MetadataStatus:
        raft = self._raft.status()
        view = self.view()
        return MetadataStatus(
            node_id=self.node_id,
            self_address=raft.self_address,
            voters=raft.voters,
            leader=raft.leader,
            is_leader=raft.is_leader,
            ready=raft.ready,
            has_quorum=raft.has_quorum,
            connected_peers=raft.connected_peers,
            term=raft.term,
            commit_index=raft.commit_index,
            last_applied=raft.last_applied,
            version=view.version,
            streams=len(view.streams),
            nodes=len(view.nodes),
        )

    # Change notifications -----------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(view)` on the event loop after every change, in order (stream created or
        deleted, node registered or its endpoints changed, leader reported, snapshot installed;
        not heartbeats). It is not called for the state that exists
        when it is added: read `view()` or `streams()` right after adding it."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _on_change_threadsafe(self, view: MetadataView) -> None:
        """Runs on pysyncobj's tick thread."""
        loop = self._loop
        if loop is not None:  # None: replay before start() bound a loop
            _call_soon(loop, self._notify, view)

    def _notify(self, view: MetadataView) -> None:
        for listener in list(self._listeners):
            listener(view)

    # Submission ---------------------------------------------------------------------------------

    async def _submit(self, command: Command) -> Result:
        assert self._started and self._loop is not None, "use the service between start and stop"
        self._raise_if_failed()
        data = encode_command(command)
        if len(data) > limits.command_bytes_max:
            raise InvalidArgument(
                f"the request is too large ({len(data)} bytes, at most {limits.command_bytes_max})"
            )
        loop = self._loop
        deadline = loop.time() + self.command_timeout_ms / 1000
        while True:
            if self._switching is not None:
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._switching.wait()
                except TimeoutError:
                    raise self._no_leader("this replica is changing its metadata role") from None
            future: asyncio.Future[tuple[Result | None, SubmitFailure | None]] = (
                loop.create_future()
            )

            def done(
                result: Result | None,
                failure: SubmitFailure | None,
                future: asyncio.Future[tuple[Result | None, SubmitFailure | None]] = future,
            ) -> None:  # tick thread
                _call_soon(loop, _settle, future, (result, failure))

            self._raft.submit(data, done)
            try:
                async with asyncio.timeout_at(deadline):
                    result, failure = await future
            except TimeoutError:
                raise self._no_leader(
                    f"the request did not commit within {self.command_timeout_ms / 1000:.1f} s; "
                    "it may still take effect once a leader is elected"
                ) from None
            if result is not None:
                if isinstance(result, Rejected):
                    raise result.error()
                return result
            if failure is SubmitFailure.QUEUE_FULL:
                raise ResourceLimitExceeded(
                    "the metadata service is overloaded (its command queue is full); retry shortly"
                )
            log.info(
                "metadata command %s %s; resubmitting",
                command.request_id,
                failure.name if failure else "?",
            )
            if loop.time() + _RETRY_DELAY_S >= deadline:
                raise self._no_leader(
                    f"the request was dropped ({failure}) and the time to "
                    "retry ran out; it may still take effect"
                )
            await asyncio.sleep(_RETRY_DELAY_S)

    def _raise_if_failed(self) -> None:
        if self._raft.failure is not None:
            raise self._raft.failure

    def _no_leader(self, detail: str) -> Unavailable:
        raft: RaftStatus = self._raft.status()
        reachable = 1 + len(raft.connected_peers)
        majority = len(raft.voters) // 2 + 1
        if raft.leader is None or not raft.has_quorum:
            missing = sorted(set(raft.voters) - set(raft.connected_peers) - {raft.self_address})
            return Unavailable(
                f"metadata service has no leader: voter {raft.self_address} reaches {reachable} of "
                f"{len(raft.voters)} voters and needs {majority}"
                + (f"; start or reconnect {', '.join(missing)}" if missing else "")
                + f" ({detail})"
            )
        return Unavailable(f"metadata service leader {raft.leader} did not answer ({detail})")


def _settle(
    future: asyncio.Future[tuple[Result | None, SubmitFailure | None]],
    outcome: tuple[Result | None, SubmitFailure | None],
) -> None:
    if not future.done():  # the caller may have timed out already
        future.set_result(outcome)


def _call_soon(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: object
) -> None:
    """From the tick thread: run callback on the loop, unless the loop has ended (a raise here
    would make pysyncobj retry the apply forever)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # "Event loop is closed": nobody is left to tell
        log.debug("event loop closed; dropped %s", callback)


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


def _new_request_id() -> RequestId:
    return RequestId(uuid.uuid4().hex)
