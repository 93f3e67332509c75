"""Prometheus metrics for real (issue 14, ADR 0023): a three-node dev cluster and its gateway,
traffic through the gateway with a named consumer and a consumer group, then
- every process's /metrics passes `promtool check metrics` (Debian's prometheus package) and
  carries the series the issue names;
- Debian's Prometheus server, run with the shipped scrape config (deploy/prometheus/) and the
  targets written by deploy/prometheus/targets.py from `spate dev status`, scrapes them all and
  answers the consumer and group lag through its HTTP API, and every query of the shipped
  Grafana dashboard (deploy/grafana/) runs there and names only series the processes serve.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spate.client.blocking import Consumer, Producer
from support.cluster import Cluster, running_cluster, spate
from support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
GRAFANA_DASHBOARD = ROOT / "deploy" / "grafana" / "spate-dashboard.json"
PUBLISHED = 100
CONSUMED = 40
"""The named consumer and the group each finish this many of the PUBLISHED messages."""

pytestmark = pytest.mark.slow


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return str(response.read().decode())


def _samples(text: str, name: str) -> dict[str, float]:
    """`{labels: value}` of one metric's samples (labels as written, sorted by the client)."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(\{{.*\}})? (\S+)", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data_dir = tmp_path_factory.mktemp("metrics") / "cluster"
    with running_cluster(data_dir, nodes=3) as cluster:
        cluster.cli("stream", "create", "orders", "--partitions", "2")
        gateway = f"amqp://{cluster.state['gateways'][0]['amqp']}"
        for partition in (0, 1):
            with Producer(gateway, "orders", partition=partition) as producer:
                producer.send_batch([b"order %d" % i for i in range(PUBLISHED)])
        with Consumer(
            gateway, "orders", partition=0, name="billing", start="first", commit="manual"
        ) as consumer:
            for _ in range(CONSUMED):
                consumer.receive()
            assert consumer.commit() == CONSUMED - 1
        with Consumer(
            gateway, "orders", partition=1, group="audit", start="first", commit="manual"
        ) as member:
            for _ in range(CONSUMED):
                member.receive()
            assert member.commit() == CONSUMED - 1
        cluster.refresh()
        yield cluster


def test_every_endpoint_passes_promtool_with_the_issue_s_series(traffic: Cluster) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: tools/bootstrap.sh installs Debian's prometheus package"
    processes = traffic.state["processes"]
    assert [p["role"] for p in processes] == ["node", "node", "node", "gateway"]
    texts = {}
    for process in processes:
        assert process["metrics"].startswith("http://127.0.0.1:"), process
        text = _scrape(process["metrics"])
        lint = subprocess.run(
            [promtool, "check", "metrics"], check=False, input=text, capture_output=True, text=True
        )
        assert lint.returncode == 0, f"{process['node_id']}: {lint.stdout}{lint.stderr}"
        texts[process["node_id"]] = text
    nodes = [texts[n] for n in ("n1", "n2", "n3")]

    def total(name: str, **labels: str) -> float:
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        return sum(
            value
            for text in nodes
            for key, value in _samples(text, name).items()
            if all(w in key for w in wanted)
        )

    # one leader per partition took every message in, and each replica holds them all
    assert total("spate_partition_messages_in_total", partition="0") == PUBLISHED
    assert total("spate_partition_end_offset", partition="1") == 3 * PUBLISHED
    assert total("spate_partition_leader", stream="orders") == 2
    assert total("spate_partition_raft_term") >= 6
    assert total("spate_partition_leader_changes_total") >= 6
    assert total("spate_partition_commit_index") > 0
    assert len(_samples("".join(nodes), "spate_partition_replica_lag_entries")) == 4  # 2 x 2
    assert total("spate_append_duration_seconds_count") >= 2
    assert total("spate_fsync_duration_seconds_count") >= 3
    assert total("spate_metadata_up") == 3
    # each node's Raft log cache (ADR 0049): a gauge per node; these few messages never reach
    # the budget, so no cache was lowered
    assert len(_samples("".join(nodes), "spate_replication_log_cache_bytes")) == 3
    assert total("spate_replication_log_cache_bytes") < 3 * 128 * 1024 * 1024
    assert total("spate_replication_log_cache_trims_total") == 0
    # followers' commits completed by their own sync (ADR 0050): a counter per node
    assert len(_samples("".join(nodes), "spate_replication_commits_completed_here_total")) == 3
    assert total("spate_metadata_leader") == 1
    assert total("spate_consumer_lag_messages", consumer="billing") == PUBLISHED - CONSUMED
    assert total("spate_consumer_stored_offset", consumer="billing") == CONSUMED - 1
    assert total("spate_consumer_group_lag_messages", group="audit") == PUBLISHED - CONSUMED
    gateway = texts["g1"]
    assert _samples(gateway, "spate_amqp_messages_in_total") == {'{node="g1"}': 2 * PUBLISHED}
    assert _samples(gateway, "spate_amqp_messages_out_total")['{node="g1"}'] >= 2 * CONSUMED
    assert _samples(gateway, "spate_amqp_connections_accepted_total")['{node="g1"}'] >= 4
    assert '{node="g1",role="consumer"}' in _samples(gateway, "spate_amqp_link_credit")
    assert _samples(gateway, "spate_gateway_partitions")['{node="g1",state="led"}'] == 2


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def test_prometheus_scrapes_the_cluster_with_the_shipped_config(
    traffic: Cluster, tmp_path: Path
) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus missing: tools/bootstrap.sh installs Debian's package"
    config_dir = tmp_path / "prometheus"
    config_dir.mkdir()
    shutil.copy(PROMETHEUS_DIR / "prometheus.yml", config_dir / "prometheus.yml")
    status = spate("dev", "status", "--data-dir", str(traffic.data_dir), "--output", "json")
    subprocess.run(
        [sys.executable, str(PROMETHEUS_DIR / "targets.py"), str(config_dir / "targets/dev.json")],
        input=status.stdout,
        text=True,
        check=True,
        capture_output=True,
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "prometheus.log", "wb") as log:
        server = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        lag: list[dict[str, Any]] = []
        up: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                up = _query(base, 'up{job="spate"} == 1')
                lag = _query(base, "sum by (stream, consumer) (spate_consumer_lag_messages)")
            except OSError:  # not listening yet
                time.sleep(0.5)
                continue
            if len(up) == 4 and lag:
                break
            time.sleep(0.5)
        assert len(up) == 4, f"targets up: {up}"
        assert {r["metric"]["role"] for r in up} == {"node", "gateway"}
        assert [(r["metric"], r["value"][1]) for r in lag] == [
            ({"stream": "orders", "consumer": "billing"}, str(PUBLISHED - CONSUMED))
        ]
        group = _query(base, "sum by (group) (spate_consumer_group_lag_messages)")
        assert [(r["metric"], r["value"][1]) for r in group] == [
            ({"group": "audit"}, str(PUBLISHED - CONSUMED))
        ]
        # the shipped Grafana dashboard: every query runs, and names only series some process
        # declares (a labelled family such as links refused has no sample until a refusal
        # happens, but its TYPE line is there; a histogram's TYPE names the base of _bucket)
        declared = {
            name
            for process in traffic.state["processes"]
            for name in re.findall(r"^(?:# TYPE )?(spate_\w+)", _scrape(process["metrics"]), re.M)
        }
        scraped = declared | {
            f"{name}{suffix}" for name in declared for suffix in ("_bucket", "_sum", "_count")
        }
        dashboard = json.loads((GRAFANA_DASHBOARD).read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        assert len(exprs) >= 20
        for expr in exprs:
            _query(base, expr)  # a syntax error or unknown function fails the query
            for name in re.findall(r"\bspate_\w+", expr):
                assert name in scraped, f"the dashboard uses {name}, which no process serves"
        lag_panel = next(
            t["expr"]
            for p in dashboard["panels"]
            for t in p.get("targets", [])
            if "spate_consumer_lag_messages" in t["expr"]
        )
        assert _query(base, lag_panel)[0]["value"][1] == str(PUBLISHED - CONSUMED)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
