"""`<stream>/$info` (000 §6) and the rhea client end to end."""

from __future__ import annotations

from collections.abc import Callable

from proton import symbol
from spate.core.ids import Offset, offset_to_symbol
from support.amqp_clients import RunningGateway, blocking, publish, run_rhea, unique


def test_info_lists_partitions_with_offsets(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §6: amqp-value map with `partitions`, each {partition, earliest-offset,
    latest-offset} (null when empty); one message per unit of credit."""
    stream = make_stream(partitions=2)
    publish(gateway, stream, ["a", "b", "c"], {symbol("event-streams-partition"): "1"})
    with blocking(gateway) as conn:
        receiver = conn.create_receiver(stream + "/$info", name=unique("info"), credit=1)
        message = receiver.receive(timeout=10)
        receiver.accept()
    body = message.body
    assert body["stream"] == stream and body["partition-count"] == 2
    empty, full = body["partitions"]
    assert empty["partition"] == symbol("0")
    assert empty["earliest-offset"] is None and empty["latest-offset"] is None
    assert full["partition"] == symbol("1")
    assert full["earliest-offset"] == offset_to_symbol(Offset(0))
    assert full["latest-offset"] == offset_to_symbol(Offset(2))
    assert isinstance(full["latest-offset"], symbol)
    assert full["messages"] == 3


def test_info_of_unknown_stream_is_not_found(gateway: RunningGateway) -> None:
    report = run_rhea(gateway, [{"op": "attach", "address": "nope/$info", "role": "receiver"}])
    assert report["steps"][0]["error"]["condition"] == "amqp:not-found"


def test_rhea_publish_consume_with_filters(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """rhea: publish with accepted outcomes; consume with the numeric and symbolic 0x200
    descriptors, the SQL filter and the relative form; DA on every delivery; $info."""
    stream = make_stream()
    o1 = offset_to_symbol(Offset(1))
    first = {"f": {"descriptor": 0x200, "type": "symbol", "value": "first"}}
    after_1 = {
        "f": {
            "descriptor": "amqp:event-streams-delivery-annotations-filter",
            "type": "map",
            "value": {"event-streams-offset": {"type": "symbol", "value": o1}},
        }
    }
    sql = {
        "f": {"descriptor": 0x201, "type": "string", "value": f"d.event-streams-offset >= '{o1}'"}
    }
    relative = {
        "f": {"descriptor": 0x200, "type": "long", "value": -1},
        "ignored": {"descriptor": "com.example:other", "type": "string", "value": "x"},
    }
    report = run_rhea(
        gateway,
        [
            {"op": "publish", "address": stream, "bodies": ["r0", "r1", "r2"]},
            {"op": "consume", "address": stream, "count": 3, "filter": first},
            {"op": "consume", "address": stream, "count": 1, "filter": after_1},
            {"op": "consume", "address": stream, "count": 2, "filter": sql},
            {"op": "consume", "address": stream, "count": 1, "filter": relative},
            {"op": "consume", "address": stream + "/$info", "count": 1},
        ],
    )
    assert "error" not in report, report
    publish_step, all3, after, sql_step, last, info = report["steps"]
    assert publish_step["outcomes"] == ["accepted"] * 3
    assert [m["body"] for m in all3["messages"]] == ["r0", "r1", "r2"]
    offsets = [m["offset"] for m in all3["messages"]]
    assert offsets == sorted(offsets) == [offset_to_symbol(Offset(i)) for i in range(3)]
    assert all(isinstance(m["timestamp"], int) for m in all3["messages"])
    assert [m["body"] for m in after["messages"]] == ["r2"]
    assert [m["body"] for m in sql_step["messages"]] == ["r1", "r2"]
    assert [m["body"] for m in last["messages"]] == ["r2"]
    assert last["echoed_filter_keys"] == ["f"]  # the unknown filter is not echoed
    assert info["messages"][0]["body"]["partitions"][0]["latest-offset"] == offset_to_symbol(
        Offset(2)
    )


def test_rhea_live_tail_on_partitioned_stream(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """000 §4.4: deliveries from a partitioned stream carry event-streams-source-partition."""
    stream = make_stream(partitions=2)
    report = run_rhea(
        gateway,
        [
            {
                "op": "publish",
                "address": stream,
                "bodies": ["p0"],
                "properties": {"event-streams-partition": "0"},
            },
            {
                "op": "publish",
                "address": stream,
                "bodies": ["p1"],
                "properties": {"event-streams-partition": "1"},
            },
            {
                "op": "consume",
                "address": stream,
                "count": 2,
                "filter": {"f": {"descriptor": 0x200, "type": "string", "value": "first"}},
            },
        ],
    )
    messages = report["steps"][2]["messages"]
    assert sorted((m["body"], m["source_partition"]) for m in messages) == [
        ("p0", "0"),
        ("p1", "1"),
    ]
