"""The chaos workload (issue 13): producers and consumers on a real cluster, every operation
recorded in the history (chaos.checker's format) as it happens.

- Producer process `p<i>` publishes to partition i % P of the stream, through the gateways (both
  listed, the first in turn: it fails over to the other) or (every third producer) directly to
  the nodes, with deduplication on: producer name `p<i>`,
  value `p<i>-<n>` with the explicit publishing id n + 1, one message at a time, each waiting
  for its confirm. `ok` = accepted; `fail` = refused and not retryable (definitely not stored);
  `info` = no answer (timeout, lost connection): after one, the producer reconnects and goes on
  with the next number (a later resend of the same value would carry the same id).
- Consumer process `c<p>` reads partition p from its first offset through the gateways, live,
  reconnecting and resuming after its last offset; each delivery is a `read` `ok`.
- Consumer-group members `g<p>a` and `g<p>b` (group `chaos`) take partition p from each other
  in turn, each time with the next epoch (`grant`: invoke {partition, epoch}; ok {partition,
  epoch, stored}), read it (`group-read`) and commit by hand every few messages (`commit`
  {partition, epoch, offset}): the checker's fenced-commit, commit-lost and group-skip. Now and
  then (`STALE_PROBE_CHANCE`) a member first asks for an epoch below the greatest one already
  granted (`grant` with "probe": true): it must be refused (the checker's stale-grant).
- Named consumer `n<p>` (server-side offset tracking: the broker stores its offset under the
  name `n<p>`, ADR 0012) reads partition p through the gateways in sessions of a few seconds
  each: `attach` with no start (so: right after the stored offset) and the stored offset the
  attach reply carried, `named-read`s, a `named-commit` by hand every few messages and before
  closing; a session ends early when its link fails (no transparent reattach: the next
  session's attach is the resume the checker judges).
- Single active consumers `s<p>a` and `s<p>b` share the name `s<p>` on partition p (ADR 0013):
  the same sessions as a named consumer's (`sac-attach`, `sac-read`, `sac-commit`), one of
  the two receiving at a time; when the active one's session ends the other takes over after
  the stored offset.
- Routed producers `r<i>` publish to the super stream (its partition streams `<super>-0`..)
  through the gateways, each message with the routing key `k<n mod 37>` in its
  `event-streams-group-key`, no deduplication (a super-stream sender takes no producer name),
  one at a time, never resending: `send` with partition `SUPER_BASE + mmh3(key) % N`, the
  partition stream the key must land on, computed here (RabbitMQ's rule, ADR 0014).
- `final_read` reads every partition whole after the faults are healed, from the gateway
  (process "final") and from each node directly (the per-replica reads for `diverged`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import mmh3
from spate.client import Consumer, Producer
from spate.client.errors import (
    AttachRefused,
    ConnectionLost,
    PublishRefused,
    is_retryable_outcome,
)
from spate.client.messages import MessageParts

from chaos.checker import SUPER_BASE

GROUP = "chaos"
ROUTING_SEED = 104729
"""RabbitMQ's stream clients' MurmurHash3 seed (issue 8)."""
ROUTING_KEYS = 37
GROUP_COMMIT_EVERY = 10
NAMED_COMMIT_EVERY = 7
NAMED_FS = ("attach", "named-read", "named-commit")
SAC_FS = ("sac-attach", "sac-read", "sac-commit")
"""The history's `f` of a named consumer's and a single active consumer's attach, read and
commit (chaos.checker)."""
STALE_PROBE_CHANCE = 0.25
"""Of a member's turns, those that begin by asking for a stale epoch (which must be refused)."""
SEND_TIMEOUT_S = 5.0
RECONNECT_TIMEOUT_S = 10.0
READ_IDLE_S = 3.0
FINAL_READ_TIMEOUT_S = 120.0


class History:
    """Operations in the order they happened, appended to a JSON-lines file as they come."""

    def __init__(self, path: Path) -> None:
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._file: TextIO = path.open("w")
        self.ops: list[dict[str, Any]] = []

    def record(self, process: str, kind: str, f: str, value: Any = None) -> dict[str, Any]:
        op = {
            "process": process,
            "type": kind,
            "f": f,
            "value": value,
            "time": round(time.monotonic() - self.started, 6),
        }
        with self._lock:
            self.ops.append(op)
            self._file.write(json.dumps(op) + "\n")
        return op

    def close(self) -> None:
        with self._lock:
            self._file.close()


class Workload:
    def __init__(  # noqa: PLR0917 (the run's settings, named at the one call)
        self,
        history: History,
        gateway_urls: list[str],
        node_urls: list[str],
        stream: str,
        partitions: int,
        producers: int,
        admin_addresses: list[str] | None = None,
        super_stream: tuple[str, int] | None = None,
    ) -> None:
        """`super_stream`: (name, partition count) for the routed producers, none without."""
        self.history = history
        self.gateway_urls, self.node_urls = gateway_urls, node_urls
        self.admin_addresses = admin_addresses or []
        self.super_stream = super_stream
        self.stream, self.partitions, self.producers = stream, partitions, producers
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self._epochs = dict.fromkeys(range(partitions), 0)
        self._granted = dict.fromkeys(range(partitions), 0)
        """The greatest epoch whose grant has been acknowledged, per partition."""
        self._epoch_lock = threading.Lock()

    def start(self) -> None:
        for i in range(self.producers):
            self._spawn(f"p{i}", functools.partial(self._produce, i))
        for p in range(self.partitions):
            self._spawn(f"c{p}", functools.partial(self._consume, p))
        for p in range(self.partitions):
            for slot in "ab":
                self._spawn(f"g{p}{slot}", functools.partial(self._group_member, p, slot))
        for p in range(self.partitions):
            self._spawn(f"n{p}", functools.partial(self._named_consumer, p))
            for slot in "ab":
                sac = functools.partial(self._named_consumer, p, f"s{p}{slot}", f"s{p}")
                self._spawn(f"s{p}{slot}", sac)
        if self.super_stream is not None:
            for i in range(2):
                self._spawn(f"r{i}", functools.partial(self._route, i, *self.super_stream))
        if self.admin_addresses:
            self._spawn("admin", self._administer)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(SEND_TIMEOUT_S + RECONNECT_TIMEOUT_S + 30)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        def run() -> None:
            try:
                target()
            except Exception as error:  # a bug in the harness: reported, never hidden
                self.errors.append(f"{name}: {type(error).__name__}: {error}")
                raise

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _urls(self, i: int) -> list[str]:
        return self.node_urls if i % 3 == 2 else self._gateways(i)

    def _gateways(self, i: int) -> list[str]:
        """Every gateway, the i-th (in turn) first."""
        first = i % len(self.gateway_urls)
        return self.gateway_urls[first:] + self.gateway_urls[:first]

    def _produce(self, i: int) -> None:
        process, partition = f"p{i}", i % self.partitions
        producer: Producer | None = None
        n = 0
        while not self.stopping.is_set():
            if producer is None:
                try:
                    producer = Producer(
                        self._urls(i),
                        self.stream,
                        partition=partition,
                        name=process,
                        timeout_s=SEND_TIMEOUT_S,
                        reconnect_timeout_s=RECONNECT_TIMEOUT_S,
                    )
                except (OSError, TimeoutError, Exception):  # no cluster to talk to yet
                    time.sleep(0.5)
                    continue
            text = f"{process}-{n}"
            value = {"partition": partition, "value": text}
            if not self._send(process, producer, value, text.encode(), n + 1):
                _closed(producer)
                producer = None
            n += 1
        if producer is not None:
            _closed(producer)

    def _route(self, i: int, super_stream: str, partitions: int) -> None:
        """Publish to `super_stream`'s address, the broker routing each message by its key."""
        process = f"r{i}"
        producer: Producer | None = None
        n = 0
        while not self.stopping.is_set():
            if producer is None:
                try:
                    producer = Producer(self._gateways(i), super_stream, timeout_s=SEND_TIMEOUT_S)
                except Exception:  # no cluster to talk to yet, or refused during a fault
                    self.stopping.wait(0.5)
                    continue
            text, key = f"{process}-{n}", f"k{n % ROUTING_KEYS}"
            routed = mmh3.hash(key.encode(), ROUTING_SEED, signed=False) % partitions
            value = {"partition": SUPER_BASE + routed, "value": text, "key": key}
            if not self._send(process, producer, value, MessageParts(text.encode(), key)):
                _closed(producer)
                producer = None
            n += 1
        if producer is not None:
            _closed(producer)

    def _send(
        self,
        process: str,
        producer: Producer,
        value: dict[str, Any],
        body: bytes | MessageParts,
        publishing_id: int | None = None,
    ) -> bool:
        """One send waiting for its confirm, recorded; False when the producer is done for."""
        self.history.record(process, "invoke", "send", value)
        try:
            producer.send(body, publishing_id=publishing_id)
        except PublishRefused as refused:
            retryable = is_retryable_outcome(refused.condition, refused.info)
            self.history.record(process, "info" if retryable else "fail", "send", value)
            return False
        except (AttachRefused, ConnectionLost, TimeoutError, OSError):
            # no answer, or the resend's re-attach was refused until the client gave up
            self.history.record(process, "info", "send", value)
            return False
        self.history.record(process, "ok", "send", value)
        return True

    def _consume(self, partition: int) -> None:
        process = f"c{partition}"
        consumer: Consumer | None = None
        start: Any = "first"
        while not self.stopping.is_set():
            if consumer is None:
                try:
                    consumer = Consumer(
                        self._gateways(partition),
                        self.stream,
                        start=start,
                        partition=partition,
                        timeout_s=SEND_TIMEOUT_S,
                        reconnect_timeout_s=RECONNECT_TIMEOUT_S,
                    )
                except Exception:  # attach failed during a fault: try again
                    time.sleep(0.5)
                    continue
            try:
                event = consumer.receive(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:  # gave up reconnecting: a new consumer after the last offset
                _closed(consumer)
                consumer = None
                continue
            value = {"partition": partition, "offset": event.offset, "value": _body(event)}
            self.history.record(process, "ok", "read", value)
            start = event.offset + 1
        if consumer is not None:
            _closed(consumer)

    def _group_member(self, partition: int, slot: str) -> None:
        """Hold partition `partition` for group `chaos` a few seconds at a time, taking it over
        from the other slot's member with the next epoch; read, and commit every few
        messages and before letting go. A member displaced (or cut off) ends with an error
        from `receive` or `commit`, and comes back with a newer epoch."""
        process = f"g{partition}{slot}"
        rng = random.Random(f"{process}")
        while not self.stopping.is_set():
            if rng.random() < STALE_PROBE_CHANCE:
                self._probe_stale_epoch(process, partition, slot)
            with self._epoch_lock:  # the invoke is recorded in epoch order
                self._epochs[partition] += 1
                epoch = self._epochs[partition]
                self.history.record(
                    process, "invoke", "grant", {"partition": partition, "epoch": epoch}
                )
            try:
                consumer = self._member(partition, slot, epoch)
            except AttachRefused as refused:  # locked by a newer epoch, or stale: not granted
                self.history.record(
                    process, "fail", "grant", {"partition": partition, "epoch": epoch,
                                               "condition": refused.condition},
                )  # fmt: skip
                self.stopping.wait(rng.uniform(0.2, 1.0))
                continue
            except Exception:  # no answer: granted or not
                unknown = {"partition": partition, "epoch": epoch}
                self.history.record(process, "info", "grant", unknown)
                self.stopping.wait(rng.uniform(0.2, 1.0))
                continue
            granted = {"partition": partition, "epoch": epoch, "stored": consumer.stored_offset}
            self.history.record(process, "ok", "grant", granted)
            with self._epoch_lock:
                self._granted[partition] = max(self._granted[partition], epoch)
            self._hold(process, consumer, partition, epoch, time.monotonic() + rng.uniform(2, 6))
            _closed(consumer)
            self.stopping.wait(rng.uniform(0.0, 1.0))

    def _member(self, partition: int, slot: str, epoch: int) -> Consumer:
        """A group member's manual-commit link on `partition` asking for `epoch` (slot b
        starts at the other gateway)."""
        return Consumer(
            self._gateways(partition + (slot == "b")),
            self.stream,
            partition=partition,
            group=GROUP,
            epoch=epoch,
            commit="manual",
            timeout_s=SEND_TIMEOUT_S,
            reconnect_timeout_s=RECONNECT_TIMEOUT_S,
        )

    def _probe_stale_epoch(self, process: str, partition: int, slot: str) -> None:
        """Ask for the epoch just below the greatest one granted so far: the partition's
        stored epoch is at least that one and never goes back, so this must be refused."""
        with self._epoch_lock:
            epoch = self._granted[partition] - 1
        if epoch < 1:
            return
        value = {"partition": partition, "epoch": epoch, "probe": True}
        self.history.record(process, "invoke", "grant", value)
        try:
            consumer = self._member(partition, slot, epoch)
        except AttachRefused as refused:
            self.history.record(process, "fail", "grant", {**value, "condition": refused.condition})
            return
        except Exception:  # no answer: granted or not
            self.history.record(process, "info", "grant", value)
            return
        self.history.record(process, "ok", "grant", {**value, "stored": consumer.stored_offset})
        _closed(consumer)

    def _hold(
        self, process: str, consumer: Consumer, partition: int, epoch: int, until: float
    ) -> None:
        last: int | None = None
        taken = 0
        while not self.stopping.is_set() and time.monotonic() < until:
            try:
                event = consumer.receive(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:  # displaced, or gave up reconnecting
                return
            value = {"partition": partition, "offset": event.offset, "value": _body(event),
                     "epoch": epoch}  # fmt: skip
            self.history.record(process, "ok", "group-read", value)
            last, taken = event.offset, taken + 1
            if taken % GROUP_COMMIT_EVERY == 0 and not self._commit(
                process, consumer, partition, epoch, last
            ):
                return
        if last is not None:
            self._commit(process, consumer, partition, epoch, last)

    def _commit(
        self, process: str, consumer: Consumer, partition: int, epoch: int, offset: int
    ) -> bool:
        value = {"partition": partition, "epoch": epoch, "offset": offset}
        self.history.record(process, "invoke", "commit", value)
        try:
            stored = consumer.commit()
        except Exception:  # the link went away first: stored or not
            self.history.record(process, "info", "commit", value)
            return False
        self.history.record(process, "ok", "commit", {**value, "offset": stored})
        return True

    def _named_consumer(
        self, partition: int, process: str | None = None, sac_name: str | None = None
    ) -> None:
        """Sessions of a named manual-commit consumer on `partition`, one after another; with
        `sac_name`, a member of that name's single active consumer group."""
        process = process or f"n{partition}"
        fs = NAMED_FS if sac_name is None else SAC_FS
        rng = random.Random(process)
        session = 0
        while not self.stopping.is_set():
            session += 1
            value: dict[str, Any] = {"partition": partition, "session": session}
            if sac_name is not None:
                value["name"] = sac_name
            self.history.record(process, "invoke", fs[0], value)
            try:
                consumer = Consumer(
                    self._gateways(partition + (process.endswith("b"))),
                    self.stream,
                    partition=partition,
                    name=sac_name or process,
                    single_active=sac_name is not None,
                    commit="manual",
                    timeout_s=SEND_TIMEOUT_S,
                )
            except AttachRefused as refused:
                self.history.record(
                    process, "fail", fs[0], {**value, "condition": refused.condition}
                )
                self.stopping.wait(rng.uniform(0.2, 1.0))
                continue
            except Exception:  # no answer: attached or not
                self.history.record(process, "info", fs[0], value)
                self.stopping.wait(rng.uniform(0.2, 1.0))
                continue
            attached = {**value, "stored": consumer.stored_offset}
            self.history.record(process, "ok", fs[0], attached)
            until = time.monotonic() + rng.uniform(1.5, 4)
            self._named_session(process, consumer, value, until, fs)
            _closed(consumer)
            self.stopping.wait(rng.uniform(0.0, 0.5))

    def _named_session(
        self,
        process: str,
        consumer: Consumer,
        session: dict[str, Any],
        until: float,
        fs: tuple[str, str, str],
    ) -> None:
        last: int | None = None
        pending = 0
        while not self.stopping.is_set() and time.monotonic() < until:
            try:
                event = consumer.receive(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:  # the link failed: this session is over
                return
            read = {**session, "offset": event.offset, "value": _body(event)}
            self.history.record(process, "ok", fs[1], read)
            last, pending = event.offset, pending + 1
            if pending == NAMED_COMMIT_EVERY:
                if not self._named_commit(process, consumer, {**session, "offset": last}, fs[2]):
                    return
                pending = 0
        if pending and last is not None:
            self._named_commit(process, consumer, {**session, "offset": last}, fs[2])

    def _named_commit(
        self, process: str, consumer: Consumer, value: dict[str, Any], f: str
    ) -> bool:
        self.history.record(process, "invoke", f, value)
        try:
            stored = consumer.commit()
        except Exception:  # the link went away first: stored or not
            self.history.record(process, "info", f, value)
            return False
        self.history.record(process, "ok", f, {**value, "offset": stored})
        return True

    def _administer(self) -> None:
        """The metadata workload (chaos.checker's admin checks): create a stream with a new
        name, list, delete it, list; each call through the next node's admin API in turn."""
        k = turn = 0
        while not self.stopping.is_set():
            name = f"m{k}"
            for f, args in (
                ("create", ["stream", "create", name, "--partitions", "1", "--replicas", "1"]),
                ("list", ["stream", "list"]),
                ("delete", ["stream", "delete", name]),
                ("list", ["stream", "list"]),
            ):
                if self.stopping.is_set():
                    return
                address = self.admin_addresses[turn % len(self.admin_addresses)]
                turn += 1
                self.history.record("admin", "invoke", f, None if f == "list" else name)
                code, out = _cli(args, address)
                if code == 0 and f == "list":
                    names = [s["name"] for s in json.loads(out)["streams"]]
                    self.history.record("admin", "ok", f, names)
                elif code == 0:
                    self.history.record("admin", "ok", f, name)
                else:
                    # invalid, not found, already exists: definitely not done; else unknown
                    definite = code in (2, 3, 4)
                    value = None if f == "list" else name
                    self.history.record("admin", "fail" if definite else "info", f, value)
            k += 1


def _cli(args: list[str], address: str) -> tuple[int, str]:
    command = [sys.executable, "-m", "spate.cli.main", *args, "--admin", address]
    try:
        done = subprocess.run(
            [*command, "--output", "json", "--timeout", "5"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return -1, ""
    return done.returncode, done.stdout


def _body(event: Any) -> str:
    body = event.body  # a copy (the decoded message's memoryview lives only as long as it)
    return body.decode() if isinstance(body, bytes) else str(body)


def _closed(client: Any) -> None:
    """Close a client that may be broken (nothing more to do with it either way); None, so that
    `client = _closed(client)` forgets it."""
    with contextlib.suppress(Exception):
        client.close()


def read_partition(url: str, stream: str, partition: int, end: int) -> list[tuple[int, str, int]]:
    """Offsets [first, end) of one partition as served at `url` (a gateway or one node):
    (offset, value, timestamp_ms)."""
    out: list[tuple[int, str, int]] = []
    if end <= 0:
        return out
    deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
    consumer = Consumer(url, stream, start="first", partition=partition, timeout_s=SEND_TIMEOUT_S)
    try:
        while time.monotonic() < deadline:
            try:
                event = consumer.receive(timeout=READ_IDLE_S)
            except TimeoutError:
                break
            out.append((event.offset, _body(event), event.timestamp_ms))
            if event.offset >= end - 1:
                break
    finally:
        _closed(consumer)
    return out
