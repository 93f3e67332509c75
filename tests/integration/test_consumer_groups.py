"""Consumer groups with epochs on a real three-node cluster (issue 9, ADR 0015; 000 §4.5.2):
an epoch takeover between two processes through the proxy gateway and a node, the epoch
surviving kill -9 of every node at once, a holder riding a leader kill, and docs/amqp.md's
examples as written."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message, symbol, ulong
from proton.utils import BlockingConnection
from support.amqp_clients import LinkProperties, run_doc_examples
from support.cluster import Cluster, running_cluster
from support.group_crew import Crew, settle

MEMBER = Path(__file__).resolve().parents[1] / "support" / "group_member.py"
GROUP = symbol("event-streams-consumer-group")
EPOCH = symbol("event-streams-epoch")
PARTITION = symbol("event-streams-partition")
STORED = symbol("spate:stored-offset")


class Member:
    """tests/support/group_member.py in its own process; its JSON lines in a queue."""

    def __init__(self, url: str, stream: str, group: str, epoch: int | None, credit: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(MEMBER), url, stream, group, "0", str(epoch or "-"), str(credit)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def next(self, timeout_s: float = 30) -> dict[str, Any]:
        return self.events.get(timeout=timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


# The tests that kill no node share one cluster (a start is ~10 s), on one worker.
shared = pytest.mark.xdist_group("consumer-groups-shared")


@pytest.fixture(scope="module")
def shared3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Shared: each test creates its own stream and group and kills no node."""
    with running_cluster(tmp_path_factory.mktemp("groups") / "cluster3", nodes=3) as cluster:
        yield cluster


def publish(url: str, stream: str, bodies: list[str]) -> None:
    conn = BlockingConnection(url, timeout=30)
    try:
        sender = conn.create_sender(stream, options=LinkProperties({PARTITION: symbol("0")}))
        for body in bodies:
            sender.send(Message(body=body))
    finally:
        conn.close()


def wait_served(url: str, stream: str, partitions: int = 1, timeout_s: float = 60) -> None:
    """Until `url` (a gateway) serves every partition of `stream`: its routes follow the
    metadata by a refresh, so a partition whose leader is known may still be refused there
    (retryable) for a moment after the stream was created or a leader changed."""
    deadline = time.monotonic() + timeout_s
    for p in range(partitions):
        while True:
            conn = BlockingConnection(url, timeout=30)
            try:
                conn.create_sender(stream, options=LinkProperties({PARTITION: symbol(str(p))}))
                break
            except Exception as refused:
                if "resource-locked" not in str(refused) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            finally:
                conn.close()


def attach(url: str, stream: str, group: str, epoch: int | None = None) -> tuple[Any, Any]:
    """(connection, receiver) holding partition 0 for the group."""
    props: dict[Any, Any] = {GROUP: group, PARTITION: symbol("0")}
    if epoch is not None:
        props[EPOCH] = ulong(epoch)
    conn = BlockingConnection(url, timeout=30)
    try:
        return conn, conn.create_receiver(stream, credit=100, options=LinkProperties(props))
    except Exception:
        conn.close()
        raise


def attach_when_led(url: str, stream: str, group: str, epoch: int | None) -> tuple[Any, Any]:
    """`attach`, retried while the partition has no leader yet (retryable conditions)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return attach(url, stream, group, epoch)
        except Exception as refused:
            text = str(refused)
            retryable = "resource-locked" in text and "already has an active receiver" not in text
            # a gateway whose routes lag a restart passes a node's redirect on: again, later
            retryable = retryable or "link:redirect" in text
            if not retryable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.long
def test_an_epoch_takeover_between_processes_commits_then_survives_kill9_of_every_node(
    cluster3: Cluster,
) -> None:
    cluster3.cli("stream", "create", "ledger", "--partitions", "2", "--replicas", "3")
    cluster3.leader_of("ledger", 0)
    gateway = f"amqp://{cluster3.state['gateways'][0]['amqp']}"
    wait_served(gateway, "ledger", 2)
    publish(gateway, "ledger", [f"m{i}" for i in range(10)])
    holder = Member(gateway, "ledger", "billing", None, credit=5)
    try:
        assert holder.next() == {"attached": 0, "stored": None}
        # the holder attached without a filter: `next`, so it sees what comes after it
        publish(gateway, "ledger", [f"n{i}" for i in range(10)])
        assert [holder.next()["body"] for _ in range(5)] == [f"n{i}" for i in range(5)]
        time.sleep(0.5)  # its accepts reach the gateway (batched commits: flushed on takeover)
        leader_url = cluster3.amqp_url(cluster3.index_of(cluster3.leader_of("ledger")))
        conn, thief = attach_when_led(leader_url, "ledger", "billing", 3)
        try:
            props = thief.link.remote_properties
            assert props[EPOCH] == 3
            stored = props[STORED]
            assert stored >= 14  # after the holder's accepted n4 (offset 14)
            got = []
            for _ in range(19 - stored):
                got.append(thief.receive(timeout=30).body)
                thief.accept()
            assert got == [f"n{i}" for i in range(stored - 9, 10)]  # no gap
        finally:
            conn.close()
        events = [holder.next()]
        while "detached" not in events[-1]:
            events.append(holder.next())
        detached = events[-1]
        assert detached["detached"] == "amqp:link:stolen", events
        late = [e["body"] for e in events[:-1]]
        assert set(late) <= {f"n{i}" for i in range(5, 10)}  # its unsettled window only
    finally:
        holder.stop()
    for index in range(3):  # every node at once: the epoch was majority-fsynced
        cluster3.kill9(index)
    cluster3.up(3)
    cluster3.leader_of("ledger")
    with pytest.raises(Exception, match="precondition-failed") as stale:
        attach_when_led(gateway, "ledger", "billing", 2)
    assert "stale" in str(stale.value)
    conn, again = attach_when_led(gateway, "ledger", "billing", None)
    try:
        assert again.link.remote_properties[EPOCH] == 3  # never reset
        assert again.link.remote_properties[STORED] == 19
    finally:
        conn.close()


def test_a_holder_rides_a_leader_kill_by_attaching_again_with_its_epoch(
    cluster3: Cluster,
) -> None:
    cluster3.cli("stream", "create", "tally", "--replicas", "3")
    gateway = f"amqp://{cluster3.state['gateways'][0]['amqp']}"
    wait_served(gateway, "tally")
    publish(gateway, "tally", ["a0", "a1"])
    leader = cluster3.leader_of("tally")
    holder = Member(gateway, "tally", "audit", 4, credit=10)
    try:
        assert holder.next()["attached"] == 4
        cluster3.kill9(cluster3.index_of(leader))
        detached = holder.next(60)
        assert "detached" in detached, detached  # ownership is the leader's: it ends
    finally:
        holder.stop()
    conn, again = attach_when_led(gateway, "tally", "audit", 4)
    try:
        assert again.link.remote_properties[EPOCH] == 4  # the same epoch holds it again
        publish(gateway, "tally", ["a2"])
        assert again.receive(timeout=30).body == "a2"
    finally:
        conn.close()


@shared
def test_the_docs_examples_run_as_written(shared3: Cluster) -> None:
    shared3.cli("stream", "create", "orders", "--replicas", "3")
    shared3.leader_of("orders")
    host, port = shared3.state["gateways"][0]["amqp"].rsplit(":", 1)
    wait_served(f"amqp://{host}:{port}", "orders")
    for output in run_doc_examples("consumer-group example", host, int(port)):
        assert "epoch" in output


# coordinator members on three nodes (003 "Consumer Groups", "Consumer Group Rebalancing") ------


@shared
def test_three_then_five_then_two_members_share_six_partitions_without_loss(
    shared3: Cluster,
) -> None:
    shared3.cli("stream", "create", "work", "--partitions", "6", "--replicas", "3")
    shared3.cli(
        "group", "create", "work", "crew", "--strategy", "round-robin", "--rebalance-delay-ms", "0"
    )
    for p in range(6):
        shared3.leader_of("work", p)
    gateway = f"amqp://{shared3.state['gateways'][0]['amqp']}"
    wait_served(gateway, "work", 6)
    published: dict[int, int] = dict.fromkeys(range(6), 0)
    conn = BlockingConnection(gateway, timeout=30)
    senders = [
        conn.create_sender(
            "work", name=f"tx-{p}", options=LinkProperties({PARTITION: symbol(str(p))})
        )
        for p in range(6)
    ]

    def publish_round() -> None:
        for p, sender in enumerate(senders):
            sender.send(Message(body=f"{p}-{published[p]}"))
            published[p] += 1

    crew = Crew(gateway, "work", "crew")
    try:
        for size in (3, 5, 2):
            if size > len(crew.members):
                crew.add(size - len(crew.members))
            else:
                crew.remove(len(crew.members) - size)
            settle(crew, publish_round, 6)
            held = crew.assignments()
            assert len(held) == size
        for _ in range(3):
            publish_round()
        crew.wait_delivered(published, 60)  # every message published reaches a member
        with crew.lock:
            got = list(crew.got)
        takers: dict[tuple[int, int], set[int]] = {}
        for ident, p, o in got:
            takers.setdefault((p, o), set()).add(ident)
        twice = [key for key, who in takers.items() if len(who) > 1]
        # only around hand-overs: what a member had been sent and not finished when it gave
        # the partition up (its unsettled window, credit 20), at most 6 moves per rebalance
        assert len(twice) <= 3 * 6 * 20, twice
        described = shared3.cli_json("group", "describe", "work", "crew")
        assert described["name"] == "crew" and described["defined"] is True
    finally:
        crew.close()
        conn.close()


@shared
def test_a_killed_member_s_partitions_move_to_the_others(shared3: Cluster) -> None:
    shared3.cli("stream", "create", "jobs", "--partitions", "4", "--replicas", "3")
    shared3.cli("group", "create", "jobs", "pool", "--rebalance-delay-ms", "0")
    for p in range(4):
        shared3.leader_of("jobs", p)
    gateway = f"amqp://{shared3.state['gateways'][0]['amqp']}"
    wait_served(gateway, "jobs", 4)
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, gateway, "jobs", "pool"], stdout=subprocess.PIPE, text=True
    )
    crew = Crew(gateway, "jobs", "pool")
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "joined"
        crew.add(1)
        count = dict.fromkeys(range(4), 0)

        def publish_round() -> None:
            for p in range(4):
                publish_one(gateway, "jobs", p, f"{p}-{count[p]}")
                count[p] += 1

        deadline = time.monotonic() + 60
        while len(next(iter(crew.assignments().values()))) != 2:
            publish_round()
            time.sleep(0.3)
            assert time.monotonic() < deadline, crew.assignments()
        victim.kill()  # kill -9: its connection drops, its link goes, the group rebalances
        victim.wait(10)
        start = time.monotonic()
        settle(crew, publish_round, 4, timeout_s=30)  # within the 30 s session timeout
        assert time.monotonic() - start < 30
        assert next(iter(crew.assignments().values())) == frozenset(range(4))
    finally:
        if victim.poll() is None:
            victim.kill()
        crew.close()


VICTIM = """
import sys
from spate.client import GroupConsumer
member = GroupConsumer(sys.argv[1], sys.argv[2], sys.argv[3])
print("joined", flush=True)
while True:
    member.receive(timeout=None)
"""


def publish_one(url: str, stream: str, partition: int, body: str) -> None:
    conn = BlockingConnection(url, timeout=30)
    try:
        sender = conn.create_sender(
            stream, options=LinkProperties({PARTITION: symbol(str(partition))})
        )
        sender.send(Message(body=body))
    finally:
        conn.close()


def test_group_definitions_and_members_survive_a_metadata_leader_kill(cluster3: Cluster) -> None:
    cluster3.cli("stream", "create", "audit", "--partitions", "2", "--replicas", "3")
    cluster3.cli("group", "create", "audit", "auditors", "--rebalance-delay-ms", "0")
    status = cluster3.cli_json("cluster", "status")
    leader_address = status["metadata"]["leader"]
    leader = next(
        n["node_id"] for n in status["nodes"] if n["endpoints"]["metadata"] == leader_address
    )
    cluster3.kill9(cluster3.index_of(leader))
    cluster3.refresh()  # the admin address moves to a live node
    deadline = time.monotonic() + 60
    while True:
        done = cluster3.cli(
            "group", "describe", "audit", "auditors", "--output", "json", check=False
        )
        if done.returncode == 0:
            break
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.5)
    described = json.loads(done.stdout)
    assert described["definition"]["strategy"] == "round-robin"
    gateway = f"amqp://{cluster3.state['gateways'][0]['amqp']}"
    from spate.client import GroupConsumer

    deadline = time.monotonic() + 60
    while True:
        try:
            member = GroupConsumer(gateway, "audit", "auditors", reconnect_timeout_s=30)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    try:
        wait_served(gateway, "audit", 2)
        publish_one(gateway, "audit", 1, "after")
        assert member.receive(timeout=60).body == "after"
    finally:
        member.close()


def test_a_group_consumer_rides_the_kill_of_its_coordinator_s_leader(cluster3: Cluster) -> None:
    """The coordinator lives at partition 0's leader: kill -9 it; the member's link ends, it
    attaches again (reconnect_timeout_s), rejoins the group at the new leader and receives
    every partition's messages again, after the group's committed offsets."""
    from spate.client import GroupConsumer

    cluster3.cli("stream", "create", "ride", "--partitions", "3", "--replicas", "3")
    cluster3.cli("group", "create", "ride", "riders", "--rebalance-delay-ms", "0")
    for p in range(3):
        cluster3.leader_of("ride", p)
    gateway = f"amqp://{cluster3.state['gateways'][0]['amqp']}"
    wait_served(gateway, "ride", 3)
    member = GroupConsumer(gateway, "ride", "riders", reconnect_timeout_s=60)
    try:
        for p in range(3):
            publish_one(gateway, "ride", p, f"before-{p}")
        got = {member.receive(timeout=60).body for _ in range(3)}
        assert got == {f"before-{p}" for p in range(3)}
        home = cluster3.leader_of("ride", 0)
        cluster3.kill9(cluster3.index_of(home))
        deadline = time.monotonic() + 60
        for p in range(3):
            while True:  # the partitions' leaders move too: publish once they have one
                try:
                    publish_one(gateway, "ride", p, f"after-{p}")
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    time.sleep(0.5)
        after = set()
        while len(after) < 3:
            try:
                body = member.receive(timeout=90).body
            except TimeoutError:
                log = Path(cluster3.state["gateways"][0]["log"]).read_text()[-3000:]
                raise AssertionError(
                    f"reconnects {member.reconnects}, assignment {member.assignment}, got "
                    f"{after}; the gateway's log ends:\n{log}"
                ) from None
            assert not body.startswith("before"), body  # committed: not delivered again
            after.add(body)
        assert after == {f"after-{p}" for p in range(3)}
        assert member.reconnects >= 1
    finally:
        member.close()


@shared
def test_members_on_nodes_that_do_not_lead_the_home_partition(shared3: Cluster) -> None:
    """A member attached to a node's own listener where partition 0 (the coordinator's home)
    is led elsewhere: the node relays the coordinator's calls, claims at each partition's
    leader and reads from its own replicas."""
    from spate.client import GroupConsumer

    shared3.cli("stream", "create", "spread", "--partitions", "3", "--replicas", "3")
    shared3.cli("group", "create", "spread", "readers", "--rebalance-delay-ms", "0")
    for p in range(3):
        shared3.leader_of("spread", p)
    wait_served(f"amqp://{shared3.state['gateways'][0]['amqp']}", "spread", 3)
    home = shared3.index_of(shared3.leader_of("spread", 0))
    others = [i for i in range(3) if i != home]
    members = [
        GroupConsumer(shared3.amqp_url(i), "spread", "readers", start="first") for i in others
    ]
    try:
        gateway = f"amqp://{shared3.state['gateways'][0]['amqp']}"
        for p in range(3):
            publish_one(gateway, "spread", p, f"x{p}")
        deadline = time.monotonic() + 60
        got: set[str] = set()
        while len(got) < 3:
            for member in members:
                with contextlib.suppress(TimeoutError):
                    got.add(member.receive(timeout=0.5).body)
            assert time.monotonic() < deadline, got
        assert got == {"x0", "x1", "x2"}
    finally:
        for member in members:
            member.close()


@pytest.mark.long
def test_a_paused_leader_s_partition_moves_on_without_a_second_holder(cluster3: Cluster) -> None:
    """SIGSTOP the leader of a partition a member holds (a pause longer than the election
    and the gateway's liveness limit, ADR 0008 "Liveness"): the gateway gives the silent node
    up, the member drops the partition and claims it again at the new leader once that leader
    settled (ADR 0015 "Leader changes"), and receives what is published meanwhile — before the
    paused node resumes; after SIGCONT nothing arrives twice."""
    from spate.client import GroupConsumer

    cluster3.cli("stream", "create", "pause", "--partitions", "3", "--replicas", "3")
    cluster3.cli("group", "create", "pause", "stoppers", "--rebalance-delay-ms", "0")
    leaders = [cluster3.leader_of("pause", p) for p in range(3)]
    gateway = f"amqp://{cluster3.state['gateways'][0]['amqp']}"
    wait_served(gateway, "pause", 3)
    member = GroupConsumer(gateway, "pause", "stoppers", reconnect_timeout_s=90)
    # a node leading some partition other than 0 (the coordinator's home) if there is one
    paused = next((n for n in leaders[1:] if n != leaders[0]), leaders[-1])
    pid = cluster3.node_pid(cluster3.index_of(paused))
    try:
        for p in range(3):
            publish_one(gateway, "pause", p, f"before-{p}")
        got = [member.receive(timeout=60).body for _ in range(3)]
        assert sorted(got) == [f"before-{p}" for p in range(3)]
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 90
        for p in range(3):
            while True:  # refused (retryable) until the partition has a live leader
                try:
                    publish_one(gateway, "pause", p, f"during-{p}")
                    break
                except Exception:
                    assert time.monotonic() < deadline, f"no leader took over {p}"
                    time.sleep(0.5)
        during = [member.receive(timeout=90).body for _ in range(3)]
        assert sorted(during) == [f"during-{p}" for p in range(3)], during
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        os.kill(pid, signal.SIGCONT)
        for p in range(3):
            publish_one(gateway, "pause", p, f"after-{p}")
        after = [member.receive(timeout=60).body for _ in range(3)]
        assert sorted(after) == [f"after-{p}" for p in range(3)], after  # nothing twice
        with pytest.raises(TimeoutError):
            member.receive(timeout=2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        member.close()
