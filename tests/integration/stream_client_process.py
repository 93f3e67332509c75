"""A producer or consumer in its own process, over raw python-qpid-proton, for the stream
feature proofs (tests/integration/test_stream_features.py): the tests kill it with SIGKILL.

Usage:
  stream_client_process.py produce --url URL [--url URL ...] --stream S --name NAME --count N
      [--prefix P] [--partition P] [--window W] [--checkpoint ID ...] [--deadline-s S]
  stream_client_process.py consume --url URL --stream S --name NAME [--credit C] [--first]
      [--pace-ms MS] [--stall-at OFFSET] [--deadline-s S]

Both print one JSON object per line on stdout (flushed), the test's only view of them.

produce: a named producer (link property `spate:producer-name`) sends bodies `P-0` .. `P-N-1`
with `x-opt-publishing-id` 0 .. N-1, at most W unconfirmed. On any failure (connection lost,
link detached, a rejection) it reconnects, trying the URLs in turn and following
`amqp:link:redirect`, and resends every unconfirmed message in order: what a careful producer
does (004 "Message Deduplication": "it will automatically recover and retry outstanding
messages"). Lines: {"attached": url, "last": id|null} (the attach's `spate:last-publishing-id`),
{"retry": why}, {"progress": confirmed}, {"done": N}. At each checkpoint C (once every id below
C is confirmed, with the next W in flight) it prints {"checkpoint": C, "confirmed": n, "sent": s}
and stops doing I/O until it reads a line on stdin (or forever, for the last checkpoint when
stdin is closed): the test kills a node, or the process, at a known point.

consume: a named consumer (`spate:consumer-name`) with credit C, no start filter (it resumes
after the stored offset) unless --first. Each message takes MS of work, is reported, then is
accepted and settled: {"offset": o} comes before its acceptance, so what the test saw is a
superset of what the broker may count as done. At offset --stall-at it stops (no work, no
I/O: {"stalled": o}) until killed. First line {"attached": url, "stored": offset|null}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import deque
from typing import Any

from proton import Delivery, Described, Message, ProtonException, Timeout, symbol, ulong
from proton.handlers import MessagingHandler
from proton.reactor import Container, Filter, LinkOption
from proton.utils import BlockingConnection, LinkDetached

PRODUCER_NAME = symbol("spate:producer-name")
LAST_ID = symbol("spate:last-publishing-id")
PUBLISHING_ID = symbol("x-opt-publishing-id")
CONSUMER_NAME = symbol("spate:consumer-name")
STORED = symbol("spate:stored-offset")
PARTITION = symbol("event-streams-partition")
OFFSET = symbol("event-streams-offset")
REDIRECT = "amqp:link:redirect"
REDIRECT_HOPS_MAX = 5
OUTCOME_TIMEOUT_S = 10.0


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Properties(LinkOption):  # type: ignore[misc]
    def __init__(self, properties: dict[Any, Any]) -> None:
        self.properties = properties

    def apply(self, link: Any) -> None:
        link.properties = self.properties


class Retry(Exception):
    """The current connection is of no more use: reconnect and resend."""


def attach_sender(url: str, args: argparse.Namespace) -> tuple[BlockingConnection, Any, str]:
    """A named sender at the partition's leader, following redirects from `url`."""
    properties: dict[Any, Any] = {PRODUCER_NAME: args.name}
    if args.partition is not None:
        properties[PARTITION] = symbol(str(args.partition))
    for _ in range(REDIRECT_HOPS_MAX + 1):
        connection = BlockingConnection(url, timeout=OUTCOME_TIMEOUT_S)
        try:
            return connection.create_sender(args.stream, options=Properties(properties)), url
        except LinkDetached as refused:
            condition = refused.link.remote_condition  # read before the close frees it
            connection.close()
            if refused.condition != REDIRECT or condition is None:
                raise Retry(str(refused)) from refused
            info = condition.info or {}
            url = f"amqp://{info[symbol('network-host')]}:{int(info[symbol('port')])}"
        except BaseException:
            connection.close()
            raise
    raise Retry(f"more than {REDIRECT_HOPS_MAX} redirects")


def produce(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.deadline_s
    checkpoints = deque(sorted(args.checkpoint))
    confirmed = 0  # every id below this one is accepted
    attempt = 0
    while confirmed < args.count:
        if time.monotonic() > deadline:
            say(error=f"gave up after {args.deadline_s} s with {confirmed} confirmed")
            return 1
        url = args.url[attempt % len(args.url)]
        attempt += 1
        connection = None
        try:
            sender, at = attach_sender(url, args)
            connection = sender.connection
            last = (sender.link.remote_properties or {}).get(LAST_ID)
            say(attached=at, last=None if last is None else int(last))
            confirmed = send_from(sender, confirmed, checkpoints, args)
        except (Retry, ProtonException, OSError) as failure:
            say(retry=f"{type(failure).__name__}: {failure}"[:300])
            time.sleep(0.1)
        finally:
            if connection is not None:  # the peer may be gone: nothing to close then
                with contextlib.suppress(ProtonException, OSError):
                    connection.close()
    say(done=args.count)
    return 0


def send_from(
    sender: Any, confirmed: int, checkpoints: deque[int], args: argparse.Namespace
) -> int:
    """Send ids from `confirmed` on, W in flight, until all are confirmed (returns the count)
    or the link fails (raises; the caller resends from the first unconfirmed id)."""
    connection = sender.connection
    in_flight: deque[tuple[int, Any]] = deque()
    next_id = confirmed
    while confirmed < args.count:
        while next_id < args.count and len(in_flight) < args.window:
            message = Message(
                body=f"{args.prefix}-{next_id}", annotations={PUBLISHING_ID: ulong(next_id)}
            )
            in_flight.append((next_id, sender.link.send(message)))
            next_id += 1
        if checkpoints and confirmed >= checkpoints[0]:
            with contextlib.suppress(Timeout):  # put what is in flight on the wire
                connection.wait(lambda: False, timeout=0.05)
            say(checkpoint=checkpoints.popleft(), confirmed=confirmed, sent=next_id)
            if not sys.stdin.readline():  # no more instructions: wait to be killed
                time.sleep(args.deadline_s)
                raise SystemExit(2)
        head = in_flight[0][1]
        connection.wait(lambda head=head: bool(head.remote_state), timeout=OUTCOME_TIMEOUT_S)
        while in_flight and in_flight[0][1].remote_state:
            publishing_id, delivery = in_flight.popleft()
            if delivery.remote_state != Delivery.ACCEPTED:
                condition = delivery.remote.condition
                raise Retry(f"id {publishing_id} refused: {condition}")
            delivery.settle()
            confirmed = publishing_id + 1
            if confirmed % 100 == 0:
                say(progress=confirmed)
    return confirmed


class NamedConsumer(MessagingHandler):  # type: ignore[misc]
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(prefetch=args.credit, auto_accept=False)
        self.args = args

    def on_start(self, event: Any) -> None:
        options: list[Any] = [Properties({CONSUMER_NAME: self.args.name})]
        if self.args.first:
            options.append(Filter({symbol("start"): Described(ulong(0x200), "first")}))
        connection = event.container.connect(self.args.url[0])
        event.container.create_receiver(connection, self.args.stream, options=options)
        event.container.schedule(self.args.deadline_s, self)

    def on_link_opened(self, event: Any) -> None:
        stored = (event.link.remote_properties or {}).get(STORED)
        say(attached=self.args.url[0], stored=None if stored is None else int(stored))

    def on_message(self, event: Any) -> None:
        time.sleep(self.args.pace_ms / 1000)  # the application's work
        offset = int(event.message.instructions[OFFSET])
        if offset == self.args.stall_at:  # no more work, no more I/O: the test kills it
            say(stalled=offset)
            time.sleep(self.args.deadline_s)
            raise SystemExit(2)
        say(offset=offset)  # reported, then accepted
        event.delivery.update(Delivery.ACCEPTED)
        event.delivery.settle()

    def on_link_error(self, event: Any) -> None:
        say(error=str(event.link.remote_condition))
        event.connection.close()

    def on_timer_task(self, event: Any) -> None:
        say(error=f"still running after {self.args.deadline_s} s")
        event.container.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("produce", "consume"))
    parser.add_argument("--url", action="append", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--prefix", default="m")
    parser.add_argument("--partition", type=int)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--checkpoint", type=int, action="append", default=[])
    parser.add_argument("--credit", type=int, default=20)
    parser.add_argument("--first", action="store_true")
    parser.add_argument("--pace-ms", type=float, default=0.0)
    parser.add_argument("--stall-at", type=int, default=-1)
    parser.add_argument("--deadline-s", type=float, default=60.0)
    args = parser.parse_args()
    if args.mode == "produce":
        return produce(args)
    Container(NamedConsumer(args)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
