"""Admin subcommands over gRPC: `spate stream create|list|describe|delete`,
`spate superstream create|list|describe|delete`, `spate group create|list|describe|delete`,
`spate partition list`, `spate consumer list|offset`, `spate producer list`,
`spate cluster status`.

Where the admin API is (first that applies): `--admin HOST:PORT`; the SPATE_ADMIN environment
variable; the "admin" field of <data dir>/endpoints.json, written by `spate dev up`, where the data
dir is SPATE_DATA_DIR or ./spate-dev; else 127.0.0.1:7600.

TLS (ADR 0023 addendum): `--tls-ca` (else $SPATE_ADMIN_TLS_CA) verifies the admin API's
certificate; `--tls-cert`/`--tls-key` (else $SPATE_ADMIN_TLS_CERT/_KEY) present a client
certificate where the nodes require one (mTLS). Any of them given: the call is made over TLS.

`--output table` (the default) prints aligned tables for a person; `--output json` prints one JSON
document on stdout whose shape is part of the interface (see README.md in this package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from spate.api.tls import AdminTls, channel, explain, from_environment
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc
from spate.cli import output
from spate.cli.main import EXIT_CODES, EXIT_FAILURE, EXIT_OK, CommandFailed
from spate.core import filtering, groups, limits
from spate.core.errors import ErrorCode, InvalidArgument, Unavailable
from spate.core.ids import StreamName
from spate.core.streams import Retention, StreamConfig, validate_stream_name
from spate.core.superstreams import Routing, define
from spate.core.units import parse_bytes, parse_duration_ms

DEFAULT_ADMIN = "127.0.0.1:7600"
DEFAULT_DATA_DIR = "spate-dev"
ENDPOINTS_FILE = "endpoints.json"
ERROR_CODE_KEY = "spate-error-code"  # the server's trailing metadata key (cluster.admin.errors)
DEFAULT_TIMEOUT_S = 10.0

_ADDRESS = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):\d{1,5}$")

# Registration -----------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument(
        "--admin",
        metavar="HOST:PORT",
        help="admin API address (default: $SPATE_ADMIN, else the admin address in "
        f"$SPATE_DATA_DIR/{ENDPOINTS_FILE} written by `spate dev up` (data dir default "
        f"./{DEFAULT_DATA_DIR}), else {DEFAULT_ADMIN})",
    )
    group.add_argument(
        "--output",
        "-o",
        choices=output.OUTPUT_FORMATS,
        default="table",
        help="table: aligned text for people (default); json: one JSON document on stdout",
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on the call after this long (default {DEFAULT_TIMEOUT_S:g})",
    )
    add_tls_options(group)

    stream = subparsers.add_parser(
        "stream",
        help="create, list, describe and delete streams",
        description="Manage stream definitions, held by the cluster's metadata service.",
    )
    stream_commands = stream.add_subparsers(
        title="stream commands", metavar="ACTION", dest="action", required=True
    )

    create = stream_commands.add_parser(
        "create",
        parents=[common],
        help="define a new stream",
        description="Define a new stream. Each partition is placed on R different live nodes "
        "(spread round robin, preferred leaders rotating) and created there right away. "
        "Sizes take B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB; "
        "durations take ms, s, m, h, d, w. Without any --max-* option the stream "
        "keeps every message forever.",
    )
    create.add_argument(
        "name",
        metavar="NAME",
        help="stream name, also its AMQP address: letters, digits, '.', '_', '-' "
        f"(at most {limits.stream_name_bytes_max} bytes)",
    )
    create.add_argument(
        "--partitions",
        type=int,
        default=1,
        metavar="N",
        help=f"number of partitions, 1-{limits.partitions_max} (default 1)",
    )
    create.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="R",
        help=f"copies of each partition, 1-{limits.replicas_max}, each on a different live node "
        "(default: min(3, registered nodes))",
    )
    _add_storage_options(create)
    create.set_defaults(run=_create)

    listing = stream_commands.add_parser(
        "list",
        parents=[common],
        help="list every stream",
        description="List every stream definition, sorted by name.",
    )
    listing.set_defaults(run=_list)

    describe = stream_commands.add_parser(
        "describe",
        parents=[common],
        help="show one stream and its partitions",
        description="Show a stream's definition and, per partition, its replicas (preferred "
        "leader first), its leader and leader epoch as last reported to the metadata service, "
        "and the offsets, message count and size reported by the node that answers "
        "(partitions it does not serve show '-').",
    )
    describe.add_argument("name", metavar="NAME", help="stream name")
    describe.set_defaults(run=_describe)

    delete = stream_commands.add_parser(
        "delete",
        parents=[common],
        help="delete a stream and its messages",
        description="Delete a stream definition; every node then deletes its partitions and "
        "their messages. This cannot be undone.",
    )
    delete.add_argument("name", metavar="NAME", help="stream name")
    delete.set_defaults(run=_delete)

    _register_super_streams(subparsers, common)
    _register_groups(subparsers, common)

    partition = subparsers.add_parser(
        "partition",
        help="where partitions live and who leads them",
        description="Inspect partition placement and leadership, held by the metadata service.",
    )
    partition_commands = partition.add_subparsers(
        title="partition commands", metavar="ACTION", dest="action", required=True
    )
    partition_list = partition_commands.add_parser(
        "list",
        parents=[common],
        help="replicas, leader and leader epoch of every partition",
        description="List every partition (of STREAM, or of all streams) with its replica set "
        "(preferred leader first), the leader last reported to the metadata service, that "
        "report's leader epoch, and whether the leader's node is alive. A leader shows '-' "
        "until the partition's first election is reported.",
    )
    partition_list.add_argument(
        "stream", metavar="STREAM", nargs="?", help="only this stream (default: every stream)"
    )
    partition_list.set_defaults(run=_partition_list)

    producer = subparsers.add_parser(
        "producer",
        help="deduplicating producers of a stream",
        description="Inspect the producer names whose messages a stream deduplicates "
        "(link property spate:producer-name, docs/amqp.md).",
    )
    producer_commands = producer.add_subparsers(
        title="producer commands", metavar="ACTION", dest="action", required=True
    )
    producer_list = producer_commands.add_parser(
        "list",
        parents=[common],
        help="last publishing id of every producer name",
        description="List, per partition of STREAM, every producer name with its last stored "
        "publishing id (what a restarted producer resumes after), the offset of its last "
        "stored message and when it was stored, as the answering node's replicas hold them: "
        "a partition it does not host is listed as not here. A partition remembers at most "
        f"{limits.producer_names_max} names; past that the name written least recently is "
        "forgotten.",
    )
    producer_list.add_argument("stream", metavar="STREAM", help="the stream")
    producer_list.set_defaults(run=_producer_list)

    consumer = subparsers.add_parser(
        "consumer",
        help="stored offsets of named consumers",
        description="Inspect and reset the offsets a stream stores for named consumers "
        "(link property spate:consumer-name, docs/amqp.md).",
    )
    consumer_commands = consumer.add_subparsers(
        title="consumer commands", metavar="ACTION", dest="action", required=True
    )
    consumer_list = consumer_commands.add_parser(
        "list",
        parents=[common],
        help="stored offset of every consumer name",
        description="List, per partition of STREAM, every consumer name with its stored "
        "offset (the last message it is done with; it resumes at the next), when it was "
        "stored and how many of its links are attached at the answering node (counted where "
        "the partition is led) — of those, how many form its single-active-consumer group, "
        "one of which receives — as the answering node's replicas hold them. Names starting "
        "with '$' belong to consumer groups and are not listed (`spate group describe`). A "
        f"partition remembers at most {limits.consumer_names_max} names; past that the name "
        "stored least recently is forgotten.",
    )
    consumer_list.add_argument("stream", metavar="STREAM", help="the stream")
    consumer_list.set_defaults(run=_consumer_list)
    consumer_offset = consumer_commands.add_parser(
        "offset",
        parents=[common],
        help="show or reset one consumer name's offset",
        description="Show NAME's stored offset on each partition of STREAM hosted by the "
        "answering node or, with --set, store OFFSET for it on one partition (at its leader, "
        "reached from any node): the consumer's next link without a start filter begins at "
        "OFFSET + 1 (-1: from the first retained message). Refused with exit 2 past the "
        "partition's last message, and with exit 1 while a link of that name is attached.",
    )
    consumer_offset.add_argument("stream", metavar="STREAM", help="the stream")
    consumer_offset.add_argument("name", metavar="NAME", help="the consumer name")
    consumer_offset.add_argument(
        "--set", dest="offset", type=int, metavar="OFFSET", help="store this offset (>= -1)"
    )
    consumer_offset.add_argument(
        "--partition", type=int, default=0, help="the partition for --set (default 0)"
    )
    consumer_offset.set_defaults(run=_consumer_offset)

    cluster = subparsers.add_parser(
        "cluster",
        help="cluster-wide status",
        description="Inspect the cluster as the node behind the admin address sees it.",
    )
    cluster_commands = cluster.add_subparsers(
        title="cluster commands", metavar="ACTION", dest="action", required=True
    )
    status = cluster_commands.add_parser(
        "status",
        parents=[common],
        help="metadata leader, voters and processes",
        description="Show the metadata service's Raft state as seen by the answering node "
        "(leader, voters, quorum, commit index), the processes it reports with "
        "their endpoints, and every registered node: its endpoints, whether it is alive "
        "(heartbeat age), whether it votes in the metadata service, and how many partitions "
        "it hosts and leads.",
    )
    status.set_defaults(run=_cluster_status)


# Commands ---------------------------------------------------------------------------------------


def _add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-age",
        metavar="DURATION",
        help="delete whole segments once all their messages are older (e.g. 6h)",
    )
    parser.add_argument(
        "--max-bytes",
        metavar="SIZE",
        help="delete the oldest segments while a partition holds more (e.g. 10GB)",
    )
    parser.add_argument(
        "--max-messages",
        type=int,
        metavar="N",
        help="delete the oldest segments while a partition holds more messages",
    )
    parser.add_argument(
        "--segment-bytes",
        metavar="SIZE",
        help="roll to a new segment file at this size (default 64MiB)",
    )
    parser.add_argument(
        "--filter-size-bytes",
        type=int,
        metavar="N",
        help=(
            "bytes of each chunk's Bloom filter of x-stream-filter-value values, "
            f"{filtering.SIZE_BYTES_MIN}-{filtering.SIZE_BYTES_MAX} (default "
            f"{filtering.SIZE_BYTES_DEFAULT}; more for chunks with many distinct values)"
        ),
    )


def _stream_config_message(args: argparse.Namespace, name: str, partitions: int) -> Any:
    """The StreamConfig message of `--replicas` and the storage options, validated here first
    (the server validates again; this answers before any network call)."""
    segment_bytes = _option(parse_bytes, "--segment-bytes", args.segment_bytes)
    config = StreamConfig(
        name=StreamName(name),
        partitions=partitions,
        replicas=args.replicas if args.replicas is not None else 1,
        segment_bytes=limits.segment_bytes_default if segment_bytes is None else segment_bytes,
        filter_size_bytes=(
            filtering.SIZE_BYTES_DEFAULT
            if args.filter_size_bytes is None
            else args.filter_size_bytes
        ),
        retention=Retention(
            max_age_ms=_option(parse_duration_ms, "--max-age", args.max_age),
            max_bytes=_option(parse_bytes, "--max-bytes", args.max_bytes),
            max_messages=args.max_messages,
        ),
    )
    config.validate()
    message = _config_message(config)
    if args.replicas is None:
        message.ClearField("replicas")
    if args.segment_bytes is None:
        message.ClearField("segment_bytes")
    if args.filter_size_bytes is None:
        message.ClearField("filter_size_bytes")
    return message


def _create(args: argparse.Namespace) -> int:
    message = _stream_config_message(args, args.name, args.partitions)
    response = _call(args, "CreateStream", pb.CreateStreamRequest(stream=message))
    stream = _stream_json(response.stream)
    if args.output == "json":
        _print(output.render_json({"stream": stream}))
    else:
        _print(f"Created stream {stream['name']!r}.\n" + _stream_fields(stream))
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    response = _call(args, "ListStreams", pb.ListStreamsRequest())
    streams = [_stream_json(s) for s in response.streams]
    if args.output == "json":
        _print(output.render_json({"streams": streams}))
    elif not streams:
        _print("No streams. Create one with `spate stream create NAME`.")
    else:
        rows = [
            [
                s["name"],
                str(s["partitions"]),
                str(s["replicas"]),
                output.duration(s["retention"]["max_age_ms"]),
                output.size(s["retention"]["max_bytes"]),
                output.number(s["retention"]["max_messages"]),
                output.size(s["segment_bytes"]),
            ]
            for s in streams
        ]
        _print(
            output.render_table(
                [
                    "NAME",
                    "PARTITIONS",
                    "REPLICAS",
                    "MAX-AGE",
                    "MAX-BYTES",
                    "MAX-MESSAGES",
                    "SEGMENT",
                ],
                rows,
            )
        )
    return EXIT_OK


def _describe(args: argparse.Namespace) -> int:
    validate_stream_name(args.name)
    response = _call(args, "DescribeStream", pb.DescribeStreamRequest(name=args.name))
    stream = _stream_json(response.stream)
    partitions = [_partition_json(p) for p in response.partitions]
    if args.output == "json":
        _print(output.render_json({"stream": stream, "partitions": partitions}))
        return EXIT_OK
    rows = []
    for p in partitions:
        placement = [
            ",".join(p["replicas"]) or output.EMPTY,
            p["leader"] or output.EMPTY,
            output.number(p["leader_epoch"]),
        ]
        if not p["available"]:
            rows.append([str(p["partition"]), *placement] + [output.EMPTY] * 6)
            continue
        rows.append(
            [
                str(p["partition"]),
                *placement,
                output.number(p["first_offset"]),
                output.number(p["last_offset"]),
                str(p["end_offset"]),
                str(p["messages"]),
                output.size(p["bytes"]),
                str(p["segments"]),
            ]
        )
    _print(
        _stream_fields(stream)
        + "\n\n"
        + output.render_table(
            [
                "PARTITION",
                "REPLICAS",
                "LEADER",
                "EPOCH",
                "FIRST",
                "LAST",
                "END",
                "MESSAGES",
                "SIZE",
                "SEGMENTS",
            ],
            rows,
        )
    )
    return EXIT_OK


def _partition_list(args: argparse.Namespace) -> int:
    if args.stream is not None:
        validate_stream_name(args.stream)
    response = _call(args, "ListPartitions", pb.ListPartitionsRequest(stream=args.stream or ""))
    partitions = [
        {
            "stream": p.stream,
            "partition": p.partition,
            "replicas": list(p.replicas),
            "leader": p.leader or None,
            "leader_epoch": p.leader_epoch if p.HasField("leader_epoch") else None,
            "leader_alive": p.leader_alive,
        }
        for p in response.partitions
    ]
    if args.output == "json":
        _print(output.render_json({"partitions": partitions}))
    elif not partitions:
        _print("No partitions. Create a stream with `spate stream create NAME`.")
    else:
        rows = [
            [
                p["stream"],
                str(p["partition"]),
                ",".join(p["replicas"]) or "(every node)",
                _leader_text(p["leader"], p["leader_alive"]),
                output.number(p["leader_epoch"]),
            ]
            for p in partitions
        ]
        _print(output.render_table(["STREAM", "PARTITION", "REPLICAS", "LEADER", "EPOCH"], rows))
    return EXIT_OK


def _producer_list(args: argparse.Namespace) -> int:
    validate_stream_name(args.stream)
    response = _call(args, "ListProducers", pb.ListProducersRequest(stream=args.stream))
    producers = [
        {
            "partition": p.partition,
            "name": p.name,
            "last_publishing_id": p.last_publishing_id,
            "last_offset": p.last_offset,
            "timestamp_ms": p.timestamp_ms,
        }
        for p in response.producers
    ]
    _print_listing(
        args,
        "producers",
        producers,
        list(response.partitions_here),
        ["PARTITION", "PRODUCER", "LAST-PUBLISHING-ID", "LAST-OFFSET", "STORED"],
        lambda p: [
            str(p["partition"]),
            p["name"],
            str(p["last_publishing_id"]),
            str(p["last_offset"]),
            output.timestamp(p["timestamp_ms"]),
        ],
    )
    return EXIT_OK


def _print_listing(  # noqa: PLR0917 - two call sites, every value named there
    args: argparse.Namespace,
    key: str,
    items: list[dict[str, Any]],
    here: list[int],
    headers: list[str],
    row: Callable[[dict[str, Any]], list[str]],
) -> None:
    """A per-partition listing of STREAM as JSON or a table, or say that there is none."""
    if args.output == "json":
        _print(output.render_json({"stream": args.stream, key: items, "partitions_here": here}))
    elif not items:
        _print(f"No {key} on the partitions of {args.stream!r} hosted here {here}.")
    else:
        _print(output.render_table(headers, [row(item) for item in items]))


def _consumers(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[int]]:
    validate_stream_name(args.stream)
    response = _call(args, "ListConsumers", pb.ListConsumersRequest(stream=args.stream))
    consumers = [
        {
            "partition": c.partition,
            "name": c.name,
            "offset": c.offset,
            "timestamp_ms": c.timestamp_ms,
            "attached": c.attached,
            "single_active_group": c.group,
        }
        for c in response.consumers
    ]
    return consumers, list(response.partitions_here)


def _print_consumers(
    args: argparse.Namespace, consumers: list[dict[str, Any]], here: list[int]
) -> None:
    _print_listing(
        args,
        "consumers",
        consumers,
        here,
        ["PARTITION", "CONSUMER", "OFFSET", "STORED", "ATTACHED", "SAC GROUP"],
        lambda c: [
            str(c["partition"]),
            c["name"],
            str(c["offset"]),
            output.timestamp(c["timestamp_ms"]),
            str(c["attached"]),
            str(c["single_active_group"] or "-"),
        ],
    )


def _consumer_list(args: argparse.Namespace) -> int:
    consumers, here = _consumers(args)
    _print_consumers(args, consumers, here)
    return EXIT_OK


def _consumer_offset(args: argparse.Namespace) -> int:
    if args.offset is not None:
        validate_stream_name(args.stream)
        request = pb.SetConsumerOffsetRequest(
            stream=args.stream, name=args.name, partition=args.partition, offset=args.offset
        )
        _call(args, "SetConsumerOffset", request)
        if args.output == "json":
            _print(
                output.render_json(
                    {
                        "stream": args.stream,
                        "name": args.name,
                        "partition": args.partition,
                        "offset": args.offset,
                    }
                )
            )
        else:
            _print(
                f"Stored offset {args.offset} for consumer {args.name!r} on partition "
                f"{args.partition} of {args.stream!r}: it resumes at {args.offset + 1}."
            )
        return EXIT_OK
    consumers, here = _consumers(args)
    _print_consumers(args, [c for c in consumers if c["name"] == args.name], here)
    return EXIT_OK


def _leader_text(leader: str | None, alive: bool) -> str:
    if leader is None:
        return output.EMPTY
    return leader if alive else f"{leader} (down)"


def _delete(args: argparse.Namespace) -> int:
    validate_stream_name(args.name)
    _call(args, "DeleteStream", pb.DeleteStreamRequest(name=args.name))
    if args.output == "json":
        _print(output.render_json({"deleted": args.name}))
    else:
        _print(f"Deleted stream {args.name!r}.")
    return EXIT_OK


# Super streams ----------------------------------------------------------------------------------


def _register_super_streams(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    superstream = subparsers.add_parser(
        "superstream",
        help="create, list, describe and delete super streams",
        description="Manage super streams (004 'Super Streams', ADR 0014): a name over "
        "partition streams; a message sent to the super stream's address goes to one "
        "partition, chosen by the broker from its routing key.",
    )
    commands = superstream.add_subparsers(
        title="superstream commands", metavar="ACTION", dest="action", required=True
    )
    create = commands.add_parser(
        "create",
        parents=[common],
        help="define a super stream and create its partition streams",
        description="Create a super stream and its partition streams in one metadata command: "
        "--partitions N makes NAME-0 .. NAME-(N-1) (hash routing: 32-bit MurmurHash3 of the "
        "routing key modulo N, as RabbitMQ's stream clients); --binding-keys K1,K2 makes "
        "NAME-K1, NAME-K2 (key routing: the stream whose key is the routing key). Each "
        "partition stream has one partition and the --replicas and storage options given.",
    )
    create.add_argument("name", metavar="NAME", help="super stream name, its AMQP address")
    kind = create.add_mutually_exclusive_group(required=True)
    kind.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help=f"number of partition streams, 1-{limits.super_stream_partitions_max}",
    )
    kind.add_argument(
        "--binding-keys",
        metavar="K1,K2,...",
        help="comma-separated binding keys, one partition stream each",
    )
    create.add_argument(
        "--routing",
        choices=[r.value for r in Routing],
        default=None,
        help="how a message's routing key picks its partition (default: hash with "
        "--partitions, key with --binding-keys)",
    )
    create.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="R",
        help="copies of each partition stream (default: min(3, registered nodes))",
    )
    _add_storage_options(create)
    create.set_defaults(run=_super_create)

    listing = commands.add_parser(
        "list",
        parents=[common],
        help="list every super stream",
        description="List every super stream with its partition streams, sorted by name.",
    )
    listing.set_defaults(run=_super_list)
    describe = commands.add_parser(
        "describe",
        parents=[common],
        help="show one super stream and its partition streams",
        description="Show a super stream's topology and, per partition stream, its binding "
        "key, replicas, leader and the figures the answering node has.",
    )
    describe.add_argument("name", metavar="NAME", help="super stream name")
    describe.set_defaults(run=_super_describe)
    delete = commands.add_parser(
        "delete",
        parents=[common],
        help="delete a super stream and its partition streams",
        description="Delete a super stream and its partition streams with their messages, "
        "in one metadata command. This cannot be undone.",
    )
    delete.add_argument("name", metavar="NAME", help="super stream name")
    delete.set_defaults(run=_super_delete)


def _super_create(args: argparse.Namespace) -> int:
    keys = None
    if args.binding_keys is not None:
        keys = tuple(k.strip() for k in args.binding_keys.split(","))
    routing = None if args.routing is None else Routing(args.routing)
    try:
        define(args.name, partitions=args.partitions, binding_keys=keys, routing=routing)
    except InvalidArgument as error:
        message = error.message
        if message.startswith(("partitions", "binding-keys")):
            message = "--" + message  # name the flag
        raise InvalidArgument(message) from None
    template = _stream_config_message(args, args.name, 1)
    template.ClearField("partitions")
    request = pb.CreateSuperStreamRequest(
        name=args.name,
        partitions=args.partitions,
        binding_keys=keys or (),
        routing=args.routing or "",
        stream=template,
    )
    response = _call(args, "CreateSuperStream", request)
    topology = _super_json(response.super_stream)
    if args.output == "json":
        _print(output.render_json({"super_stream": topology}))
    else:
        _print(
            f"Created super stream {topology['name']!r} with "
            f"{len(topology['partitions'])} partition streams.\n" + _super_fields(topology)
        )
    return EXIT_OK


def _super_list(args: argparse.Namespace) -> int:
    response = _call(args, "ListSuperStreams", pb.ListSuperStreamsRequest())
    topologies = [_super_json(t) for t in response.super_streams]
    if args.output == "json":
        _print(output.render_json({"super_streams": topologies}))
    elif not topologies:
        _print("No super streams. Create one with `spate superstream create NAME --partitions N`.")
    else:
        rows = [
            [t["name"], t["routing"], str(len(t["partitions"])), ",".join(t["partitions"])]
            for t in topologies
        ]
        _print(output.render_table(["NAME", "ROUTING", "PARTITIONS", "STREAMS"], rows))
    return EXIT_OK


def _super_describe(args: argparse.Namespace) -> int:
    validate_stream_name(args.name)
    response = _call(args, "DescribeSuperStream", pb.DescribeSuperStreamRequest(name=args.name))
    topology = _super_json(response.super_stream)
    stream = _stream_json(response.stream)
    partitions = [
        {"stream": p.stream, "binding_key": p.binding_key, **_partition_json(p.stats)}
        for p in response.partitions
    ]
    if args.output == "json":
        _print(
            output.render_json(
                {"super_stream": topology, "stream": stream, "partitions": partitions}
            )
        )
        return EXIT_OK
    rows = []
    for index, p in enumerate(partitions):
        rows.append(
            [
                str(index),
                p["stream"],
                p["binding_key"],
                ",".join(p["replicas"]) or output.EMPTY,
                p["leader"] or output.EMPTY,
                output.number(p["last_offset"]) if p["available"] else output.EMPTY,
                str(p["messages"]) if p["available"] else output.EMPTY,
            ]
        )
    _print(
        _super_fields(topology)
        + "\n"
        + output.render_fields(
            [
                ("replicas", str(stream["replicas"])),
                ("retention", output.retention_text(stream["retention"])),
                ("segment size", output.size(stream["segment_bytes"])),
            ]
        )
        + "\n\n"
        + output.render_table(
            ["PARTITION", "STREAM", "KEY", "REPLICAS", "LEADER", "LAST", "MESSAGES"], rows
        )
    )
    return EXIT_OK


def _super_delete(args: argparse.Namespace) -> int:
    validate_stream_name(args.name)
    _call(args, "DeleteSuperStream", pb.DeleteSuperStreamRequest(name=args.name))
    if args.output == "json":
        _print(output.render_json({"deleted": args.name}))
    else:
        _print(f"Deleted super stream {args.name!r} and its partition streams.")
    return EXIT_OK


def _super_json(message: Any) -> dict[str, Any]:
    return {
        "name": message.name,
        "partitions": list(message.partitions),
        "binding_keys": list(message.binding_keys),
        "routing": message.routing,
        "version": message.version,
    }


def _super_fields(topology: dict[str, Any]) -> str:
    return output.render_fields(
        [
            ("super stream", topology["name"]),
            ("routing", topology["routing"]),
            ("partitions", ", ".join(topology["partitions"])),
            ("binding keys", ", ".join(topology["binding_keys"])),
            ("version", str(topology["version"])),
        ]
    )


# Consumer groups (ADR 0015) ---------------------------------------------------------------------


def _register_groups(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    group = subparsers.add_parser(
        "group",
        help="define, list, describe and delete consumer groups",
        description="Manage consumer groups (000 §4.5, 003, ADR 0015). A group exists once "
        "links attach with event-streams-consumer-group, or once defined here ahead of them "
        "(with `spate node run --require-defined-groups`, only defined groups may attach). "
        "A group's committed offsets live in the stream's partitions, under the consumer "
        "name '$group/GROUP'.",
    )
    commands = group.add_subparsers(
        title="group commands", metavar="ACTION", dest="action", required=True
    )
    create = commands.add_parser(
        "create",
        parents=[common],
        help="define a consumer group on a stream",
        description="Define consumer group GROUP on STREAM in the metadata service, with how "
        "its coordinator assigns partitions to members. Refused with exit 3 when STREAM does "
        "not exist and exit 4 when GROUP is defined on it already.",
    )
    create.add_argument("stream", metavar="STREAM", help="the stream")
    create.add_argument(
        "name",
        metavar="GROUP",
        help=f"group name: UTF-8, at most {limits.group_name_bytes_max} bytes, not starting "
        "with '$'",
    )
    create.add_argument(
        "--strategy",
        choices=[s.value for s in groups.Strategy],
        default=None,
        help=f"how partitions are assigned to members (default {groups.STRATEGY_DEFAULT.value})",
    )
    create.add_argument(
        "--session-timeout-ms",
        type=int,
        metavar="N",
        help="a member silent this long leaves the group, "
        f"{limits.group_session_timeout_ms_min}-{limits.group_session_timeout_ms_max} "
        f"(default {limits.group_session_timeout_ms_default})",
    )
    create.add_argument(
        "--rebalance-delay-ms",
        type=int,
        metavar="N",
        help="wait this long for more members before the first assignment, "
        f"0-{limits.group_rebalance_delay_ms_max} "
        f"(default {limits.group_rebalance_delay_ms_default})",
    )
    create.add_argument(
        "--pending-max",
        type=int,
        metavar="N",
        help="members beyond the partition count kept waiting for a partition before the next "
        f"attach is refused (amqp:link:detach-forced), 0-{limits.group_pending_max_max} "
        f"(default {limits.group_pending_max_default})",
    )
    create.set_defaults(run=_group_create)

    listing = commands.add_parser(
        "list",
        parents=[common],
        help="list the consumer groups of a stream",
        description="List every consumer group of STREAM — defined, or seen because a "
        "partition stores a committed offset (or partition 0 a generation) for it — with its "
        "strategy; its coordinator's state (Stable, Rebalancing, or Empty: no members now), "
        "member count and generation; how many of its partition owners are attached and its "
        "total lag, as the answering node's replicas hold them (like `spate consumer list`: "
        "partitions it does not host count for nothing). When the coordinator (at the leader "
        "of partition 0) cannot be reached the rest is shown, with the reason.",
    )
    listing.add_argument("stream", metavar="STREAM", help="the stream")
    listing.set_defaults(run=_group_list)

    describe = commands.add_parser(
        "describe",
        parents=[common],
        help="show one consumer group and its partitions",
        description="Show GROUP's definition (or that it is not defined) and, per partition "
        "of STREAM: whether its owner is attached, the owner epoch, the committed offset (the "
        "last message the group is done with), the end offset and the lag (messages after "
        "the committed offset; all retained ones when nothing is committed), as the answering "
        "node's replicas hold them ('-' for partitions it does not host), and the member "
        "holding it; then the coordinator's state, generation and members (partitions held "
        "and being released, heartbeat age, session timeout). When the coordinator cannot be "
        "reached the rest is shown, with the reason. Exit 3 when GROUP is neither defined, "
        "seen, nor known to its coordinator.",
    )
    describe.add_argument("stream", metavar="STREAM", help="the stream")
    describe.add_argument("name", metavar="GROUP", help="the group")
    describe.set_defaults(run=_group_describe)

    delete = commands.add_parser(
        "delete",
        parents=[common],
        help="forget a consumer group's definition",
        description="Delete GROUP's definition on STREAM. Its committed offsets and epochs "
        "stay in the partitions (attaching again resumes after them). Exit 3 when GROUP is "
        "not defined on STREAM.",
    )
    delete.add_argument("stream", metavar="STREAM", help="the stream")
    delete.add_argument("name", metavar="GROUP", help="the group")
    delete.set_defaults(run=_group_delete)


def _group_create(args: argparse.Namespace) -> int:
    try:
        groups.define(
            args.stream,
            args.name,
            strategy=args.strategy,
            session_timeout_ms=args.session_timeout_ms,
            rebalance_delay_ms=args.rebalance_delay_ms,
            pending_max=args.pending_max,
        )
    except InvalidArgument as error:
        message = error.message
        if message.startswith(("session-timeout-ms", "rebalance-delay-ms", "pending-max")):
            message = "--" + message  # name the flag
        raise InvalidArgument(message) from None
    request = pb.CreateConsumerGroupRequest(
        stream=args.stream,
        name=args.name,
        strategy=args.strategy or "",
        session_timeout_ms=args.session_timeout_ms,
        rebalance_delay_ms=args.rebalance_delay_ms,
        pending_max=args.pending_max,
    )
    definition = _group_json(_call(args, "CreateConsumerGroup", request).group)
    if args.output == "json":
        _print(output.render_json({"group": definition}))
    else:
        _print(
            f"Defined consumer group {definition['name']!r} on stream "
            f"{definition['stream']!r}.\n" + _group_fields(definition)
        )
    return EXIT_OK


def _group_list(args: argparse.Namespace) -> int:
    validate_stream_name(args.stream)
    response = _call(args, "ListConsumerGroups", pb.ListConsumerGroupsRequest(stream=args.stream))
    found = [
        {
            "name": g.name,
            "defined": g.HasField("definition"),
            "definition": _group_json(g.definition) if g.HasField("definition") else None,
            "links_attached": g.links_attached,
            "lag": g.lag,
            "state": g.state or None,
            "generation": g.generation if g.HasField("generation") else None,
            "members": g.members,
            "coordinator_unavailable": g.coordinator_unavailable or None,
        }
        for g in response.groups
    ]
    here = list(response.partitions_here)
    if args.output == "json":
        _print(
            output.render_json({"stream": args.stream, "groups": found, "partitions_here": here})
        )
    elif not found:
        _print(
            f"No consumer groups on {args.stream!r} (none defined, none with a committed "
            f"offset on the partitions hosted here {here}). Define one with "
            f"`spate group create {args.stream} GROUP`."
        )
    else:
        rows = [
            [
                g["name"],
                g["definition"]["strategy"] if g["defined"] else "not defined",
                g["state"] or "unknown",
                str(g["members"]) if g["state"] else output.EMPTY,
                output.number(g["generation"]),
                str(g["links_attached"]),
                str(g["lag"]),
            ]
            for g in found
        ]
        headers = ["GROUP", "STRATEGY", "STATE", "MEMBERS", "GENERATION", "ATTACHED", "LAG"]
        notes = sorted({g["coordinator_unavailable"] for g in found} - {None})
        _print(
            "\n".join(
                [output.render_table(headers, rows)]
                + [f"The coordinator could not be asked: {why}" for why in notes]
            )
        )
    return EXIT_OK


def _group_describe(args: argparse.Namespace) -> int:
    validate_stream_name(args.stream)
    request = pb.DescribeConsumerGroupRequest(stream=args.stream, name=args.name)
    response = _call(args, "DescribeConsumerGroup", request)
    definition = _group_json(response.definition) if response.HasField("definition") else None
    partitions = [
        {
            "partition": p.partition,
            "available": p.available,
            "owner_attached": p.owner_attached,
            "epoch": p.epoch if p.HasField("epoch") else None,
            "committed_offset": p.committed_offset if p.HasField("committed_offset") else None,
            "end_offset": p.end_offset if p.available else None,
            "lag": p.lag if p.available else None,
            "member": p.member if p.HasField("member") else None,
        }
        for p in response.partitions
    ]
    members: list[dict[str, Any]] = [
        {
            "member": m.member,
            "partitions": list(m.partitions),
            "releasing": list(m.releasing),
            "heartbeat_age_ms": m.heartbeat_age_ms,
            "session_timeout_ms": m.session_timeout_ms,
        }
        for m in response.members
    ]
    state = response.state or None
    generation = response.generation if response.HasField("generation") else None
    unavailable = response.coordinator_unavailable or None
    if args.output == "json":
        _print(
            output.render_json(
                {
                    "stream": response.stream,
                    "name": response.name,
                    "defined": definition is not None,
                    "definition": definition,
                    "state": state,
                    "generation": generation,
                    "members": members,
                    "coordinator_unavailable": unavailable,
                    "partitions": partitions,
                    "links_attached": response.links_attached,
                    "lag": response.lag,
                    "partitions_here": list(response.partitions_here),
                }
            )
        )
        return EXIT_OK
    fields = (
        _group_fields(definition)
        if definition is not None
        else output.render_fields(
            [("group", response.name), ("stream", response.stream), ("definition", "not defined")]
        )
    )
    coordinator = output.render_fields(
        [
            ("state", state or f"unknown: the coordinator could not be asked ({unavailable})"),
            ("generation", output.number(generation)),
            ("members", str(len(members)) if state else output.EMPTY),
        ]
    )
    member_rows = [
        [
            str(m["member"]),
            _partitions_text(m["partitions"]),
            _partitions_text(m["releasing"]),
            output.duration(m["heartbeat_age_ms"]),
            output.duration(m["session_timeout_ms"]),
        ]
        for m in members
    ]
    member_table = output.render_table(
        ["MEMBER", "PARTITIONS", "RELEASING", "HEARTBEAT AGO", "SESSION TIMEOUT"], member_rows
    )
    rows = [
        [
            str(p["partition"]),
            ("yes" if p["owner_attached"] else "no") if p["available"] else output.EMPTY,
            output.number(p["epoch"]),
            output.number(p["committed_offset"]),
            output.number(p["end_offset"]),
            output.number(p["lag"]),
            output.number(p["member"]),
        ]
        for p in partitions
    ]
    totals = output.render_fields(
        [
            ("owners attached", f"{response.links_attached} of {len(partitions)}"),
            ("total lag", str(response.lag)),
        ]
    )
    table = output.render_table(
        ["PARTITION", "OWNER", "EPOCH", "COMMITTED", "END", "LAG", "MEMBER"], rows
    )
    blocks = [fields, coordinator] + ([member_table] if members else []) + [table, totals]
    _print("\n\n".join(blocks))
    return EXIT_OK


def _partitions_text(partitions: list[int]) -> str:
    return ",".join(map(str, partitions)) or output.EMPTY


def _group_delete(args: argparse.Namespace) -> int:
    validate_stream_name(args.stream)
    request = pb.DeleteConsumerGroupRequest(stream=args.stream, name=args.name)
    _call(args, "DeleteConsumerGroup", request)
    if args.output == "json":
        _print(output.render_json({"deleted": {"stream": args.stream, "name": args.name}}))
    else:
        _print(f"Deleted the definition of consumer group {args.name!r} on {args.stream!r}.")
    return EXIT_OK


def _group_json(message: Any) -> dict[str, Any]:
    return {
        "stream": message.stream,
        "name": message.name,
        "strategy": message.strategy,
        "session_timeout_ms": message.session_timeout_ms,
        "rebalance_delay_ms": message.rebalance_delay_ms,
        "pending_max": message.pending_max,
        "version": message.version,
    }


def _group_fields(group: dict[str, Any]) -> str:
    return output.render_fields(
        [
            ("group", group["name"]),
            ("stream", group["stream"]),
            ("strategy", group["strategy"]),
            ("session timeout", output.duration(group["session_timeout_ms"])),
            ("rebalance delay", output.duration(group["rebalance_delay_ms"])),
            ("pending max", str(group["pending_max"])),
            ("version", str(group["version"])),
        ]
    )


def _cluster_status(args: argparse.Namespace) -> int:
    response = _call(args, "ClusterStatus", pb.ClusterStatusRequest())
    m = response.metadata
    metadata = {
        "node_id": m.node_id,
        "self_address": m.self_address,
        "voters": list(m.voters),
        "leader": m.leader or None,
        "is_leader": m.is_leader,
        "ready": m.ready,
        "has_quorum": m.has_quorum,
        "connected_peers": list(m.connected_peers),
        "term": m.term,
        "commit_index": m.commit_index,
        "last_applied": m.last_applied,
        "version": m.version,
        "streams": m.streams,
        "nodes": m.nodes,
    }
    processes = [
        {
            "node_id": p.node_id,
            "role": p.role,
            "pid": p.pid,
            "endpoints": {e.name: e.address for e in p.endpoints},
            "partitions": p.partitions,
            "streams": p.streams,
        }
        for p in response.processes
    ]
    nodes = [
        {
            "node_id": n.node_id,
            "endpoints": {
                name: address
                for name, address in (
                    ("amqp", n.amqp),
                    ("admin", n.admin),
                    ("replication", n.replication),
                    ("metadata", n.metadata),
                )
                if address
            },
            "alive": n.alive,
            "heartbeat_ms": n.heartbeat_ms,
            "heartbeat_age_ms": n.heartbeat_age_ms,
            "partitions_hosted": n.partitions_hosted,
            "partitions_led": n.partitions_led,
            "metadata_voter": n.metadata_voter,
            "failure_domain": n.failure_domain or n.node_id,
        }
        for n in response.nodes
    ]
    if args.output == "json":
        _print(output.render_json({"metadata": metadata, "processes": processes, "nodes": nodes}))
        return EXIT_OK
    connected = set(m.connected_peers) | {m.self_address}
    voters = ", ".join(f"{v}{'' if v in connected else ' (unreachable)'}" for v in m.voters)
    blocks = [
        output.render_fields(
            [
                ("metadata leader", m.leader or "none (election in progress or no quorum)"),
                (
                    "answered by",
                    f"{m.node_id} ({m.self_address}, {'leader' if m.is_leader else 'follower'})",
                ),
                ("voters", voters),
                ("quorum", "yes" if m.has_quorum else "no"),
                ("ready", "yes" if m.ready else "no (not caught up with a leader yet)"),
                ("term", str(m.term)),
                ("commit index", f"{m.commit_index} (applied {m.last_applied})"),
                ("streams", str(m.streams)),
            ]
        )
    ]
    if processes:
        blocks.append(
            output.render_table(
                ["NODE", "ROLE", "PID", "PARTITIONS", "ENDPOINTS"],
                [
                    [
                        p["node_id"],
                        p["role"],
                        str(p["pid"]),
                        str(p["partitions"]),
                        " ".join(f"{k}={v}" for k, v in p["endpoints"].items()) or output.EMPTY,
                    ]
                    for p in processes
                ],
            )
        )
    if nodes:
        blocks.append(
            output.render_table(
                ["REGISTERED NODE", "DOMAIN", "METADATA", "ALIVE", "HOSTS", "LEADS", "ENDPOINTS"],
                [
                    [
                        n["node_id"],
                        n["failure_domain"],
                        "voter" if n["metadata_voter"] else "non-voting",
                        output.liveness(n["alive"], n["heartbeat_age_ms"]),
                        str(n["partitions_hosted"]),
                        str(n["partitions_led"]),
                        " ".join(f"{k}={v}" for k, v in n["endpoints"].items()),
                    ]
                    for n in nodes
                ],
            )
        )
    else:
        blocks.append("No registered nodes: nodes register themselves when they start.")
    _print("\n\n".join(blocks))
    return EXIT_OK


# Admin address and calls ------------------------------------------------------------------------


def resolve_admin(flag: str | None, environ: dict[str, str] | None = None) -> str:
    """The admin address by the precedence in this module's docstring."""
    env = dict(os.environ) if environ is None else environ
    if flag:
        return _checked_address(flag, "--admin")
    if env.get("SPATE_ADMIN"):
        return _checked_address(env["SPATE_ADMIN"], "SPATE_ADMIN")
    path = Path(env.get("SPATE_DATA_DIR") or DEFAULT_DATA_DIR) / ENDPOINTS_FILE
    try:
        endpoints = json.loads(path.read_text())
    except FileNotFoundError:
        return DEFAULT_ADMIN
    except (OSError, ValueError) as error:
        raise InvalidArgument(f"cannot read {path}: {error}; pass --admin HOST:PORT") from error
    admin = endpoints.get("admin") if isinstance(endpoints, dict) else None
    if not isinstance(admin, str):
        raise InvalidArgument(f'{path} has no "admin" address; pass --admin HOST:PORT')
    return _checked_address(admin, str(path))


def add_tls_options(group: Any) -> None:
    """--tls-ca, --tls-cert, --tls-key in a command's connection group (spate.api.tls)."""
    group.add_argument(
        "--tls-ca",
        type=Path,
        metavar="PEM",
        help="call the admin API over TLS, verifying its certificate with this CA bundle "
        "(default: $SPATE_ADMIN_TLS_CA)",
    )
    group.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="client certificate for nodes requiring one (mutual TLS; its common name is the "
        "user when no $SPATE_ADMIN_TOKEN is set; default: $SPATE_ADMIN_TLS_CERT)",
    )
    group.add_argument(
        "--tls-key",
        type=Path,
        metavar="PEM",
        help="private key of --tls-cert (default: $SPATE_ADMIN_TLS_KEY)",
    )


def admin_tls(args: argparse.Namespace) -> AdminTls | None:
    """The TLS settings of a command (flags, then environment); None: plaintext."""
    return from_environment(
        getattr(args, "tls_ca", None),
        getattr(args, "tls_cert", None),
        getattr(args, "tls_key", None),
    )


def _checked_address(address: str, source: str) -> str:
    if not _ADDRESS.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise InvalidArgument(f"{source}: expected HOST:PORT, got {address!r}")
    return address


def _call(args: argparse.Namespace, method: str, request: Any) -> Any:

    address = resolve_admin(args.admin)
    if args.timeout <= 0:
        raise InvalidArgument(f"--timeout must be positive, got {args.timeout:g}")
    token = os.environ.get("SPATE_ADMIN_TOKEN")  # ADR 0023: nodes may require one
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    tls = admin_tls(args)
    with channel(address, tls) as opened:
        stub = admin_pb2_grpc.AdminStub(opened)
        try:
            return getattr(stub, method)(request, timeout=args.timeout, metadata=metadata)
        except grpc.RpcError as error:
            raise _failure(error, address, args.timeout, tls) from None


def _failure(
    error: Any, address: str, timeout_s: float, tls: AdminTls | None = None
) -> CommandFailed:

    details = error.details() or error.code().name
    spate_code = dict(error.trailing_metadata() or ()).get(ERROR_CODE_KEY)
    if spate_code is not None:
        try:
            code = ErrorCode(spate_code)
        except ValueError:
            return CommandFailed(details)
        return CommandFailed(details, EXIT_CODES.get(code, EXIT_FAILURE))
    unavailable = EXIT_CODES[Unavailable.code]
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        why = explain(details, address, tls)
        if why is not None:
            return CommandFailed(why, unavailable)
        return CommandFailed(
            f"cannot reach the admin API at {address} ({details}). Is a cluster running? Start "
            "one with `spate dev up`, or point --admin (or SPATE_ADMIN) at a node's admin "
            "address.",
            unavailable,
        )
    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CommandFailed(
            f"the admin API at {address} did not answer within {timeout_s:g} s (--timeout)",
            unavailable,
        )
    return CommandFailed(f"the admin API at {address} failed: {error.code().name}: {details}")


# Conversions ------------------------------------------------------------------------------------


def _option(parse: Callable[[str], int], flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse(text)
    except InvalidArgument as error:
        raise InvalidArgument(f"{flag}: {error.message}") from None


def _config_message(config: StreamConfig) -> Any:
    r = config.retention
    return pb.StreamConfig(
        name=config.name,
        partitions=config.partitions,
        replicas=config.replicas,
        segment_bytes=config.segment_bytes,
        filter_size_bytes=config.filter_size_bytes,
        retention=pb.Retention(
            max_age_ms=r.max_age_ms, max_bytes=r.max_bytes, max_messages=r.max_messages
        ),
    )


def _stream_json(message: Any) -> dict[str, Any]:
    r = message.retention
    return {
        "name": message.name,
        "partitions": message.partitions,
        "replicas": message.replicas,
        "retention": {
            "max_age_ms": r.max_age_ms if r.HasField("max_age_ms") else None,
            "max_bytes": r.max_bytes if r.HasField("max_bytes") else None,
            "max_messages": r.max_messages if r.HasField("max_messages") else None,
        },
        "segment_bytes": message.segment_bytes,
        "filter_size_bytes": message.filter_size_bytes or filtering.SIZE_BYTES_DEFAULT,
    }


def _partition_json(message: Any) -> dict[str, Any]:
    def optional(field: str) -> int | None:
        return getattr(message, field) if message.HasField(field) else None

    return {
        "partition": message.partition,
        "available": message.available,
        "replicas": list(message.replicas),
        "leader": message.leader or None,
        "leader_epoch": optional("leader_epoch"),
        "first_offset": optional("first_offset"),
        "last_offset": optional("last_offset"),
        "end_offset": message.end_offset if message.available else None,
        "messages": message.messages if message.available else None,
        "bytes": message.bytes if message.available else None,
        "segments": message.segments if message.available else None,
        "first_timestamp_ms": optional("first_timestamp_ms"),
        "last_timestamp_ms": optional("last_timestamp_ms"),
    }


def _stream_fields(stream: dict[str, Any]) -> str:
    return output.render_fields(
        [
            ("stream", stream["name"]),
            ("partitions", str(stream["partitions"])),
            ("replicas", str(stream["replicas"])),
            ("retention", output.retention_text(stream["retention"])),
            ("segment size", output.size(stream["segment_bytes"])),
            ("filter size", f"{stream['filter_size_bytes']} bytes per chunk"),
        ]
    )


def _print(text: str) -> None:
    print(text)
