"""`spate gateway run`: a stateless AMQP 1.0 gateway in proxy or redirect mode (issue 7).

It holds no partition and no metadata voter. Every `refresh_ms` it reads the cluster from any
node's admin API (streams, partition leaders and epochs, nodes' advertised AMQP and replication
addresses) into a `RoutingTable` — a picture is taken only when the metadata version is the
same before and after the reads, and never replaces a newer one (revision fencing) — and
serves AMQP with the node's own listener over
- a `RemoteBroker` (proxy mode, spate.gateway.remote): it keeps every link and carries its
  messages to and from the nodes over the gateway wire (ADR 0008), so clients that do not
  follow redirects work; it needs the cluster secret;
- a `RedirectBroker` (redirect mode, spate.gateway.routes): every link is redirected to its
  partition's leader.
`mode` is the default; a client may ask for the other per connection or per link
(`spate:gateway-mode`). Several gateways behind one address work: they share nothing.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from spate.api.tls import AdminTls, aio_channel, explain
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc
from spate.cluster.admin import convert
from spate.core import limits
from spate.core.backend import Broker
from spate.core.errors import (
    AlreadyExists,
    BrokerError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from spate.core.groups import GroupDefinition
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.gateway.auth import Users
from spate.gateway.remote import RemoteBroker, Sessions
from spate.gateway.rooms import RoomsConfig
from spate.gateway.routes import RedirectBroker, Route, Routes, RoutingTable
from spate.gateway.server import GatewayServer, ListenerConfig
from spate.gateway.synap_http import SynapServer
from spate.gateway.synap_service import SynapService
from spate.server import allocator, gcpolicy, logs, metrics
from spate.server.metrics import MetricsServer
from spate.server.settings import DIALECTS, check_fields, read_table
from spate.server.tls import check_all_or_none, cluster_contexts

log = logging.getLogger(__name__)

ENDPOINTS_FILE = "gateway.json"
MODES = ("proxy", "redirect")
refresh_ms_default = 1000
"""How often the gateway re-reads the cluster's routes."""
admin_timeout_s = 5.0


@dataclass(frozen=True)
class GatewaySettings:
    admin: tuple[str, ...]
    """Admin endpoints (host:port) of nodes to read the routes from, tried in turn."""
    data_dir: Path
    gateway_id: str = "g1"
    host: str = "127.0.0.1"
    port: int = 5672
    refresh_ms: int = refresh_ms_default
    allow_anonymous: bool = True
    allow_remote_anonymous: bool = False
    """SASL ANONYMOUS from non-loopback clients too (ADR 0023; default: loopback only)."""
    admin_token: str = field(default="", repr=False)
    """Token for the nodes' admin API when they require one ($SPATE_ADMIN_TOKEN)."""
    users_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    mode: str = "proxy"
    """Default for links that do not ask: "proxy" or "redirect"."""
    offset_commit_messages: int = limits.offset_commit_messages
    offset_commit_ms: int = limits.offset_commit_interval_ms
    require_defined_groups: bool = False
    """Refuse attaches naming a consumer group not defined in the metadata service (ADR 0015)."""
    dialects: tuple[str, ...] = ()
    """Vendor dialects the AMQP listener speaks besides Spate's own ("eventhubs", ADR 0021)."""
    secret: str = field(default="", repr=False)
    """The cluster secret (the nodes' metadata password): proxy mode opens wire sessions with it."""
    synap_port: int | None = None
    """The Synap command API's port (ADR 0018; 0: any free port; None: not served)."""
    rooms: RoomsConfig = field(default_factory=RoomsConfig)
    cluster_tls_cert: Path | None = None
    cluster_tls_key: Path | None = None
    cluster_tls_ca: Path | None = None
    """Mutual TLS to the nodes' replication port (proxy mode's wire sessions), as the nodes'
    settings of the same names (spate.server.tls)."""
    admin_tls_ca: Path | None = None
    admin_tls_cert: Path | None = None
    admin_tls_key: Path | None = None
    """TLS to the nodes' admin API (ADR 0023 addendum; spate.api.tls): the CA that signed the
    nodes' admin certificates; with the nodes' `admin_tls_client_auth`, this gateway's client
    certificate and key too (both or neither; they need the CA)."""
    metrics_port: int | None = None
    """Prometheus `/metrics` over HTTP (ADR 0023; 0: any free port; None: not served)."""
    log_format: str = "text"
    """`text` or `json` (JSON lines, spate.server.logs)."""

    def validate(self) -> None:
        unknown = sorted(set(self.dialects) - set(DIALECTS))
        if unknown:
            raise InvalidArgument(
                f"dialects: unknown {', '.join(unknown)}; known: {', '.join(DIALECTS)}"
            )
        if not self.admin:
            raise InvalidArgument("a gateway needs at least one node admin endpoint (--admin)")
        if self.mode not in MODES:
            raise InvalidArgument(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "proxy" and not self.secret:
            raise InvalidArgument(
                "proxy mode talks to the nodes with the cluster secret: set "
                "SPATE_METADATA_PASSWORD (the nodes' metadata password), or use --mode redirect"
            )
        check_all_or_none(self.cluster_tls_cert, self.cluster_tls_key, self.cluster_tls_ca)
        if (self.admin_tls_cert is None) != (self.admin_tls_key is None):
            raise InvalidArgument(
                "admin TLS client certificate needs both admin_tls_cert and admin_tls_key"
            )
        if self.admin_tls_cert is not None and self.admin_tls_ca is None:
            raise InvalidArgument(
                "admin_tls_cert needs admin_tls_ca (the CA of the nodes' admin certificates)"
            )
        if self.log_format not in ("text", "json"):
            raise InvalidArgument(f"--log-format must be text or json, got {self.log_format!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise InvalidArgument(f"--metrics-port must be 0-65535, got {self.metrics_port}")
        if self.refresh_ms <= 0:
            raise InvalidArgument(f"--refresh-ms must be positive, got {self.refresh_ms}")
        if self.synap_port is not None and self.mode != "proxy":
            raise InvalidArgument("the Synap API (--synap-port) is served in proxy mode only")
        self.rooms.check()


def admin_channel(address: str, token: str, tls: AdminTls | None = None) -> grpc.aio.Channel:
    """A channel to a node's admin API that sends the token, if any, with every call; over TLS
    with `tls` (the gateway's admin_tls_* settings)."""
    if not token:
        return aio_channel(address, tls)
    interceptor: Any = _TokenInterceptor(token)
    return aio_channel(address, tls, interceptors=[interceptor])


class _TokenInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self.metadata = (("authorization", f"Bearer {token}"),)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        metadata = tuple(details.metadata or ()) + self.metadata
        return await continuation(details._replace(metadata=metadata), request)


def load_gateway_settings(
    config_file: Path | None, overrides: dict[str, Any], rooms: dict[str, Any] | None = None
) -> GatewaySettings:
    """Defaults < TOML file (table [gateway], with [gateway.rooms]) < non-None overrides (the
    command line; `rooms` are its room flags), validated with errors naming the field."""
    where = f"config file {config_file} [gateway]" if config_file is not None else "settings"
    table = read_table(config_file, "gateway")
    rooms_table = table.pop("rooms", {})
    if not isinstance(rooms_table, dict):
        raise InvalidArgument(f"{where}: rooms must be a table ([gateway.rooms])")
    values = check_fields(table, GatewaySettings, where)
    values.update(
        check_fields(
            {k: v for k, v in overrides.items() if v is not None}, GatewaySettings, "command line"
        )
    )
    room_values = check_fields(rooms_table, RoomsConfig, f"{where} rooms")
    room_values.update({k: v for k, v in (rooms or {}).items() if v is not None})
    values["rooms"] = RoomsConfig(**room_values)
    for required in ("admin", "data_dir"):
        if required not in values:
            raise InvalidArgument(
                f"a gateway needs {required} (--{required.replace('_', '-')} or {required} in "
                "the config file)"
            )
    settings = GatewaySettings(**values)
    settings.validate()
    return settings


async def read_routes(channel: grpc.aio.Channel) -> Routes | None:
    """One consistent picture from one node, or None when the metadata moved meanwhile."""
    stub = pb_grpc.AdminStub(channel)
    before = await stub.ClusterStatus(pb.ClusterStatusRequest(), timeout=admin_timeout_s)
    streams = await stub.ListStreams(pb.ListStreamsRequest(), timeout=admin_timeout_s)
    placements = await stub.ListPartitions(pb.ListPartitionsRequest(), timeout=admin_timeout_s)
    try:
        supers = await stub.ListSuperStreams(pb.ListSuperStreamsRequest(), timeout=admin_timeout_s)
    except grpc.aio.AioRpcError as error:
        if error.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        supers = pb.ListSuperStreamsResponse()  # a node of a build before super streams
    try:
        defined = await stub.ListConsumerGroups(
            pb.ListConsumerGroupsRequest(), timeout=admin_timeout_s
        )
    except grpc.aio.AioRpcError as error:
        if error.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        defined = pb.ListConsumerGroupsResponse()  # a node of a build before consumer groups
    after = await stub.ClusterStatus(pb.ClusterStatusRequest(), timeout=admin_timeout_s)
    if before.metadata.version != after.metadata.version:
        return None
    amqp: dict[NodeId, tuple[str, int]] = {}
    replication: dict[NodeId, tuple[str, int]] = {}
    for node in after.nodes:
        for endpoint, table in ((node.amqp, amqp), (node.replication, replication)):
            host, _, port = endpoint.rpartition(":")
            if host and port.isdigit():
                table[NodeId(node.node_id)] = (host, int(port))
    partitions = {
        (StreamName(p.stream), PartitionId(p.partition)): Route(
            NodeId(p.leader) if p.leader else None,
            LeaderEpoch(p.leader_epoch) if p.HasField("leader_epoch") else None,
            p.leader_alive,
            tuple(NodeId(r) for r in p.replicas),
        )
        for p in placements.partitions
    }
    configs = {StreamName(m.name): convert.stream_config(m) for m in streams.streams}
    topologies = {StreamName(m.name): convert.super_stream(m) for m in supers.super_streams}
    groups = {
        (StreamName(g.stream), g.name): convert.consumer_group(g.definition) for g in defined.groups
    }
    return Routes(
        after.metadata.version, configs, partitions, amqp, replication, topologies, groups
    )


class GatewayProcess:
    def __init__(self, settings: GatewaySettings) -> None:
        settings.validate()
        self.settings = settings
        self.admin_tls = (
            AdminTls.load(settings.admin_tls_ca, settings.admin_tls_cert, settings.admin_tls_key)
            if settings.admin_tls_ca is not None
            else None
        )
        self.table = RoutingTable()
        modes: dict[str, Broker] = {}
        self.sessions: Sessions | None = None
        if settings.secret:
            ssl_client = None
            if settings.cluster_tls_cert and settings.cluster_tls_key and settings.cluster_tls_ca:
                _, ssl_client = cluster_contexts(
                    settings.cluster_tls_cert, settings.cluster_tls_key, settings.cluster_tls_ca
                )
            self.sessions = Sessions(settings.gateway_id, settings.secret, self.table, ssl_client)
            proxy = RemoteBroker(self.table, self.sessions, self._refresh_now)
            proxy.groups_required = settings.require_defined_groups
            modes["proxy"] = proxy
        # partition-agnostic links cannot be redirected to one leader: proxied when possible
        redirect = RedirectBroker(self.table, relay=modes.get("proxy"))
        redirect.require_groups = settings.require_defined_groups
        modes["redirect"] = redirect
        self.rooms: SynapService | None = None
        """Rooms (ADR 0018), in proxy mode: `$rooms/<room>` over AMQP, and the Synap API."""
        if "proxy" in modes:
            self.rooms = SynapService(modes["proxy"], GrpcAdmin(self), settings.rooms)
        self.server = GatewayServer(
            modes[settings.mode],
            ListenerConfig(
                host=settings.host,
                port=settings.port,
                node_id=settings.gateway_id,
                allow_anonymous=settings.allow_anonymous,
                allow_remote_anonymous=settings.allow_remote_anonymous,
                users_file=settings.users_file,
                tls_cert=settings.tls_cert,
                tls_key=settings.tls_key,
                offset_commit_messages=settings.offset_commit_messages,
                offset_commit_ms=settings.offset_commit_ms,
                dialects=settings.dialects,
            ),
            modes,
            rooms=self.rooms,
        )
        self.synap: SynapServer | None = None
        if settings.synap_port is not None:
            assert self.rooms is not None  # validate: the Synap API needs proxy mode
            self.synap = SynapServer(self.rooms, settings.host, settings.synap_port)
        self.refresh_failures = 0
        """Route refreshes in which no node's admin API answered (/metrics)."""
        self.metrics: MetricsServer | None = None
        if settings.metrics_port is not None:
            self.metrics = MetricsServer(
                [
                    metrics.BuildCollector(settings.gateway_id, "gateway"),
                    metrics.ListenerCollector(settings.gateway_id, self.server),
                    metrics.GatewayCollector(
                        settings.gateway_id, self.table, lambda: self.refresh_failures
                    ),
                ],
                settings.host,
                settings.metrics_port,
            )
        self._task: asyncio.Task[None] | None = None
        self.idle_trim = allocator.IdleTrim() if allocator.settings(os.environ) else None
        """Gives the free heap back once quiet (ADR 0048); not when glibc is left alone."""
        self._reading: asyncio.Future[bool] | None = None
        """A routes read asked for by attaches (`_refresh_now`); concurrent ones share it."""
        self.endpoints: dict[str, Any] = {}

    async def start(self) -> dict[str, Any]:
        await self._refresh_once(self.settings.admin)  # serve with routes from the start
        port = await self.server.start()
        if self.synap is not None:
            await self.synap.start()  # starts the rooms service too
        elif self.rooms is not None:
            self.rooms.start()
        self._task = asyncio.get_running_loop().create_task(self._refresh(), name="routes")
        metrics_url = None
        if self.metrics is not None:
            metrics_port = await self.metrics.start()
            metrics_url = f"http://{self.settings.host}:{metrics_port}{metrics.METRICS_PATH}"
        self.endpoints = {
            "gateway_id": self.settings.gateway_id,
            "role": "gateway",
            "pid": os.getpid(),
            "amqp": f"{self.settings.host}:{port}",
            "mode": self.settings.mode,
            **({"synap": self.synap.url} if self.synap is not None else {}),
            **({"metrics": metrics_url} if metrics_url is not None else {}),
            "started_at_ms": int(time.time() * 1000),
        }
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.settings.data_dir / ENDPOINTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.endpoints, indent=2))
        tmp.replace(path)
        gcpolicy.after_startup()
        log.info(
            "gateway %s ready: amqp %s (%s mode)",
            self.settings.gateway_id,
            port,
            self.settings.mode,
        )
        return self.endpoints

    async def _refresh(self) -> None:
        admins = list(self.settings.admin)
        while True:
            await asyncio.sleep(self.settings.refresh_ms / 1000)
            self._trim_when_idle()
            if await self._refresh_once(admins):
                continue
            admins = admins[1:] + admins[:1]  # next time, ask another node first

    def _trim_when_idle(self) -> None:
        """Quiet for `allocator.IDLE_TRIM_S` after traffic: the free heap goes back (ADR 0048)."""
        if self.idle_trim is None:
            return
        stats = self.server.counters()
        if not self.idle_trim.due(time.monotonic(), stats.bytes_in + stats.bytes_out):
            return
        before, started = allocator.rss_mib(), time.perf_counter()
        allocator.trim()
        log.info(
            "quiet for %.0f s: free heap given back, RSS %d -> %d MiB (%.1f ms)",
            self.idle_trim.idle_s,
            before,
            allocator.rss_mib(),
            (time.perf_counter() - started) * 1000,
        )

    async def _refresh_now(self) -> bool:
        """Read the routes at once (an attach names something they do not hold); attaches
        arriving while a read is under way wait for that one."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._refresh_once(self.settings.admin))
        return await asyncio.shield(self._reading)

    async def _refresh_once(self, admins: Sequence[str]) -> bool:
        for admin in admins:
            try:
                async with admin_channel(
                    admin, self.settings.admin_token, self.admin_tls
                ) as channel:
                    routes = await read_routes(channel)
            except grpc.aio.AioRpcError as error:
                details = error.details() or ""
                why = explain(details, admin, self.admin_tls, probe=False)
                log.info("routes from %s unavailable: %s", admin, why or details)
                continue
            if routes is not None:
                self.table.update(routes)
                return True
        self.refresh_failures += 1
        return False

    async def stop(self) -> None:
        for task in (self._task, self._reading):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.metrics is not None:
            await self.metrics.close()
        if self.synap is not None:
            await self.synap.close()  # closes the rooms service too
        elif self.rooms is not None:
            await self.rooms.close()
        await self.server.close()
        if self.sessions is not None:
            await self.sessions.close()
        (self.settings.data_dir / ENDPOINTS_FILE).unlink(missing_ok=True)


_GRPC_ERRORS: dict[grpc.StatusCode, type[BrokerError]] = {
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
}


class GrpcAdmin:
    """The Synap service's metadata requests (spate.gateway.synap_service.Admin) over the
    nodes' admin API, tried in turn."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.gateway = gateway

    async def _call(self, method: str, request: Any) -> Any:
        error: BrokerError = Unavailable("no node's admin API answered; retry")
        for admin in self.gateway.settings.admin:
            try:
                async with admin_channel(
                    admin, self.gateway.settings.admin_token, self.gateway.admin_tls
                ) as channel:
                    stub = pb_grpc.AdminStub(channel)
                    return await getattr(stub, method)(request, timeout=admin_timeout_s)
            except grpc.aio.AioRpcError as failure:
                kind = _GRPC_ERRORS.get(failure.code())
                if kind is not None:
                    raise kind(failure.details() or str(failure.code())) from None
                details = failure.details() or str(failure.code())
                why = explain(details, admin, self.gateway.admin_tls, probe=False)
                error = Unavailable(why or f"{admin}: {details}")
        raise error

    async def create_stream(self, config: StreamConfig) -> None:
        message = convert.stream_config_message(config)
        if config.replicas <= 0:
            message.ClearField("replicas")  # the server's default: min(3, nodes)
        await self._call("CreateStream", pb.CreateStreamRequest(stream=message))

    async def create_group(self, definition: GroupDefinition) -> None:
        await self._call(
            "CreateConsumerGroup",
            pb.CreateConsumerGroupRequest(
                stream=definition.stream,
                name=definition.name,
                strategy=definition.strategy.value,
                session_timeout_ms=definition.session_timeout_ms,
                rebalance_delay_ms=definition.rebalance_delay_ms,
            ),
        )

    async def find_group(self, group: str) -> GroupDefinition | None:
        for (_, name), definition in self.gateway.table.routes.groups.items():
            if name == group:
                return definition
        answer = await self._call("ListConsumerGroups", pb.ListConsumerGroupsRequest())
        for summary in answer.groups:
            if summary.name == group and summary.HasField("definition"):
                return convert.consumer_group(summary.definition)
        return None

    async def committed(self, stream: str, group: str) -> dict[int, int]:
        answer = await self._call(
            "DescribeConsumerGroup", pb.DescribeConsumerGroupRequest(stream=stream, name=group)
        )
        return {
            int(p.partition): int(p.committed_offset)
            for p in answer.partitions
            if p.HasField("committed_offset")
        }

    async def refresh(self) -> object:
        return await self.gateway._refresh_now()


def _reload_users(gateway: GatewayProcess, settings: GatewaySettings) -> None:
    """SIGHUP: re-read the users file (passwords, permissions, shared access keys); a file
    that does not parse is refused with the reason in the log, and the users in force stay."""
    if settings.users_file is None:
        log.info("SIGHUP: no users file to reload")
        return
    try:
        users = Users.load(settings.users_file)
    except BrokerError as error:
        log.error("SIGHUP: users file not reloaded, the previous one stays: %s", error.message)
        return
    gateway.server.reload_users(users)
    log.info("SIGHUP: reloaded the users file %s", settings.users_file)


async def run_gateway(settings: GatewaySettings) -> None:
    gateway = GatewayProcess(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _reload_users, gateway, settings)
    await gateway.start()
    try:
        await stop.wait()
    finally:
        log.info("gateway %s stopping", settings.gateway_id)
        await gateway.stop()


def main_run(settings: GatewaySettings) -> int:
    import uvloop

    logs.configure(
        settings.log_format, settings.gateway_id, os.environ.get("SPATE_LOG_LEVEL", "INFO")
    )
    allocator.configure()  # before the loop allocates its first RECORDS buffer (ADR 0046)
    uvloop.run(run_gateway(settings))
    return 0
