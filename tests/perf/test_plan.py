"""spate.perf's pure parts: stream names, offsets, routing keys, placement, latency buckets."""

from __future__ import annotations

import random
from array import array
from datetime import UTC, datetime

import pytest
from spate.core.errors import InvalidArgument
from spate.core.superstreams import hash_partition
from spate.perf import latency, plan


@pytest.mark.parametrize(
    ("names", "count", "expected"),
    [
        ("stream", None, ("stream",)),
        ("a, b,c", None, ("a", "b", "c")),
        ("stream", "5", tuple(f"stream-{i}" for i in range(1, 6))),
        ("stream-%d", "3", ("stream-1", "stream-2", "stream-3")),
        ("stream", "10", tuple(f"stream-{i:02d}" for i in range(1, 11))),
        ("s-%03d", "50-52", ("s-050", "s-051", "s-052")),
    ],
)
def test_stream_names_as_stream_perf_test_computes_them(
    names: str, count: str | None, expected: tuple[str, ...]
) -> None:
    assert plan.stream_names(names, count) == expected


@pytest.mark.parametrize(
    ("names", "count"), [("s-%d", None), ("a,b", "2"), ("s", "0"), ("s", "5-2"), ("s", "x")]
)
def test_stream_names_refused(names: str, count: str | None) -> None:
    with pytest.raises(InvalidArgument):
        plan.stream_names(names, count)


def test_offsets() -> None:
    assert plan.parse_offset("first") == "first"
    assert plan.parse_offset("42") == 42
    assert plan.parse_offset("2026-11-26T07:45:54Z") == datetime(
        2026, 11, 26, 7, 45, 54, tzinfo=UTC
    )
    for bad in ("-1", "soon", "2026-11-26T07:45:54"):
        with pytest.raises(InvalidArgument):
            plan.parse_offset(bad)


@pytest.mark.parametrize("partitions", [1, 3, 12])
def test_hash_routing_keys_reach_every_partition_in_order(partitions: int) -> None:
    keys = plan.routing_keys(partitions, "hash", ())
    assert [hash_partition(k, partitions) for k in keys] == list(range(partitions))
    assert plan.routing_keys(2, "key", ("amer", "emea")) == ("amer", "emea")


def test_assign_spreads_clients_and_keeps_producers_and_consumers_apart() -> None:
    settings = plan.Settings(
        urls=("amqp://a:1", "amqp://b:1"), producers=3, consumers=2, count=10, processes=2
    )
    workers = plan.assign(settings, ("s1", "s2"), {}, {})
    assert [w.role for w in workers] == ["producers", "producers", "consumers", "consumers"]
    producers = [p for w in workers for p in w.producers]
    assert sorted(p.count or 0 for p in producers) == [3, 3, 4]
    assert {p.index: p.target for p in producers} == {0: "s1", 1: "s2", 2: "s1"}
    assert {p.index: p.urls[0] for p in producers} == {
        0: "amqp://a:1",
        1: "amqp://b:1",
        2: "amqp://a:1",
    }
    assert all(not w.consumers for w in workers[:2]) and all(not w.producers for w in workers[2:])


def test_super_stream_consumers_read_every_partition() -> None:
    settings = plan.Settings(urls=("amqp://a:1",), producers=1, consumers=2, count=5)
    parts = ("inv-0", "inv-1", "inv-2")
    workers = plan.assign(settings, ("inv",), {"inv": parts}, {"inv": ("k0", "k1", "k2")})
    consumers = [c for w in workers for c in w.consumers]
    assert [c.streams for c in consumers] == [parts, parts]
    assert workers[0].producers[0].routing_keys == ("k0", "k1", "k2")


def test_fold_buckets_are_exact_within_their_width() -> None:
    rng = random.Random(7)
    values = [rng.randrange(0, 5_000_000_000) for _ in range(20_000)] + [0, 999, 1000, 255_999]
    folded = latency.fold(array("q", values))
    assert sum(count for _, count in folded) == len(values)
    floors = [floor for floor, _ in folded]
    assert floors == sorted(floors) and len(set(floors)) == len(floors)
    for value in values:  # each value's bucket holds it, and is at most 1/128 of it wide
        floor, width = latency.bucket_floor_us(value // 1000)
        assert floor <= value // 1000 < floor + width
        assert width == 1 or width <= floor / 127
    assert latency.fold(array("q")) == []
