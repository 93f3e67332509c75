"""Cluster operations on real processes (issue 14, ADR 0022): grow a three-node dev cluster
to four, move a partition's replica onto the new node and drain an old one while a producer
publishes with confirms and a consumer reads, stop the drained node; rebalance leaders on a
skewed cluster (every leadership on one node). On the same cluster (ADR 0025): add the fourth
node to the metadata voters, remove the metadata leader from them and add it back, kill another
voter and remove it, restart.

BRIEF §4: zero confirmed messages lost, no reordering; publishing pauses only while a
leadership moves (the longest pause is printed, and bounded loosely: timing is not the test).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from integration.test_cluster import check_log, consume_all, publish_with_failover
from spate.client import Consumer
from support.cluster import Cluster, running_cluster

BATCH = 10
VOTERS_CONNECT_S = 30.0
"""How long a restarted metadata voter may take to be connected again (pysyncobj reconnects)."""
pause_s_max = 15.0
"""A generous bound on the longest publishing pause (one leadership transfer, plus the
client's reconnect); measured values are printed and in docs/operations.md."""


class _Traffic:
    """A producer (batches with confirms, failing over between nodes) and a consumer reading
    from a node that stays, both in threads."""

    def __init__(self, cluster: Cluster, stream: str, consumer_url: str) -> None:
        self.cluster = cluster
        self.stream = stream
        self.acked: list[bytes] = []
        self.read: list[tuple[int, bytes]] = []
        self.pauses: list[float] = []
        self.failure: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, name="producer"),
            threading.Thread(target=self._consume, args=(consumer_url,), name="consumer"),
        ]

    def __enter__(self) -> _Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)

    def _produce(self) -> None:
        batch = 0
        try:
            while not self._stop.is_set():
                bodies = [f"m{batch}-{i}".encode() for i in range(BATCH)]
                started = time.monotonic()
                publish_with_failover(self.cluster.urls(), self.stream, bodies, timeout_s=60)
                self.pauses.append(time.monotonic() - started)
                self.acked.extend(bodies)
                batch += 1
        except BaseException as error:  # reported by the test
            self.failure.append(error)

    def _consume(self, url: str) -> None:
        try:
            with Consumer(url, self.stream, start="first", timeout_s=20) as consumer:
                while not self._stop.is_set():
                    try:
                        event = consumer.receive(timeout=0.5)
                    except TimeoutError:
                        continue
                    self.read.append((event.offset, event.body))
        except BaseException as error:
            self.failure.append(error)

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count and not self.failure:
            assert time.monotonic() < deadline, f"only {len(self.acked)} of {count} confirmed"
            time.sleep(0.02)
        assert not self.failure, self.failure


def _replicas(cluster: Cluster, stream: str, partition: int = 0) -> dict[str, Any]:
    found = cluster.cli_json("partition", "list", stream)["partitions"]
    return next(p for p in found if p["partition"] == partition)


@pytest.mark.long
def test_grow_move_drain_and_stop_lose_nothing(tmp_path: Any) -> None:
    with running_cluster(tmp_path / "ops", nodes=3) as cluster:
        cluster.up(4)  # a fourth node: a non-voting metadata replica
        status = cluster.cli_json("cluster", "status")
        assert {n["node_id"] for n in status["nodes"] if n["alive"]} == {"n1", "n2", "n3", "n4"}
        assert len(status["metadata"]["voters"]) == 3
        cluster.cli("stream", "create", "orders", "--replicas", "3")
        before = _replicas(cluster, "orders")["replicas"]
        assert "n4" not in before
        source = cluster.leader_of("orders")  # the hardest case: move the leader's replica
        staying = next(n for n in before if n != source)
        drained = next(n for n in before if n not in (source, staying))
        with _Traffic(cluster, "orders", cluster.urls()[cluster.index_of(staying)]) as traffic:
            traffic.wait_for(5 * BATCH)
            moved = cluster.cli_json(
                "partition", "move", "orders", "0", "--from", source, "--to", "n4"
            )
            assert moved["state"] == "succeeded", moved
            traffic.wait_for(len(traffic.acked) + 3 * BATCH)
            after_move = _replicas(cluster, "orders")
            assert set(after_move["replicas"]) == (set(before) - {source}) | {"n4"}
            drain = cluster.cli_json("node", "drain", drained)
            assert drain["state"] == "succeeded", drain
            traffic.wait_for(len(traffic.acked) + 3 * BATCH)
            assert drained not in _replicas(cluster, "orders")["replicas"]
            # The drained node hosts none of the stream now and still describes all of it (it
            # asks a node that does)
            admin = cluster.state["nodes"][cluster.index_of(drained)]["admin"]
            confirmed = len(traffic.acked)  # before the call: the producer goes on meanwhile
            described = cluster.cli_json("stream", "describe", "orders", "--admin", admin)
            (only,) = described["partitions"]
            assert only["available"] and only["end_offset"] >= confirmed > 0, only
            cluster.stop_node(cluster.index_of(drained))
            traffic.wait_for(len(traffic.acked) + 3 * BATCH)
        assert not traffic.failure, traffic.failure
        acked = list(traffic.acked)
        longest = max(traffic.pauses)
        print(f"confirmed {len(acked)}; longest publishing pause {longest:.2f} s")
        assert longest < pause_s_max
        # The consumer that read throughout saw the log in order, without gaps.
        offsets = [o for o, _ in traffic.read]
        assert offsets == list(range(len(offsets)))
        # Everything confirmed is there, in order, on the partition's new replicas.
        final = _replicas(cluster, "orders")
        assert set(final["replicas"]) <= {"n1", "n2", "n3", "n4"} - {drained}
        url = cluster.urls()[cluster.index_of(staying)]
        check_log(consume_all(url, "orders", set(acked)), acked)
        _change_metadata_voters(cluster, drained)


def _voting(cluster: Cluster, admin: str | None = None) -> tuple[set[str], dict[str, Any]]:
    """The metadata voters as node ids, and the answering node's metadata status."""
    status = cluster.cli_json("cluster", "status", *(("--admin", admin) if admin else ()))
    voters = {n["node_id"] for n in status["nodes"] if n["metadata_voter"]}
    return voters, status["metadata"]


def _change_metadata_voters(cluster: Cluster, stopped: str) -> None:
    """ADR 0025 on the same cluster: promote the non-voting n4, demote the metadata leader and
    promote it back, kill a voter (the metadata service keeps its quorum, admin writes work),
    remove the dead voter; restarts keep every node's membership, and the removed voter comes
    back as a non-voting node."""
    refused = cluster.cli("cluster", "add-voter", "n4", check=False)  # `stopped` is down
    assert refused.returncode == 1 and "metadata voters are alive" in refused.stderr, refused
    cluster.up(4)
    # `dev up` returns once every node answers; the answering node's metadata replica may not
    # have reconnected to the restarted voter yet, and until then the change is refused with
    # the same "alive" condition (seen once in CI): retry that refusal only, for a while.
    deadline = time.monotonic() + VOTERS_CONNECT_S
    while True:
        attempt = cluster.cli("cluster", "add-voter", "n4", "--output", "json", check=False)
        if attempt.returncode == 0 or time.monotonic() > deadline:
            break
        assert "metadata voters are alive" in attempt.stderr, attempt.stderr
        time.sleep(0.5)
    assert attempt.returncode == 0, attempt.stderr
    added = json.loads(attempt.stdout)
    assert added["state"] == "succeeded" and added["kind"] == "add-voter", added
    voters, metadata = _voting(cluster)
    assert voters == {"n1", "n2", "n3", "n4"} and len(metadata["voters"]) == 4, metadata
    by_address = {n["metadata"]: n["node_id"] for n in cluster.state["nodes"]}
    demoted = by_address[metadata["leader"]]  # the hardest case: the leader leaves
    removed = cluster.cli_json("cluster", "remove-voter", demoted)
    assert removed["state"] == "succeeded", removed
    assert any("handing leadership over" in step for step in removed["log"]), removed["log"]
    assert removed["step"] == f"{demoted} follows the metadata service without a vote"
    assert cluster.cli_json("cluster", "add-voter", demoted)["state"] == "succeeded"
    # Kill a voter other than the one answering admin calls and n4; three of four commit.
    admin_node = next(n["node_id"] for n in cluster.state["nodes"] if n["admin"] == cluster.admin)
    killed = sorted({"n1", "n2", "n3"} - {admin_node, demoted})[0]
    cluster.kill9(cluster.index_of(killed))
    cluster.cli("stream", "create", "after-a-voter-died", "--replicas", "2")
    gone = cluster.cli_json("cluster", "remove-voter", killed)
    assert gone["state"] == "succeeded", gone
    voters = {"n1", "n2", "n3", "n4"} - {killed}
    too_few = cluster.cli("cluster", "remove-voter", "n4", check=False)
    assert too_few.returncode == 1 and "at least 3" in too_few.stderr, too_few.stderr
    unknown = cluster.cli("cluster", "remove-voter", "n9", check=False)
    assert unknown.returncode == 3 and "n9" in unknown.stderr, unknown.stderr
    # Restart: n4 (configured as non-voting) comes back a voter; the voter removed while it
    # was dead learns it from the others and comes back non-voting.
    cluster.stop_node(cluster.index_of("n4"))
    cluster.up(4)  # returns once every node is ready: it has a metadata leader
    nodes = [n for n in cluster.state["nodes"] if n["role"] == "node"]
    assert all(n["ready"] for n in nodes), nodes
    assert {n["node_id"] for n in nodes if n["metadata_voter"]} == voters  # as recorded
    seen, metadata = _voting(cluster)
    assert seen == voters and metadata["has_quorum"], metadata
    assert len(metadata["connected_peers"]) == 2, metadata  # the other two voters
    # Operations are kept in the metadata service: n4 (restarted) answers for one n1 ran.
    n4_admin = cluster.state["nodes"][cluster.index_of("n4")]["admin"]
    shown = cluster.cli_json("operation", "show", removed["id"], "--admin", n4_admin)
    assert shown["state"] == "succeeded" and shown["log"] == removed["log"], shown


@pytest.mark.long
def test_rebalance_moves_leaders_back_to_their_preferred_nodes(tmp_path: Any) -> None:
    with running_cluster(tmp_path / "skew", nodes=3) as cluster:
        cluster.cli("stream", "create", "events", "--partitions", "3", "--replicas", "3")
        # Skew: every leadership onto n1.
        for partition in range(3):
            cluster.leader_of("events", partition)
            done = cluster.cli_json(
                "partition", "transfer-leader", "events", str(partition), "--to", "n1"
            )
            assert done["state"] == "succeeded", done
        leaders = [p["leader"] for p in cluster.cli_json("partition", "list")["partitions"]]
        assert leaders == ["n1"] * 3
        result = cluster.cli_json("partition", "rebalance")
        assert result["state"] == "succeeded", result
        print("\n".join(result["log"]))
        placements = cluster.cli_json("partition", "list")["partitions"]
        assert all(p["leader"] == p["replicas"][0] for p in placements), placements
        counts: dict[str, int] = {}
        for p in placements:
            counts[p["leader"]] = counts.get(p["leader"], 0) + 1
        assert counts == {"n1": 1, "n2": 1, "n3": 1}
        # The automatic balancer, switched on, undoes a skew by itself.
        moved_away = next(p for p in placements if p["leader"] != "n1")
        cluster.cli_json(
            "partition", "transfer-leader", "events", str(moved_away["partition"]), "--to", "n1"
        )
        switched = cluster.cli_json("partition", "rebalance", "--auto", "on", "--interval", "1")
        assert switched["enabled"] and switched["interval_s"] == 1.0
        deadline = time.monotonic() + 60
        while True:
            placements = cluster.cli_json("partition", "list")["partitions"]
            if all(p["leader"] == p["replicas"][0] for p in placements):
                break
            assert time.monotonic() < deadline, placements
            time.sleep(0.5)
        off = cluster.cli_json("partition", "rebalance", "--auto", "off")
        assert not off["enabled"] and off["operations"], off
        # Bad requests get a clear status and exit code, and change nothing.
        missing = cluster.cli(
            "partition", "transfer-leader", "nope", "0", "--to", "n1", check=False
        )
        assert missing.returncode == 3 and "does not exist" in missing.stderr
        bad = cluster.cli("partition", "transfer-leader", "events", "9", "--to", "n1", check=False)
        assert bad.returncode == 2 and "partition" in bad.stderr
        alive = cluster.cli("node", "remove", "n2", check=False)
        assert alive.returncode == 1 and "alive" in alive.stderr
