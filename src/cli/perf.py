"""`spate perf`: the performance tool (spate.perf), RabbitMQ stream-perf-test's options where
they make sense for AMQP 1.0."""

from __future__ import annotations

import argparse

from spate.cli.admin import resolve_admin
from spate.cli.main import CommandFailed
from spate.core.errors import InvalidArgument
from spate.core.units import parse_bytes, parse_duration_ms

_DESCRIPTION = """\
Publish to and consume from streams, printing published, confirmed and consumed msg/s and the
publish-to-consume latency (min/p50/p75/p95/p99, from the publish time carried in the first
8 bytes of each body) once a second, then a summary with perf's own CPU per message.
Streams are created first through the admin API (--admin; streams that exist are used as they
are). Producers and consumers run in worker processes of their own (--processes of each)."""

_EPILOG = """\
examples:
  spate perf --url amqp://127.0.0.1:5672 --producers 1 --consumers 1 --size 100 --count 100000
  spate perf --url amqp://127.0.0.1:5672 --producers 2 --consumers 2 --size 1024 --time 30 \\
      --rate 5000 --stream-count 2 --stream perf-%d --delete-streams
  spate perf --url amqp://n1:5672 --url amqp://n2:5672 --producers 2 --consumers 2 \\
      --count 200000 --super-stream invoices --super-stream-partitions 3 --processes 2
  spate perf --url amqps://gw:5671 --ca-file ca.pem --user app --password s3cret ...

--output json: the last line of stdout is one JSON object: published_per_s, confirmed_per_s,
consumed_per_s, latency_ms {min, p50, p75, p95, p99, max}, published, confirmed, failed,
consumed, expected_consumed, cpu_us_per_published, cpu_us_per_consumed, load_average, errors,
interrupted (docs/cli.md lists them all); the live lines go to stderr.

exit codes: 0 every message confirmed and consumed, 1 the run completed with errors (listed),
2 invalid argument, 5 nothing listening at a URL or the admin API, or a client could not
attach, 130 Ctrl-C (after the summary of what was done)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "perf",
        help="measure throughput and latency against a cluster",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c = p.add_argument_group("connection")
    c.add_argument(
        "--url",
        action="append",
        metavar="URL",
        help="amqp://HOST:PORT or amqps://HOST:PORT of a node or gateway; repeat it (or give "
        "a comma-separated list) for several endpoints: clients spread over them, and try them "
        "in turn to connect (default amqp://127.0.0.1:5672)",
    )
    c.add_argument(
        "--admin",
        metavar="HOST:PORT",
        help="admin API, where streams are created "
        "(default: $SPATE_ADMIN, else $SPATE_DATA_DIR/endpoints.json, else "
        "127.0.0.1:7600); over TLS with $SPATE_ADMIN_TLS_CA (and $SPATE_ADMIN_TLS_CERT, "
        "$SPATE_ADMIN_TLS_KEY for mutual TLS), with $SPATE_ADMIN_TOKEN if set",
    )
    c.add_argument("--user", help="SASL PLAIN user (with --password)")
    c.add_argument("--password", help="SASL PLAIN password")
    c.add_argument("--ca-file", metavar="PEM", help="CA certificates to trust (amqps:// URLs)")
    c.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to connect and attach each client (default 30)",
    )
    c.add_argument(
        "--reconnect-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="reconnect (to the URLs in turn) for up to S seconds after a client loses its "
        "connection; producers resend what was unconfirmed (default 0: a lost connection ends "
        "the run with an error)",
    )
    w = p.add_argument_group("workload")
    w.add_argument("--producers", type=int, default=1, metavar="N", help="default 1")
    w.add_argument("--consumers", type=int, default=1, metavar="N", help="default 1")
    w.add_argument(
        "--size",
        type=int,
        default=100,
        metavar="BYTES",
        help="message body size, at least 8 (default 100)",
    )
    w.add_argument(
        "--count",
        type=int,
        metavar="N",
        help="messages to publish in all, spread over the producers",
    )
    w.add_argument(
        "--time",
        type=float,
        metavar="S",
        help="publish for this many seconds (instead of, or as well as, --count)",
    )
    w.add_argument(
        "--rate",
        type=float,
        metavar="R",
        help="messages per second per producer (default: as fast as possible)",
    )
    w.add_argument(
        "--batch-size",
        type=int,
        default=100,
        metavar="B",
        help="messages a producer hands the connection per write (default 100)",
    )
    w.add_argument(
        "--confirm-window",
        type=int,
        default=10_000,
        metavar="W",
        help="unconfirmed messages per producer at most (default 10000)",
    )
    w.add_argument(
        "--credit",
        type=int,
        default=10_000,
        metavar="N",
        help="link credit per consumer link (default 10000)",
    )
    w.add_argument(
        "--offset",
        default="next",
        help="where consumers start: first, last, next (default), an offset, or an "
        "ISO 8601 timestamp",
    )
    w.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="worker processes for the producers, and as many for the consumers (default 1 each)",
    )
    w.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="after the producers finish, how long consumers may take to receive "
        "the rest (default 30)",
    )
    s = p.add_argument_group("streams")
    target = s.add_mutually_exclusive_group()
    target.add_argument(
        "--stream",
        metavar="S",
        help="stream name, a comma-separated list, or with --stream-count a pattern (default perf)",
    )
    target.add_argument(
        "--super-stream",
        metavar="S",
        help="publish to super stream S (routed by key over its partitions); "
        "each consumer reads every partition stream",
    )
    s.add_argument(
        "--stream-count",
        metavar="N|A-B",
        help="streams NAME-1..NAME-N (or a printf pattern: perf-%%02d)",
    )
    s.add_argument(
        "--super-stream-partitions",
        type=int,
        default=3,
        metavar="N",
        help="partitions of a super stream perf creates (default 3)",
    )
    s.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="replicas of the streams perf creates (default: the cluster's)",
    )
    s.add_argument(
        "--max-bytes", metavar="SIZE", help="retention of the streams perf creates, e.g. 10GB"
    )
    s.add_argument(
        "--max-age",
        metavar="DURATION",
        help="retention by age of the streams perf creates, e.g. 5m",
    )
    s.add_argument(
        "--delete-streams",
        action="store_true",
        help="delete the streams this run created when it ends",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--output",
        "-o",
        choices=("text", "json"),
        default="text",
        help="json: one JSON object as the last line of stdout",
    )
    o.add_argument(
        "--histogram-file",
        metavar="PATH",
        help="write the latency of every second as an HdrHistogram interval log "
        "(values in microseconds)",
    )
    p.set_defaults(run=_run)


def _urls(values: list[str] | None) -> tuple[str, ...]:
    if not values:
        return ("amqp://127.0.0.1:5672",)
    return tuple(u.strip() for v in values for u in v.split(",") if u.strip())


def _run(args: argparse.Namespace) -> int:
    from spate.perf import plan, run
    from spate.perf.streams import Retention

    streams = plan.stream_names(args.stream or "perf", args.stream_count)
    if args.super_stream is not None and args.stream_count is not None:
        raise InvalidArgument("--stream-count applies to --stream, not --super-stream")
    settings = plan.Settings(
        urls=_urls(args.url),
        producers=args.producers,
        consumers=args.consumers,
        size=args.size,
        count=args.count,
        time_s=args.time,
        rate=args.rate,
        batch_size=args.batch_size,
        confirm_window=args.confirm_window,
        credit=args.credit,
        streams=streams,
        super_stream=args.super_stream,
        offset=plan.parse_offset(args.offset),
        processes=args.processes,
        user=args.user,
        password=args.password,
        ca_file=args.ca_file,
        timeout_s=args.timeout,
        drain_timeout_s=args.drain_timeout,
        reconnect_timeout_s=args.reconnect_timeout,
    )
    settings.validate()
    retention = Retention(
        max_bytes=_parsed(parse_bytes, "--max-bytes", args.max_bytes),
        max_age_ms=_parsed(parse_duration_ms, "--max-age", args.max_age),
    )
    if args.replicas is not None and args.replicas < 1:
        raise InvalidArgument(f"--replicas must be at least 1, got {args.replicas}")
    options = run.Options(
        admin=resolve_admin(args.admin),
        replicas=args.replicas,
        retention=retention,
        super_stream_partitions=args.super_stream_partitions,
        delete_streams=args.delete_streams,
        output=args.output,
        histogram_file=args.histogram_file,
    )
    try:
        return run.run(settings, options)
    except run.PerfFailed as failure:
        raise CommandFailed(failure.message, failure.exit_code) from None


def _parsed(parse: object, flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    assert callable(parse)
    try:
        value = parse(text)
    except InvalidArgument as error:
        raise InvalidArgument(f"{flag}: {error.message}") from None
    assert isinstance(value, int)
    return value
