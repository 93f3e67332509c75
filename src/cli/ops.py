"""Cluster operations from the command line (issue 14, ADR 0022, ADR 0025): `spate partition
move|transfer-leader|rebalance|replicas`, `spate node drain|remove`, `spate cluster
add-voter|remove-voter`, `spate operation show|wait`.

Long operations run on the node whose admin API was called; the command waits for the
operation (a progress line on stderr while it runs) unless `--no-wait`, then prints it.
Exit codes: 0 the operation succeeded (or, with --no-wait, started); the code of its error
when it failed (2 invalid argument, 3 not found, 5 unavailable, 1 anything else, e.g. a
failed precondition); 6 when --wait-timeout passed while it still runs (it goes on: watch it
with `spate operation wait ID`)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from spate.api.v1 import admin_pb2 as pb
from spate.cli import output
from spate.cli.admin import _call as admin_call
from spate.cli.admin import add_tls_options
from spate.core.errors import ErrorCode

EXIT_STILL_RUNNING = 6
wait_poll_s = 0.25
default_wait_timeout_s = 900.0


def _subcommands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The subcommand action of an existing command (`partition`, `node`)."""
    parser = subparsers.choices[name]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise AssertionError(f"spate {name} has no subcommands")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument("--admin", metavar="HOST:PORT", help="admin API address (as `spate stream`)")
    group.add_argument("--output", "-o", choices=output.OUTPUT_FORMATS, default="table")
    group.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS", help="per API call (default 10)"
    )
    add_tls_options(group)
    waiting = argparse.ArgumentParser(add_help=False)
    wait_group = waiting.add_argument_group("waiting")
    wait_group.add_argument(
        "--no-wait", action="store_true", help="print the operation id and return at once"
    )
    wait_group.add_argument(
        "--wait-timeout",
        type=float,
        default=default_wait_timeout_s,
        metavar="SECONDS",
        help=f"stop waiting after this long, exit code {EXIT_STILL_RUNNING} "
        f"(default {default_wait_timeout_s:g})",
    )
    formatter = argparse.RawDescriptionHelpFormatter

    partition = _subcommands(subparsers, "partition")
    move = partition.add_parser(
        "move",
        parents=[common, waiting],
        formatter_class=formatter,
        help="move a partition's replica from one node to another",
        description="Move the replica of STREAM's PARTITION on node --from to node --to: the "
        "new replica joins as a non-voting learner, catches up from the leader, becomes a "
        "voter; leadership moves off --from if it has it; then --from leaves and closes its "
        "replica. Writes are accepted throughout (a leadership transfer pauses them for "
        "about one election round trip).\n\nexample:\n  spate partition move orders 0 "
        "--from n1 --to n4",
    )
    move.add_argument("stream", metavar="STREAM")
    move.add_argument("partition", metavar="PARTITION", type=int)
    move.add_argument("--from", dest="from_node", required=True, metavar="NODE")
    move.add_argument("--to", dest="to_node", required=True, metavar="NODE")
    move.set_defaults(run=_move)

    transfer = partition.add_parser(
        "transfer-leader",
        parents=[common, waiting],
        formatter_class=formatter,
        help="hand a partition's leadership to another of its replicas",
        description="Make node --to lead STREAM's PARTITION: the leader brings it up to date "
        "and tells it to campaign at once (Raft leadership transfer). --to must be a voter "
        "of the partition.\n\nexample:\n  spate partition transfer-leader orders 0 --to n2",
    )
    transfer.add_argument("stream", metavar="STREAM")
    transfer.add_argument("partition", metavar="PARTITION", type=int)
    transfer.add_argument("--to", dest="to_node", required=True, metavar="NODE")
    transfer.set_defaults(run=_transfer)

    rebalance = partition.add_parser(
        "rebalance",
        parents=[common, waiting],
        formatter_class=formatter,
        help="move every leadership back to the partition's preferred leader",
        description="Transfer the leadership of every partition led elsewhere than its "
        "preferred leader (the first replica in `spate partition list`) to it, where that "
        "node is alive; prints the leaders per node afterwards.\n\nexample:\n  spate "
        "partition rebalance",
    )
    rebalance.add_argument(
        "--auto",
        choices=("on", "off"),
        help="instead: switch the answering node's automatic leader balancer on or off (it "
        "starts a rebalance every --interval seconds while a partition is led elsewhere than "
        "its preferred leader; in memory: off again when that node restarts)",
    )
    rebalance.add_argument(
        "--interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="the automatic balancer's period (default 30)",
    )
    rebalance.set_defaults(run=_rebalance)

    replicas = partition.add_parser(
        "replicas",
        parents=[common],
        formatter_class=formatter,
        help="every replica's Raft state: role, term, commit index, lag",
        description="Ask every node hosting a partition (of STREAM, or of all streams) for "
        "its replica: role, term, commit and last index, the membership in its log, and "
        "from the leader how many entries each member is behind (LAG).\n\nexample:\n  "
        "spate partition replicas orders",
    )
    replicas.add_argument("stream", metavar="STREAM", nargs="?")
    replicas.set_defaults(run=_replicas)

    node = _subcommands(subparsers, "node")
    drain = node.add_parser(
        "drain",
        parents=[common, waiting],
        formatter_class=formatter,
        help="move every replica off a node, so it can be stopped",
        description="Move every partition replica NODE holds to the live node holding fewest "
        "(one `partition move` each, leadership moving away first), so NODE hosts nothing "
        "and can be stopped.\n\nexample:\n  spate node drain n2",
    )
    drain.add_argument("node", metavar="NODE")
    drain.set_defaults(run=_drain)
    remove = node.add_parser(
        "remove",
        parents=[common, waiting],
        formatter_class=formatter,
        help="re-create a dead node's replicas on the live nodes",
        description="For a node that is dead (no heartbeat for 10 s): re-create each of its "
        "replicas on a live node from the remaining copies and drop NODE from every replica "
        "set. Refused while NODE is alive (drain it).\n\nexample:\n  spate node remove n3",
    )
    remove.add_argument("node", metavar="NODE")
    remove.set_defaults(run=_remove)

    cluster = _subcommands(subparsers, "cluster")
    add_voter = cluster.add_parser(
        "add-voter",
        parents=[common, waiting],
        formatter_class=formatter,
        help="make a non-voting node a metadata voter",
        description="Make NODE (registered, alive, not a voter) a voter of the metadata "
        "service: the metadata leader adds its Raft address to the voter set (one change at "
        "a time), then NODE restarts its metadata replica in place as a voter. The voter set "
        "is recorded in each node's metadata/metadata.voters, so restarts keep it.\n\n"
        "example:\n  spate cluster add-voter n4",
    )
    add_voter.add_argument("node", metavar="NODE")
    add_voter.set_defaults(run=_add_voter)
    remove_voter = cluster.add_parser(
        "remove-voter",
        parents=[common, waiting],
        formatter_class=formatter,
        help="make a metadata voter a non-voting node",
        description="Remove NODE from the metadata voters (leadership moves off it first if "
        "it leads); NODE goes on as a non-voting metadata replica and keeps its partitions. "
        "Refused when it would leave fewer than 3 voters or fewer live voters than a quorum "
        "needs.\n\nexample:\n  spate cluster remove-voter n1",
    )
    remove_voter.add_argument("node", metavar="NODE")
    remove_voter.set_defaults(run=_remove_voter)

    operation = subparsers.add_parser(
        "operation",
        help="watch a long cluster operation",
        description="Operations (moves, transfers, drains, removals, rebalances, voter "
        "changes) run on the node that started them, which publishes their state to the "
        "metadata service: any node answers for the last 256 (ADR 0025). An operation whose "
        "node restarted while it ran shows as failed (interrupted); run the command again.",
    )
    operation_commands = operation.add_subparsers(
        title="operation commands", metavar="ACTION", dest="action", required=True
    )
    show = operation_commands.add_parser(
        "show", parents=[common], help="an operation's state and steps"
    )
    show.add_argument("id", metavar="ID")
    show.set_defaults(run=_show)
    wait = operation_commands.add_parser(
        "wait", parents=[common, waiting], help="wait for an operation to finish"
    )
    wait.add_argument("id", metavar="ID")
    wait.set_defaults(run=_wait)


# -- commands


def _move(args: argparse.Namespace) -> int:
    request = pb.MovePartitionRequest(
        stream=args.stream,
        partition=args.partition,
        from_node=args.from_node,
        to_node=args.to_node,
    )
    return _follow(args, admin_call(args, "MovePartition", request))


def _transfer(args: argparse.Namespace) -> int:
    request = pb.TransferLeaderRequest(
        stream=args.stream, partition=args.partition, to_node=args.to_node
    )
    return _follow(args, admin_call(args, "TransferLeader", request))


def _rebalance(args: argparse.Namespace) -> int:
    if args.auto is not None:
        request = pb.SetLeaderBalancerRequest(enabled=args.auto == "on", interval_s=args.interval)
        status = admin_call(args, "SetLeaderBalancer", request)
        document = {
            "enabled": status.enabled,
            "interval_s": status.interval_s,
            "operations": list(status.operations),
        }
        if args.output == "json":
            print(output.render_json(document))
        else:
            state = f"on, every {status.interval_s:g} s" if status.enabled else "off"
            print(f"automatic leader balancer: {state}")
        return 0
    return _follow(args, admin_call(args, "RebalanceLeaders", pb.RebalanceLeadersRequest()))


def _drain(args: argparse.Namespace) -> int:
    return _follow(args, admin_call(args, "DrainNode", pb.DrainNodeRequest(node=args.node)))


def _remove(args: argparse.Namespace) -> int:
    return _follow(args, admin_call(args, "RemoveNode", pb.RemoveNodeRequest(node=args.node)))


def _add_voter(args: argparse.Namespace) -> int:
    request = pb.MetadataVoterRequest(node=args.node)
    return _follow(args, admin_call(args, "AddMetadataVoter", request))


def _remove_voter(args: argparse.Namespace) -> int:
    request = pb.MetadataVoterRequest(node=args.node)
    return _follow(args, admin_call(args, "RemoveMetadataVoter", request))


def _show(args: argparse.Namespace) -> int:
    found = admin_call(args, "GetOperation", pb.GetOperationRequest(id=args.id))
    _print_operation(args, found)
    return _exit_code(found)


def _wait(args: argparse.Namespace) -> int:
    found = admin_call(args, "GetOperation", pb.GetOperationRequest(id=args.id))
    return _follow(args, found)


def _replicas(args: argparse.Namespace) -> int:
    response = admin_call(args, "ListReplicas", pb.ListReplicasRequest(stream=args.stream or ""))
    partitions = [_partition_json(p) for p in response.partitions]
    if args.output == "json":
        print(output.render_json({"partitions": partitions}))
        return 0
    rows = []
    for p in partitions:
        lag = {}
        for state in p["states"]:
            if state.get("role") == "leader":
                lag = {g["node"]: g["lag"] for g in state["progress"]}
        for state in p["states"]:
            if not state["available"]:
                rows.append(
                    [f"{p['stream']}/{p['partition']}", state["node"], "unavailable"] + ["-"] * 6
                )
                continue
            kind = "learner" if state["node"] in p["learners"] else "voter"
            rows.append(
                [
                    f"{p['stream']}/{p['partition']}",
                    state["node"],
                    f"{state['role']} ({kind})",
                    str(state["term"]),
                    state["leader"] or "-",
                    str(state["commit_index"]),
                    str(state["last_index"]),
                    "-" if state["role"] == "leader" else str(lag.get(state["node"], "?")),
                    ",".join(state["voters"])
                    + (f" +{','.join(state['learners'])}" if state["learners"] else ""),
                ]
            )
    print(
        output.render_table(
            ["PARTITION", "NODE", "ROLE", "TERM", "LEADER", "COMMIT", "LAST", "LAG", "MEMBERS"],
            rows,
        )
    )
    return 0


# -- waiting and printing


def _follow(args: argparse.Namespace, operation: Any) -> int:
    if args.no_wait or operation.state != "running":
        _print_operation(args, operation)
        return _exit_code(operation)
    deadline = time.monotonic() + args.wait_timeout
    shown = ""
    tty = sys.stderr.isatty()
    while operation.state == "running" and time.monotonic() < deadline:
        line = f"{operation.id}: {operation.progress * 100:5.1f}% {operation.step}"
        if line != shown:
            if tty:
                sys.stderr.write("\r\033[K" + line[:200])
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()
            shown = line
        time.sleep(wait_poll_s)
        operation = admin_call(args, "GetOperation", pb.GetOperationRequest(id=operation.id))
    if tty and shown:
        sys.stderr.write("\n")
    _print_operation(args, operation)
    if operation.state == "running":
        print(
            f"spate: still running after {args.wait_timeout:g} s; watch it with "
            f"`spate operation wait {operation.id}`",
            file=sys.stderr,
        )
        return EXIT_STILL_RUNNING
    return _exit_code(operation)


def _exit_code(operation: Any) -> int:
    from spate.cli.main import EXIT_CODES, EXIT_FAILURE

    if operation.state != "failed":
        return 0
    try:
        return EXIT_CODES.get(ErrorCode(operation.error_code), EXIT_FAILURE)
    except ValueError:
        return EXIT_FAILURE


def _operation_json(operation: Any) -> dict[str, Any]:
    return {
        "id": operation.id,
        "kind": operation.kind,
        "target": operation.target,
        "state": operation.state,
        "step": operation.step,
        "progress": round(operation.progress, 4),
        "error": operation.error or None,
        "error_code": operation.error_code or None,
        "started_ms": operation.started_ms,
        "finished_ms": operation.finished_ms or None,
        "log": list(operation.log),
    }


def _print_operation(args: argparse.Namespace, operation: Any) -> None:
    document = _operation_json(operation)
    if args.output == "json":
        print(output.render_json(document))
        return
    print(
        output.render_fields(
            [
                ("operation", operation.id),
                ("kind", operation.kind),
                ("target", operation.target),
                ("state", operation.state),
                ("progress", f"{operation.progress * 100:.0f}%"),
                ("step", operation.step),
            ]
            + ([("error", operation.error)] if operation.error else [])
        )
    )
    if operation.state != "running" and operation.log:
        print("\nsteps:")
        for step in operation.log:
            print(f"  {step}")


def _partition_json(p: Any) -> dict[str, Any]:
    return {
        "stream": p.stream,
        "partition": p.partition,
        "replicas": list(p.replicas),
        "learners": list(p.learners),
        "leader": p.leader or None,
        "leader_epoch": p.leader_epoch if p.HasField("leader_epoch") else None,
        "states": [
            {
                "node": s.node,
                "available": s.available,
                **(
                    {
                        "role": s.role,
                        "term": s.term,
                        "leader": s.leader or None,
                        "leader_epoch": s.leader_epoch,
                        "commit_index": s.commit_index,
                        "applied_index": s.applied_index,
                        "last_index": s.last_index,
                        "voters": list(s.voters),
                        "learners": list(s.learners),
                        "membership_index": s.membership_index,
                        "transferring_to": s.transferring_to or None,
                        "progress": [
                            {"node": g.node, "match_index": g.match_index, "lag": g.lag}
                            for g in s.progress
                        ],
                    }
                    if s.available
                    else {"unavailable_reason": s.unavailable_reason}
                ),
            }
            for s in p.states
        ],
    }
