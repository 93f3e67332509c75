"""Server-side offset tracking over AMQP (issue 8, ADR 0012; 004 "Offset Tracking (Consumer)"),
through python-qpid-proton, against every broker of the gateway suite (memory, node, proxy).

Contract: a receiver link with the link property `spate:consumer-name` is a named consumer; the
offset of what it settles accepted is stored per (stream, partition, name), batched, and
flushed before its detach is answered; a named consumer attaching with no start filter resumes
right after the stored offset (`next` when there is none; an explicit filter wins); the attach
reply carries `spate:stored-offset` when one exists.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from proton import Timeout, symbol
from spate.client import Consumer
from spate.core.errors import InvalidArgument
from spate.gateway.server import ListenerConfig
from support.amqp_clients import (
    LinkProperties,
    RunningGateway,
    blocking,
    fill,
    offset_filter,
    partition_option,
    receive,
    run_rhea,
    unique,
)

NAME = symbol("spate:consumer-name")
STORED = symbol("spate:stored-offset")


def pump(conn: Any) -> None:
    """Let a BlockingConnection send what is queued (dispositions) and read for a moment."""
    with contextlib.suppress(Timeout):
        conn.wait(lambda: False, timeout=0.2)


def named(name: str, **more: Any) -> LinkProperties:
    return LinkProperties({NAME: name, **{symbol(k): v for k, v in more.items()}})


def consume(
    gateway: RunningGateway, stream: str, name: str, count: int, options: list[Any] | None = None
) -> tuple[list[Any], Any]:
    """Attach a named consumer, accept `count` messages, detach; (bodies, stored-offset seen)."""
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=50, options=[named(name), *(options or [])]
        )
        stored = (receiver.link.remote_properties or {}).get(STORED)
        bodies = [m.body for m in receive(receiver, count)]
        receiver.close()  # the detach is answered once the offset is stored
    return bodies, stored


def test_a_named_consumer_resumes_after_what_it_accepted(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    fill(gateway, stream, 10)
    first, stored = consume(gateway, stream, "billing", 4, [offset_filter("first")])
    assert first == ["m0", "m1", "m2", "m3"] and stored is None
    again, stored = consume(gateway, stream, "billing", 3)  # no filter: after the stored one
    assert again == ["m4", "m5", "m6"] and stored == 3
    _, stored = consume(gateway, stream, "audit", 0)  # never stored: `next`
    assert stored is None
    fill(gateway, stream, 2, start=10)
    rest, stored = consume(gateway, stream, "billing", 5)
    assert rest == ["m7", "m8", "m9", "m10", "m11"] and stored == 6


def test_an_explicit_start_filter_wins_over_the_stored_offset(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    fill(gateway, stream, 6)
    consume(gateway, stream, "c", 5, [offset_filter("first")])
    bodies, stored = consume(gateway, stream, "c", 2, [offset_filter(1)])
    assert bodies == ["m1", "m2"] and stored == 4
    bodies, stored = consume(gateway, stream, "c", 1)  # the explicit read stored 2
    assert bodies == ["m3"] and stored == 2


def test_the_offset_never_runs_ahead_of_an_unsettled_or_released_delivery(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    fill(gateway, stream, 6)
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=10, options=[named("r"), offset_filter("first")]
        )
        receiver.receive(timeout=5)
        receiver.accept()  # m0
        receiver.receive(timeout=5)
        receiver.release()  # m1: not done, the consumer gets it again
        for _ in range(3):
            receiver.receive(timeout=5)
            receiver.accept()  # m2..m4 accepted after a released one
        receiver.close()
    bodies, stored = consume(gateway, stream, "r", 2)
    assert stored == 0 and bodies == ["m1", "m2"]


def test_settling_out_of_order_stores_the_contiguous_prefix(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    fill(gateway, stream, 5)
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=10, options=[named("o"), offset_filter("first")]
        )
        got = [receiver.receive(timeout=5) for _ in range(5)]
        assert [m.body for m in got] == [f"m{i}" for i in range(5)]
        deliveries = list(receiver.fetcher.unsettled)  # type: ignore[attr-defined]
        for i in (0, 1, 3, 4):  # m2 stays unsettled when the link goes
            deliveries[i].update(deliveries[i].ACCEPTED)
            deliveries[i].settle()
        receiver.close()  # the dispositions go out before the detach
    bodies, stored = consume(gateway, stream, "o", 1)
    assert stored == 1 and bodies == ["m2"]


def test_a_named_consumer_on_a_partitioned_stream_must_name_its_partition(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream(partitions=3)
    with blocking(gateway) as conn:
        with pytest.raises(Exception, match="invalid-field") as refused:
            conn.create_receiver(stream, name=unique("rx"), options=[named("p")])
        assert "partition-bound" in str(refused.value)
        receiver = conn.create_receiver(
            stream, name=unique("rx"), options=[named("p"), partition_option("1")]
        )
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.2)
        with pytest.raises(Exception, match="invalid-field"):
            conn.create_receiver(stream, name=unique("rx"), options=[named("")])


def test_rhea_consumer_resumes_after_its_stored_offset(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    fill(gateway, stream, 6)
    props = {"spate:consumer-name": "rhea-billing"}
    report = run_rhea(
        gateway,
        [
            {"op": "consume", "address": stream, "count": 3, "properties": props, "exact": True,
             "filter": {"rabbitmq:stream-offset-spec": {"type": "string", "value": "first"}}},
            {"op": "consume", "address": stream, "count": 2, "properties": props, "exact": True},
        ],
    )  # fmt: skip
    first, second = report["steps"]
    assert [m["body"] for m in first["messages"]] == ["m0", "m1", "m2"]
    assert "spate:stored-offset" not in first["attach_properties"]
    assert second["attach_properties"]["spate:stored-offset"] == "2"
    assert [m["body"] for m in second["messages"]] == ["m3", "m4"]


# spate.client: Consumer(name=..., start="stored", commit="auto" | "manual") ----------------------


def bodies_of(events: list[Any]) -> list[str]:
    return [str(e.message.body) for e in events]


def test_client_automatic_commits_finish_an_event_when_the_next_is_asked_for(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """An event counts as finished once the application asks for the next one (Kafka's
    auto-commit at the next poll); `close()` finishes the last and returns once it is stored."""
    stream = make_stream()
    fill(gateway, stream, 8)
    with Consumer(gateway.url, stream, name="auto", start="first", timeout_s=10) as consumer:
        assert consumer.stored_offset is None
        got = [consumer.receive(timeout=5) for _ in range(3)]
    assert bodies_of(got) == ["m0", "m1", "m2"]
    with Consumer(gateway.url, stream, name="auto", timeout_s=10) as consumer:  # start=stored
        assert consumer.stored_offset == 2
        assert bodies_of([consumer.receive(timeout=5)]) == ["m3"]
        # abandoned without close: m3 was taken but not finished (no next receive)
        consumer._aio._engine.abort()  # type: ignore[attr-defined]
    with Consumer(gateway.url, stream, name="auto", timeout_s=10) as consumer:
        assert consumer.stored_offset == 2
        assert bodies_of([consumer.receive(timeout=5)]) == ["m3"]


def test_client_manual_commit_returns_once_the_offset_is_stored(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """commit() accepts in rcv-settle-mode second (002 §2.7.3); the broker settles once the
    offset is replicated, so what commit() returned is what the next consumer resumes after."""
    stream = make_stream()
    fill(gateway, stream, 10)
    consumer = Consumer(gateway.url, stream, name="manual", start="first", commit="manual")
    assert consumer.commit() is None  # nothing taken, nothing stored
    [consumer.receive(timeout=5) for _ in range(4)]
    assert consumer.commit() == 3
    # stored by the time commit() returned: another link (no detach flush) reads it at attach
    assert consume(gateway, stream, "manual", 0)[1] == 3
    assert consumer.commit() == 3  # nothing new: the last confirmed one
    [consumer.receive(timeout=5) for _ in range(2)]  # m4, m5: received, not committed
    consumer.close()  # a manual consumer stores nothing on close
    assert consume(gateway, stream, "manual", 0)[1] == 3
    with Consumer(gateway.url, stream, name="manual", commit="manual") as again:
        assert again.stored_offset == 3
        assert bodies_of([again.receive(timeout=5)]) == ["m4"]
        assert again.commit() == 4
    assert consume(gateway, stream, "manual", 0)[1] == 4


def test_client_handler_events_are_finished_when_the_handler_returns(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    fill(gateway, stream, 5)
    seen: list[int] = []
    consumer = Consumer(
        gateway.url, stream, name="h", start="first", handler=lambda o, t, raw: seen.append(o)
    )
    deadline = time.monotonic() + 10
    while len(seen) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    consumer.close()
    assert seen == [0, 1, 2, 3, 4]
    assert consume(gateway, stream, "h", 0)[1] == 4


def test_client_misuse_of_names_and_commits_is_refused_before_connecting(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    with pytest.raises(ValueError, match="consumer name"):
        Consumer(gateway.url, stream, start="stored")
    with pytest.raises(ValueError, match="consumer name"):
        Consumer(gateway.url, stream, commit="manual")
    with pytest.raises(ValueError, match="commit must be"):
        Consumer(gateway.url, stream, name="x", commit="sometimes")
    with Consumer(gateway.url, stream, name="x") as consumer, pytest.raises(RuntimeError):
        consumer.commit()  # automatic commits: nothing to call


def test_the_batch_size_is_the_listeners_setting(
    start_gateway: Callable[..., RunningGateway], make_stream: Callable[..., str]
) -> None:
    """`--offset-commit-messages 2 --offset-commit-ms 60000`: a store after every second
    finished message, none on time within the test."""
    gateway = start_gateway(offset_commit_messages=2, offset_commit_ms=60_000)
    stream = make_stream()
    fill(gateway, stream, 5)
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=10, options=[named("b"), offset_filter("first")]
        )
        receiver.receive(timeout=5)
        receiver.accept()
        pump(conn)
        assert consume(gateway, stream, "b", 0)[1] is None  # one finished: not due
        receiver.receive(timeout=5)
        receiver.accept()
        pump(conn)
        deadline = time.monotonic() + 5
        while consume(gateway, stream, "b", 0)[1] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert consume(gateway, stream, "b", 0)[1] == 1
        receiver.close()


@pytest.mark.parametrize(
    ("setting", "value", "flag"),
    [
        ("offset_commit_messages", 0, "--offset-commit-messages"),
        ("offset_commit_ms", 0, "--offset-commit-ms"),
        ("offset_commit_ms", 3_600_000, "--offset-commit-ms"),
    ],
)
def test_bad_batch_settings_are_refused_naming_the_flag(
    setting: str, value: int, flag: str
) -> None:
    with pytest.raises(InvalidArgument, match=flag):
        ListenerConfig(node_id="n1", **{setting: value}).validate()
