"""`spate node run`: run one storage node in the foreground."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from spate.core import limits


def register(subparsers: Any) -> None:
    node = subparsers.add_parser(
        "node", help="run a storage node", description="Storage node commands."
    )
    commands = node.add_subparsers(dest="node_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run one node in the foreground",
        description="Run one Spate node: its partitions, a metadata voter, the AMQP 1.0 listener "
        "and the gRPC admin API. Flags override the --config TOML file. The metadata "
        "password comes from SPATE_METADATA_PASSWORD or the config file.",
    )
    run.add_argument("--config", type=Path, help="TOML settings file ([node] table)")
    run.add_argument("--node-id", help="stable node name, e.g. n1")
    run.add_argument("--data-dir", type=Path, help="directory for partitions and metadata")
    run.add_argument("--host", help="address to bind every listener to (default 127.0.0.1)")
    run.add_argument(
        "--advertise-host",
        help="host other nodes and clients reach this node at (default --host; required when "
        "--host is 0.0.0.0 or ::); redirects send clients there",
    )
    run.add_argument("--amqp-port", type=int, help="AMQP 1.0 port (default 5672; 0 = any free)")
    run.add_argument(
        "--advertise-amqp-port",
        type=int,
        help="AMQP port clients should use when a load balancer or port mapping fronts the node "
        "(default: the bound port)",
    )
    run.add_argument("--admin-port", type=int, help="gRPC admin port (default 7600; 0 = any free)")
    run.add_argument("--metadata-port", type=int, help="metadata Raft port (default 7700)")
    run.add_argument(
        "--replication-port", type=int, help="node-to-node replication port (default 7800)"
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        help="Prometheus /metrics HTTP port (default 7900; 0 = any free)",
    )
    run.add_argument(
        "--shards",
        type=int,
        help="run the node as this many shard processes (default 1), one per core: shard 0 is "
        "the node itself, shard i is node ID-sI with data directory DATA_DIR-sI, every port "
        "plus i and a non-voting metadata replica; this process supervises them (a shard that "
        "exits is logged and restarted; SIGTERM stops all). See docs/adr/0032-node-shards.md",
    )
    run.add_argument(
        "--failure-domain",
        help="the host (machine) this node runs on: placement puts a partition's replicas on "
        "distinct failure domains when there are enough (default: the node id with --shards "
        "above 1, else none: the node is its own)",
    )
    run.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="log lines as text (default) or JSON lines with node, stream, partition and link ids",
    )
    run.add_argument(
        "--metadata-peers", help="other metadata voters as host:port,host:port (default: none)"
    )
    run.add_argument(
        "--metadata-observer",
        action="store_true",
        help="join the metadata service as a non-voting replica of the voters in "
        "--metadata-peers (a fourth node and beyond; its --metadata-port is not used)",
    )
    run.add_argument(
        "--users-file",
        type=Path,
        help="JSON users file for SASL PLAIN (make hashes with `spate user hash`)",
    )
    run.add_argument(
        "--no-anonymous", action="store_true", help="refuse SASL ANONYMOUS (needs --users-file)"
    )
    run.add_argument(
        "--allow-remote-anonymous",
        action="store_true",
        help="accept SASL ANONYMOUS and admin calls without a token from other hosts too "
        "(default: from loopback only)",
    )
    run.add_argument(
        "--admin-require-token",
        action="store_true",
        help="every admin call needs a user's token ($SPATE_ADMIN_TOKEN on the CLI; "
        "needs --users-file)",
    )
    run.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="the token this node sends to other nodes' admin APIs in cluster operations "
        "(a user with configure on $cluster; needed where tokens are required). Default: "
        "$SPATE_ADMIN_TOKEN, else admin_token in the config file",
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
        (
            "cert",
            "the admin server's certificate (PEM; naming the advertised host), also "
            "presented to the other nodes' admin APIs in cluster operations",
        ),
        ("key", "its private key (PEM)"),
        (
            "ca",
            "the CA bundle (PEM) verifying the other nodes' admin certificates, and the "
            "clients' with --admin-tls-client-auth",
        ),
    ):
        run.add_argument(f"--admin-tls-{name}", type=Path, help=f"TLS on the admin port: {what}")
    run.add_argument(
        "--admin-tls-client-auth",
        action="store_true",
        help="mutual TLS on the admin port: require a client certificate signed by "
        "--admin-tls-ca; its common name, when a user of --users-file, is the caller",
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
        "--dialect",
        action="append",
        choices=["eventhubs"],
        help="also speak this vendor's AMQP dialect on the AMQP port: eventhubs = Azure Event "
        "Hubs applications and SDKs (docs/event-hubs.md); repeatable",
    )
    run.add_argument(
        "--require-defined-groups",
        action="store_true",
        help="refuse an attach naming a consumer group not defined with `spate group create` "
        "(amqp:not-found; default: a group is created on its first attach)",
    )
    run.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from spate.server.node_process import main_run
    from spate.server.settings import load_settings

    overrides = {
        "node_id": args.node_id,
        "data_dir": args.data_dir,
        "host": args.host,
        "advertise_host": args.advertise_host,
        "amqp_port": args.amqp_port,
        "advertise_amqp_port": args.advertise_amqp_port,
        "admin_port": args.admin_port,
        "metadata_port": args.metadata_port,
        "replication_port": args.replication_port,
        "metrics_port": args.metrics_port,
        "log_format": args.log_format,
        "shards": args.shards,
        "failure_domain": args.failure_domain,
        "metadata_peers": args.metadata_peers,
        "metadata_voter": False if args.metadata_observer else None,
        "users_file": args.users_file,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "cluster_tls_cert": args.cluster_tls_cert,
        "cluster_tls_key": args.cluster_tls_key,
        "cluster_tls_ca": args.cluster_tls_ca,
        "admin_tls_cert": args.admin_tls_cert,
        "admin_tls_key": args.admin_tls_key,
        "admin_tls_ca": args.admin_tls_ca,
        "admin_tls_client_auth": True if args.admin_tls_client_auth else None,
        "allow_anonymous": False if args.no_anonymous else None,
        "allow_remote_anonymous": True if args.allow_remote_anonymous else None,
        "admin_require_token": True if args.admin_require_token else None,
        "offset_commit_messages": args.offset_commit_messages,
        "offset_commit_ms": args.offset_commit_ms,
        "require_defined_groups": True if args.require_defined_groups else None,
        "dialects": tuple(args.dialect) if args.dialect else None,
        "metadata_password": os.environ.get("SPATE_METADATA_PASSWORD"),
        "admin_token": _admin_token(args.admin_token_file),
    }
    settings = load_settings(args.config, overrides)
    if settings.shards > 1:
        from spate.server.shards import supervise

        return supervise(settings)
    return main_run(settings)


def _admin_token(path: Path | None) -> str | None:
    """From --admin-token-file (first line), else $SPATE_ADMIN_TOKEN; None: the config's."""
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as error:
            raise SystemExit(f"--admin-token-file: cannot read {path}: {error.strerror}") from None
        if not token:
            raise SystemExit(f"--admin-token-file: {path} is empty")
        return token
    return os.environ.get("SPATE_ADMIN_TOKEN") or None
