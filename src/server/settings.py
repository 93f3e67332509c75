"""Settings of one node process: command-line flags over an optional TOML file over defaults."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from spate.core import limits
from spate.core.errors import InvalidArgument
from spate.server.tls import check_all_or_none

DEFAULT_HOST = "127.0.0.1"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
LOG_FORMATS = ("text", "json")


shards_max = 64
"""Shard processes of one node (ADR 0032): one per core; the port offsets (port + i) stay
below the next default port (they are 100 apart)."""

DIALECTS = ("eventhubs",)
"""Vendor AMQP dialects a listener can speak besides Spate's own (ADR 0021)."""


@dataclass(frozen=True)
class NodeSettings:
    node_id: str
    data_dir: Path
    host: str = DEFAULT_HOST
    """Address every listener binds to."""
    advertise_host: str | None = None
    """Host other nodes and clients reach this node at (registered endpoints, link redirects,
    `open.hostname`/SNI of redirected clients). Default: `host`; required when `host` is a
    wildcard (0.0.0.0, ::)."""
    advertise_amqp_port: int | None = None
    """AMQP port clients should use when it differs from the bound one (a load balancer or a
    port mapping in front of the node). Default: the bound port."""
    amqp_port: int = 5672
    admin_port: int = 7600
    metadata_port: int = 7700
    replication_port: int = 7800
    """Node-to-node partition replication (Raft) listener."""
    metrics_port: int = 7900
    """Prometheus `/metrics` over HTTP (ADR 0023; 0: any free port)."""
    log_format: str = "text"
    """`text` (one line per record) or `json` (JSON lines with node, stream, partition and
    link ids as fields; spate.server.logs)."""
    metadata_peers: tuple[str, ...] = ()
    """Other metadata voters as host:port (empty: this node is the only voter)."""
    metadata_voter: bool = True
    """False: a non-voting metadata replica (pysyncobj read-only node) that follows the voters
    in `metadata_peers`; a cluster grows beyond its voters this way (ADR 0022)."""
    metadata_password: str = field(default="", repr=False)
    """Shared secret of the metadata Raft group (pysyncobj encrypts and authenticates with it)."""
    allow_anonymous: bool = True
    allow_remote_anonymous: bool = False
    """SASL ANONYMOUS and token-less admin calls from non-loopback clients too (ADR 0023). Off:
    a node bound to a real interface serves nobody without credentials but its own host."""
    admin_require_token: bool = False
    """Every admin call needs `authorization: Bearer <token>` of a user in the users file."""
    admin_token: str = field(default="", repr=False)
    """The token this node sends to the other nodes' admin APIs during cluster operations
    (moves, drains, voter changes; a user with configure on `$cluster`). Needed where the
    nodes require tokens; `--admin-token-file` or `$SPATE_ADMIN_TOKEN` override it."""
    users_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    cluster_tls_cert: Path | None = None
    cluster_tls_key: Path | None = None
    cluster_tls_ca: Path | None = None
    """Mutual TLS on the replication port (node-to-node Raft and gateways' wire sessions;
    spate.server.tls): this node's certificate and key, and the cluster CA every peer's
    certificate must chain to. All three or none."""
    admin_tls_cert: Path | None = None
    admin_tls_key: Path | None = None
    admin_tls_ca: Path | None = None
    """TLS on the admin port (ADR 0023 addendum; spate.api.tls): this node's admin certificate
    (naming its advertised host) and key, also presented as the client certificate when this
    node calls the other nodes' admin APIs; the CA bundle that verifies the other nodes' admin
    certificates, and the clients' with `admin_tls_client_auth`. All three or none."""
    admin_tls_client_auth: bool = False
    """Mutual TLS: every admin client must present a certificate signed by `admin_tls_ca`; its
    common name, when it is a user of the users file, identifies the caller without a token."""
    retention_interval_ms: int = 60_000
    offset_commit_messages: int = limits.offset_commit_messages
    """Named consumers: store the offset after at most this many finished messages..."""
    offset_commit_ms: int = limits.offset_commit_interval_ms
    """...or this long after the first one not stored (ADR 0012)."""
    dialects: tuple[str, ...] = ()
    """Vendor dialects the AMQP listener speaks besides Spate's own ("eventhubs", ADR 0021)."""
    failure_domain: str | None = None
    """The host (machine) this node runs on, registered in the metadata service: placement puts
    a partition's replicas on distinct failure domains whenever there are enough (ADR 0032).
    Default: the node id when `shards` > 1 (all shards share it), else none (the node is its
    own failure domain)."""
    shards: int = 1
    """Shard processes to run this node as (ADR 0032), 1 to `shards_max`: shard 0 is the node
    itself; shard i is node `<node_id>-s<i>` with data directory `<data_dir>-s<i>`, every port
    (but 0) plus i, and a non-voting metadata replica (`shard_settings`)."""
    require_defined_groups: bool = False
    """Consumer groups (ADR 0015): refuse an attach naming a group that is not defined in the
    metadata service (`spate group create`) instead of creating it on first attach."""

    def validate(self) -> None:
        if not 1 <= self.shards <= shards_max:
            raise InvalidArgument(
                f"shards must be 1-{shards_max} (one per core is the aim), got {self.shards}"
            )
        unknown = sorted(set(self.dialects) - set(DIALECTS))
        if unknown:
            raise InvalidArgument(
                f"dialects: unknown {', '.join(unknown)}; known: {', '.join(DIALECTS)}"
            )
        if not self.node_id or not self.node_id.replace("-", "").replace("_", "").isalnum():
            raise InvalidArgument(f"node id {self.node_id!r} must be letters, digits, '-' or '_'")
        if not self.metadata_password:
            raise InvalidArgument(
                "the metadata service needs a password: set metadata_password in the config file "
                "or the SPATE_METADATA_PASSWORD environment variable"
            )
        check_all_or_none(self.cluster_tls_cert, self.cluster_tls_key, self.cluster_tls_ca)
        check_admin_tls(
            {
                "admin_tls_cert": self.admin_tls_cert,
                "admin_tls_key": self.admin_tls_key,
                "admin_tls_ca": self.admin_tls_ca,
            },
            self.admin_tls_client_auth,
        )
        if self.log_format not in LOG_FORMATS:
            raise InvalidArgument(
                f"log_format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("TLS needs both a certificate (--tls-cert) and a key (--tls-key)")
        if self.host in WILDCARD_HOSTS and not self.advertise_host:
            raise InvalidArgument(
                f"--host {self.host} binds every interface, so the address other nodes and "
                "clients should use cannot be guessed: set --advertise-host (e.g. this "
                "machine's DNS name)"
            )
        if self.advertise_host is not None and (
            not self.advertise_host or any(c in self.advertise_host for c in " /:")
        ):
            raise InvalidArgument(
                f"--advertise-host {self.advertise_host!r} must be a host name or IPv4 address"
            )
        if self.advertise_amqp_port is not None and not 0 < self.advertise_amqp_port < 65536:
            raise InvalidArgument(
                f"--advertise-amqp-port must be 1-65535, got {self.advertise_amqp_port}"
            )
        if self.admin_require_token and self.users_file is None:
            raise InvalidArgument(
                "admin_require_token needs a users file (users_file) with tokens "
                "(`spate user add NAME --token`)"
            )
        if not self.allow_anonymous and self.users_file is None:
            raise InvalidArgument(
                "anonymous access is off but no users file is given (--users-file)"
            )


def check_admin_tls(files: dict[str, Path | None], client_auth: bool) -> bool:
    """True when admin TLS is on; InvalidArgument naming the missing settings when only some of
    `files` are set, or when `admin_tls_client_auth` is on without them."""
    missing = [name for name, path in files.items() if path is None]
    if missing and len(missing) < len(files):
        raise InvalidArgument(
            f"admin TLS needs all of {', '.join(files)}; missing: {', '.join(missing)}"
        )
    if client_auth and missing:
        raise InvalidArgument(
            f"admin_tls_client_auth (mutual TLS) needs {', '.join(files)}, which are not set"
        )
    return not missing


def read_table(config_file: Path | None, table: str) -> dict[str, Any]:
    """The `[table]` of a TOML config file (the whole file when it has no such table and no
    other known table), or {} without a file. One file may hold both `[node]` and `[gateway]`
    (a host running both reads one file)."""
    if config_file is None:
        return {}
    try:
        raw = tomllib.loads(config_file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise InvalidArgument(f"cannot read config file {config_file}: {error}") from error
    if table in raw:
        section = raw[table]
        if not isinstance(section, dict):
            raise InvalidArgument(f"config file {config_file}: [{table}] must be a table")
        return dict(section)
    if any(name in raw for name in CONFIG_TABLES):
        raise InvalidArgument(
            f"config file {config_file} has no [{table}] table (it has "
            f"{', '.join(f'[{t}]' for t in CONFIG_TABLES if t in raw)})"
        )
    return dict(raw)


CONFIG_TABLES = ("node", "gateway")


def check_fields(values: dict[str, Any], cls: type, where: str) -> dict[str, Any]:
    """Refuse unknown names and values of the wrong type, naming the field; returns `values`
    with paths as Path and lists as tuples. `cls` is a dataclass whose annotations are the
    strings `int`, `str`, `bool`, `Path`, `X | None`, `tuple[str, ...]` (and nested tables
    handled by the caller)."""
    known = {f.name: str(f.type) for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise InvalidArgument(
            f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    out: dict[str, Any] = {}
    for name, given in values.items():
        value = given
        kind = known[name]
        optional = kind.endswith(" | None")
        base = kind.removesuffix(" | None")
        if value is None and optional:
            out[name] = None
            continue
        if base == "bool":
            ok = isinstance(value, bool)
        elif base == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif base == "str":
            ok = isinstance(value, str)
        elif base == "Path":
            ok = isinstance(value, str | Path) and str(value) != ""
            value = Path(value) if ok else value
        elif base == "tuple[str, ...]":
            if isinstance(value, str):
                value = [part for part in value.split(",") if part]
            ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
            value = tuple(value) if ok else value
        else:
            ok = True  # a nested table: checked by the caller
        if not ok:
            expected = {
                "bool": "true or false",
                "int": "an integer",
                "str": "a string",
                "Path": "a path (a non-empty string)",
                "tuple[str, ...]": 'a list of strings (["host:port", ...])',
            }.get(base, base)
            raise InvalidArgument(f"{where}: {name} must be {expected}, got {value!r}")
        out[name] = value
    for name, value in out.items():
        listening = name.endswith("_port") and not name.startswith("advertise_")
        if listening and isinstance(value, int) and not 0 <= value < 65536:
            raise InvalidArgument(f"{where}: {name} must be 0-65535, got {value}")
    return out


def load_settings(config_file: Path | None, overrides: dict[str, Any]) -> NodeSettings:
    """Defaults < TOML file (table [node] or top level) < non-None overrides."""
    where = f"config file {config_file} [node]" if config_file is not None else "settings"
    values = check_fields(read_table(config_file, "node"), NodeSettings, where)
    values.update(
        check_fields(
            {k: v for k, v in overrides.items() if v is not None}, NodeSettings, "command line"
        )
    )
    if "node_id" not in values or "data_dir" not in values:
        raise InvalidArgument(
            "a node needs --node-id and --data-dir (or node_id/data_dir in the config file)"
        )
    settings = NodeSettings(**values)
    settings.validate()
    return settings


def shard_id(node_id: str, index: int) -> str:
    """Shard `index` of node `node_id`: the node's own id for shard 0 (so a node that grows
    from one shard to several keeps its replicas), `<node_id>-s<index>` for the others."""
    assert index >= 0, index
    return node_id if index == 0 else f"{node_id}-s{index}"


def shard_settings(settings: NodeSettings, index: int) -> NodeSettings:
    """The settings of shard `index` (0 <= index < settings.shards) of a node (ADR 0032): its
    own id, data directory and ports, the node's failure domain, and a non-voting metadata
    replica for every shard but 0 (the metadata voter count must not grow with the cores)."""
    assert 0 <= index < settings.shards, (index, settings.shards)
    if settings.shards == 1:
        return settings
    domain = settings.failure_domain or settings.node_id
    if index == 0:
        return replace(settings, failure_domain=domain, shards=1)

    def port(base: int) -> int:
        return base + index if base else 0

    shard0_metadata = f"{advertised_host(settings)}:{settings.metadata_port}"
    peers = settings.metadata_peers
    if settings.metadata_voter and shard0_metadata not in peers:
        peers = (*peers, shard0_metadata)
    amqp_advertised = settings.advertise_amqp_port
    return replace(
        settings,
        node_id=shard_id(settings.node_id, index),
        data_dir=settings.data_dir.with_name(f"{settings.data_dir.name}-s{index}"),
        failure_domain=domain,
        shards=1,
        metadata_voter=False,
        metadata_peers=peers,
        advertise_amqp_port=None if amqp_advertised is None else amqp_advertised + index,
        amqp_port=port(settings.amqp_port),
        admin_port=port(settings.admin_port),
        metadata_port=port(settings.metadata_port),
        replication_port=port(settings.replication_port),
        metrics_port=port(settings.metrics_port),
    )


def advertised_host(settings: NodeSettings) -> str:
    return settings.advertise_host or settings.host
