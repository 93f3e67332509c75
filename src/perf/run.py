"""The conductor of a `spate perf` run: streams, worker processes, one line a second, summary.

    check the URLs answer (TCP) -> create or find the streams (admin API) -> start the worker
    processes (spawn), wait until every client attached -> "start" -> every second: ask each
    worker for its counters and latency buckets, print a line -> producers done: tell each
    consumer how many messages to expect -> consumers done (or --drain-timeout) -> "stop",
    final reports, summary -> delete the streams (--delete-streams)

Producers and consumers never share a process, so the CPU of each side divides by its own
messages: the summary's CPU-µs per published and per consumed message are the worker
processes' own (getrusage), from "start" to their last report.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection, wait
from typing import Any, TextIO
from urllib.parse import urlsplit

from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogWriter
from spate.core.errors import InvalidArgument, Unavailable
from spate.perf import plan as planning
from spate.perf import worker
from spate.perf.plan import Settings, WorkerPlan
from spate.perf.streams import Admin, Retention

LATENCY_MAX_US = 3_600_000_000
"""The histograms' range: 1 µs to an hour (longer is recorded as an hour)."""
LATENCY_DIGITS = 3
REPORT_INTERVAL_S = 1.0
EXIT_INTERRUPTED = 130
"""Ctrl-C, after the summary (the shell's code for SIGINT)."""
POLL_S = 0.02
"""How often the conductor looks for workers that finished between reports."""
PROBE_TIMEOUT_S = 5.0
READY_GRACE_S = 30.0
"""Allowance on top of --timeout for worker processes to start (imports) and attach."""
ANSWER_TIMEOUT_S = 30.0
"""How long a worker may take to answer one request before the run is declared stuck."""


class _Shortfall(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PerfFailed(Exception):
    """The run could not start or did not complete; `exit_code` for the CLI."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message, self.exit_code = message, exit_code


@dataclass
class Options:
    """What the run needs beyond `Settings` (the workers' part)."""

    admin: str
    """The admin API's address (where the streams are created)."""
    replicas: int | None = None
    retention: Retention = field(default_factory=Retention)
    super_stream_partitions: int = 3
    delete_streams: bool = False
    output: str = "text"
    histogram_file: str | None = None


@dataclass
class _Handle:
    plan: WorkerPlan
    process: Any
    conn: Connection
    last: worker.Report = field(default_factory=worker.Report)
    done: bool = False
    final: bool = False


def probe(urls: tuple[str, ...]) -> list[str]:
    """Fail fast, with the URLs, when nothing listens at any endpoint; returns a warning for
    each one that does not answer while others do (clients try the URLs in turn)."""
    failures: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
        try:
            with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
                pass
        except OSError as error:
            failures.append(f"cannot connect to {url}: {error.strerror or error}")
    if len(failures) == len(urls):
        raise Unavailable(
            "; ".join(failures) + ". Is a cluster running? Start one with `spate dev up`, or "
            "point --url at a node or gateway"
        )
    return [f"{failure} (the other URLs answer)" for failure in failures]


def percentiles_ms(histogram: HdrHistogram) -> dict[str, float | None]:
    if histogram.get_total_count() == 0:
        return {"min": None, "p50": None, "p75": None, "p95": None, "p99": None, "max": None}
    out: dict[str, float | None] = {"min": histogram.get_min_value() / 1000}
    for name, q in (("p50", 50), ("p75", 75), ("p95", 95), ("p99", 99)):
        out[name] = histogram.get_value_at_percentile(q) / 1000
    out["max"] = histogram.get_max_value() / 1000
    return out


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _latency_text(lat: dict[str, float | None]) -> str:
    keys = ("min", "p50", "p75", "p95", "p99")
    return "latency min/p50/p75/p95/p99 " + "/".join(_ms(lat[k]) for k in keys) + " ms"


class Conductor:
    def __init__(self, settings: Settings, options: Options, out: TextIO, err: TextIO) -> None:
        self.settings, self.options, self.out, self.err = settings, options, out, err
        self.live = err if options.output == "json" else out
        self.handles: list[_Handle] = []
        self.total = HdrHistogram(1, LATENCY_MAX_US, LATENCY_DIGITS)
        self.interval = HdrHistogram(1, LATENCY_MAX_US, LATENCY_DIGITS)
        self.log: HistogramLogWriter | None = None
        self.log_file: TextIO | None = None
        self.start_ns = 0
        self.targets: tuple[str, ...] = ()
        self.warnings: list[str] = []
        self.logged_until_s = 0.0
        self.before: dict[int, worker.Report] = {}
        """Each worker's report at the last line printed."""
        self.interrupted = False
        self.phases: dict[str, float] = {}
        """Setup time: streams created, worker processes started and attached (seconds)."""
        self.created: list[tuple[str, bool]] = []
        """(name, is a super stream) of what this run created."""

    # setup

    def prepare_streams(self) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
        s, o = self.settings, self.options
        admin = Admin(o.admin, s.timeout_s)
        partitions_of: dict[str, tuple[str, ...]] = {}
        keys_of: dict[str, tuple[str, ...]] = {}
        try:
            if s.super_stream is not None:
                created, topology = admin.ensure_super_stream(
                    s.super_stream, o.super_stream_partitions, o.replicas, o.retention
                )
                if created:
                    self.created.append((s.super_stream, True))
                partitions_of[s.super_stream] = topology.partitions
                keys_of[s.super_stream] = planning.routing_keys(
                    len(topology.partitions), topology.routing, topology.binding_keys
                )
                self.targets = (s.super_stream,)
            else:
                self.targets = s.streams
                for name in s.streams:
                    try:
                        created, warning = admin.ensure_stream(name, o.replicas, o.retention)
                    except Unavailable as unreachable:
                        # streams made beforehand need no admin API: attach to them as they are
                        # (a missing one then fails its attach with amqp:not-found)
                        self.warnings.append(
                            f"{unreachable.message}; using the streams as they are"
                        )
                        break
                    if created:
                        self.created.append((name, False))
                    if warning:
                        self.warnings.append(warning)
        finally:
            admin.close()
        return partitions_of, keys_of

    def delete_streams(self) -> None:
        admin = Admin(self.options.admin, self.settings.timeout_s)
        try:
            for name, is_super in self.created:
                if is_super:
                    admin.delete_super_stream(name)
                else:
                    admin.delete_stream(name)
        finally:
            admin.close()

    def spawn(self, plans: list[WorkerPlan]) -> None:
        context = multiprocessing.get_context("spawn")
        for p in plans:
            ours, theirs = context.Pipe()
            process = context.Process(
                target=worker.main,
                args=(p, self.settings, theirs, self.start_ns),
                name=f"spate-perf-{p.role}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self.handles.append(_Handle(p, process, ours))

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.timeout_s + READY_GRACE_S
        pending: dict[Any, _Handle] = {h.conn: h for h in self.handles}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PerfFailed(
                    f"{len(pending)} worker process(es) did not attach within "
                    f"{self.settings.timeout_s + READY_GRACE_S:g} s"
                )
            for conn in wait(list(pending), left):
                kind, payload = self._receive(pending[conn])
                if kind == "failed":
                    raise PerfFailed(f"could not attach: {payload}", 5)
                assert kind == "ready", kind
                del pending[conn]

    def _receive(self, handle: _Handle) -> tuple[str, Any]:
        try:
            message: tuple[str, Any] = handle.conn.recv()
        except EOFError:
            raise PerfFailed(
                f"a {handle.plan.role} worker process exited unexpectedly "
                f"(exit code {handle.process.exitcode})"
            ) from None
        return message

    # the run

    def ask_all(self, request: tuple[Any, ...], answer: str) -> None:
        """Send `request` to every live worker and take in each one's `answer` (noting
        "done" messages that arrive first)."""
        live = [h for h in self.handles if not h.final]
        for h in live:
            h.conn.send(request)
        for h in live:
            while True:
                if not h.conn.poll(ANSWER_TIMEOUT_S):
                    raise PerfFailed(f"a {h.plan.role} worker did not answer within 30 s")
                kind, payload = self._receive(h)
                self._take(h, kind, payload)
                if kind == answer:
                    break

    def _take(self, h: _Handle, kind: str, payload: Any) -> None:
        assert kind in ("report", "done", "final"), kind
        report: worker.Report = payload
        h.last = report
        for floor_us, count in report.latency:
            value = max(1, min(floor_us, LATENCY_MAX_US))
            self.total.record_value(value, count)
            self.interval.record_value(value, count)
        if kind == "done":
            h.done = True
        if kind == "final":
            h.final = True
        if report.error and kind != "report":
            self.warnings.append(report.error)

    def poll_done(self) -> None:
        for h in self.handles:
            while not h.final and h.conn.poll():
                kind, payload = self._receive(h)
                self._take(h, kind, payload)

    def sums(self) -> worker.Report:
        total = worker.Report()
        for h in self.handles:
            r = h.last
            total.published += r.published
            total.confirmed += r.confirmed
            total.failed += r.failed
            total.consumed += r.consumed
            total.consumed_run += r.consumed_run
            for target, n in r.published_by_target.items():
                total.published_by_target[target] = total.published_by_target.get(target, 0) + n
            total.last_publish_ns = max(total.last_publish_ns, r.last_publish_ns)
            total.last_confirm_ns = max(total.last_confirm_ns, r.last_confirm_ns)
            total.last_consume_ns = max(total.last_consume_ns, r.last_consume_ns)
        return total

    def run(self) -> dict[str, Any]:
        o = self.options
        began = time.monotonic()
        if o.histogram_file:
            try:
                self.log_file = open(o.histogram_file, "w")  # noqa: SIM115 - closed in finally
            except OSError as error:
                raise InvalidArgument(
                    f"--histogram-file: cannot write {o.histogram_file}: {error.strerror or error}"
                ) from None
        try:
            return self._run(began)
        finally:
            if self.log_file is not None:
                self.log_file.close()

    def _run(self, began: float) -> dict[str, Any]:
        s, o = self.settings, self.options
        self.warnings.extend(probe(s.urls))
        partitions_of, keys_of = self.prepare_streams()
        self.phases["streams_s"] = round(time.monotonic() - began, 3)
        for warning in self.warnings:
            print(f"spate perf: warning: {warning}", file=self.err)
        self.warnings.clear()
        plans = planning.assign(s, self.targets, partitions_of, keys_of)
        if self.log_file is not None:
            self.log = HistogramLogWriter(self.log_file)
            self.log.output_comment("spate perf publish-to-consume latency, values in us")
            self.log.output_log_format_version()
            # hdrh 0.10.8's output_start_time is broken (datetime.iso_format): written here
            now = datetime.now(UTC)
            self.log_file.write(
                f"#[StartTime: {now.timestamp():.3f} (seconds since epoch), "
                f"{now.isoformat(' ', 'seconds')}]\n"
            )
            self.log.output_legend()
        self.start_ns = time.monotonic_ns()
        try:
            self.spawn(plans)
            self.wait_ready()
            self.phases["attach_s"] = round(time.monotonic() - began - self.phases["streams_s"], 3)
            return self._measure()
        finally:
            self._shutdown()
            if o.delete_streams and self.created:
                self.delete_streams()

    def _measure(self) -> dict[str, Any]:
        for h in self.handles:
            h.conn.send(("start",))
        started = time.monotonic()
        started_ns = time.monotonic_ns()
        cpu_start = os.times()
        producers = [h for h in self.handles if h.plan.role == "producers"]
        consumers = [h for h in self.handles if h.plan.role == "consumers"]
        before = {i: worker.Report(at_ns=started_ns) for i in range(len(self.handles))}
        tick = 0
        shortfall: str | None = None
        try:
            tick = self._loop(started, producers, consumers, before)
        except _Shortfall as short:
            shortfall = short.message
        except KeyboardInterrupt:  # Ctrl-C: stop, and summarise what was done (the workers
            self.interrupted = True  # ignore SIGINT: the conductor stops them)
        self.ask_all(("stop",), "final")
        elapsed = time.monotonic() - started
        if tick == 0 or elapsed - self.logged_until_s >= POLL_S * 5:
            self._live_line(elapsed, self.before)  # the last, partial interval
        sums = self.sums()
        return self._summary(sums, started_ns, shortfall, cpu_start)

    def _loop(
        self,
        started: float,
        producers: list[_Handle],
        consumers: list[_Handle],
        before: dict[int, worker.Report],
    ) -> int:
        """Report every second until the run is over; returns the reports taken."""
        s = self.settings
        self.before = before
        expecting_since: float | None = None
        stopped_producers = False
        tick = 0
        while True:
            self.poll_done()
            now = time.monotonic()
            sums = self.sums()
            if not stopped_producers and all(h.done for h in producers):
                stopped_producers = True
                if producers and not sums.failed:
                    expected = self._expected(sums)
                    for h in consumers:
                        h.conn.send(("expect", expected))
                expecting_since = now
            if not producers:
                assert s.time_s is not None, "validated: consumers alone run for --time"
                if now - started >= s.time_s:
                    break
            elif stopped_producers and sums.failed:
                break  # the summary's errors say which; the consumers cannot get them all
            elif stopped_producers and all(h.done for h in consumers):
                break
            elif expecting_since is not None and now - expecting_since > s.drain_timeout_s:
                raise _Shortfall(
                    f"consumers received {sums.consumed_run:,} of the "
                    f"{self._expected_total(sums):,} messages published in this run within "
                    f"--drain-timeout {s.drain_timeout_s:g} s"
                )
            if now >= started + (tick + 1) * REPORT_INTERVAL_S:
                tick += 1
                self.ask_all(("report",), "report")
                self._live_line(time.monotonic() - started, self.before)
                self.before = {i: h.last for i, h in enumerate(self.handles)}
                continue
            time.sleep(POLL_S)
        return tick

    def _expected(self, sums: worker.Report) -> dict[int, int]:
        return {
            c.index: sums.published_by_target.get(c.target, 0)
            for h in self.handles
            for c in h.plan.consumers
        }

    def _expected_total(self, sums: worker.Report) -> int:
        return sum(self._expected(sums).values())

    def _live_line(self, elapsed_s: float, before: dict[int, worker.Report]) -> None:
        """Rates per worker over its own report times (a worker busy with a burst answers
        late; its rate is still its count over its own interval), summed."""
        rates = {"published": 0.0, "confirmed": 0.0, "consumed": 0.0}
        for i, h in enumerate(self.handles):
            old, new = before[i], h.last
            span_s = (new.at_ns - old.at_ns) / 1e9
            if span_s <= 0:
                continue
            for name in rates:
                rates[name] += (getattr(new, name) - getattr(old, name)) / span_s
        lat = percentiles_ms(self.interval)
        line = (
            f"{elapsed_s:5.1f} s  published {rates['published']:>9,.0f} msg/s, "
            f"confirmed {rates['confirmed']:>9,.0f} msg/s, "
            f"consumed {rates['consumed']:>9,.0f} msg/s, " + _latency_text(lat)
        )
        print(line, file=self.live, flush=True)
        if self.log is not None and self.interval.get_total_count():
            self.log.output_interval_histogram(
                self.interval,
                self.logged_until_s,
                elapsed_s,
                max_value_unit_ratio=1000.0,
            )
        self.interval.reset()
        self.logged_until_s = elapsed_s

    def _summary(
        self, sums: worker.Report, started_ns: int, shortfall: str | None, cpu_start: Any
    ) -> dict[str, Any]:
        def per_s(count: int, last_ns: int) -> float:
            span = (last_ns - started_ns) / 1e9
            return count / span if count and span > 0 else 0.0

        def cpu_s(role: str) -> float:
            return sum(h.last.cpu_s for h in self.handles if h.plan.role == role)

        def cpu_us(role: str, count: int) -> float | None:
            return round(cpu_s(role) * 1e6 / count, 2) if count else None

        s = self.settings
        failures = list(dict.fromkeys(w for w in self.warnings if w))  # a worker's error
        # comes with its "done" and again with its "final" report
        conductor = os.times()
        return {
            "published": sums.published,
            "confirmed": sums.confirmed,
            "failed": sums.failed,
            "consumed": sums.consumed,
            "consumed_this_run": sums.consumed_run,
            "expected_consumed": self._expected_total(sums) if s.producers else None,
            "published_per_s": round(per_s(sums.published, sums.last_publish_ns), 1),
            "confirmed_per_s": round(per_s(sums.confirmed, sums.last_confirm_ns), 1),
            "consumed_per_s": round(per_s(sums.consumed, sums.last_consume_ns), 1),
            "latency_ms": percentiles_ms(self.total),
            "latency_samples": self.total.get_total_count(),
            "duration_s": round((time.monotonic_ns() - started_ns) / 1e9, 3),
            "setup_s": self.phases,
            "cpu_us_per_published": cpu_us("producers", sums.published),
            "cpu_us_per_consumed": cpu_us("consumers", sums.consumed),
            "cpu_s": {
                "producers": round(cpu_s("producers"), 3),
                "consumers": round(cpu_s("consumers"), 3),
            },
            "conductor_cpu_s": round(
                conductor.user + conductor.system - cpu_start.user - cpu_start.system, 3
            ),
            "producers": s.producers,
            "consumers": s.consumers,
            "processes": len(self.handles),
            "size": s.size,
            "batch_size": s.batch_size,
            "confirm_window": s.confirm_window,
            "rate": s.rate,
            "streams": list(self.targets) if s.super_stream is None else [],
            "super_stream": s.super_stream,
            "urls": list(s.urls),
            "load_average": list(os.getloadavg()),
            "errors": failures + ([shortfall] if shortfall else []),
            "interrupted": self.interrupted,
        }

    def _shutdown(self) -> None:
        for h in self.handles:
            if not h.final and h.process.is_alive():
                with contextlib.suppress(OSError):
                    h.conn.send(("stop",))
        for h in self.handles:
            h.process.join(10)
            if h.process.is_alive():
                h.process.kill()
                h.process.join()
            h.conn.close()


def summary_text(summary: dict[str, Any]) -> str:
    lat = summary["latency_ms"]

    def cpu(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        f"Summary: published {summary['published_per_s']:,.0f} msg/s, "
        f"confirmed {summary['confirmed_per_s']:,.0f} msg/s, "
        f"consumed {summary['consumed_per_s']:,.0f} msg/s, " + _latency_text(lat),
        f"  messages: published {summary['published']:,}, confirmed {summary['confirmed']:,}, "
        f"failed {summary['failed']:,}, consumed {summary['consumed']:,}"
        + (
            f" (of {summary['expected_consumed']:,} expected)"
            if summary["expected_consumed"] is not None
            else ""
        ),
        f"  perf's own CPU: {cpu(summary['cpu_us_per_published'])} us per published message, "
        f"{cpu(summary['cpu_us_per_consumed'])} us per consumed message "
        f"({summary['processes']} worker processes, CPU {summary['cpu_s']['producers']:.2f} s "
        f"producing, {summary['cpu_s']['consumers']:.2f} s consuming in "
        f"{summary['duration_s']:.1f} s), load average "
        + "/".join(f"{x:.2f}" for x in summary["load_average"]),
    ]
    lines.extend(f"  error: {e}" for e in summary["errors"])
    return "\n".join(lines)


def run(settings: Settings, options: Options, out: TextIO = sys.stdout) -> int:
    """Run, print the summary (text, or one JSON line last on stdout); 0 when every message
    was confirmed and consumed as expected, else 1 (the summary's `errors` say why)."""
    settings.validate()
    if options.super_stream_partitions < 1:
        raise InvalidArgument("--super-stream-partitions must be at least 1")
    conductor = Conductor(settings, options, out, sys.stderr)
    summary = conductor.run()
    if options.output == "json":
        print(json.dumps(summary), file=out, flush=True)
    else:
        print(summary_text(summary), file=out, flush=True)
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    return 0 if not summary["errors"] else 1
