"""Shards of a node (ADR 0032), the pure parts: the settings each shard process derives from
the node's, the settings' trip to a shard over its stdin, and how `spate dev up --shards N`
plans hosts and shards (which ones vote)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spate.core.errors import InvalidArgument
from spate.server.devcluster import DevCluster, NodePlan, grow_plan
from spate.server.settings import NodeSettings, shard_settings
from spate.server.shards import settings_from_json, settings_json


def node(**changes: object) -> NodeSettings:
    base = NodeSettings(
        node_id="n1",
        data_dir=Path("/var/lib/spate"),
        metadata_password="s3cret",
        metadata_peers=("10.0.0.2:7700", "10.0.0.3:7700"),
        advertise_host="10.0.0.1",
        host="0.0.0.0",
        shards=2,
    )
    fields = {**base.__dict__, **changes}
    return NodeSettings(**fields)  # type: ignore[arg-type]


def test_shard_0_is_the_node_itself_and_shard_i_is_derived_from_it() -> None:
    settings = node()
    zero, one = shard_settings(settings, 0), shard_settings(settings, 1)
    assert (zero.node_id, zero.data_dir, zero.amqp_port, zero.metadata_voter) == (
        "n1", Path("/var/lib/spate"), 5672, True,
    )  # fmt: skip
    assert zero.failure_domain == one.failure_domain == "n1"
    assert (one.node_id, one.data_dir) == ("n1-s1", Path("/var/lib/spate-s1"))
    assert (one.amqp_port, one.admin_port, one.metadata_port) == (5673, 7601, 7701)
    assert (one.replication_port, one.metrics_port) == (7801, 7901)
    # only shard 0 votes: shard 1 follows the voters, shard 0 among them
    assert not one.metadata_voter
    assert one.metadata_peers == ("10.0.0.2:7700", "10.0.0.3:7700", "10.0.0.1:7700")
    assert zero.shards == one.shards == 1
    named = shard_settings(node(failure_domain="rack1-host7", amqp_port=0), 1)
    assert named.failure_domain == "rack1-host7" and named.amqp_port == 0
    single = node(shards=1)
    assert shard_settings(single, 0) is single and single.failure_domain is None


def test_shards_out_of_range_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="shards must be 1-64"):
        node(shards=0).validate()
    node(shards=64).validate()


def test_a_shard_s_settings_survive_the_trip_over_its_stdin() -> None:
    settings = shard_settings(node(dialects=("eventhubs",), users_file=Path("/etc/u.json")), 1)
    assert settings_from_json(settings_json(settings)) == settings


def test_dev_up_plans_hosts_of_shards_and_only_shard_0_of_three_hosts_votes(
    tmp_path: Path,
) -> None:
    ports = itertools.count(30_000)
    plan = grow_plan([], 1, 2, lambda: next(ports))
    assert [(n.node_id, n.host_id, n.shard) for n in plan] == [("n1", "n1", 0), ("n1-s1", "n1", 1)]
    assert plan[1].amqp_port != plan[0].amqp_port
    plan = grow_plan(plan, 4, 2, lambda: next(ports))
    assert [n.node_id for n in plan] == [
        "n1", "n1-s1", "n2", "n2-s1", "n3", "n3-s1", "n4", "n4-s1",
    ]  # fmt: skip
    cluster = DevCluster(tmp_path)
    assert [n.node_id for n in cluster._voters(plan)] == ["n1", "n2", "n3"]
    # an unsharded cluster growing shards: n1 keeps its ports and gets its host named
    old = [NodePlan("n1", 1, 2, 3, 4, 5)]
    grown = grow_plan(old, 1, 2, lambda: next(ports))
    assert grown[0] == NodePlan("n1", 1, 2, 3, 4, 5, host="n1", shard=0)
    assert grown[1].node_id == "n1-s1"
    # a plan only grows: --shards 1 later keeps the shards
    assert grow_plan(grown, 1, 1, lambda: next(ports)) == grown
    # and round-trips through cluster.json (entries written before shards have neither key)
    assert NodePlan(**grown[1].to_json()) == grown[1]
    assert "host" not in old[0].to_json()


def test_a_shard_does_not_outlive_a_supervisor_killed_outright() -> None:
    """PR_SET_PDEATHSIG: SIGKILL the process that started a child through `_stop_with_parent`
    (as the supervisor starts its shards) and the child gets SIGTERM."""
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "from spate.server.shards import _stop_with_parent\n"
         "child = subprocess.Popen(['sleep', '60'], preexec_fn=_stop_with_parent)\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _running(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
