"""`spate node run`: one storage node process on one asyncio (uvloop) loop.

Start order: metadata voter (waits for a leader) -> replication host -> AMQP listener -> gRPC
admin -> register the node with all its endpoints -> open the partitions placed here -> follow
metadata changes and heartbeat -> write the endpoints file (the "ready" signal `spate dev up`
waits for). Stop order is the reverse; SIGTERM and SIGINT stop it cleanly, and a kill -9 loses
nothing acknowledged either (acks follow a majority's fsync).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spate.api.tls import AdminTls
from spate.api.v1 import admin_pb2 as pb
from spate.cluster.admin.auth import AdminAuth
from spate.cluster.admin.operations import Peers
from spate.cluster.admin.providers import ProcessFacts
from spate.cluster.admin.server import AdminServer
from spate.cluster.metadata import limits as metadata_limits
from spate.cluster.metadata.service import MetadataService
from spate.cluster.metadata.state import StreamRecord
from spate.core.errors import BrokerError, NotFound
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.gateway.auth import Users
from spate.gateway.remote import RemoteBroker, Sessions
from spate.gateway.routes import Route, Routes, RoutingTable
from spate.gateway.server import GatewayServer, ListenerConfig
from spate.node.manager import Assignment, LocalBroker, PartitionManager
from spate.node.replication.host import ReplicationHost
from spate.node.wire_server import WireServer
from spate.server import gcpolicy, logs, metrics
from spate.server.leader_reports import LeaderReports
from spate.server.metrics import MetricsServer
from spate.server.node_front import NodeFront
from spate.server.replica_control import LocalReplicaControl
from spate.server.settings import NodeSettings, advertised_host
from spate.server.tls import cluster_contexts

log = logging.getLogger(__name__)

ENDPOINTS_FILE = "node.json"
"""Written into the node's data directory once every listener is bound."""


def _split(address: str | None) -> tuple[str, int] | None:
    if not address:
        return None
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass(frozen=True)
class NodeEndpoints:
    node_id: str
    pid: int
    amqp: str
    admin: str
    metadata: str
    replication: str
    metrics: str
    started_at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "pid": self.pid,
            "role": "node",
            "amqp": self.amqp,
            "admin": self.admin,
            "metadata": self.metadata,
            "replication": self.replication,
            "metrics": self.metrics,
            "started_at_ms": self.started_at_ms,
        }


class NodeProcess:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.node_id = NodeId(settings.node_id)
        self.metadata = MetadataService(
            node_id=settings.node_id,
            data_dir=settings.data_dir / "metadata",
            self_address=f"{advertised_host(settings)}:{settings.metadata_port}",
            bind_address=f"{settings.host}:{settings.metadata_port}",
            peer_addresses=list(settings.metadata_peers),
            password=settings.metadata_password,
            voter=settings.metadata_voter,
        )
        ssl_server = ssl_client = None
        if settings.cluster_tls_cert and settings.cluster_tls_key and settings.cluster_tls_ca:
            ssl_server, ssl_client = cluster_contexts(
                settings.cluster_tls_cert, settings.cluster_tls_key, settings.cluster_tls_ca
            )
        self.admin_tls = (
            AdminTls.load(
                settings.admin_tls_ca,
                settings.admin_tls_cert,
                settings.admin_tls_key,
                client_auth=settings.admin_tls_client_auth,
            )
            if settings.admin_tls_cert is not None
            else None
        )
        self.replication = ReplicationHost(
            self.node_id,
            settings.data_dir,
            host=settings.host,
            port=settings.replication_port,
            secret=settings.metadata_password,
            peers=self._replication_address,
            ssl_server=ssl_server,
            ssl_client=ssl_client,
        )
        self.manager = PartitionManager(self.replication)
        self.broker = LocalBroker(
            self.manager,
            self._locate,
            self._amqp_address,
            find_group=self.metadata.consumer_group,
            groups_required=settings.require_defined_groups,
        )
        self.wire = WireServer(self.broker)
        """Gateways' sessions (ADR 0008), on the replication port."""
        self.replication.transport.on_session = self.wire.open
        self.routes = RoutingTable()
        """The cluster as this node's metadata replica sees it, for relayed links."""
        self.relay_sessions = Sessions(
            f"{settings.node_id}/relay", settings.metadata_password, self.routes, ssl_client
        )
        self.front = NodeFront(
            self.broker, RemoteBroker(self.routes, self.relay_sessions), self._update_routes
        )
        self.gateway = GatewayServer(
            self.front,
            ListenerConfig(
                host=settings.host,
                port=settings.amqp_port,
                node_id=settings.node_id,
                allow_anonymous=settings.allow_anonymous,
                allow_remote_anonymous=settings.allow_remote_anonymous,
                users_file=settings.users_file,
                tls_cert=settings.tls_cert,
                tls_key=settings.tls_key,
                offset_commit_messages=settings.offset_commit_messages,
                offset_commit_ms=settings.offset_commit_ms,
                dialects=settings.dialects,
            ),
        )
        self.admin = AdminServer(
            self.metadata,
            stats=self.manager.stats,
            status=self._status,
            producers=self.manager.producers,
            consumers=self.front,
            coordinators=self.front,
            replicas=LocalReplicaControl(self.manager),
            host=settings.host,
            port=settings.admin_port,
            peer_token=settings.admin_token or None,
            tls=self.admin_tls,
            auth=AdminAuth(
                Users.load(settings.users_file).store if settings.users_file else None,
                require_token=settings.admin_require_token,
                allow_remote_anonymous=settings.allow_remote_anonymous,
            ),
        )
        self.metrics = MetricsServer(
            [
                metrics.BuildCollector(settings.node_id, "node"),
                metrics.NodeCollector(settings.node_id, self.replication, self.metadata),
                metrics.ListenerCollector(settings.node_id, self.gateway),
                metrics.GcCollector(settings.node_id, gcpolicy.PAUSES),
            ],
            settings.host,
            settings.metrics_port,
        )
        self.endpoints: NodeEndpoints | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.leader_reports = LeaderReports(self.node_id, self.metadata.report_leaders)
        self._changed = asyncio.Event()
        self._assigned: dict[StreamName, tuple[StreamRecord, list[Assignment]]] = {}
        self._applied_once = False
        self._freezer = gcpolicy.Freezer()
        self._routed: dict[
            StreamName, tuple[StreamRecord, dict[tuple[StreamName, PartitionId], Route]]
        ] = {}
        self._routes_alive: frozenset[NodeId] = frozenset()

    # -- lookups the node package needs from metadata (it never imports spate.cluster) -------

    def _replication_address(self, node: NodeId) -> tuple[str, int] | None:
        try:
            return _split(self.metadata.node(node).replication)
        except NotFound:
            return None

    def _amqp_address(self, node: NodeId) -> tuple[str, int] | None:
        try:
            return _split(self.metadata.node(node).amqp)
        except NotFound:
            return None

    def _locate(self, stream: StreamName, partition: PartitionId) -> Sequence[NodeId]:
        try:
            placements = self.metadata.partitions(stream)
        except NotFound:
            return []
        for placement in placements:
            if placement.partition == partition:
                first = [placement.leader.node] if placement.leader is not None else []
                return first + [n for n in placement.replicas if n not in first]
        return []

    def _status(self) -> list[ProcessFacts]:
        assert self.endpoints is not None
        e = self.endpoints
        hosted = self.manager.hosted()
        return [
            ProcessFacts(
                node_id=e.node_id,
                role="node",
                pid=e.pid,
                endpoints={
                    "amqp": e.amqp,
                    "admin": e.admin,
                    "metadata": e.metadata,
                    "replication": e.replication,
                    "metrics": e.metrics,
                },
                partitions=len(hosted),
                streams=len({a.config.name for a in hosted}),
            )
        ]

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> NodeEndpoints:
        settings = self.settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        if (
            settings.admin_require_token
            and not settings.admin_token
            and not settings.admin_tls_client_auth  # its certificate's CN may be the user
        ):
            log.warning(
                "admin_require_token is on but this node has no admin_token: cluster "
                "operations it runs cannot call the other nodes (set admin_token, "
                "--admin-token-file or SPATE_ADMIN_TOKEN)"
            )
        await self.metadata.start()
        await self._metadata_ready()  # a leader exists and this replica has caught up
        replication_port = await self.replication.start()
        self.replication.add_leader_listener(self._on_leader)
        amqp_port = await self.gateway.start()
        admin_port = await self.admin.start()
        metrics_port = await self.metrics.start()
        host = advertised_host(settings)
        self.endpoints = NodeEndpoints(
            node_id=settings.node_id,
            pid=os.getpid(),
            amqp=f"{host}:{settings.advertise_amqp_port or amqp_port}",
            admin=f"{host}:{admin_port}",
            metadata=f"{host}:{settings.metadata_port}",
            replication=f"{host}:{replication_port}",
            metrics=f"http://{host}:{metrics_port}{metrics.METRICS_PATH}",
            started_at_ms=int(time.time() * 1000),
        )
        await self._register()
        try:
            await self.admin.recover_operations()
        except BrokerError as error:  # not fatal: the records only say what happened
            log.warning("could not mark interrupted operations: %s", error.message)
        self.metadata.add_listener(lambda *_: self._changed.set())
        await self._apply_metadata()
        self._update_routes()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._follow_metadata(), name="follow-metadata"),
            loop.create_task(self._heartbeat(), name="heartbeat"),
            loop.create_task(self._watch_metadata_role(), name="metadata-role"),
            loop.create_task(self.leader_reports.run(), name="leader-reports"),
        ]
        path = settings.data_dir / ENDPOINTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.endpoints.to_json(), indent=2))
        tmp.replace(path)
        gcpolicy.record_pauses()
        gcpolicy.after_startup()
        log.info(
            "node %s ready: amqp %s admin %s",
            self.node_id,
            self.endpoints.amqp,
            self.endpoints.admin,
        )
        return self.endpoints

    async def _metadata_ready(self) -> None:
        """Wait for a metadata leader. A voter that was removed from the voters while it was
        down (ADR 0025) is refused by the others and never hears of it: when no leader shows up
        quickly, ask the registered nodes; if one with a quorum lists voters without this node,
        go on as a non-voting replica of them."""
        deadline = time.monotonic() + self.metadata.ready_timeout_ms / 1000
        while True:
            try:
                await self.metadata.wait_ready(metadata_limits.rejoin_check_ms)
                return
            except BrokerError:
                if time.monotonic() >= deadline:
                    raise
            await self._leave_voters_if_removed()

    async def _leave_voters_if_removed(self) -> None:
        if not self.metadata.is_voter:
            return
        voters = await self._voters_elsewhere()
        if voters is not None and self.metadata.self_address not in voters:
            log.warning(
                "this node was removed from the metadata voters (%s) while it was down or "
                "unreachable; it follows them as a non-voting replica",
                ", ".join(voters),
            )
            await self.metadata.set_role(False, voters)

    async def _watch_metadata_role(self) -> None:
        """A running voter that loses its quorum may have been removed while unreachable."""
        period_s = metadata_limits.rejoin_check_ms / 1000
        while True:
            await asyncio.sleep(period_s)
            status = self.metadata.status()
            if status.leader is None or not status.has_quorum:
                try:
                    await self._leave_voters_if_removed()
                except BrokerError as error:
                    log.warning("metadata role check failed: %s", error.message)

    async def _voters_elsewhere(self) -> list[str] | None:
        """The metadata voters as a registered node with a quorum reports them (None: none
        answered)."""
        peers = Peers(self.metadata, self.settings.admin_token or None, self.admin_tls)
        try:
            for record in self.metadata.nodes():
                if record.node == self.node_id:
                    continue
                try:
                    answer = await peers.call_any(
                        record.node, "ClusterStatus", pb.ClusterStatusRequest()
                    )
                except BrokerError:
                    continue
                assert isinstance(answer, pb.ClusterStatusResponse)
                if answer.metadata.has_quorum and answer.metadata.leader:
                    return list(answer.metadata.voters)
            return None
        finally:
            await peers.close()

    def reload_users(self) -> None:
        """SIGHUP: re-read the users file for the AMQP listener and the admin API (passwords,
        permissions, tokens, shared access keys). A file that does not parse is refused with
        the reason in the log, and the users in force stay."""
        path = self.settings.users_file
        if path is None:
            log.info("SIGHUP: no users file to reload")
            return
        try:
            users = Users.load(path)
        except BrokerError as error:
            log.error("SIGHUP: users file not reloaded, the previous one stays: %s", error.message)
            return
        self.gateway.reload_users(users)
        self.admin.auth.store = users.store
        log.info("SIGHUP: reloaded the users file %s", path)

    async def _register(self) -> None:
        e = self.endpoints
        assert e is not None
        await self.metadata.register_node(
            self.node_id,
            amqp=e.amqp,
            admin=e.admin,
            replication=e.replication,
            metadata=e.metadata or None,
            failure_domain=self.settings.failure_domain,
        )

    async def _apply_metadata(self) -> None:
        """Open and close replicas to match the placement. Incremental (issue 16): a stream
        whose configuration and replica sets are the objects seen last time (a leader report
        keeps them) reuses its assignments, and when no stream changed so, the partition
        manager is not asked at all; a 1,000-partition stream's leader reports are many
        metadata changes, none of which moves a replica."""
        view = self.metadata.view()
        cache = self._assigned
        changed = cache.keys() - view.streams.keys()
        for name in changed:
            del cache[name]
        for name, record in view.streams.items():
            cached = cache.get(name)
            if cached is not None and _same_placement(cached[0], record):
                continue
            changed.add(name)
            cache[name] = (record, self._assignments_of(record))
        if not changed and self._applied_once:
            return
        self._applied_once = True
        wanted = [a for name in sorted(cache) for a in cache[name][1]]
        try:
            await self.manager.apply(self.metadata.streams(), wanted)
        except BaseException:
            cache.clear()  # not applied: the next change compares against nothing
            raise

    def _assignments_of(self, record: StreamRecord) -> list[Assignment]:
        """This node's replicas of one stream (an unplaced format-1 stream: every node)."""
        me = self.node_id
        return [
            Assignment(
                record.config,
                PartitionId(index),
                tuple(partition.replicas) or (me,),
                partition.learners,
            )
            for index, partition in enumerate(record.partitions)
            if not partition.replicas or me in partition.replicas + partition.learners
        ]

    async def _follow_metadata(self) -> None:
        """Open and close replicas whenever the metadata service reports a change."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self._apply_metadata()
            self._update_routes()
            if self._freezer.after_opening(len(self.manager.hosted())):
                log.info(
                    "%d replicas hosted: frozen for the garbage collector",
                    len(self.manager.hosted()),
                )

    def _update_routes(self) -> None:
        """Routes for relayed links (NodeFront) from this node's metadata replica; a stream's
        routes are rebuilt only when its record or the set of live nodes changed (issue 16)."""
        view = self.metadata.view()
        now_ms = int(time.time() * 1000)
        alive = frozenset(
            node
            for node, record in view.nodes.items()
            if record.alive(now_ms, metadata_limits.node_alive_ms)
        )
        if alive != self._routes_alive:
            self._routes_alive = alive
            self._routed.clear()
        for name in self._routed.keys() - view.streams.keys():
            del self._routed[name]
        partitions: dict[tuple[StreamName, PartitionId], Route] = {}
        for name, record in view.streams.items():
            cached = self._routed.get(name)
            if cached is None or cached[0] is not record:
                cached = (record, _routes_of(name, record, alive))
                self._routed[name] = cached
            partitions.update(cached[1])
        amqp: dict[NodeId, tuple[str, int]] = {}
        replication: dict[NodeId, tuple[str, int]] = {}
        for node in view.nodes.values():
            for endpoint, table in ((node.amqp, amqp), (node.replication, replication)):
                address = _split(endpoint)
                if address is not None:
                    table[node.node] = address
        streams = {name: record.config for name, record in view.streams.items()}
        supers = dict(view.super_streams)
        self.routes.update(
            Routes(view.version, streams, partitions, amqp, replication, supers, dict(view.groups))
        )

    async def _heartbeat(self) -> None:
        period_s = metadata_limits.heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.metadata.heartbeat(self.node_id)
            except NotFound:
                await self._register()
            except BrokerError as error:  # no metadata quorum right now: try again next period
                log.warning("heartbeat failed: %s", error.message)

    def _on_leader(
        self, stream: StreamName, partition: PartitionId, leader: NodeId | None, epoch: LeaderEpoch
    ) -> None:
        if leader == self.node_id:
            self.leader_reports.add(stream, partition, epoch)  # sent coalesced (issue 16)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.metrics.close()
        await self.admin.stop()
        await self.gateway.close()
        await self.relay_sessions.close()
        await self.manager.close()
        await self.replication.stop()
        await self.metadata.stop()
        (self.settings.data_dir / ENDPOINTS_FILE).unlink(missing_ok=True)


def _same_placement(old: StreamRecord, new: StreamRecord) -> bool:
    """The same configuration and replica sets (identical objects: a leader report replaces a
    partition's record but keeps its tuples)."""
    if old is new:
        return True
    if old.config is not new.config or len(old.partitions) != len(new.partitions):
        return False
    return all(
        a.replicas is b.replicas and a.learners is b.learners
        for a, b in zip(old.partitions, new.partitions, strict=True)
    )


def _routes_of(
    name: StreamName, record: StreamRecord, alive: frozenset[NodeId]
) -> dict[tuple[StreamName, PartitionId], Route]:
    routes = {}
    for index, p in enumerate(record.partitions):
        leader = p.leader
        routes[(name, PartitionId(index))] = Route(
            leader.node if leader is not None else None,
            leader.epoch if leader is not None else None,
            leader is not None and leader.node in alive,
            tuple(p.replicas),
        )
    return routes


async def run_node(settings: NodeSettings) -> None:
    node = NodeProcess(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, node.reload_users)
    await node.start()
    try:
        await stop.wait()
    finally:
        log.info("node %s stopping", settings.node_id)
        await node.stop()


def main_run(settings: NodeSettings) -> int:
    import uvloop  # the one place the node's event loop is chosen

    logs.configure(settings.log_format, settings.node_id, os.environ.get("SPATE_LOG_LEVEL", "INFO"))
    uvloop.run(run_node(settings))
    return 0
