#!/usr/bin/env python3
"""The PySpark connector's throughput: streaming read and streaming write on local[2], in rows/s
and CPU-seconds per million rows, against the same pipelines on Spark's file source and sink
and a null Python data source that yields the connector's own batches with no broker behind it.

    python benchmarks/spark.py                        # 100 B, 1 KiB and 16 KiB rows, 2 runs each
    python benchmarks/spark.py --sizes 100 --rows 100:50000 --runs 3    # quicker
    python benchmarks/spark.py --sizes 100 --reads-only --pin 1:0   # broker on CPU 1, Spark on 0

For each row size (`--sizes`, rows per size `--rows SIZE:N`), on one SparkSession:
  read  spate        readStream.format("spate") (availableNow, earliest, bulkRead) -> noop
  read  spate timed  the same source, each task's batches timed (benchmarks/spark_timed.py):
                     how long the reader sat blocked waiting for deliveries vs. how long
                     Spark held each batch
  read  null         format "spate_null" (benchmarks/spark_null.py): the very Arrow batches a
                     spate read yielded (captured once per size), from memory, same input
                     partitions, one micro-batch -> noop
  read  null tuples  the same rows yielded as Python tuples (Spark's row path; `--tuples-sizes`)
  read  parquet      readStream.parquet over the same rows                       -> noop
and the writes, streaming (readStream parquet -> writeStream, `Trigger.AvailableNow`) and batch
(read.parquet -> write, mode append), columns `value, key`, into:
  noop               Spark reads the input and drops it: Spark's own cost of the input side
  null (count)       format "spate_null" (benchmarks/spark_null.py), encode=false: the same
                     Python Data Source writer path as the connector's sink, the tasks only
                     count the Arrow batches Spark hands them
  null (encode)      encode=true: the connector's writer up to the client (rows encoded,
                     routed, cut into sub-entries), sending nothing
  spate              the connector's sink (exactly-once writer) to a stream
  parquet            Spark's own file sink
Every case runs once to warm up, then the cases alternate for `--runs` rounds; the median is
reported (every run is printed as a JSON line). `spate - null` is the connector's whole share of
a read (reader, planning, offsets, connections, its imports); `null - parquet` is Spark's Python
Data Source path. For a write, `null (count) - noop` is Spark's Python Data Source writer path,
`null (encode) - null (count)` the connector's encoding, `spate - null (encode)` its client
and connections (the broker's CPU apart).

CPU-seconds are Spark's: this process (the PySpark driver), its JVM and every Python worker
(read from /proc for the live process tree, dead children included through cutime/cstime),
split into the JVM's own and the Python processes'. That sum can lose processes reaped outside
the tree (one run came out negative, benchmarks/RESULTS.md §30); the JVM's own figure holds.
For CPU by process, robustly, run benchmarks/spark_cpu_sampler.py beside it. The broker's own
CPU (nodes and gateway) is reported beside the Spate rows. The cluster is `spate dev up
--nodes 3` in a temp dir, stopped at the end; everything on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")
CONNECT_BACK = "Python worker failed to connect back"


def spate(*args: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "spate.cli.main", *args, "--output", "json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return json.loads(out.stdout) if out.stdout.strip() else None


def stat(pid: int) -> tuple[str, float, float]:
    """(command name, own utime + stime, cutime + cstime of children waited for), seconds."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0.0, 0.0
    head, tail = text.rsplit(")", 1)
    fields = tail.split()
    own = (int(fields[11]) + int(fields[12])) / TICK
    reaped = (int(fields[13]) + int(fields[14])) / TICK
    return head.split("(", 1)[1], own, reaped


def cpu_s(pid: int) -> float:
    """utime + stime (+ children waited for) of one process, seconds (0 if it is gone)."""
    _, own, reaped = stat(pid)
    return own + reaped


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:  # a child belongs to the thread that forked it (the JVM forks from many)
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


def tree_cpu_s(pid: int) -> tuple[float, float]:
    """(the whole tree's CPU, the JVM's own share), seconds. The rest is Python: this driver
    and every Python process Spark started (the JVM's reaped children are Python workers)."""
    total = jvm = 0.0
    for p in tree(pid):
        name, own, reaped = stat(p)
        total += own + reaped
        if name == "java":
            jvm += own
    return total, jvm


def publish(url: str, stream: str, partitions: int, rows: int, size: int) -> None:
    from spate.client.aio import AsyncProducer

    async def one(partition: int, count: int) -> None:
        producer = await AsyncProducer.connect(url, stream, partition=partition)
        body = b"x" * (size - 8)
        for i in range(count):
            await producer.send(b"%08d" % i + body)
        await producer.flush()
        await producer.close()

    async def every() -> None:
        share = rows // partitions
        await asyncio.gather(*(one(p, share) for p in range(partitions)))

    asyncio.run(every())


class Case:
    """One pipeline, run several times; `run()` returns the rows it read or wrote."""

    def __init__(self, label: str, run: Callable[[], int], broker: bool,
                 stats: Path | None = None) -> None:  # fmt: skip
        self.label, self.run, self.broker, self.stats = label, run, broker, stats
        self.results: list[dict[str, Any]] = []


def blocked_summary(stats: Path) -> dict[str, Any]:
    """From spate_timed's per-task lines: where the reading tasks' time went (seconds, summed
    over tasks; see benchmarks/spark_timed.py)."""
    tasks = [json.loads(line) for line in stats.read_text().splitlines()]
    rows = wall = cpu = queue = spark = first = last = 0.0
    per_batch_blocked: list[float] = []
    sizes: list[int] = []
    for task in tasks:
        batches = task["batches"]
        first += batches[0][1]
        last += batches[-1][1]
        for i, (n, w, c, q, s) in enumerate(batches):
            rows += n
            wall += w
            cpu += c
            queue += q
            spark += s
            if n:
                sizes.append(int(n))
            if 0 < i < len(batches) - 1:  # not connecting (first) nor closing (last)
                per_batch_blocked.append(max(0.0, w - c - q))
    blocked = max(0.0, wall - cpu - queue)
    return {
        "tasks": len(tasks),
        "batches": len(sizes),
        "batch_rows": f"{min(sizes)}..{max(sizes)} (median {statistics.median(sizes):.0f})",
        "reader_wall_s": round(wall, 3),
        "reader_cpu_s": round(cpu, 3),
        "reader_runqueue_s": round(queue, 3),
        "reader_blocked_s": round(blocked, 3),
        "spark_holding_s": round(spark, 3),
        "first_next_s": round(first, 3),
        "last_next_s": round(last, 3),
        "blocked_middle_batches_s": round(sum(per_batch_blocked), 3),
        "blocked_middle_max_ms": round(1000 * max(per_batch_blocked, default=0.0), 1),
    }


def measure(case: Case, rows: int, size: int, broker_pids: list[int]) -> dict[str, Any]:
    if case.stats is not None:
        case.stats.unlink(missing_ok=True)
    load = os.getloadavg()[0]
    (cpu0, jvm0), broker0 = tree_cpu_s(os.getpid()), sum(map(cpu_s, broker_pids))
    t0 = time.time()
    count = case.run()
    wall = time.time() - t0
    cpu1, jvm1 = tree_cpu_s(os.getpid())
    broker = sum(map(cpu_s, broker_pids)) - broker0
    assert count == rows, f"{case.label}: {count} rows, expected {rows}"
    result: dict[str, Any] = {
        "pipeline": case.label,
        "size": size,
        "rows": rows,
        "wall_s": round(wall, 2),
        "rows_per_s": round(rows / wall),
        "mb_per_s": round(rows * size / wall / 1e6, 1),
        "spark_cpu_s_per_million": round((cpu1 - cpu0) / rows * 1e6, 1),
        "jvm_cpu_s_per_million": round((jvm1 - jvm0) / rows * 1e6, 1),
        "python_cpu_s_per_million": round(((cpu1 - cpu0) - (jvm1 - jvm0)) / rows * 1e6, 1),
        "broker_cpu_s_per_million": round(broker / rows * 1e6, 1) if case.broker else None,
        "load_1min": round(load, 2),
    }
    if case.stats is not None:
        result["reader"] = blocked_summary(case.stats)
    print(json.dumps(result), flush=True)
    return result


def median_row(case: Case) -> dict[str, Any]:
    keys = ("rows_per_s", "mb_per_s", "spark_cpu_s_per_million", "jvm_cpu_s_per_million",
            "python_cpu_s_per_million", "broker_cpu_s_per_million", "load_1min")  # fmt: skip
    out: dict[str, Any] = {"pipeline": case.label, "runs": len(case.results)}
    for key in keys:
        values = [r[key] for r in case.results if r[key] is not None]
        if values:
            out[key] = round(statistics.median(values), 1)
            out[key + "_all"] = values
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1024, 16384],
                        help="message body bytes, one set of runs each")  # fmt: skip
    parser.add_argument("--rows", nargs="+", default=["100:200000", "1024:50000",
                        "16384:8000"], help="SIZE:ROWS; sizes not listed get 200000")  # fmt: skip
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2, help="measured runs per case (+ warm-up)")
    parser.add_argument("--tuples-sizes", type=int, nargs="*", default=[100],
                        help="sizes at which the null source is also read as tuples")  # fmt: skip
    parser.add_argument("--read-modes", nargs="+", default=["true"],
                        help="option bulkRead values of the spate reads (ADR 0029)")  # fmt: skip
    parser.add_argument("--credits", type=int, nargs="*", default=[],
                        help="also read spate timed with these credit options")  # fmt: skip
    parser.add_argument("--reads-only", action="store_true", help="skip the write pipelines")
    parser.add_argument(
        "--writes-only",
        action="store_true",
        help="skip the read pipelines (and the capture for the null source)",
    )
    parser.add_argument("--no-batch-writes", action="store_true",
                        help="streaming writes only")  # fmt: skip
    parser.add_argument("--zip-pyspark", action="store_true",
                        help="leave pyspark.zip first on the workers' path")  # fmt: skip
    parser.add_argument("--pin", metavar="BROKER_CPUS:SPARK_CPUS",
                        help="pin the broker (nodes, gateway, publisher) and Spark (driver, "
                        "JVM, Python workers) to disjoint CPUs, e.g. 1:0")  # fmt: skip
    args = parser.parse_args()
    pin = parse_pin(args.pin) if args.pin else None
    rows_for = {int(s): int(n) for s, n in (item.split(":") for item in args.rows)}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # a shared machine: a Python worker gets 120 s, not 15, to connect back to the JVM
    os.environ["SPARK_AUTH_SOCKET_TIMEOUT"] = "120"
    # the null and timed sources are modules here: the Python workers import them by name
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p
    )
    sys.path.insert(0, str(HERE))
    work = Path(tempfile.mkdtemp(prefix="spate-spark-bench-"))
    if not args.zip_pyspark:
        # As the test stage does (tests/spark/conftest.py): Spark puts pyspark.zip first on the
        # path of every Python process it starts, and importing from a zip compiles pyspark
        # each time (~1.6 CPU-s per process under load); the installed package (same version,
        # with its bytecode) goes first instead. Same for every pipeline here.
        site = work / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            "import sys\nsys.path.sort(key=lambda entry: entry.endswith('pyspark.zip'))\n"
        )
        os.environ["PYTHONPATH"] = os.pathsep.join((str(site), os.environ["PYTHONPATH"]))
    data = work / "cluster"
    try:
        state = spate("dev", "up", "--nodes", "3", "--data-dir", str(data))
        admin = state["admin"]
        gateway = state["gateways"][0]["amqp"]
        endpoints = ",".join([gateway, *(n["amqp"] for n in state["nodes"])])
        broker_pids = [n["pid"] for n in state["nodes"]] + [state["gateways"][0]["pid"]]
        if pin:
            for pid in broker_pids:
                pin_process(pid, pin[0])
            pin_process(os.getpid(), pin[0])  # the publisher below runs in this process
        for size in args.sizes:
            for name in (f"bench-in-{size}", f"bench-out-{size}"):
                spate("stream", "create", name, "--partitions", str(args.partitions),
                      "--admin", admin)  # fmt: skip
            rows = rows_for.get(size, 200_000) // args.partitions * args.partitions
            t0 = time.time()
            publish(f"amqp://{gateway}", f"bench-in-{size}", args.partitions, rows, size)
            print(f"# published {rows} x {size} B in {time.time() - t0:.1f} s", flush=True)
        if pin:
            pin_process(os.getpid(), pin[1])  # the JVM and Python workers start after this
            print(f"# pinned: broker {sorted(pin[0])}, Spark {sorted(pin[1])}", flush=True)
        run_all(args, rows_for, work, endpoints, broker_pids)
    finally:
        subprocess.run(
            [sys.executable, "-m", "spate.cli.main", "dev", "down", "--data-dir", str(data)],
            check=False,
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(work, ignore_errors=True)


def parse_pin(text: str) -> tuple[set[int], set[int]]:
    broker, _, spark = text.partition(":")
    cpus = (
        {int(c) for c in broker.split(",") if c},
        {int(c) for c in spark.split(",") if c},
    )
    if not all(cpus) or cpus[0] & cpus[1]:
        raise SystemExit(f"--pin {text!r}: two disjoint, non-empty CPU lists, e.g. 1:0")
    return cpus


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def run_all(args: argparse.Namespace, rows_for: dict[int, int], work: Path, endpoints: str,
            broker_pids: list[int]) -> None:  # fmt: skip
    import spark_null
    import spark_timed
    import spate.spark
    from pyspark.sql import SparkSession
    from spate.spark.source import SCHEMA

    assert spark_null.SCHEMA == SCHEMA, "spate_null must yield the connector's schema"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("spate-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spate.spark.register(spark)
    spark.dataSource.register(spark_null.NullDataSource)
    spark.dataSource.register(spark_timed.TimedDataSource)
    print(f"# spark {spark.version}, load average {os.getloadavg()}", flush=True)
    runs = iter(range(1_000_000))

    def stream(source: Any, sink: str, **options: str) -> int:
        for attempt in range(3):
            writer = source.writeStream.format(sink).option(
                "checkpointLocation", str(work / f"ck{next(runs)}")
            )
            for key, value in options.items():
                writer = writer.option(key, value)
            query = writer.trigger(availableNow=True).start()
            try:
                query.awaitTermination()
            except Exception as error:
                # On a loaded machine a fresh Python process can miss Spark's fixed 10 s to
                # connect back before the query started (as support.spark retries in tests).
                if CONNECT_BACK not in str(error) or query.recentProgress or attempt == 2:
                    raise
                print(f"# retried: {CONNECT_BACK}", flush=True)
                continue
            return sum(p["numInputRows"] for p in query.recentProgress)
        raise AssertionError("unreachable")

    summary: list[dict[str, Any]] = []
    for size in args.sizes:
        rows = rows_for.get(size, 200_000) // args.partitions * args.partitions
        files = work / f"files-{size}"
        (
            spark.read.format("spate")
            .option("endpoints", endpoints)
            .option("stream", f"bench-in-{size}")
            .load()
            .repartition(args.partitions)
            .write.parquet(str(files))
        )
        schema = spark.read.parquet(str(files)).schema

        def spate_source(fmt: str = "spate", bulk: str = "true", size: int = size,
                         **extra: str) -> Any:  # fmt: skip
            reader = (
                spark.readStream.format(fmt)
                .option("endpoints", endpoints)
                .option("stream", f"bench-in-{size}")
                .option("startingOffsets", "earliest")
                .option("bulkRead", bulk)
            )
            for key, value in extra.items():
                reader = reader.option(key, value)
            return reader.load()

        def file_source(schema: Any = schema, files: Path = files) -> Any:
            return spark.readStream.schema(schema).parquet(str(files))

        cases: list[Case] = []
        if not args.writes_only:
            cases += read_cases(args, size=size, rows=rows, work=work, spark=spark,
                                stream=stream, spate_source=spate_source,
                                file_source=file_source)  # fmt: skip
        if not args.reads_only:
            cases += write_cases(args, size=size, rows=rows, work=work, stream=stream,
                                 endpoints=endpoints, spark=spark, files=files)  # fmt: skip
        if size == args.sizes[0]:  # warm-up: Python workers started, classes loaded
            for case in cases:
                got = case.run()
                assert got == rows, (case.label, got, rows)
        for _ in range(args.runs):  # the cases alternate
            for case in cases:
                try:
                    case.results.append(measure(case, rows, size, broker_pids))
                except Exception as error:  # one failed run (a loaded machine): report, go on
                    print(f"# {case.label}: run failed: {str(error)[:300]}", flush=True)
        for case in (c for c in cases if c.results):
            row = median_row(case) | {"size": size, "rows": rows}
            summary.append(row)
            print("# median " + json.dumps(row), flush=True)
    print("# summary")
    for row in summary:
        print(json.dumps(row))
    spark.stop()


def read_cases(args: argparse.Namespace, *, size: int, rows: int, work: Path, spark: Any,
               stream: Callable[..., int], spate_source: Callable[..., Any],
               file_source: Callable[[], Any]) -> list[Case]:  # fmt: skip
    """The read pipelines of one size (after capturing a spate read for the null source)."""
    import spark_null

    stream_in = f"bench-in-{size}"
    captured, stats = work / f"null-{size}", work / f"stats-{size}.jsonl"
    got = stream(spate_source("spate_timed", _stats=str(stats), _capture=str(captured)),
                 "noop")  # fmt: skip
    assert got == rows, (got, rows)
    tasks = [json.loads(line) for line in stats.read_text().splitlines()]
    spark_null.write_index(
        captured, stream_in, {t["partition"]: sum(b[0] for b in t["batches"]) for t in tasks}
    )
    print(f"# {size} B: captured {blocked_summary(stats)}", flush=True)

    def null_source(tuples: str) -> Any:
        return (
            spark.readStream.format("spate_null")
            .option("path", str(captured))
            .option("tuples", tuples)
            .load()
        )

    cases: list[Case] = []
    for mode in args.read_modes:
        cases.append(Case(f"read spate (bulkRead={mode}) -> noop",
                          lambda mode=mode: stream(spate_source(bulk=mode), "noop"),
                          True))  # fmt: skip
    timed_stats = work / f"timed-{size}.jsonl"
    cases.append(Case("read spate timed -> noop",
                      lambda: stream(spate_source("spate_timed", _stats=str(timed_stats)),
                                     "noop"),
                      True, timed_stats))  # fmt: skip
    for credit in args.credits:
        credit_stats = work / f"timed-{size}-{credit}.jsonl"
        cases.append(Case(f"read spate timed (credit={credit}) -> noop",
                          lambda s=credit_stats, c=credit: stream(
                              spate_source("spate_timed", _stats=str(s), credit=str(c)),
                              "noop"),
                          True, credit_stats))  # fmt: skip
    cases.append(Case("read null (Arrow batches) -> noop",
                      lambda: stream(null_source("false"), "noop"), False))  # fmt: skip
    if size in args.tuples_sizes:
        cases.append(Case("read null (tuples) -> noop",
                          lambda: stream(null_source("true"), "noop"), False))  # fmt: skip
    cases.append(Case("read parquet -> noop", lambda: stream(file_source(), "noop"), False))
    return cases


def write_cases(args: argparse.Namespace, *, size: int, rows: int, work: Path,
                stream: Callable[..., int], endpoints: str, spark: Any,
                files: Path) -> list[Case]:  # fmt: skip
    """The write pipelines of one size: streaming, then batch, into noop, the null sink
    counting, the null sink encoding, Spate and parquet (see the module docstring)."""
    schema = spark.read.parquet(str(files)).schema
    stream_out = f"bench-out-{size}"
    outs = iter(range(1_000_000))
    null_options = {"partitions": str(args.partitions)}

    def streamed() -> Any:
        return spark.readStream.schema(schema).parquet(str(files)).select("value", "key")

    def batch(sink: str, mode: str = "append", **options: str) -> int:
        writer = spark.read.parquet(str(files)).select("value", "key").write.format(sink)
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.mode(mode).save()
        return rows

    def batch_null(encode: str) -> int:
        """A batch write to spate_null, counted by its commit (the report file)."""
        report = work / f"null-report-{next(outs)}.jsonl"
        batch("spate_null", encode=encode, report=str(report), **null_options)
        return int(json.loads(report.read_text().splitlines()[-1])["rows"])

    cases = [
        Case("write stream parquet -> noop", lambda: stream(streamed(), "noop"), False),
        Case("write stream parquet -> null (count)",
             lambda: stream(streamed(), "spate_null", encode="false", **null_options),
             False),
        Case("write stream parquet -> null (encode)",
             lambda: stream(streamed(), "spate_null", encode="true", **null_options), False),
        Case("write stream parquet -> spate",
             lambda: stream(streamed(), "spate", endpoints=endpoints, stream=stream_out), True),
        Case("write stream parquet -> parquet",
             lambda: stream(streamed(), "parquet", path=str(work / f"out{next(outs)}")),
             False),
    ]  # fmt: skip
    if not args.no_batch_writes:
        cases += [
            Case("write batch parquet -> noop", lambda: batch("noop", "overwrite"), False),
            Case("write batch parquet -> null (count)", lambda: batch_null("false"), False),
            Case("write batch parquet -> null (encode)", lambda: batch_null("true"), False),
            Case("write batch parquet -> spate",
                 lambda: batch("spate", endpoints=endpoints, stream=stream_out), True),
            Case("write batch parquet -> parquet",
                 lambda: batch("parquet", path=str(work / f"out{next(outs)}")), False),
        ]  # fmt: skip
    return cases


if __name__ == "__main__":
    main()
