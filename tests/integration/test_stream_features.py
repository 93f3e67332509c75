"""Issue 8's proofs of deduplication and offset tracking on a real three-process cluster
(`spate dev up --nodes 3`: three nodes and a proxy gateway), with real clients in their own
processes — python-qpid-proton over raw AMQP (tests/integration/stream_client_process.py) and
rhea (tests/js/client.js) — killed with SIGKILL, like the partition leaders.

Clauses proved (../shared/seeds/004_4cf6e8eab0240210.txt, cited as 004):
- 004 "Message Deduplication": "If the producer connection unexpectedly closes, it will
  automatically recover and retry outstanding messages. The broker will then filter out
  messages it has already received and persisted. No more duplicates!"; "Restarting a Producer
  Where It Left Off": "the producer can restart from the beginning of the file: there would no
  duplicate messages because the producer has a name and the application sets publishing IDs";
  `getLastPublishingId`; "the sequence must be strictly increasing".
- 004 "Offset Tracking": "server-side offset tracking ... allows a new incarnation of the
  consumer to restart consuming where it left off"; "Considerations On Offset Tracking": "the
  last tracked offset may be a little behind the very last message the previous incarnation
  actually processed, so the consumer may see some messages that have been already processed"
  — here that is bounded by the consumer's unsettled window (credit) or its commit interval.
The AMQP contract is docs/amqp.md "Deduplication" and "Offset tracking" (ADR 0011, ADR 0012).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, Timeout, symbol, ulong
from proton.utils import BlockingConnection, LinkDetached
from spate.client import Consumer, Producer
from support.amqp_clients import (
    JS_DIR,
    LinkProperties,
    RunningGateway,
    offset_filter,
    partition_option,
    run_rhea,
    unique,
)
from support.cluster import Cluster

HERE = Path(__file__).resolve().parent
CLIENT_PROCESS = HERE / "stream_client_process.py"
PRODUCER_NAME = symbol("spate:producer-name")
LAST_ID = symbol("spate:last-publishing-id")
PUBLISHING_ID = symbol("x-opt-publishing-id")
CONSUMER_NAME = symbol("spate:consumer-name")
STORED = symbol("spate:stored-offset")
OFFSET = symbol("event-streams-offset")
WAIT_S = 60.0
"""Bound on every wait for the cluster or a client process (a loaded machine is slow, never
wrong: nothing below asserts on how long something took)."""


class JsonLinesProcess:
    """A client in its own process that reports in JSON lines on stdout (read on a thread)."""

    def __init__(self, argv: list[str], log: Path, *, cwd: Path | None = None) -> None:
        self.log = log
        self._stderr = log.open("w")
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            text = line.strip()
            self._queue.put(json.loads(text) if text.startswith("{") else {"text": text})
        self._queue.put(None)

    def tell(self, text: str, *, close: bool = False) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        if close:
            self.proc.stdin.close()

    def expect(self, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first new line that satisfies `predicate` (every line is kept in `lines`)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {what} within {WAIT_S} s: {self._tail()}"
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self._queue.put(None)
                raise AssertionError(f"exited ({self.proc.wait(5)}) before {what}: {self._tail()}")
            self.lines.append(line)
            if predicate(line):
                return line

    def _tail(self) -> str:
        return f"{self.lines[-5:]}\nstderr: {self.log.read_text()[-2000:]}"

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def drain(self) -> None:
        """Keep every line printed before the process ended."""
        self.proc.wait(10)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        self._queue.put(None)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill9()
        self._stderr.close()


@contextmanager
def client_process(argv: list[str], log: Path, **kwargs: Any) -> Iterator[JsonLinesProcess]:
    process = JsonLinesProcess(argv, log, **kwargs)
    try:
        yield process
    finally:
        process.close()


def python_client(mode: str, *args: str) -> list[str]:
    return [sys.executable, str(CLIENT_PROCESS), mode, *args]


def gateway_url(cluster: Cluster) -> str:
    return f"amqp://{cluster.state['gateways'][0]['amqp']}"


def gateway_knows_the_leader(cluster: Cluster, stream: str, partition: int = 0) -> str:
    """The gateway's URL, once its routing table names the partition's leader (it refreshes
    from metadata on its own clock): until then it refuses named links as retryable, as a
    client that retries would see. Probed with a named producer's attach, which asks the
    leader for the name's last id and stores nothing."""
    url = gateway_url(cluster)
    probe = LinkProperties(
        {PRODUCER_NAME: "gateway-probe", symbol("event-streams-partition"): symbol(str(partition))}
    )
    deadline = time.monotonic() + WAIT_S
    while True:
        connection = BlockingConnection(url, timeout=20)
        try:
            connection.create_sender(stream, name=unique("probe"), options=probe)
            return url
        except LinkDetached as refused:
            assert refused.condition == "amqp:resource-locked", refused
            assert time.monotonic() < deadline, f"the gateway never routed {stream}/{partition}"
        finally:
            connection.close()
        time.sleep(0.1)


def new_leader(cluster: Cluster, stream: str, old: str, partition: int = 0) -> str:
    """Once metadata reports a leader other than `old` (killed)."""
    cluster.refresh()  # the admin address of a live node
    deadline = time.monotonic() + WAIT_S
    while (leader := cluster.leader_of(stream, partition, timeout_s=WAIT_S)) == old:
        assert time.monotonic() < deadline, f"{stream}/{partition} kept its dead leader {old}"
        time.sleep(0.2)
    return leader


def read_all(
    url: str, stream: str, count: int, partition: str | None = None
) -> list[tuple[int, Any]]:
    """(offset, body) of the partition's first `count` messages, and a check that nothing
    follows them."""
    options: list[Any] = [offset_filter("first")]
    if partition is not None:
        options.append(partition_option(partition))
    connection = BlockingConnection(url, timeout=20)
    try:
        receiver = connection.create_receiver(stream, credit=500, options=options)
        got = []
        for _ in range(count):
            message = receiver.receive(timeout=20)
            receiver.accept()
            got.append((int(message.instructions[OFFSET]), message.body))
        with pytest.raises(Timeout):
            extra = receiver.receive(timeout=0.5)
            raise AssertionError(f"more than {count} messages: {extra.body!r}")
        return got
    finally:
        connection.close()


# Deduplication ----------------------------------------------------------------------------------


def test_a_named_proton_producer_stores_each_id_once_across_a_leader_kill_and_its_own(
    cluster3: Cluster, tmp_path: Path
) -> None:
    """004 "Message Deduplication" and "Restarting a Producer Where It Left Off": a producer
    process (raw AMQP: `spate:producer-name`, `x-opt-publishing-id`) publishes ids 0..N-1;
    at id 500 the partition leader is killed with -9 while W messages are in flight, and the
    producer resends what was unconfirmed through another node; at id 1000 the producer
    process is killed with -9 too, W messages in flight. A new process with the same name
    resends everything from id 0. The stream holds each id once, in id order."""
    count, window = 1500, 50
    cluster3.cli("stream", "create", "ledger", "--replicas", "3")
    urls = cluster3.urls()
    leader_url = urls[cluster3.index_of(cluster3.leader_of("ledger"))]
    common = ["--stream", "ledger", "--name", "ledger-app", "--count", str(count)]
    common += ["--prefix", "l", "--window", str(window)]
    first_run = python_client(
        "produce", *[a for u in [leader_url, *urls] for a in ("--url", u)], *common,
        "--checkpoint", "500", "--checkpoint", "1000",
    )  # fmt: skip
    with client_process(first_run, tmp_path / "producer-1.log") as producer:
        attached = producer.expect(lambda line: "attached" in line, "the first attach")
        assert attached["last"] is None  # a new name: nothing stored
        leader_url = attached["attached"]  # a named producer appends at the leader
        survivors = [u for u in urls if u != leader_url]
        at_500 = producer.expect(lambda line: line.get("checkpoint") == 500, "checkpoint 500")
        assert at_500["sent"] - at_500["confirmed"] == window  # in flight as the leader dies
        cluster3.kill9(urls.index(leader_url))
        producer.tell("go on")
        reattached = producer.expect(lambda line: "attached" in line, "a reattach")
        # 004 getLastPublishingId, at the new leader: at least every confirmed id, and never
        # more than was sent
        assert at_500["confirmed"] - 1 <= reattached["last"] < at_500["sent"], reattached
        at_1000 = producer.expect(lambda line: line.get("checkpoint") == 1000, "checkpoint 1000")
        producer.kill9()  # the producer dies with `window` messages in flight
    assert any("retry" in line for line in producer.lines)  # it did resend after the kill
    second_run = python_client("produce", *[a for u in survivors for a in ("--url", u)], *common)
    with client_process(second_run, tmp_path / "producer-2.log") as restarted:
        attached = restarted.expect(lambda line: "attached" in line, "the restart's attach")
        assert at_1000["confirmed"] - 1 <= attached["last"] < at_1000["sent"], attached
        restarted.expect(lambda line: "done" in line, "the restart to finish")
        assert restarted.proc.wait(10) == 0
    log = read_all(survivors[0], "ledger", count)
    assert [body for _, body in log] == [f"l-{i}" for i in range(count)]
    assert [offset for offset, _ in log] == list(range(count))
    cluster3.refresh()  # the admin address of a live node
    listed = cluster3.cli_json("producer", "list", "ledger")["producers"]
    assert [(p["name"], p["last_publishing_id"]) for p in listed] == [("ledger-app", count - 1)]
    print(
        f"proton: {reattached['last'] + 1 - at_500['confirmed']} resends after the leader kill and "
        f"{attached['last'] + 1} after the restart were not stored again"
    )


def test_a_named_rhea_producer_killed_with_the_leader_is_restarted_from_id_zero(
    cluster3: Cluster, tmp_path: Path
) -> None:
    """004 "Message Deduplication" ("No more duplicates!") and "Restarting a Producer Where It
    Left Off", with rhea, through the proxy gateway, on a link bound to partition 1 of three
    (`event-streams-partition`): the leader of partition 1 and the rhea process are killed
    with -9 while messages are in flight; a new rhea process resends every id from 0."""
    count = 1000
    cluster3.cli("stream", "create", "clicks", "--partitions", "3", "--replicas", "3")
    leader = cluster3.leader_of("clicks", partition=1)
    gateway_knows_the_leader(cluster3, "clicks", 1)
    gateway = RunningGateway(port=int(cluster3.state["gateways"][0]["amqp"].rsplit(":", 1)[1]))
    properties = {"spate:producer-name": "rhea-app", "event-streams-partition": "1"}
    publish = {
        "op": "publish", "address": "clicks", "bodies": {"prefix": "r", "count": count},
        "properties": properties, "first_publishing_id": 0,
    }  # fmt: skip
    args = {
        "port": gateway.port,
        "timeout_ms": int(WAIT_S * 1000),
        "steps": [publish | {"window": 20, "hold_after": 700, "progress_every": 20}],
    }
    with client_process(
        ["node", str(JS_DIR / "client.js")], tmp_path / "rhea-1.log", cwd=JS_DIR
    ) as producer:
        producer.tell(json.dumps(args), close=True)
        progress = producer.expect(
            lambda line: line.get("progress", {}).get("accepted", 0) >= 300, "300 accepted"
        )["progress"]
        cluster3.kill9(cluster3.index_of(leader))
        producer.kill9()
    assert progress["sent"] < count  # it died mid-way
    new_leader(cluster3, "clicks", leader, partition=1)
    gateway_knows_the_leader(cluster3, "clicks", 1)
    restarts = []
    for _ in range(5):  # a restart resends everything from 0; one refused while the gateway
        # switches to the new leader is resent by the next restart (as idempotent)
        step = run_rhea(gateway, [publish], timeout_s=WAIT_S)["steps"][0]
        restarts.append(step)
        if "error" in step:  # the attach or the link was refused: restart again
            time.sleep(0.5)
            continue
        last = int(step["attach_properties"]["spate:last-publishing-id"])
        assert last >= progress["accepted"] - 1, (last, progress)  # every confirmed id
        if step["outcomes"] == ["accepted"] * count:
            break
    else:
        raise AssertionError(f"a restarted rhea producer was refused: {restarts}")
    print(f"rhea: killed with {progress}; {len(restarts)} restart(s), the first after id {last}")
    log = read_all(gateway.url, "clicks", count, partition="1")
    assert [body for _, body in log] == [f"r{i}" for i in range(count)]


def rejected(sender: Any, message: Message) -> tuple[str, str]:
    delivery = sender.link.send(message)
    sender.connection.wait(lambda: bool(delivery.remote_state), 10)
    assert delivery.remote_state == Delivery.REJECTED, delivery.remote_state
    condition = delivery.remote.condition
    return condition.name, condition.description


def numbered(publishing_id: int, body: str) -> Message:
    return Message(body=body, annotations={PUBLISHING_ID: ulong(publishing_id)})


def test_an_id_going_backwards_on_one_link_is_rejected_and_harms_nothing(
    cluster3: Cluster,
) -> None:
    """004 "the sequence must be strictly increasing": within one link an id not above the
    previous one is misuse (`amqp:invalid-field`, naming the last id) and the link goes on;
    on a new link (a restart) the same id is a duplicate: accepted, not stored. At the leader
    directly and through the gateway."""
    cluster3.cli("stream", "create", "misuse", "--replicas", "3")
    leader_url = cluster3.urls()[cluster3.index_of(cluster3.leader_of("misuse"))]
    expected = []
    for url, name in (
        (leader_url, "direct"),
        (gateway_knows_the_leader(cluster3, "misuse"), "proxied"),
    ):
        named = LinkProperties({PRODUCER_NAME: name})
        connection = BlockingConnection(url, timeout=20)
        try:
            sender = connection.create_sender("misuse", name=unique("tx"), options=named)
            for i in range(5):
                assert sender.send(numbered(i, f"{name}-{i}")).remote_state == Delivery.ACCEPTED
            for backwards in (2, 4):
                condition, text = rejected(sender, numbered(backwards, f"{name}-again"))
                assert condition == "amqp:invalid-field", (condition, text)
                assert f"publishing id {backwards} is not above 4" in text, text
            assert sender.send(numbered(5, f"{name}-5")).remote_state == Delivery.ACCEPTED
            restarted = connection.create_sender("misuse", name=unique("tx"), options=named)
            assert restarted.link.remote_properties[LAST_ID] == 5
            duplicate = restarted.send(numbered(3, f"{name}-3 again"))
            assert duplicate.remote_state == Delivery.ACCEPTED  # a resend: not stored again
        finally:
            connection.close()
        expected += [f"{name}-{i}" for i in range(6)]
    log = read_all(leader_url, "misuse", len(expected))
    assert [body for _, body in log] == expected


# Offset tracking ---------------------------------------------------------------------------------


def fill(cluster: Cluster, stream: str, count: int) -> None:
    with Producer(cluster.urls(), stream, timeout_s=20) as producer:
        producer.send_batch([b"%d" % i for i in range(count)])


def named_consumer(
    url: str, stream: str, name: str, count: int, *, first: bool = False
) -> tuple[Any, list[int], Any]:
    """Attach a named consumer (no start filter unless `first`) and accept `count` messages:
    (the attach's stored offset, the offsets, the connection — its link still attached)."""
    options: list[Any] = [LinkProperties({CONSUMER_NAME: name})]
    if first:
        options.append(offset_filter("first"))
    connection = BlockingConnection(url, timeout=20)
    receiver = connection.create_receiver(stream, credit=50, options=options)
    stored = (receiver.link.remote_properties or {}).get(STORED)
    offsets = []
    for _ in range(count):
        offsets.append(int(receiver.receive(timeout=20).instructions[OFFSET]))
        receiver.accept()
    return stored, offsets, receiver


def detach(receiver: Any) -> None:
    """Detach (answered once the offset is stored) and close the connection."""
    receiver.close()
    receiver.connection.close()


def stored_offset(cluster: Cluster, stream: str, name: str) -> int | None:
    listed = cluster.cli_json("consumer", "offset", stream, name)["consumers"]
    return next((c["offset"] for c in listed), None)


def attached_links(cluster: Cluster, admin: str, stream: str, name: str) -> int:
    """Links of `name` counted by the node at `admin` (the leader counts them)."""
    listed = cluster.cli_json("consumer", "list", stream, "--admin", admin)["consumers"]
    return sum(c["attached"] for c in listed if c["name"] == name)


def test_a_named_consumer_resumes_after_a_detach_and_after_its_process_is_killed(
    cluster3: Cluster, tmp_path: Path
) -> None:
    """004 "Offset Tracking": a new incarnation restarts where the last one left off. After a
    detach, exactly; after a kill -9 of the consumer process mid-stream (raw AMQP through the
    gateway, credit 20), without a gap, and it sees again at most what was in its unsettled
    window (004 "Considerations": "may see some messages that have been already
    processed")."""
    count, credit = 3000, 20
    cluster3.cli("stream", "create", "bills", "--replicas", "3")
    fill(cluster3, "bills", count)
    gateway = gateway_knows_the_leader(cluster3, "bills")
    stored, offsets, receiver = named_consumer(gateway, "bills", "billing", 100, first=True)
    detach(receiver)
    assert (stored, offsets) == (None, list(range(100)))
    stored, offsets, receiver = named_consumer(gateway, "bills", "billing", 50)  # no filter
    detach(receiver)
    assert (stored, offsets) == (99, list(range(100, 150)))

    consumer_run = python_client(
        "consume", "--url", gateway, "--stream", "bills", "--name", "billing",
        "--credit", str(credit), "--pace-ms", "1", "--stall-at", "2000",
    )  # fmt: skip
    with client_process(consumer_run, tmp_path / "consumer.log") as consumer:
        attached = consumer.expect(lambda line: "attached" in line, "the attach")
        assert attached["stored"] == 149
        consumer.expect(lambda line: line.get("offset", 0) >= 1000, "offset 1000")
        consumer.kill9()
        consumer.drain()
    seen = [line["offset"] for line in consumer.lines if "offset" in line]
    assert seen == list(range(150, 150 + len(seen)))
    last = seen[-1]  # killed between 1000 and 2000 (where it stalls), of 3000
    # The gateway stores what the dead link was done with, then stops counting it at the
    # leader: once the leader counts no link, the stored offset is final.
    leader = cluster3.leader_of("bills")
    leader_admin = cluster3.state["nodes"][cluster3.index_of(leader)]["admin"]
    deadline = time.monotonic() + WAIT_S
    while attached_links(cluster3, leader_admin, "bills", "billing"):
        assert time.monotonic() < deadline, "the dead consumer's link is still counted"
        time.sleep(0.2)
    stored, offsets, receiver = named_consumer(gateway, "bills", "billing", count - 1 - last)
    detach(receiver)
    resumed = offsets[0]
    assert stored == resumed - 1 and stored <= last  # never ahead of what it processed
    assert resumed <= last + 1, "a gap: messages the dead consumer never saw were skipped"
    seen_again = last + 1 - resumed
    assert seen_again <= credit, f"{seen_again} redelivered, more than the window {credit}"
    print(f"killed at offset {last}: resumed at {resumed}, {seen_again} seen again")
    assert offsets == list(range(resumed, resumed + len(offsets)))


def test_confirmed_commits_survive_a_leader_kill_and_the_consumer_resumes_via_another_node(
    cluster3: Cluster,
) -> None:
    """004 "Manual Offset Tracking" (spate.client commit="manual": rcv-settle-mode second, the
    broker settles once the offset is replicated): the consumer reads at the leader and
    commits every 50 events; the leader is killed with -9 while the link is attached and 30
    events are taken but not committed. A new consumer with the name, connected to the node
    that neither led nor leads (it is redirected to the new leader), resumes right after the
    last confirmed commit: what it sees again is what was not committed."""
    count, commit_every = 1000, 50
    cluster3.cli("stream", "create", "audit", "--replicas", "3")
    fill(cluster3, "audit", count)
    leader = cluster3.leader_of("audit")
    urls = cluster3.urls()
    consumer = Consumer(
        urls[cluster3.index_of(leader)], "audit", name="auditor", start="first",
        commit="manual", credit=100, timeout_s=20,
    )  # fmt: skip
    try:
        committed = None
        for i in range(300):
            assert consumer.receive(timeout=20).offset == i
            if i % commit_every == commit_every - 1:
                committed = consumer.commit()
                assert committed == i
        taken = [consumer.receive(timeout=20).offset for _ in range(30)]  # not committed
        assert taken == list(range(300, 330))
        cluster3.kill9(cluster3.index_of(leader))
    finally:
        consumer.close()
    leader_now = new_leader(cluster3, "audit", leader)
    third = next(
        i for i, n in enumerate(cluster3.state["nodes"]) if n["node_id"] not in (leader, leader_now)
    )
    again = Consumer(
        urls[third], "audit", name="auditor", commit="manual", timeout_s=20,
        reconnect_timeout_s=WAIT_S,
    )  # fmt: skip
    try:
        assert again.stored_offset == committed == 299
        offsets = [again.receive(timeout=20).offset for _ in range(count - 300)]
        assert offsets == list(range(300, count))
        assert again.commit() == count - 1
    finally:
        again.close()
    shown = cluster3.cli_json("consumer", "offset", "audit", "auditor")["consumers"]
    assert [(c["name"], c["offset"]) for c in shown] == [("auditor", count - 1)]


def test_an_offset_reset_is_refused_while_the_name_is_attached_then_resumes_there(
    cluster3: Cluster,
) -> None:
    """004 "Offset Tracking" (a new incarnation starts where the stored offset says) under
    docs/amqp.md's reset rule: `spate consumer offset STREAM NAME --set OFFSET` while a link of
    the name is attached (here through the gateway) is refused with exit 1 and a message
    saying why, and stores nothing; after the detach it succeeds and the next attach resumes
    at OFFSET + 1."""
    cluster3.cli("stream", "create", "resets", "--replicas", "3")
    fill(cluster3, "resets", 20)
    gateway = gateway_knows_the_leader(cluster3, "resets")
    stored, offsets, receiver = named_consumer(gateway, "resets", "ops", 5, first=True)
    assert (stored, offsets) == (None, [0, 1, 2, 3, 4])
    try:
        refused = cluster3.cli("consumer", "offset", "resets", "ops", "--set", "10", check=False)
        assert refused.returncode == 1, refused
        assert "'ops'" in refused.stderr and "attached" in refused.stderr, refused.stderr
        assert "detach" in refused.stderr, refused.stderr
    finally:
        detach(receiver)
    shown = cluster3.cli_json("consumer", "offset", "resets", "ops")["consumers"]
    assert [(c["offset"], c["attached"]) for c in shown] == [(4, 0)]  # the refusal stored nothing
    done = cluster3.cli("consumer", "offset", "resets", "ops", "--set", "10")
    assert "resumes at 11" in done.stdout, done.stdout
    stored, offsets, receiver = named_consumer(gateway, "resets", "ops", 3)
    detach(receiver)
    assert (stored, offsets) == (10, [11, 12, 13])


def test_a_named_consumer_through_the_gateway_rides_a_leader_kill_and_stays_counted(
    cluster3: Cluster,
) -> None:
    """004 "Offset Tracking" through the proxy gateway: a named consumer's link outlives a
    leader kill -9. It goes on reading without a gap or a repeat, the new leader counts it (so
    a reset is still refused while it is attached, ADR 0012) and stores its offsets; after
    its detach the reset succeeds and the next attach resumes there. (Its offset is stored
    before the kill: a store that meets the dead leader ends the link instead, docs/amqp.md,
    and the consumer attaches again, as in the leader-kill test above.)"""
    cluster3.cli("stream", "create", "tally", "--replicas", "3")
    fill(cluster3, "tally", 400)
    leader = cluster3.leader_of("tally")
    gateway = gateway_knows_the_leader(cluster3, "tally")
    stored, offsets, receiver = named_consumer(gateway, "tally", "tally-app", 100, first=True)
    try:
        assert (stored, offsets) == (None, list(range(100)))
        deadline = time.monotonic() + WAIT_S
        while stored_offset(cluster3, "tally", "tally-app") != 99:
            assert time.monotonic() < deadline, "the accepted offsets were never stored"
            with contextlib.suppress(Timeout):  # the dispositions go out as the link pumps
                receiver.connection.wait(lambda: False, timeout=0.2)
        cluster3.kill9(cluster3.index_of(leader))
        leader_now = new_leader(cluster3, "tally", leader)
        admin = cluster3.state["nodes"][cluster3.index_of(leader_now)]["admin"]
        deadline = time.monotonic() + WAIT_S
        while attached_links(cluster3, admin, "tally", "tally-app") != 1:
            assert time.monotonic() < deadline, "the new leader does not count the live link"
            time.sleep(0.2)
        refused = cluster3.cli(
            "consumer", "offset", "tally", "tally-app", "--set", "49", check=False
        )
        assert refused.returncode == 1 and "attached" in refused.stderr, refused
        for expected in range(100, 200):  # the same link, served on
            assert int(receiver.receive(timeout=20).instructions[OFFSET]) == expected
            receiver.accept()
    finally:
        detach(receiver)
    shown = cluster3.cli_json("consumer", "offset", "tally", "tally-app", "--admin", admin)
    assert [(c["offset"], c["attached"]) for c in shown["consumers"]] == [(199, 0)]
    cluster3.cli("consumer", "offset", "tally", "tally-app", "--set", "49")
    stored, offsets, receiver = named_consumer(gateway, "tally", "tally-app", 2)
    detach(receiver)
    assert (stored, offsets) == (49, [50, 51])
