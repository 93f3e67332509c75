"""Server-side filtering over AMQP (issue 11, ADR 0016), through python-qpid-proton and rhea,
against every broker of the gateway suite (memory, node, proxy).

Contract (docs/amqp.md "Filtering"):
- 004 "Filtering": a producer sets `x-stream-filter-value` (message annotation); a consumer
  attaching with `rabbitmq:stream-filter` (a string or a list of strings) is sent only the
  messages whose value is one of them — plus those without a value when
  `rabbitmq:stream-match-unfiltered` is true. The node passes over chunks whose Bloom filter
  holds none of them; the broker drops the rest before sending (RabbitMQ leaves that to the
  client).
- 000 §5.2.2 / FILTEX §6: an `event-streams-sql` filter with a full expression sends only the
  messages for which it is TRUE; its top-level offset/timestamp conjuncts also set the start;
  a malformed one refuses the attach with `amqp:invalid-field` naming the position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Described, Message, Timeout, symbol, ulong
from proton.reactor import Filter
from spate.core.ids import StreamName
from spate.core.streams import StreamConfig
from support.amqp_clients import (
    LoopThread,
    RunningGateway,
    blocking,
    run_doc_examples,
    run_rhea,
    unique,
)
from support.memory_broker import MemoryBroker
from support.node_broker import NodeBroker
from support.proxy_broker import ProxyBroker

VALUE = symbol("x-stream-filter-value")
STREAM_FILTER = symbol("rabbitmq:stream-filter")
MATCH_UNFILTERED = symbol("rabbitmq:stream-match-unfiltered")
OFFSET_SPEC = symbol("rabbitmq:stream-offset-spec")
SQL = ulong(0x201)


def publish(gateway: RunningGateway, stream: str, messages: list[Message]) -> None:
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        for message in messages:
            sender.send(message)


def regional(count: int, regions: tuple[str | None, ...]) -> list[Message]:
    """Message k: body "m<k>", filter value regions[k % len(regions)] (None: no value),
    application properties {n: k, region: that value}."""
    out = []
    for k in range(count):
        region = regions[k % len(regions)]
        annotations = {} if region is None else {VALUE: region}
        props = {"n": k} | ({} if region is None else {"region": region})
        out.append(
            Message(body=f"m{k}", annotations=annotations, properties=props)  # app properties
        )
    return out


def consume_all(
    gateway: RunningGateway, stream: str, filters: dict[Any, Any], *, settle_s: float = 0.3
) -> tuple[list[str], Any]:
    """Every message the link is sent from `first` (until `settle_s` of quiet); and the link."""
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(
            stream,
            name=unique("rx"),
            credit=500,
            options=Filter({OFFSET_SPEC: "first", **filters}),
        )
        data = receiver.link.remote_source.filter
        data.rewind()
        echoed = data.get_object() if data.next() else {}
        got = []
        while True:
            try:
                got.append(receiver.receive(timeout=settle_s).body)
            except Timeout:
                return got, echoed
            receiver.accept()


def test_a_value_filter_sends_only_messages_with_those_values(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """004 "Filtering": only messages whose x-stream-filter-value is asked for; in order."""
    stream = make_stream()
    publish(gateway, stream, regional(60, ("emea", "apac", "amer")))
    got, echoed = consume_all(gateway, stream, {STREAM_FILTER: "apac"})
    assert got == [f"m{k}" for k in range(60) if k % 3 == 1]
    assert STREAM_FILTER in echoed  # the filter is in force (AMQP 3.5.1)
    got, _ = consume_all(gateway, stream, {STREAM_FILTER: ["emea", "amer"]})
    assert got == [f"m{k}" for k in range(60) if k % 3 != 1]


def test_match_unfiltered_adds_messages_without_a_value(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """004 "Filtering": `match-unfiltered` also sends messages that carry no filter value,
    including whole chunks without one (a chunk of unfiltered messages has no Bloom filter)."""
    stream = make_stream()
    publish(gateway, stream, regional(20, ("emea", None)))
    publish(gateway, stream, [Message(body="plain")])
    got, _ = consume_all(gateway, stream, {STREAM_FILTER: "emea"})
    assert got == [f"m{k}" for k in range(0, 20, 2)]
    got, echoed = consume_all(gateway, stream, {STREAM_FILTER: ["emea"], MATCH_UNFILTERED: True})
    assert got == [f"m{k}" for k in range(20)] + ["plain"]
    assert MATCH_UNFILTERED in echoed


def test_an_sql_filter_selects_on_properties_annotations_and_the_offset(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §5.2.2 (FILTEX §6): a full expression over application properties, annotations and
    the offset delivery annotation; its top-level offset conjunct also sets the start."""
    stream = make_stream()
    publish(gateway, stream, regional(40, ("emea", "apac")))
    cases = {
        "a.n % 10 = 3": [3, 13, 23, 33],
        "region = 'apac' AND n >= 30": [31, 33, 35, 37, 39],
        "m.x-stream-filter-value IN ('emea') AND n BETWEEN 2 AND 6": [2, 4, 6],
        "n < 3 OR a.region LIKE 'ap%' AND n > 35": [0, 1, 2, 37, 39],
        "d.event-streams-offset > '00000000000000000035' AND NOT (a.region = 'emea')": [37, 39],
        "a.missing IS NULL AND n = 5": [5],
    }
    for expression, expected in cases.items():
        got, echoed = consume_all(gateway, stream, {symbol("sql"): Described(SQL, expression)})
        assert got == [f"m{k}" for k in expected], expression
        assert symbol("sql") in echoed


@pytest.mark.parametrize(
    ("expression", "position"),
    [
        ("a.n >", "position 5"),
        ("a.n = 'x' AND (", "position 15"),
        ("region LIKE 5", "position 12"),
        ("a.n IN ()", "position 8"),
    ],
)
def test_a_malformed_sql_filter_refuses_the_attach_naming_the_position(
    gateway: RunningGateway, make_stream: Callable[..., str], expression: str, position: str
) -> None:
    """000 §5.2.2: a filter of ours the broker cannot honour refuses the attach
    (`amqp:invalid-field`); the message says where the expression went wrong. The connection
    keeps serving: a good link on it works afterwards."""
    stream = make_stream()
    publish(gateway, stream, regional(3, ("emea",)))
    with blocking(gateway) as conn:
        with pytest.raises(Exception, match="invalid-field") as refused:
            conn.create_receiver(
                stream,
                name=unique("rx"),
                options=Filter({symbol("sql"): Described(SQL, expression)}),
            )
        assert position in str(refused.value), str(refused.value)
        receiver = conn.create_receiver(
            stream, name=unique("rx"), credit=10, options=Filter({OFFSET_SPEC: "first"})
        )
        assert receiver.receive(timeout=5).body == "m0"


@pytest.mark.parametrize(
    "filters",
    [
        {STREAM_FILTER: []},
        {STREAM_FILTER: 5},
        {STREAM_FILTER: ["a", 1]},
        {MATCH_UNFILTERED: True},
        {STREAM_FILTER: "a", MATCH_UNFILTERED: "yes"},
    ],
)
def test_bad_value_filters_are_invalid_field(
    gateway: RunningGateway, make_stream: Callable[..., str], filters: dict[Any, Any]
) -> None:
    stream = make_stream()
    with blocking(gateway) as conn, pytest.raises(Exception, match="invalid-field"):
        conn.create_receiver(stream, name=unique("rx"), options=Filter(filters))


def test_rhea_filters_by_value_and_by_sql(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """The same contract from rhea (Node.js): values set by rhea, filters attached by rhea."""
    stream = make_stream()
    regions = ["emea", "apac", None] * 4
    report = run_rhea(
        gateway,
        [
            {
                "op": "publish",
                "address": stream,
                "bodies": {"prefix": "r", "count": 12},
                "filter_values": regions,
                "application_properties": [{"n": k} for k in range(12)],
            },
            {
                "op": "consume",
                "address": stream,
                "count": 4,
                "filter": {
                    "rabbitmq:stream-offset-spec": {"type": "string", "value": "first"},
                    "rabbitmq:stream-filter": {"type": "list", "value": ["apac"]},
                },
            },
            {
                "op": "consume",
                "address": stream,
                "count": 3,
                "filter": {
                    "rabbitmq:stream-offset-spec": {"type": "string", "value": "first"},
                    "sql": {"descriptor": 0x201, "type": "string", "value": "a.n % 4 = 1"},
                },
            },
        ],
    )
    assert report.get("error") is None, report
    by_value = report["steps"][1]["messages"]
    assert [m["body"] for m in by_value] == ["r1", "r4", "r7", "r10"]
    by_sql = report["steps"][2]["messages"]
    assert [m["body"] for m in by_sql] == ["r1", "r5", "r9"]
    assert [int(m["offset"]) for m in by_sql] == [1, 5, 9]  # offsets as stored


def test_the_docs_examples_run_as_written(
    gateway: RunningGateway,
    loop_thread: LoopThread,
    broker: MemoryBroker | NodeBroker | ProxyBroker,
) -> None:
    """docs/amqp.md "Filtering": the python-qpid-proton and rhea examples, as written."""
    config = StreamConfig(name=StreamName("regions"))
    if isinstance(broker, NodeBroker | ProxyBroker):
        loop_thread.call(broker.create_stream(config))
    else:
        loop_thread.run(lambda: broker.create_stream(config))
    python, js = run_doc_examples("filtering", gateway.host, gateway.port)
    assert python.split("\n")[:3] == ["order 1", "order 4", "order 7"]
    assert js.split("\n")[:3] == ["order 5", "order 6", "order 7"]


def test_spate_client_consumers_filter_by_value_and_sql(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """spate.client: `filter_values=`, `match_unfiltered=` and `sql=` on a Consumer."""
    from spate.client import Consumer

    stream = make_stream()
    publish(gateway, stream, regional(12, ("emea", "apac", None)))
    cases: list[tuple[dict[str, Any], list[int]]] = [
        ({"filter_values": ["apac"]}, [1, 4, 7, 10]),
        ({"filter_values": ["apac"], "match_unfiltered": True}, [1, 2, 4, 5, 7, 8, 10, 11]),
        ({"sql": "n > 8"}, [9, 10, 11]),
        ({"filter_values": ["emea"], "sql": "n >= 3"}, [3, 6, 9]),
    ]
    for kwargs, expected in cases:
        consumer = Consumer(gateway.url, stream, start="first", **kwargs)
        try:
            got = [consumer.receive(timeout=10) for _ in expected]
            assert [e.offset for e in got] == expected, kwargs
            with pytest.raises(TimeoutError):
                consumer.receive(timeout=0.5)
        finally:
            consumer.close()
    with pytest.raises(ValueError, match="match_unfiltered goes with filter_values"):
        Consumer(gateway.url, stream, match_unfiltered=True)


def test_filters_see_inside_compressed_sub_entries(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """Issue 11: filtering stays correct over sub-entries (ADR 0017). A sub-entry chunk's Bloom
    filter holds its inner messages' values (tests/gateway/test_remote.py shows the node passing
    over those that cannot match); the messages of those read are unpacked and chosen one by one
    (by value and by SQL), and a filtered link asking for sub-entries as is gets its messages
    one by one too (whole, it would see the others)."""
    from spate.client import Consumer, Producer

    stream = make_stream()
    producer = Producer(gateway.url, stream)
    try:
        producer.send_batch(
            regional(30, ("emea", "apac", None)), sub_entry_size=10, compression="zstd"
        )
    finally:
        producer.close()
    got, _ = consume_all(gateway, stream, {STREAM_FILTER: "apac"})
    assert got == [f"m{k}" for k in range(30) if k % 3 == 1]
    got, _ = consume_all(gateway, stream, {symbol("sql"): Described(SQL, "n BETWEEN 8 AND 11")})
    assert got == ["m8", "m9", "m10", "m11"]
    consumer = Consumer(
        gateway.url, stream, start="first", sub_entries=True, filter_values=["emea"]
    )
    try:
        events = [consumer.receive(timeout=10) for _ in range(10)]
        assert [e.offset for e in events] == list(range(0, 30, 3))
        with pytest.raises(TimeoutError):
            consumer.receive(timeout=0.5)
    finally:
        consumer.close()
