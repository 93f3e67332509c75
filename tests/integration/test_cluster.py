"""A real three-process cluster (`spate dev up --nodes 3`): failures of whole nodes.

BRIEF §4 reliability: zero acknowledged messages lost, zero reorderings within a partition,
no acknowledgement without a majority on disk.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
from proton import ProtonException, symbol
from proton.utils import BlockingConnection
from spate.client import AttachRefused, Consumer, Producer, PublishRefused
from support.amqp_clients import offset_filter, partition_option
from support.cluster import Cluster

BATCH = 20


def publish_with_failover(
    urls: list[str], stream: str, bodies: list[bytes], timeout_s: float
) -> None:
    """Publish one batch with confirms, trying the nodes in turn until it is accepted. A batch
    cut off mid-way is sent again (at-least-once: the log may hold a duplicate, never a loss)."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        url = urls[attempt % len(urls)]
        attempt += 1
        try:
            with Producer(url, stream, timeout_s=5) as producer:
                producer.send_batch(bodies)
                return
        except (ProtonException, PublishRefused, AttachRefused, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def consume_all(
    url: str, stream: str, want: set[bytes], timeout_s: float = 60
) -> list[tuple[int, bytes]]:
    """(offset, body) from the first message until every body in `want` was seen."""
    seen: list[tuple[int, bytes]] = []
    missing = set(want)
    deadline = time.monotonic() + timeout_s
    with Consumer(url, stream, start="first", timeout_s=20) as consumer:
        while missing:
            assert time.monotonic() < deadline, f"{len(missing)} acknowledged messages missing"
            event = consumer.receive(timeout=20)
            seen.append((event.offset, event.body))
            missing.discard(event.body)
    return seen


def leader_epoch_seen_by_a_consumer(url: str, stream: str) -> int:
    """The `spate:leader-epoch` a partition-bound consumer attach is answered with."""
    connection = BlockingConnection(url, timeout=20)
    try:
        receiver = connection.create_receiver(
            stream, credit=1, options=[partition_option("0"), offset_filter("next")]
        )
        return int(receiver.link.remote_properties[symbol("spate:leader-epoch")])
    finally:
        connection.close()


def check_log(seen: list[tuple[int, bytes]], acked: list[bytes]) -> None:
    offsets = [o for o, _ in seen]
    assert offsets == list(range(len(seen))), "offsets must be consecutive from 0"
    first_seen: dict[bytes, int] = {}
    for offset, body in seen:
        first_seen.setdefault(body, offset)
    positions = [first_seen[body] for body in acked]
    assert positions == sorted(positions), "acknowledged messages were reordered"


def test_kill9_of_the_leader_while_publishing_loses_nothing(cluster3: Cluster) -> None:
    cluster3.cli("stream", "create", "orders", "--replicas", "3")
    leader = cluster3.leader_of("orders")
    epoch_before = leader_epoch_seen_by_a_consumer(cluster3.urls()[0], "orders")
    acked: list[bytes] = []
    stop = threading.Event()
    failure: list[BaseException] = []

    def publisher() -> None:
        batch = 0
        try:
            while not stop.is_set():
                bodies = [f"m{batch}-{i}".encode() for i in range(BATCH)]
                publish_with_failover(cluster3.urls(), "orders", bodies, timeout_s=60)
                acked.extend(bodies)
                batch += 1
        except BaseException as error:  # reported to the test thread below
            failure.append(error)

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        while len(acked) < 20 * BATCH and not failure:
            time.sleep(0.02)
        cluster3.kill9(cluster3.index_of(leader))
        before = len(acked)
        deadline = time.monotonic() + 60
        while len(acked) < before + 20 * BATCH and not failure:  # publishing resumes
            assert time.monotonic() < deadline, "publishing did not resume after the leader died"
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(90)
    assert not failure, failure
    survivor = next(u for i, u in enumerate(cluster3.urls()) if i != cluster3.index_of(leader))
    # the consumer can tell its partition changed leader
    assert leader_epoch_seen_by_a_consumer(survivor, "orders") > epoch_before
    cluster3.up(3)  # restart the killed node on its data
    cluster3.refresh()
    assert cluster3.leader_of("orders") is not None
    seen = consume_all(cluster3.urls()[cluster3.index_of(leader)], "orders", set(acked))
    check_log(seen, acked)


def test_a_wiped_replica_catches_up_and_serves_reads(cluster3: Cluster) -> None:
    cluster3.cli("stream", "create", "logs", "--replicas", "3")
    acked = [f"log {i}".encode() for i in range(300)]
    for start in range(0, len(acked), 50):
        publish_with_failover(cluster3.urls(), "logs", acked[start : start + 50], timeout_s=30)
    leader = cluster3.leader_of("logs")
    victim = next(i for i, n in enumerate(cluster3.state["nodes"]) if n["node_id"] != leader)
    cluster3.kill9(victim)
    shutil.rmtree(Path(cluster3.state["nodes"][victim]["data_dir"]))
    cluster3.up(3)
    cluster3.refresh()
    node = cluster3.state["nodes"][victim]
    deadline = time.monotonic() + 60
    while True:  # the wiped node's own view of its replica (describe answers with local stats)
        info = cluster3.cli_json("stream", "describe", "logs", "--admin", node["admin"])
        if info["partitions"][0]["messages"] == len(acked):
            break
        assert time.monotonic() < deadline, f"the wiped replica did not catch up: {info}"
        time.sleep(0.2)
    # read from the wiped node itself: no redirect following, so a refusal would fail the test
    connection = BlockingConnection(f"amqp://{node['amqp']}", timeout=20)
    try:
        receiver = connection.create_receiver("logs", credit=500, options=offset_filter("first"))
        bodies = []
        for _ in acked:
            message = receiver.receive(timeout=20)
            receiver.accept()
            bodies.append(bytes(message.body))
    finally:
        connection.close()
    assert bodies == acked


@pytest.mark.long
def test_without_a_majority_publishing_is_refused_then_resumes(cluster3: Cluster) -> None:
    cluster3.cli("stream", "create", "quorum", "--replicas", "3")
    before = [f"before {i}".encode() for i in range(50)]
    publish_with_failover(cluster3.urls(), "quorum", before, timeout_s=30)
    survivor = 0
    cluster3.stop_node(1)
    cluster3.stop_node(2)
    url = cluster3.urls()[survivor]
    refusal: BaseException | None = None
    deadline = time.monotonic() + 30
    while refusal is None:
        assert time.monotonic() < deadline, "a publish without a majority was never refused"
        try:
            with Producer(url, "quorum", timeout_s=10) as producer:
                producer.send(b"during outage")
            raise AssertionError("a message was acknowledged without a majority of replicas")
        except PublishRefused as refused:
            refusal = refused
        except AttachRefused as detached:
            refusal = detached
        except (ProtonException, OSError):  # e.g. a timeout while the leader steps down
            time.sleep(0.2)
    text = str(refusal)
    assert "amqp:resource-locked" in text or "amqp:link:redirect" in text, text
    cluster3.up(3)
    cluster3.refresh()
    after = [f"after {i}".encode() for i in range(50)]
    publish_with_failover(cluster3.urls(), "quorum", after, timeout_s=60)
    seen = consume_all(cluster3.urls()[0], "quorum", set(before + after))
    check_log(seen, before + after)
