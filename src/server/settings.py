"""Settings of one node process: command-line flags over an optional TOML file over defaults."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from spate.core import limits
from spate.core.errors import InvalidArgument

DEFAULT_HOST = "127.0.0.1"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


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
    metadata_peers: tuple[str, ...] = ()
    """Other metadata voters as host:port (empty: this node is the only voter)."""
    metadata_voter: bool = True
    """False: a non-voting metadata replica (pysyncobj read-only node) that follows the voters
    in `metadata_peers`; a cluster grows beyond its voters this way (ADR 0022)."""
    metadata_password: str = field(default="", repr=False)
    """Shared secret of the metadata Raft group (pysyncobj encrypts and authenticates with it)."""
    allow_anonymous: bool = True
    users_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    retention_interval_ms: int = 60_000
    offset_commit_messages: int = limits.offset_commit_messages
    """Named consumers: store the offset after at most this many finished messages..."""
    offset_commit_ms: int = limits.offset_commit_interval_ms
    """...or this long after the first one not stored (ADR 0012)."""
    require_defined_groups: bool = False
    """Consumer groups (ADR 0015): refuse an attach naming a group that is not defined in the
    metadata service (`spate group create`) instead of creating it on first attach."""

    def validate(self) -> None:
        if not self.node_id or not self.node_id.replace("-", "").replace("_", "").isalnum():
            raise InvalidArgument(f"node id {self.node_id!r} must be letters, digits, '-' or '_'")
        if not self.metadata_password:
            raise InvalidArgument(
                "the metadata service needs a password: set metadata_password in the config file "
                "or the SPATE_METADATA_PASSWORD environment variable"
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
        if not self.allow_anonymous and self.users_file is None:
            raise InvalidArgument(
                "anonymous access is off but no users file is given (--users-file)"
            )


def load_settings(config_file: Path | None, overrides: dict[str, Any]) -> NodeSettings:
    """Defaults < TOML file (table [node] or top level) < non-None overrides."""
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            raw = tomllib.loads(config_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise InvalidArgument(f"cannot read config file {config_file}: {error}") from error
        values.update(raw.get("node", raw))
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in fields(NodeSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidArgument(
            f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    for key in ("data_dir", "users_file", "tls_cert", "tls_key"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    if "metadata_peers" in values:
        peers = values["metadata_peers"]
        values["metadata_peers"] = tuple(peers.split(",") if isinstance(peers, str) else peers)
        values["metadata_peers"] = tuple(p for p in values["metadata_peers"] if p)
    if "node_id" not in values or "data_dir" not in values:
        raise InvalidArgument(
            "a node needs --node-id and --data-dir (or node_id/data_dir in the config file)"
        )
    settings = NodeSettings(**values)
    settings.validate()
    return settings


def advertised_host(settings: NodeSettings) -> str:
    return settings.advertise_host or settings.host
