"""Prometheus `/metrics` for node and gateway processes (ADR 0023): the only module that imports
prometheus_client.

Nothing is counted through prometheus_client on the hot path. The data path keeps plain integer
counters and `spate.core.histogram.Histogram`s on the objects that own them (a replica, the
replication driver, an AMQP listener's `ListenerStats`), updated once per append, per read or
per fsync batch; the collectors below read them, and the live state (Raft terms, commit
indexes, followers' progress, stored consumer offsets, connections, links, credit, the metadata
replica's status), only when Prometheus scrapes. A scrape runs on the process's event loop (the
aiohttp handler calls `generate_latest`), so it reads that state from the thread that owns it.

Names follow Prometheus' conventions: `spate_` prefix, base units in the name (`_bytes`,
`_seconds`), `_total` on counters, one `node` label naming the process (node or gateway id) on
every series so a dashboard can tell the processes apart without relabelling.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from spate.cluster.metadata.service import MetadataService
from spate.core.groups import COMMITTED_PREFIX, RESERVED_PREFIX
from spate.core.histogram import Histogram
from spate.gateway.routes import RoutingTable
from spate.gateway.server import GatewayServer
from spate.node.replication.host import ReplicationHost
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.raft import Role
from spate.server import gcpolicy

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"


def _version() -> str:
    try:
        return importlib.metadata.version("spate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def histogram_family(name: str, doc: str, node: str, histogram: Histogram) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=["node"])
    family.add_metric(
        [node],
        [(_bound(bound), count) for bound, count in histogram.buckets()],
        histogram.sum,
    )
    return family


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def lag_messages(end_offset: int, stored: int, retained: int) -> int:
    """Messages after a stored offset (the last one its consumer is done with, ADR 0012) that
    the partition still holds: `end - stored - 1`, at most what is retained (the same figure as
    `spate group describe`, spate.cluster.admin.group_stats.lag)."""
    return max(0, min(end_offset - stored - 1, retained))


class ListenerCollector(Collector):
    """An AMQP listener's connections, links, credit and message counters."""

    def __init__(self, node: str, server: GatewayServer) -> None:
        self.node = node
        self.server = server

    def collect(self) -> Iterator[Metric]:
        node = self.node
        stats, live = self.server.stats()
        gauges = (
            ("spate_amqp_connections", "Open AMQP connections.", live.connections),
            (
                "spate_amqp_unconfirmed_deliveries",
                "Messages received from producers and not yet confirmed (waiting for a "
                "majority's fsync).",
                live.unconfirmed,
            ),
        )
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=["node"])
            family.add_metric([node], value)
            yield family
        links = GaugeMetricFamily(
            "spate_amqp_links", "Attached AMQP links by role.", labels=["node", "role"]
        )
        for role, value in (
            ("producer", live.producer_links),
            ("consumer", live.consumer_links),
            ("info", live.info_links),
            ("attaching", live.attaching_links),
        ):
            links.add_metric([node, role], value)
        yield links
        credit = GaugeMetricFamily(
            "spate_amqp_link_credit",
            "Link credit outstanding, by role: producer = granted by this listener, consumer = "
            "granted by the clients.",
            labels=["node", "role"],
        )
        credit.add_metric([node, "producer"], live.producer_credit)
        credit.add_metric([node, "consumer"], live.consumer_credit)
        yield credit
        counters = (
            ("spate_amqp_messages_in", "Messages received from producers.", stats.messages_in),
            ("spate_amqp_bytes_in", "Bytes of messages received from producers.", stats.bytes_in),
            ("spate_amqp_messages_out", "Messages delivered to consumers.", stats.messages_out),
            ("spate_amqp_bytes_out", "Bytes of messages delivered to consumers.", stats.bytes_out),
            (
                "spate_amqp_connections_accepted",
                "AMQP connections accepted.",
                stats.connections_accepted,
            ),
            (
                "spate_amqp_connections_refused",
                "AMQP connections refused (connection limit reached).",
                stats.connections_refused,
            ),
            (
                "spate_amqp_authentication_failures",
                "SASL exchanges that ended without an authenticated user.",
                stats.authentication_failures,
            ),
        )
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=["node"])
            counter.add_metric([node], value)
            yield counter
        refused = CounterMetricFamily(
            "spate_amqp_links_refused",
            "Link attaches refused, by AMQP error condition.",
            labels=["node", "condition"],
        )
        for condition, value in sorted(stats.links_refused.items()):
            refused.add_metric([node, condition], value)
        yield refused


@dataclass
class _Families:
    """The per-partition families of one node scrape, filled partition by partition."""

    node: str

    def __post_init__(self) -> None:
        labels = ["node", "stream", "partition"]

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=labels)

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*labels, *extra])

        self.messages_in = counter(
            "spate_partition_messages_in", "Messages appended through this replica as leader."
        )
        self.bytes_in = counter(
            "spate_partition_bytes_in", "Bytes of chunks appended through this replica as leader."
        )
        self.messages_out = counter(
            "spate_partition_messages_out", "Messages read from this replica by consumers."
        )
        self.bytes_out = counter(
            "spate_partition_bytes_out", "Bytes of messages read from this replica (as stored)."
        )
        self.leader_changes = counter(
            "spate_partition_leader_changes", "Leader changes this replica has seen."
        )
        self.end_offset = gauge(
            "spate_partition_end_offset",
            "Offset the next committed message gets (committed end of the log).",
        )
        self.first_offset = gauge(
            "spate_partition_first_offset", "First offset still retained (retention moves it)."
        )
        self.log_messages = gauge("spate_partition_log_messages", "Messages retained.")
        self.log_bytes = gauge("spate_partition_log_bytes", "Bytes retained in segments.")
        self.log_segments = gauge("spate_partition_log_segments", "Segment files.")
        self.commit_index = gauge("spate_partition_commit_index", "Raft commit index.")
        self.last_index = gauge("spate_partition_last_index", "Raft index of the last entry.")
        self.term = gauge("spate_partition_raft_term", "Raft term of this replica.")
        self.leader_epoch = gauge("spate_partition_leader_epoch", "Leader epoch (000 4.6.8).")
        self.is_leader = gauge("spate_partition_leader", "1 when this replica leads.")
        self.has_leader = gauge(
            "spate_partition_has_leader", "1 when this replica knows a leader (itself or a peer)."
        )
        self.failed = gauge(
            "spate_partition_failed", "1 when this replica stopped after a disk failure."
        )
        self.replica_lag = gauge(
            "spate_partition_replica_lag_entries",
            "On the leader: Raft entries each follower is behind its last entry.",
            ("replica",),
        )
        self.consumer_offset = gauge(
            "spate_consumer_stored_offset",
            "On the leader: a named consumer's stored offset (the last message it is done with).",
            ("consumer",),
        )
        self.consumer_lag = gauge(
            "spate_consumer_lag_messages",
            "On the leader: messages after a named consumer's stored offset still retained.",
            ("consumer",),
        )
        self.group_offset = gauge(
            "spate_consumer_group_committed_offset",
            "On the leader: a consumer group's committed offset.",
            ("group",),
        )
        self.group_lag = gauge(
            "spate_consumer_group_lag_messages",
            "On the leader: messages after a consumer group's committed offset still retained "
            "(end offset minus committed offset minus one).",
            ("group",),
        )

    def add(self, replica: ReplicatedPartition) -> None:
        key = [self.node, str(replica.stream), str(int(replica.partition))]
        raft = replica.raft
        self.messages_in.add_metric(key, replica.messages_in)
        self.bytes_in.add_metric(key, replica.bytes_in)
        self.messages_out.add_metric(key, replica.messages_out)
        self.bytes_out.add_metric(key, replica.bytes_out)
        self.leader_changes.add_metric(key, replica.leader_changes)
        self.commit_index.add_metric(key, raft.log.committed)
        self.last_index.add_metric(key, raft.log.last_index)
        self.term.add_metric(key, int(raft.term))
        self.leader_epoch.add_metric(key, int(replica.leader_epoch))
        self.is_leader.add_metric(key, 1 if raft.role is Role.LEADER else 0)
        self.has_leader.add_metric(key, 1 if raft.leader is not None else 0)
        self.failed.add_metric(key, 1 if replica.failure is not None else 0)
        if replica.closed:
            return
        info = replica.info()
        self.end_offset.add_metric(key, int(info.end_offset))
        self.first_offset.add_metric(
            key, int(info.first_offset) if info.first_offset is not None else int(info.end_offset)
        )
        self.log_messages.add_metric(key, info.messages)
        self.log_bytes.add_metric(key, info.bytes)
        self.log_segments.add_metric(key, info.segments)
        if raft.role is not Role.LEADER:
            return
        last = raft.log.last_index
        for peer in raft.peers:
            self.replica_lag.add_metric([*key, str(peer)], max(0, last - raft.progress(peer).match))
        for stored in replica.offsets():
            lag = lag_messages(int(info.end_offset), stored.offset, info.messages)
            name = stored.name
            if name.startswith(COMMITTED_PREFIX):
                group = name[len(COMMITTED_PREFIX) :]
                self.group_offset.add_metric([*key, group], stored.offset)
                self.group_lag.add_metric([*key, group], lag)
            elif not name.startswith(RESERVED_PREFIX):  # `$epoch/g`, `$generation/g`: no lag
                self.consumer_offset.add_metric([*key, name], stored.offset)
                self.consumer_lag.add_metric([*key, name], lag)

    def families(self) -> Iterable[Metric]:
        return [value for value in vars(self).values() if isinstance(value, Metric)]


SCRAPE_REPLICAS_PER_TURN = 250
"""Replicas whose series one loop turn of a scrape builds (issue 16, RESULTS §42): a node with
5,000 replicas built them all in one callback, seconds under load, and its peers' node
liveness saw the stall (RESULTS §34)."""


class NodeCollector(Collector):
    """A storage node: its replicas, its replication shell and its metadata replica."""

    def __init__(self, node: str, host: ReplicationHost, metadata: MetadataService) -> None:
        self.node = node
        self.host = host
        self.metadata = metadata

    def collect(self) -> Iterator[Metric]:
        families = _Families(self.node)
        for replica in self._replicas():
            families.add(replica)
        yield from families.families()
        yield from self._node_families()

    async def collect_async(self) -> list[Metric]:
        """`collect`, giving the loop back every `SCRAPE_REPLICAS_PER_TURN` replicas."""
        families = _Families(self.node)
        for i, replica in enumerate(self._replicas()):
            if i and i % SCRAPE_REPLICAS_PER_TURN == 0:
                await asyncio.sleep(0)
            families.add(replica)
        return [*families.families(), *self._node_families()]

    def _replicas(self) -> list[ReplicatedPartition]:
        return sorted(self.host.partitions(), key=lambda r: (r.stream, r.partition))

    def _node_families(self) -> Iterator[Metric]:
        node = self.node
        driver = self.host.driver
        yield histogram_family(
            "spate_fsync_duration_seconds",
            "Wall time of one group-commit batch of fsyncs (every dirty file of every replica).",
            node,
            driver.fsync_seconds,
        )
        yield histogram_family(
            "spate_append_duration_seconds",
            "Appends by local leaders, proposed to committed by a majority (on disk).",
            node,
            driver.append_seconds,
        )
        quiet = sum(1 for g in driver.groups.values() if g.raft.quiesced)
        for family_of, name, doc, value in (
            (
                CounterMetricFamily,
                "spate_replication_batches",
                "Replication shell batches run.",
                driver.batches,
            ),
            (
                CounterMetricFamily,
                "spate_replication_fsyncs",
                "Replica syncs (each fsyncs its dirty files).",
                driver.fsyncs,
            ),
            (
                CounterMetricFamily,
                "spate_replication_sync_batches_inline",
                "Batches whose fsyncs ran on the event-loop thread (small batches, ADR 0036).",
                self.host.syncs_inline,
            ),
            (
                CounterMetricFamily,
                "spate_replication_sync_backoffs",
                "Inline fsyncs slower than 20 ms: the next second's batches synced in a thread.",
                self.host.inline_backoffs,
            ),
            (
                CounterMetricFamily,
                "spate_replication_appends_sent",
                "Raft Append messages sent to followers (entries, or a commit advance).",
                driver.appends_sent,
            ),
            (
                CounterMetricFamily,
                "spate_replication_appends_received",
                "Raft Append messages received from leaders.",
                driver.appends_received,
            ),
            (
                CounterMetricFamily,
                "spate_replication_entries_received",
                "Raft entries (chunks) received in Append messages from leaders.",
                driver.entries_received,
            ),
            (
                CounterMetricFamily,
                "spate_replication_commits_ahead_of_write",
                "Messages from leaders that left a follower's commit index above what it had "
                "handed to disk (those entries are applied after its next write).",
                driver.commits_ahead_of_write,
            ),
            (
                CounterMetricFamily,
                "spate_replication_commits_completed_here",
                "Times a follower committed entries because its own sync completed the quorum "
                "its leader had counted, before the leader heard its ack (ADR 0050).",
                sum(g.raft.commits_completed for g in driver.groups.values()),
            ),
            (
                CounterMetricFamily,
                "spate_replication_acks_coalesced",
                "Follower acks replaced by a later one to the same leader in one batch.",
                sum(g.raft.acks_coalesced for g in driver.groups.values()),
            ),
            (
                GaugeMetricFamily,
                "spate_replication_catchup_transfers",
                "Catch-up (snapshot) transfers in progress to replicas here.",
                driver.transfers,
            ),
            (
                GaugeMetricFamily,
                "spate_replication_quiet_replicas",
                "Local replicas whose Raft group is quiet (idle: no heartbeats, ADR 0026).",
                quiet,
            ),
            (
                GaugeMetricFamily,
                "spate_replication_peers_suspected",
                "Peer nodes silent for longer than their lateness allows (ADR 0026).",
                len(driver.suspected),
            ),
            (
                CounterMetricFamily,
                "spate_replication_suspicions",
                "Times a peer node was suspected (silent for longer than its lateness allows).",
                driver.suspicions,
            ),
            (
                GaugeMetricFamily,
                "spate_replication_peers_late",
                "Peer nodes silent for an election timeout but not suspected yet (late lately).",
                len(driver.liveness.late),
            ),
            (
                CounterMetricFamily,
                "spate_replication_late",
                "Times a peer node went silent for an election timeout without being suspected "
                "(its lateness learned: liveness.py).",
                driver.liveness.lates,
            ),
            (
                CounterMetricFamily,
                "spate_replication_campaigns_held",
                "Ticks on which a follower's election timer had run out while its leader's node "
                "was late, not suspected (no campaign).",
                sum(g.raft.campaigns_held for g in driver.groups.values()),
            ),
            (
                CounterMetricFamily,
                "spate_replication_liveness_settled",
                "Followers woken by a suspicion of their leader's node, put back to sleep "
                "when it was heard from again.",
                driver.settled,
            ),
            (
                CounterMetricFamily,
                "spate_replication_quorum_back",
                "Quiet leaders whose quorum node liveness suspected, heard from again within an "
                "election timeout (never woken).",
                driver.quorum_back,
            ),
            (
                CounterMetricFamily,
                "spate_replication_message_wakes",
                "Quiet replicas woken by a Raft message from a peer.",
                driver.message_wakes,
            ),
            (
                GaugeMetricFamily,
                "spate_replication_log_cache_bytes",
                "Applied Raft entry bytes the replicas kept in memory at the last sweep (once a "
                "second), before it lowered any to fit the budget (ADR 0049).",
                driver.log_cache_bytes,
            ),
            (
                CounterMetricFamily,
                "spate_replication_log_cache_trims",
                "Replicas' Raft log caches lowered by a sweep to fit the node's budget.",
                driver.log_cache_trims,
            ),
        ):
            family = family_of(name, doc, labels=["node"])
            family.add_metric([node], value)
            yield family
        wakes = CounterMetricFamily(
            "spate_replication_liveness_wakes",
            "Quiet replicas woken by node liveness: a follower's leader suspected, a leader's "
            "quorum suspected, a suspected peer back and lacking entries.",
            labels=["node", "reason"],
        )
        for reason, count in driver.wakes_by_reason.items():
            wakes.add_metric([node, reason], count)
        yield wakes
        suspect_after = GaugeMetricFamily(
            "spate_replication_suspect_after_ticks",
            "Ticks of silence after which each peer node is suspected (liveness.py: one election "
            "timeout for a punctual peer, more for one that was late lately).",
            labels=["node", "peer"],
        )
        for peer in sorted(driver.liveness.peers):
            suspect_after.add_metric([node, str(peer)], driver.liveness.suspect_after(peer))
        yield suspect_after
        yield histogram_family(
            "spate_replication_tick_gap_seconds",
            "Time between two replication ticks (past the tick period the loop was late, and "
            "so were this node's liveness PINGs).",
            node,
            driver.tick_gap_seconds,
        )
        yield from self._metadata()

    def _metadata(self) -> Iterator[Metric]:
        node = self.node
        status = self.metadata.status()
        healthy = status.ready and status.has_quorum and status.leader is not None
        for name, doc, value in (
            (
                "spate_metadata_up",
                "1 when this metadata replica has caught up, reaches a quorum and knows a leader.",
                int(healthy),
            ),
            (
                "spate_metadata_leader",
                "1 when this replica leads the metadata group.",
                int(status.is_leader),
            ),
            (
                "spate_metadata_has_quorum",
                "1 when this replica reaches a majority.",
                int(status.has_quorum),
            ),
            ("spate_metadata_term", "Metadata Raft term.", status.term),
            ("spate_metadata_commit_index", "Metadata Raft commit index.", status.commit_index),
            (
                "spate_metadata_applied_index",
                "Metadata Raft last applied index.",
                status.last_applied,
            ),
            ("spate_metadata_version", "Metadata state version (changes applied).", status.version),
            ("spate_metadata_voters", "Metadata voters.", len(status.voters)),
            (
                "spate_metadata_connected_peers",
                "Other voters this replica is connected to.",
                len(status.connected_peers),
            ),
            ("spate_cluster_streams", "Streams in the cluster.", status.streams),
        ):
            family = GaugeMetricFamily(name, doc, labels=["node"])
            family.add_metric([node], value)
            yield family
        nodes = GaugeMetricFamily(
            "spate_cluster_nodes",
            "Registered nodes by liveness (heartbeats), as this metadata replica sees them.",
            labels=["node", "state"],
        )
        statuses = self.metadata.node_statuses()
        alive = sum(1 for s in statuses if s.alive)
        nodes.add_metric([node, "alive"], alive)
        nodes.add_metric([node, "dead"], len(statuses) - alive)
        yield nodes


class GatewayCollector(Collector):
    """A gateway's view of the cluster: its routing table and how its refreshes go."""

    def __init__(self, node: str, table: RoutingTable, refresh_failures: Callable[[], int]) -> None:
        self.node = node
        self.table = table
        self.refresh_failures = refresh_failures

    def collect(self) -> Iterator[Metric]:
        node = self.node
        routes = self.table.routes
        version = GaugeMetricFamily(
            "spate_gateway_routes_version",
            "Metadata version of the routes this gateway uses.",
            labels=["node"],
        )
        version.add_metric([node], routes.version)
        yield version
        partitions = GaugeMetricFamily(
            "spate_gateway_partitions",
            "Partitions in the routes, by whether their leader is alive.",
            labels=["node", "state"],
        )
        led = sum(1 for route in routes.partitions.values() if route.leader_alive)
        partitions.add_metric([node, "led"], led)
        partitions.add_metric([node, "leaderless"], len(routes.partitions) - led)
        yield partitions
        failures = CounterMetricFamily(
            "spate_gateway_route_refresh_failures",
            "Route refreshes in which no node's admin API answered.",
            labels=["node"],
        )
        failures.add_metric([node], self.refresh_failures())
        yield failures


class GcCollector(Collector):
    """The cyclic garbage collector's pauses (spate.server.gcpolicy): the loop's own stalls."""

    def __init__(self, node: str, pauses: gcpolicy.Pauses) -> None:
        self.node, self.pauses = node, pauses

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "spate_gc_pause_seconds",
            "Wall time of the cyclic garbage collector's generation 1 and 2 collections (the "
            "process's loop, and its liveness PINGs, stop meanwhile).",
            labels=["node", "generation"],
        )
        for generation, histogram in enumerate(self.pauses.seconds, start=1):
            family.add_metric(
                [self.node, str(generation)],
                [(_bound(bound), count) for bound, count in histogram.buckets()],
                histogram.sum,
            )
        yield family


class BuildCollector(Collector):
    def __init__(self, node: str, role: str) -> None:
        self.node, self.role = node, role

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "spate_build_info",
            "1, labelled with the process's role and Spate's version.",
            labels=["node", "role", "version"],
        )
        info.add_metric([self.node, self.role, _version()], 1)
        yield info


def registry(collectors: Iterable[Collector]) -> CollectorRegistry:
    """A registry of our collectors only (no process_* defaults: they read /proc on every
    scrape and say nothing Spate-specific; node_exporter covers the host)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


class _Collected(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def render(families: list[Metric]) -> bytes:
    """The text exposition of families already collected (any thread: it reads only them)."""
    return generate_latest(registry([_Collected(families)]))


class MetricsServer:
    """`GET /metrics` over aiohttp on the process's loop. A scrape collects on the loop, a
    node's replicas a slice per loop turn (`NodeCollector.collect_async`), and renders the
    text in a thread: at 5,000 replicas, collecting and rendering in one callback held the
    loop for seconds (issue 16, RESULTS §34, §42)."""

    def __init__(self, collectors: Sequence[Collector], host: str, port: int) -> None:
        self.collectors = list(collectors)
        self.host = host
        self.port = port
        app = web.Application()
        app.router.add_get(METRICS_PATH, self._metrics)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)

    async def start(self) -> int:
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or ()
        port = int(sockets[0].getsockname()[1]) if sockets else self.port
        log.info("metrics on http://%s:%d%s", self.host, port, METRICS_PATH)
        return port

    async def close(self) -> None:
        await self.runner.cleanup()

    async def scrape(self) -> bytes:
        families: list[Metric] = []
        for collector in self.collectors:
            if isinstance(collector, NodeCollector):
                families += await collector.collect_async()
            else:
                families += collector.collect()
        return await asyncio.to_thread(render, families)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await self.scrape()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
