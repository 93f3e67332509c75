"""`spate gateway run`: run one stateless AMQP 1.0 gateway in the foreground."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from spate.core import limits
from spate.gateway.rooms import RoomsConfig

ROOM_FLAG_HELP = (
    ("--rooms-partitions", "partitions", "partitions of the spate.rooms stream (on creation)"),
    ("--room-max-events", "max_events", "events a room's history keeps at most"),
    ("--room-retention-ms", "retention_ms", "age past which a room's events leave its history"),
    ("--max-rooms", "max_rooms", "rooms this gateway holds before refusing new ones"),
    ("--room-inactive-timeout-ms", "inactive_timeout_ms", "a room idle this long is removed"),
    ("--room-cleanup-interval-ms", "cleanup_interval_ms", "how often idle rooms are removed"),
    ("--room-max-subscribers", "max_subscribers", "subscribers per room on this gateway"),
)
ROOM_FLAGS = tuple(attr for _, attr, _ in ROOM_FLAG_HELP)


def register(subparsers: Any) -> None:
    gateway = subparsers.add_parser(
        "gateway", help="run an AMQP gateway", description="Gateway commands."
    )
    commands = gateway.add_subparsers(dest="gateway_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run one gateway in the foreground",
        description="Run a stateless AMQP 1.0 gateway: clients connect to it without knowing "
        "where partitions live. In proxy mode (the default) it keeps every link and carries "
        "messages to and from the nodes, so any AMQP 1.0 client works; in redirect mode each "
        "link is redirected (amqp:link:redirect) to the node that leads its partition. A client "
        "may ask for either per connection or per link with the 'spate:gateway-mode' property. "
        "It learns the routes from any node's admin API. Proxy mode needs the cluster secret "
        "(the nodes' metadata password) in SPATE_METADATA_PASSWORD.",
    )
    run.add_argument(
        "--config", type=Path, help="TOML settings file ([gateway] table; docs/deploy.md)"
    )
    run.add_argument("--gateway-id", help="name shown to clients (default g1)")
    run.add_argument(
        "--admin",
        help="node admin endpoints to read routes from, host:port[,host:port...] (required "
        "here or as admin in the config file)",
    )
    run.add_argument("--data-dir", type=Path, help="where gateway.json is written (required)")
    run.add_argument("--host", help="address to bind (default 127.0.0.1)")
    run.add_argument("--port", type=int, help="AMQP port (default 5672; 0 = any)")
    run.add_argument("--refresh-ms", type=int, help="how often routes are re-read (default 1000)")
    run.add_argument(
        "--mode",
        choices=("proxy", "redirect"),
        help="how links are served unless a client asks otherwise (default proxy)",
    )
    run.add_argument("--users-file", type=Path, help="JSON users file for SASL PLAIN")
    run.add_argument("--no-anonymous", action="store_true", help="refuse SASL ANONYMOUS")
    run.add_argument(
        "--allow-remote-anonymous",
        action="store_true",
        help="accept SASL ANONYMOUS from other hosts too (default: from loopback only)",
    )
    run.add_argument(
        "--dialect",
        action="append",
        choices=["eventhubs"],
        help="also speak this vendor's AMQP dialect: eventhubs = Azure Event Hubs applications "
        "and SDKs (docs/event-hubs.md); repeatable",
    )
    run.add_argument("--tls-cert", type=Path, help="PEM certificate: serve AMQP over TLS")
    run.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    for name, what in (
        ("cert", "this process's certificate (PEM)"),
        ("key", "its private key (PEM)"),
        ("ca", "the cluster CA every peer's certificate must chain to (PEM)"),
    ):
        run.add_argument(
            f"--cluster-tls-{name}",
            type=Path,
            help=f"mutual TLS on the replication port (nodes and gateways): {what}",
        )
    for name, what in (
        ("ca", "the CA that signed the nodes' admin certificates (PEM)"),
        ("cert", "this gateway's client certificate, where the nodes require one (PEM)"),
        ("key", "its private key (PEM)"),
    ):
        run.add_argument(
            f"--admin-tls-{name}",
            type=Path,
            help=f"TLS to the nodes' admin API (routes, rooms): {what}",
        )
    run.add_argument(
        "--offset-commit-messages",
        type=int,
        help="named consumers: store the offset after at most this many finished messages "
        f"(default {limits.offset_commit_messages})",
    )
    run.add_argument(
        "--offset-commit-ms",
        type=int,
        help="...or this long after the first one not stored "
        f"(default {limits.offset_commit_interval_ms})",
    )
    run.add_argument(
        "--require-defined-groups",
        action="store_true",
        help="refuse an attach naming a consumer group not defined with `spate group create` "
        "(amqp:not-found; default: a group is created on its first attach)",
    )
    run.add_argument(
        "--synap-port",
        type=int,
        help="serve the Synap command API (003 rooms, topics and consumer groups as JSON over "
        "WebSocket and HTTP, docs/synap-api.md) on this port at /synap (0 = any free port; "
        "default: not served; proxy mode only)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus /metrics over HTTP on this port (0 = any free port; default: "
        "not served)",
    )
    run.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="log lines as text (default) or JSON lines with gateway, stream, partition and "
        "link ids",
    )
    rooms = RoomsConfig()
    for flag, attr, what in ROOM_FLAG_HELP:
        default = getattr(rooms, attr)
        run.add_argument(flag, type=int, dest=f"room_{attr}", help=f"{what} (default {default})")
    run.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from spate.server.gateway_process import load_gateway_settings, main_run

    overrides = {
        "gateway_id": args.gateway_id,
        "admin": args.admin,
        "data_dir": args.data_dir,
        "host": args.host,
        "port": args.port,
        "refresh_ms": args.refresh_ms,
        "allow_anonymous": False if args.no_anonymous else None,
        "allow_remote_anonymous": True if args.allow_remote_anonymous else None,
        "admin_token": os.environ.get("SPATE_ADMIN_TOKEN"),
        "users_file": args.users_file,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "cluster_tls_cert": args.cluster_tls_cert,
        "cluster_tls_key": args.cluster_tls_key,
        "cluster_tls_ca": args.cluster_tls_ca,
        "admin_tls_ca": args.admin_tls_ca,
        "admin_tls_cert": args.admin_tls_cert,
        "admin_tls_key": args.admin_tls_key,
        "mode": args.mode,
        "offset_commit_messages": args.offset_commit_messages,
        "offset_commit_ms": args.offset_commit_ms,
        "require_defined_groups": True if args.require_defined_groups else None,
        "dialects": tuple(args.dialect) if args.dialect else None,
        "secret": os.environ.get("SPATE_METADATA_PASSWORD"),
        "synap_port": args.synap_port,
        "metrics_port": args.metrics_port,
        "log_format": args.log_format,
    }
    rooms = {attr: getattr(args, f"room_{attr}") for attr in ROOM_FLAGS}
    return main_run(load_gateway_settings(args.config, overrides, rooms))
