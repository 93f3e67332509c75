"""The Event Hubs SDKs against a three-node cluster through a proxy-mode gateway (ADR 0021):
partitions led by different nodes, replicated and fsynced before the SDK hears `accepted`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.amqp_clients import unique
from support.eventhubs import Hubs, collect, run_js, run_sample, running_hubs

SAMPLES = Path(__file__).resolve().parents[2] / ".venv" / "azure-eventhub-samples"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("eventhubs-cluster")]


@pytest.fixture(scope="module")
def cluster_hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hubs]:
    root = tmp_path_factory.mktemp("eventhubs-cluster")
    with running_hubs(root, nodes=3, gateways=1) as running:
        yield running


def test_both_sdks_through_a_gateway_of_three_nodes(cluster_hubs: Hubs) -> None:
    hub = unique("cluster")
    cluster_hubs.cluster.cli("stream", "create", hub, "--partitions", "3", "--replicas", "3")
    for partition in range(3):  # every partition has a leader before the SDKs send
        cluster_hubs.cluster.leader_of(hub, partition)
    env = dict(os.environ, EVENT_HUB_CONN_STR=cluster_hubs.conn_str(), EVENT_HUB_NAME=hub)
    assert "Send messages in" in run_sample(SAMPLES / "send.py", env)
    run_js(cluster_hubs.conn_str(), hub, [{"op": "send", "bodies": ["from-js"]}])
    total = 0
    [props] = run_js(cluster_hubs.conn_str(), hub, [{"op": "properties"}])
    for figures in props["partitions"].values():
        total += figures["last_sequence_number"] + 1
    events = collect(cluster_hubs.conn_str(), hub, total, starting_position="-1")
    bodies = [e.body_as_str() for _, e in events]
    assert '"from-js"' in bodies and "Single message" in bodies
    assert len(bodies) == total
