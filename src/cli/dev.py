"""`spate dev up|down|status`: a local cluster of node processes (spate.server.devcluster)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

DEFAULT_DATA_DIR = "spate-dev"


def _data_dir_default() -> str:
    return os.environ.get("SPATE_DATA_DIR", DEFAULT_DATA_DIR)


def register(subparsers: Any) -> None:
    dev = subparsers.add_parser(
        "dev",
        help="run a local cluster of node processes on this machine",
        description="Run a local Spate cluster: separate node processes on 127.0.0.1, data under "
        "--data-dir, with one AMQP gateway (proxy mode) in front unless --gateways 0. "
        "`up` is idempotent: it starts whichever nodes are not running, "
        "reusing their data and ports, so it also restarts a killed node.",
    )
    commands = dev.add_subparsers(dest="dev_command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        default=_data_dir_default(),
        help="cluster directory (default: $SPATE_DATA_DIR or ./spate-dev)",
    )
    common.add_argument(
        "--output",
        choices=("table", "json"),
        default="table",
        help="output format (default: table)",
    )
    up = commands.add_parser(
        "up",
        parents=[common],
        help="start the cluster's missing processes",
        description="Start every node of the cluster that is not running, "
        "wait until each is ready, write DIR/endpoints.json and "
        "print the endpoints.",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="number of nodes, 1 to 9 (default: 1): the first three are metadata voters, the "
        "rest non-voting; raising it on a running three-node cluster adds nodes",
    )
    up.add_argument(
        "--shards",
        type=int,
        default=1,
        help="shard processes per node, 1 to 8 (default: 1): node n1 runs n1, n1-s1, ..., each "
        "owning a share of the partitions, so one host uses several cores (ADR 0032); only "
        "shard 0 is a metadata voter; raising it on a running cluster adds shards",
    )
    up.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="AMQP gateways in proxy mode in front of the nodes, 0 to 4 (default: 1)",
    )
    up.add_argument(
        "--require-defined-groups",
        action="store_true",
        help="nodes and gateways started now refuse attaches naming a consumer group not "
        "defined with `spate group create` (default: groups are created on first attach)",
    )
    up.add_argument(
        "--dialect",
        action="append",
        choices=["eventhubs"],
        help="nodes and gateways started now also speak this vendor's AMQP dialect (eventhubs: "
        "Azure Event Hubs applications, docs/event-hubs.md); repeatable",
    )
    up.set_defaults(run=_up)
    down = commands.add_parser(
        "down",
        parents=[common],
        help="stop the cluster's processes",
        description="Stop every node process of the cluster (SIGTERM, "
        "then SIGKILL after 15 s). Data is kept.",
    )
    down.set_defaults(run=_down)
    status = commands.add_parser(
        "status",
        parents=[common],
        help="show the cluster's processes",
        description="List every process of the cluster with its role, pid, state and endpoints.",
    )
    status.set_defaults(run=_status)


def _print(result: dict[str, Any], output: str) -> None:
    if output == "json":
        print(json.dumps(result, indent=2))
        return
    from spate.cli.output import render_table

    rows = [
        [
            n["node_id"],
            n["role"],
            str(n["pid"] or "-"),
            "ready" if n["ready"] else ("starting" if n["running"] else "stopped"),
            n["amqp"],
            n.get("admin", "-"),
            n.get("metadata", "-") if n.get("metadata_voter", True) else "(non-voting)",
        ]
        for n in result["processes"]
    ]
    print(render_table(["NODE", "ROLE", "PID", "STATE", "AMQP", "ADMIN", "METADATA"], rows))
    print(f"\ndata: {result['data_dir']}   admin: {result['admin'] or '-'}")
    print(f"endpoints: {Path(result['data_dir']) / 'endpoints.json'}")


def _up(args: argparse.Namespace) -> int:
    from spate.server.devcluster import DevCluster

    dialects = tuple(arg for d in args.dialect or () for arg in ("--dialect", d))
    cluster = DevCluster(
        Path(args.data_dir),
        require_defined_groups=args.require_defined_groups,
        node_args=dialects,
        gateway_args=dialects,
    )
    _print(cluster.up(args.nodes, args.gateways, args.shards), args.output)
    return 0


def _down(args: argparse.Namespace) -> int:
    from spate.server.devcluster import DevCluster

    result = DevCluster(Path(args.data_dir)).down()
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        for s in result["stopped"]:
            print(f"stopped {s['node_id']} (pid {s['pid']})")
        if not result["stopped"]:
            print("nothing was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    from spate.server.devcluster import DevCluster

    _print(DevCluster(Path(args.data_dir)).status(), args.output)
    return 0
