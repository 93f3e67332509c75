"""Real clients against a real node process started by `spate dev up`.

python-qpid-proton (BlockingConnection and Container) and rhea publish, consume from every kind of
start, read `$info` and see the documented refusals — the same contract the gateway suite checks
in-process, here through the shipped process, CLI and ports.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from proton import Message
from spate.client import Consumer, Producer
from spate.core import limits
from spate.core.ids import Offset, offset_to_symbol
from support.amqp_clients import RawExchange, RunningGateway, blocking, run_rhea, unique
from support.cluster import Cluster


def _gateway(cluster: Cluster) -> RunningGateway:
    host, port = cluster.state["nodes"][0]["amqp"].rsplit(":", 1)
    return RunningGateway(port=int(port), host=host)


def test_proton_blocking_and_container_clients(cluster: Cluster) -> None:
    """Publish with confirms, then consume from first, an offset, last, next, -N and a time."""
    cluster.cli("stream", "create", "events")
    url = cluster.amqp_url()
    with Producer(url, "events") as producer:
        producer.send_batch([f"e{i}".encode() for i in range(10)])
    time.sleep(0.01)
    cut = datetime.now(UTC)
    time.sleep(0.01)
    with Producer(url, "events") as producer:
        producer.send_batch([f"e{i}".encode() for i in range(10, 15)])

    def bodies(start: object, count: int) -> list[bytes]:
        with Consumer(url, "events", start=start) as consumer:  # type: ignore[arg-type]
            return [consumer.receive(timeout=10).body for _ in range(count)]

    assert bodies("first", 15) == [f"e{i}".encode() for i in range(15)]
    assert bodies(12, 3) == [b"e12", b"e13", b"e14"]
    assert bodies("last", 5) == [f"e{i}".encode() for i in range(10, 15)]  # the last chunk
    assert bodies(-2, 2) == [b"e13", b"e14"]
    assert bodies(cut, 5) == [f"e{i}".encode() for i in range(10, 15)]
    with Consumer(url, "events", start="next") as consumer, Producer(url, "events") as producer:
        producer.send(b"live")
        event = consumer.receive(timeout=10)
    assert (event.offset, event.body) == (15, b"live")

    # Container / MessagingHandler: raw encoded messages in, the same bytes (plus DA) out
    encoded = [Message(body=f"raw {i}", properties={"k": i}).encode() for i in range(3)]
    exchange = RawExchange(url, "events", encoded, expect=3).run()
    assert all(condition is None for _, condition in exchange.outcomes)


def test_rhea_publish_consume_info_and_refusals(cluster: Cluster) -> None:
    cluster.cli("stream", "create", "rhea-orders", "--partitions", "2")
    gateway = _gateway(cluster)
    o0 = offset_to_symbol(Offset(0))
    report = run_rhea(
        gateway,
        [
            {
                "op": "publish",
                "address": "rhea-orders",
                "bodies": ["a", "b", "c"],
                "properties": {"event-streams-partition": "1"},
            },
            {
                "op": "consume",
                "address": "rhea-orders",
                "count": 2,
                "properties": {"event-streams-partition": "1"},
                "filter": {
                    "f": {
                        "descriptor": 0x200,
                        "type": "map",
                        "value": {"event-streams-offset": {"type": "symbol", "value": o0}},
                    }
                },
            },
            {"op": "consume", "address": "rhea-orders/$info", "count": 1},
            {"op": "attach", "address": "no-such-stream", "role": "sender"},
            {
                "op": "attach",
                "address": "rhea-orders",
                "role": "receiver",
                "filter": {"f": {"descriptor": 0x200, "type": "string", "value": "sideways"}},
            },
        ],
    )
    assert "error" not in report, report
    published, consumed, info, unknown, bad_filter = report["steps"]
    assert published["outcomes"] == ["accepted"] * 3
    assert [m["body"] for m in consumed["messages"]] == ["b", "c"]  # strictly after offset 0
    partitions = info["messages"][0]["body"]["partitions"]
    assert [p["latest-offset"] for p in partitions] == [None, offset_to_symbol(Offset(2))]
    assert unknown["error"]["condition"] == "amqp:not-found"
    assert "no-such-stream" in unknown["error"]["description"]
    assert bad_filter["error"]["condition"] == "amqp:invalid-field"


def test_oversize_message_refused_and_connection_keeps_serving(cluster: Cluster) -> None:
    cluster.cli("stream", "create", "sizes")
    gateway = _gateway(cluster)
    with blocking(gateway) as conn:
        sender = conn.create_sender("sizes", name=unique("tx"))
        delivery = sender.link.send(Message(body=b"x" * (limits.message_bytes_max + 1)))
        conn.wait(lambda: delivery.settled, timeout=10)
        assert delivery.remote_state == delivery.REJECTED
        assert delivery.remote.condition.name == "amqp:link:message-size-exceeded"
        ok = sender.send(Message(body="fits"))
        assert ok.remote_state == ok.ACCEPTED
    info = cluster.cli_json("stream", "describe", "sizes")
    assert info["partitions"][0]["messages"] == 1
