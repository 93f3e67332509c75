"""A super stream's single active consumers on a real three-node cluster with a proxy gateway
(issue 8, ADR 0034): consumer processes (spate.client over python-qpid-proton,
tests/support/sac_member.py) attach to the super stream's address with one name — one through
a node (partitions it does not lead are relayed), one through the gateway — and the broker
spreads the partitions over them; one is killed with SIGKILL and the other takes its
partitions over after the stored offsets; a raw python-qpid-proton link through the gateway in
redirect mode joins and takes a partition over; then that partition's leader node is killed
and the links join its group again at the new leader without being ended.

Clauses proved (../shared/seeds/004_4cf6e8eab0240210.txt, cited as 004):
- 004 "Single Active Consumer Support" (super streams): "only one consumer instance will
  receive messages from a partition at a time"; the active consumers are spread over the
  instances (partition i to member i % size in joining order, RabbitMQ's rule).
- 004 "Single Active Consumer": "If the active consumer instance stops or crashes, one of the
  inactive instances takes over" and resumes "where the former active left off" (its stored
  offset): no message skipped; what is delivered twice is bounded by the killed consumer's
  unsettled window (its credit).
The AMQP contract is docs/amqp.md "Super streams"; its documented examples run here too.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proton import Message, Timeout, symbol
from proton.utils import BlockingConnection
from spate.client import Producer
from spate.core.superstreams import hash_partition
from support.amqp_clients import LinkProperties, run_doc_examples
from support.cluster import Cluster

MEMBER = Path(__file__).resolve().parents[1] / "support" / "sac_member.py"
CREDIT = 10
"""sac_member.py's credit: the bound on what a killed member had unsettled per link."""
WAIT_S = 60.0


class Member:
    """tests/support/sac_member.py as a process; its JSON lines collected by a thread."""

    def __init__(self, urls: list[str], stream: str, name: str, delay_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(MEMBER), ",".join(urls), stream, name, str(delay_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def events(self) -> list[dict[str, Any]]:
        return [line for line in list(self.lines) if "offset" in line]

    def wait_for(self, what: Callable[[], bool], why: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not what():
            if self.proc.poll() is not None:
                stderr = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"the member exited before {why}: {stderr[-2000:]}")
            assert time.monotonic() < deadline, f"no {why} within {WAIT_S} s: {self.lines[-3:]}"
            time.sleep(0.05)

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill9()


def publish(urls: list[str], keys: list[str]) -> dict[str, list[str]]:
    """Each key's message to the super stream (routed by its message-id); returns the bodies
    expected on each partition stream, in order."""
    expected: dict[str, list[str]] = {f"invoices-{p}": [] for p in range(3)}
    with Producer(urls, "invoices", timeout_s=30, reconnect_timeout_s=30) as producer:
        assert producer.send_batch([Message(id=key, body=key) for key in keys]) == len(keys)
    for key in keys:
        expected[f"invoices-{hash_partition(key, 3)}"].append(key)
    return expected


def by_stream(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        out.setdefault(event["stream"], []).append(event)
    return out


def handed_over(
    before: list[dict[str, Any]], after: list[dict[str, Any]], everything: list[str]
) -> None:
    """One partition stream read by one member (`before`), then by the one that took it over
    (`after`): each in order, together everything with no gap, and what both received no more
    than the first one's unsettled window (its credit)."""
    old, new = [e["offset"] for e in before], [e["offset"] for e in after]
    assert old == list(range(len(old))), "the first member read its partition in order"
    assert new, "the successor received nothing"
    resumed = new[0]
    assert new == list(range(resumed, len(everything))), "the successor skipped or repeated"
    assert resumed <= len(old), f"a gap: the first had {len(old)}, the next resumed at {resumed}"
    again = len(old) - resumed
    assert again <= CREDIT, f"{again} delivered twice, above the credit {CREDIT}"
    assert [e["body"] for e in after] == everything[resumed:]
    print(f"{after[0]['stream']}: first had {len(old)}, next resumed at {resumed} ({again} again)")


def test_two_consumer_processes_share_the_partitions_and_one_takes_over_after_a_kill(
    cluster3: Cluster,
) -> None:
    cluster3.cli("superstream", "create", "invoices", "--partitions", "3", "--replicas", "3")
    nodes = cluster3.urls()
    gateway = f"amqp://{cluster3.state['gateways'][0]['amqp']}"
    host, port = cluster3.state["gateways"][0]["amqp"].rsplit(":", 1)

    # docs/amqp.md's examples first: publish hello1, hello2, hello4 (python, then rhea), then
    # consume them as the single active consumer "billing": python takes three, rhea after it
    # the other three (what python accepted is stored: nothing twice, nothing skipped)
    run_doc_examples("super-stream example", host, int(port))
    seen = set()
    for output in run_doc_examples("super-stream-sac example", host, int(port)):
        assert "active on" in output, output
        read = [line.split() for line in output.splitlines() if "invoice of" in line]
        assert len(read) == 3, output
        seen |= {(words[0], int(words[1])) for words in read}
    assert seen == {(f"invoices-{p}", offset) for p in range(3) for offset in (0, 1)}
    documented = {
        f"invoices-{hash_partition(key, 3)}": [f"invoice of {key}"] * 2
        for key in ("hello1", "hello2", "hello4")
    }
    # the first through a node (its link relays the partitions led elsewhere), paced so that
    # it has deliveries in flight when it is killed; the second through the proxy gateway
    first = Member(nodes, "invoices", "settlement", delay_s=0.05)
    members = [first]
    try:
        first.wait_for(lambda: bool(first.lines), "attach")
        assert first.lines[0] == {
            "attached": True,
            "active": True,
            "streams": ["invoices-0", "invoices-1", "invoices-2"],
        }
        second = Member([gateway], "invoices", "settlement", delay_s=0.0)
        members.append(second)
        second.wait_for(lambda: bool(second.lines), "attach")
        assert second.lines[0] == {"attached": True, "active": False}  # told by delivery

        # spread: member i % 2 of partition i's group — invoices-1 is the second's
        keys = [f"key-{i}" for i in range(60)]
        expected = publish(nodes, keys)
        assert all(expected.values()), expected
        for stream, bodies in documented.items():  # a new name starts at `first`
            expected[stream] = bodies + expected[stream]

        def received() -> set[str]:
            return {e["body"] for m in members for e in m.events()}

        second.wait_for(lambda: received() >= set(keys), "the first batch")
        took = by_stream(second.events())
        assert set(took) == {"invoices-1"}, "the second is active on invoices-1 only"
        assert took["invoices-1"][0]["active"] and took["invoices-1"][0]["streams"] == [
            "invoices-1"
        ]
        kept = by_stream(first.events())
        assert {"invoices-0", "invoices-2"} <= set(kept)
        for stream in ("invoices-0", "invoices-2"):
            assert [e["body"] for e in kept[stream]] == expected[stream]
        # what the first had of invoices-1 (the documented messages) before it stepped down,
        # then the second's
        handed_over(kept.get("invoices-1", []), took["invoices-1"], expected["invoices-1"])

        more = [f"key-{i}" for i in range(60, 600)]
        before = len(first.events())
        later = publish(nodes, more)
        first.wait_for(lambda: len(first.events()) >= before + 30, "the second batch")
        first.kill9()  # mid-stream: it has up to CREDIT deliveries unsettled
        # it was told it handed invoices-1 over (the first delivery after that said so)
        assert first.events()[-1]["streams"] == ["invoices-0", "invoices-2"]

        second.wait_for(lambda: received() >= set(keys + more), "every message after the kill")
        had, took = by_stream(first.events()), by_stream(second.events())
        for stream in ("invoices-0", "invoices-2"):
            assert took[stream][0]["active"], "the takeover is announced on its first delivery"
            handed_over(had[stream], took[stream], expected[stream] + later[stream])
        assert [e["body"] for e in took["invoices-1"]][-len(later["invoices-1"]) :] == later[
            "invoices-1"
        ]
        assert second.events()[-1]["streams"] == ["invoices-0", "invoices-1", "invoices-2"]

        # a raw python-qpid-proton link through the gateway in redirect mode (proxied: the
        # gateway has the cluster secret) joins as the second member of each group and takes
        # invoices-1 over (1 % 2), after what the second member finished of it
        properties = {
            symbol("spate:consumer-name"): "settlement",
            symbol("spate:single-active-consumer"): True,
            symbol("spate:gateway-mode"): "redirect",
        }
        connection = BlockingConnection(gateway, timeout=30)
        try:
            third = connection.create_receiver(
                "invoices", credit=10, options=[LinkProperties(properties)]
            )
            assert third.link.remote_properties[symbol("spate:active")] is False
            key = next(k for k in (f"late-{i}" for i in range(100)) if hash_partition(k, 3) == 1)
            publish(nodes, [key])
            got = []
            while not got or got[-1].body != key:
                got.append(third.receive(timeout=30))
                third.accept()
            # before the new key: only what the second had not finished (automatic commits
            # finish an event when the next is asked for)
            assert len(got) - 1 <= CREDIT, [m.body for m in got]
            everything = expected["invoices-1"] + later["invoices-1"] + [key]
            offsets = [int(m.instructions[symbol("event-streams-offset")]) for m in got]
            assert offsets == list(range(len(everything) - len(got), len(everything)))
            assert [m.body for m in got] == everything[offsets[0] :]
            assert {m.instructions[symbol("spate:stream")] for m in got} == {"invoices-1"}
            assert got[0].instructions[symbol("spate:active")] is True

            # invoices-1's leader is killed: its groups go with it; both links join the group
            # again at the new leader (neither is ended) and one of them receives what comes
            # next, after the stored offset
            dead = cluster3.index_of(cluster3.leader_of("invoices-1"))
            cluster3.kill9(dead)
            cluster3.refresh()
            deadline = time.monotonic() + WAIT_S
            while cluster3.leader_of("invoices-1") == cluster3.state["nodes"][dead]["node_id"]:
                assert time.monotonic() < deadline, "invoices-1 kept its dead leader"
                time.sleep(0.2)
            live = [url for i, url in enumerate(nodes) if i != dead]
            after = next(k for k in (f"after-{i}" for i in range(100)) if hash_partition(k, 3) == 1)
            publish(live, [after])
            seen_by_third: list[str] = []
            while after not in seen_by_third and after not in received():
                assert time.monotonic() < deadline + WAIT_S, "nobody received after the kill"
                with contextlib.suppress(Timeout):  # LinkDetached here: the link was ended
                    seen_by_third.append(third.receive(timeout=0.2).body)
                    third.accept()
            assert second.proc.poll() is None
        finally:
            connection.close()
    finally:
        for member in members:
            member.stop()
