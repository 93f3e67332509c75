"""A real dev cluster whose nodes speak the Event Hubs dialect (ADR 0021), with SAS keys."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest
from support.cluster import Cluster, spate
from support.eventhubs import KEY_NAME, Hubs

from spate.gateway.auth import hash_password
from spate.server.devcluster import DevCluster


@pytest.fixture(scope="module")
def hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hubs]:
    root = tmp_path_factory.mktemp("eventhubs")
    key = secrets.token_urlsafe(32)
    users = root / "users.json"
    users.write_text(
        json.dumps({"users": {"app": hash_password("pw")}, "sas_keys": {KEY_NAME: key}})
    )
    data_dir = root / "cluster"
    dev = DevCluster(
        data_dir, node_args=("--dialect", "eventhubs", "--users-file", str(users))
    )
    try:
        state = dev.up(1, 0)
        cluster = Cluster(data_dir, state)
        host, port = state["nodes"][0]["amqp"].split(":")
        yield Hubs(cluster, key, host, int(port))
    finally:
        spate("dev", "down", "--data-dir", str(data_dir), check=False)
