"""`spate perf` as scripts run it: the real command (its own worker processes) against a real
three-node dev cluster (fsync on, majority before `accepted`), with small counts.

The checks are counts and orderings, never speeds: the machine is shared; where the rate limit
is checked it is by an upper bound that follows from the count (a limited producer cannot
finish sooner than its count allows), which load can only make safer.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hdrh.log import HistogramLogReader
from spate.cli.main import main
from support.cluster import Cluster, running_cluster, tls_gateway

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("perf") / "cluster", nodes=3) as c:
        yield c


def perf(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "spate.cli.main", "perf", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"spate perf {' '.join(args)} -> {proc.returncode}\n{proc.stderr}")
    return proc


def perf_json(cluster: Cluster, *args: str, url: str | None = None) -> dict[str, Any]:
    proc = perf(
        "--url", url or cluster.amqp_url(0), "--admin", cluster.admin, *args, "--output", "json"
    )  # fmt: skip
    last = proc.stdout.strip().splitlines()[-1]
    summary: dict[str, Any] = json.loads(last)
    assert summary["errors"] == [], summary["errors"]
    return summary


def assert_latency_ordered(summary: dict[str, Any]) -> None:
    lat = summary["latency_ms"]
    values = [lat[k] for k in ("min", "p50", "p75", "p95", "p99", "max")]
    assert all(isinstance(v, float) for v in values), lat
    assert values[0] > 0, lat
    assert values == sorted(values), lat


def test_json_summary_counts_add_up(cluster: Cluster, tmp_path: Path) -> None:
    histogram = tmp_path / "latency.hlog"
    summary = perf_json(
        cluster,
        "--producers", "2", "--consumers", "2", "--size", "100", "--count", "4000",
        "--stream", "perf-json", "--histogram-file", str(histogram),
    )  # fmt: skip
    for key in ("published_per_s", "confirmed_per_s", "consumed_per_s"):
        assert summary[key] > 0, key
    assert summary["published"] == summary["confirmed"] == 4000
    assert summary["failed"] == 0
    assert summary["consumed"] == summary["consumed_this_run"] == 4000 * 2
    assert summary["latency_samples"] == 8000
    assert_latency_ordered(summary)
    assert summary["cpu_us_per_published"] > 0 and summary["cpu_us_per_consumed"] > 0
    assert summary["processes"] == 2  # one for the producers, one for the consumers

    # the interval log holds every latency measured, readable by HdrHistogram's own reader
    reader = HistogramLogReader(str(histogram), None)
    total = 0
    while (interval := reader.get_next_interval_histogram()) is not None:
        total += interval.get_total_count()
    assert total == 8000


def test_text_output_has_live_lines_and_a_summary(cluster: Cluster) -> None:
    proc = perf(
        "--url", cluster.amqp_url(1), "--admin", cluster.admin, "--count", "2000",
        "--stream", "perf-text", "--max-bytes", "1GB", "--max-age", "6h", "--replicas", "2",
    )  # fmt: skip
    created = cluster.cli_json("stream", "describe", "perf-text")["stream"]
    assert created["retention"]["max_bytes"] == 1_000_000_000
    assert created["retention"]["max_age_ms"] == 6 * 3600 * 1000
    assert created["replicas"] == 2
    lines = proc.stdout.strip().splitlines()
    live = [line for line in lines if " s  published " in line]
    assert live, proc.stdout
    assert "latency min/p50/p75/p95/p99" in live[0]
    assert any(line.startswith("Summary: published ") for line in lines), proc.stdout
    assert "us per published message" in proc.stdout
    assert "published 2,000, confirmed 2,000, failed 0, consumed 2,000" in proc.stdout


def test_super_stream_spreads_over_every_partition(cluster: Cluster) -> None:
    summary = perf_json(
        cluster,
        "--producers", "2", "--consumers", "2", "--count", "3000", "--size", "32",
        "--super-stream", "perf-super", "--super-stream-partitions", "3", "--processes", "2",
    )  # fmt: skip
    assert summary["published"] == summary["confirmed"] == 3000
    assert summary["consumed"] == 3000 * 2  # each consumer reads every partition stream
    assert summary["processes"] == 4
    assert_latency_ordered(summary)
    described = cluster.cli_json("superstream", "describe", "perf-super")
    messages = [p["messages"] for p in described["partitions"]]
    assert len(messages) == 3 and all(m and m > 0 for m in messages), messages
    assert sum(messages) == 3000


def test_gateway_and_direct_endpoints_with_several_processes(cluster: Cluster) -> None:
    gateway = f"amqp://{cluster.state['gateways'][0]['amqp']}"
    urls = ",".join([gateway, *cluster.urls()])
    summary = perf_json(
        cluster,
        "--producers", "3", "--consumers", "2", "--count", "3001", "--processes", "2",
        "--stream-count", "2", "--stream", "perf-multi-%d", "--batch-size", "10",
        "--confirm-window", "50", "--delete-streams",
        url=urls,
    )  # fmt: skip
    assert summary["streams"] == ["perf-multi-1", "perf-multi-2"]
    assert summary["published"] == summary["confirmed"] == 3001
    # producers 0 and 2 publish to perf-multi-1 (1001 + 1000), producer 1 to perf-multi-2
    # (1000); consumer 0 reads perf-multi-1, consumer 1 perf-multi-2
    assert summary["expected_consumed"] == summary["consumed"] == 2001 + 1000
    listed = [s["name"] for s in cluster.cli_json("stream", "list")["streams"]]
    assert "perf-multi-1" not in listed and "perf-multi-2" not in listed  # --delete-streams


def test_rate_limit_bounds_the_publishing_rate(cluster: Cluster) -> None:
    # 600 messages at 300/s: the limiter lets message n go at n/300 s, so publishing takes
    # at least 2 s whatever the machine does
    summary = perf_json(
        cluster, "--rate", "300", "--count", "600", "--stream", "perf-rate", "--batch-size", "50"
    )
    assert summary["published"] == summary["confirmed"] == 600
    assert summary["consumed"] == 600
    assert summary["published_per_s"] <= 300 * 1.02, summary["published_per_s"]
    assert summary["duration_s"] >= 1.9


def test_time_limited_run_consumes_what_was_published(cluster: Cluster) -> None:
    summary = perf_json(
        cluster, "--time", "2", "--rate", "200", "--stream", "perf-time", "--consumers", "2"
    )
    assert 1 <= summary["published"] <= 200 * 2 + 1
    assert summary["confirmed"] == summary["published"]
    assert summary["consumed"] == 2 * summary["published"]
    # consumers alone read for --time: what is there, none of it this run's
    reader = perf_json(
        cluster, "--producers", "0", "--time", "3", "--offset", "first", "--stream", "perf-time"
    )
    assert 0 < reader["consumed"] <= summary["published"]
    assert reader["consumed_this_run"] == reader["latency_samples"] == reader["published"] == 0


def test_offset_first_reads_what_was_there_and_counts_this_run_apart(cluster: Cluster) -> None:
    perf_json(cluster, "--count", "500", "--stream", "perf-offset")
    proc = perf(
        "--url", cluster.amqp_url(0), "--admin", cluster.admin, "--count", "300",
        "--stream", "perf-offset", "--offset", "first", "--max-age", "1h", "--output", "json",
    )  # fmt: skip
    # the stream exists: used as it is, with a warning that its retention is not the one asked
    assert "stream 'perf-offset' exists with retention" in proc.stderr, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["consumed"] == 800  # the 500 already there, then this run's 300
    assert summary["consumed_this_run"] == summary["latency_samples"] == 300


def test_tls_and_credentials_through_a_tls_gateway(cluster: Cluster, tmp_path: Path) -> None:
    with tls_gateway(cluster, tmp_path / "tls") as gateway:
        summary = perf_json(
            cluster,
            "--count", "1000", "--stream", "perf-tls", "--ca-file", str(gateway.ca),
            "--user", gateway.user, "--password", gateway.password,
            url=gateway.url,
        )  # fmt: skip
        assert summary["published"] == summary["confirmed"] == 1000
        assert summary["consumed"] == 1000
        wrong = perf(
            "--url", gateway.url, "--admin", cluster.admin, "--count", "10", "--stream",
            "perf-tls", "--ca-file", str(gateway.ca), "--user", gateway.user,
            "--password", "wrong", "--timeout", "5", check=False,
        )  # fmt: skip
        assert wrong.returncode == 5, wrong.stderr
        assert "could not attach" in wrong.stderr


def _sigint_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT back to its default. A suite started in the
    background by a non-interactive shell (`(pytest &)`) runs with SIGINT ignored, which every
    child inherits; the Python it starts then never installs its Ctrl-C handler, and this test
    saw a run ignore the signal (a local run of 2026-11-27)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_the_run_and_prints_the_summary(cluster: Cluster) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "spate.cli.main", "perf", "--url", cluster.amqp_url(0),
         "--admin", cluster.admin, "--time", "60", "--rate", "500", "--stream", "perf-ctrl-c",
         "--output", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_sigint_as_in_a_terminal,  # noqa: PLW1509 (signal disposition only)
    )  # fmt: skip
    try:
        assert process.stderr is not None
        first = process.stderr.readline()  # the first live line: the run is under way
        assert " s  published " in first, first
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["interrupted"] is True
    assert summary["errors"] == []  # the producer waited for its confirms before closing
    assert 0 < summary["published"] == summary["confirmed"]
    assert summary["duration_s"] < 60


@pytest.mark.long
def test_a_leader_killed_mid_run_is_survived_with_reconnect_timeout(cluster: Cluster) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "spate.cli.main", "perf", "--url", ",".join(cluster.urls()),
         "--admin", cluster.admin, "--count", "3000", "--rate", "300", "--stream",
         "perf-failover", "--replicas", "3", "--reconnect-timeout", "60", "--output", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    killed = None
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert " s  published " in first, first + process.stderr.read()
        killed = cluster.index_of(cluster.leader_of("perf-failover"))
        cluster.kill9(killed)  # the producer's link is at the leader
        out, err = process.communicate(timeout=150)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if killed is not None:
            cluster.up(3)  # the module's other tests want three nodes
    assert process.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["published"] == summary["confirmed"] == 3000
    assert summary["consumed_this_run"] >= 3000  # at least once: a resend may be stored twice


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_workers_stop_when_perf_itself_is_killed(cluster: Cluster) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "spate.cli.main", "perf", "--url", cluster.amqp_url(0),
         "--admin", cluster.admin, "--time", "60", "--rate", "200", "--stream", "perf-orphans",
         "--output", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    first = process.stderr.readline()
    assert " s  published " in first, first
    children = children_of(process.pid)
    assert len(children) >= 2, children  # the two workers (and multiprocessing's tracker)
    process.kill()
    process.wait()
    deadline = time.monotonic() + 30
    alive = children
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and not zombie(pid)]
        time.sleep(0.1)
    for pid in alive:  # do not leave them behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert alive == [], "worker processes outlived perf"


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "4", "--count", "10"], "--size must be 8.."),
        (["--count", "0"], "--count must be"),
        (["--producers", "0", "--consumers", "0", "--count", "5"], "nothing to measure"),
        (["--producers", "3", "--count", "2"], "below --producers"),
        ([], "give --count N"),
        (["--count", "5", "--offset", "yesterday"], "--offset: expected first, last, next"),
        (["--count", "5", "--url", "http://x:1"], "--url: expected amqp://"),
        (["--count", "5", "--ca-file", "ca.pem"], "--ca-file applies to amqps://"),
        (["--count", "5", "--user", "u"], "--user and --password go together"),
        (["--count", "5", "--stream", "a", "--super-stream", "b"], "not allowed with"),
        (["--count", "5", "--stream-count", "x"], "--stream-count: expected N or A-B"),
        (["--count", "5", "--max-bytes", "lots"], "--max-bytes"),
        (["--count", "five"], "invalid int value"),
        (["--count", "5", "--histogram-file", "/nonexistent/h.hlog"], "--histogram-file: cannot"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # in-process (the same parser and checks as the console script; a process per case would
    # spend seconds importing): nothing is dialled before the arguments are checked
    try:
        code = main(["perf", *args])
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    stderr = capsys.readouterr().err
    assert code == 2, (code, stderr)
    assert message in stderr, stderr
    assert stderr.startswith("spate: "), stderr


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]  # nothing listens once it is closed
    return port


def test_unreachable_url_fails_at_once_with_the_url() -> None:
    port = closed_port()
    proc = perf("--url", f"amqp://127.0.0.1:{port}", "--count", "10", check=False)
    assert proc.returncode == 5, proc.stderr
    assert f"cannot connect to amqp://127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_stream_setup_failures_say_why(cluster: Cluster) -> None:
    url = cluster.amqp_url(0)
    # no admin API: streams that exist are used as they are; a missing one fails its attach
    cluster.cli("stream", "create", "perf-made-before", "--replicas", "3")
    # (and a URL that does not answer is passed over when another does)
    made = perf(
        "--url", f"amqp://127.0.0.1:{closed_port()},{url}", "--admin", "127.0.0.1:1",
        "--count", "10", "--stream", "perf-made-before",
    )  # fmt: skip
    assert "cannot reach the admin API at 127.0.0.1:1" in made.stderr
    assert "(the other URLs answer)" in made.stderr
    missing = perf(
        "--url", url, "--admin", "127.0.0.1:1", "--count", "10", "--stream", "perf-missing",
        check=False,
    )  # fmt: skip
    assert missing.returncode == 5, missing.stderr
    assert "cannot reach the admin API at 127.0.0.1:1" in missing.stderr
    assert "stream 'perf-missing' does not exist" in missing.stderr
    bad_name = perf(
        "--url", url, "--admin", cluster.admin, "--count", "10", "--stream", "bad name!",
        check=False,
    )  # fmt: skip
    assert bad_name.returncode == 2, bad_name.stderr
    assert "invalid stream name 'bad name!'" in bad_name.stderr
    too_many = perf(
        "--url", url, "--admin", cluster.admin, "--count", "10", "--stream", "perf-r5",
        "--replicas", "5", check=False,
    )  # fmt: skip
    assert too_many.returncode == 2, too_many.stderr
    assert "needs 5 replicas but the cluster has 3" in too_many.stderr


def test_help_shows_an_example() -> None:
    proc = perf("--help")
    assert "spate perf --url amqp://" in proc.stdout
    assert "--confirm-window" in proc.stdout and "--super-stream" in proc.stdout
