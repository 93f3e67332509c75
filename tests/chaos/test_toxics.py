"""chaos.toxics, the pure part of the Toxiproxy-compatible server: parsing and checking toxics
(clear messages naming the field), and the plans each toxic makes for a chunk."""

from __future__ import annotations

import random

import pytest

from chaos import toxics as tx


def test_parse_fills_defaults_and_names_like_toxiproxy() -> None:
    toxic = tx.parse({"type": "latency", "attributes": {"latency": 100}})
    assert toxic.to_json() == {
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 100, "jitter": 0},
    }
    updated = tx.parse({"attributes": {"jitter": 5}}, toxic)
    assert updated.attributes == {"latency": 100, "jitter": 5} and updated.name == toxic.name


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "JSON object"),
        ({"type": "latencyy"}, "unknown toxic type 'latencyy'"),
        ({"type": "latency", "stream": "sideways"}, "stream must be"),
        ({"type": "latency", "toxicity": 1.5}, "toxicity must be between 0 and 1"),
        ({"type": "latency", "toxicity": "high"}, "toxicity must be a number"),
        ({"type": "latency", "attributes": {"latencyy": 1}}, "latency has no attribute"),
        ({"type": "latency", "attributes": {"latency": -1}}, "attribute 'latency'"),
        ({"type": "latency", "attributes": {"latency": 1.5}}, "must be an integer"),
        ({"type": "latency", "name": ""}, "name must be"),
    ],
)
def test_bad_toxics_are_refused_naming_the_field(body: object, message: str) -> None:
    with pytest.raises(tx.InvalidToxic, match=message):
        tx.parse(body)


def test_plans() -> None:
    rng = random.Random(1)
    latency = tx.parse({"type": "latency", "attributes": {"latency": 100, "jitter": 20}})
    slow = tx.parse({"type": "latency", "name": "more", "attributes": {"latency": 50}})
    delays = [tx.delay_s([latency, slow], rng) for _ in range(200)]
    assert all(0.13 <= d <= 0.17 for d in delays) and len(set(delays)) > 100
    slicer = tx.parse(
        {"type": "slicer", "attributes": {"average_size": 10, "size_variation": 3, "delay": 7}}
    )
    data = bytes(range(256)) * 4
    pieces = tx.slices(data, [slicer], rng)
    assert b"".join(pieces) == data and all(1 <= len(p) <= 13 for p in pieces)
    assert tx.piece_delay_s([slicer]) == 7e-6
    assert tx.slices(b"whole", [latency], rng) == [b"whole"]
    rates = [
        tx.parse({"type": "bandwidth", "name": n, "attributes": {"rate": r}})
        for n, r in (("a", 100), ("b", 30))
    ]
    assert tx.rate_bytes_per_s(rates) == 30_000 and tx.rate_bytes_per_s([]) is None
    limit = tx.parse({"type": "limit_data", "attributes": {"bytes": 9}})
    assert tx.byte_limit([limit]) == 9 and tx.byte_limit([]) is None


def test_cuts_take_the_earliest_and_timeouts_drop_data() -> None:
    reset = tx.parse({"type": "reset_peer", "attributes": {"timeout": 300}})
    hold = tx.parse({"type": "timeout", "attributes": {"timeout": 0}})
    close = tx.parse({"type": "timeout", "name": "t2", "attributes": {"timeout": 100}})
    assert tx.cut([]) is None
    assert tx.cut([reset]) == tx.Cut(drop=False, after_s=0.3, reset=True)
    assert tx.cut([hold]) == tx.Cut(drop=True, after_s=None, reset=False)
    assert tx.cut([reset, hold]) == tx.Cut(drop=True, after_s=0.3, reset=True)
    assert tx.cut([reset, hold, close]) == tx.Cut(drop=True, after_s=0.1, reset=False)


def test_toxicity_is_a_per_connection_chance() -> None:
    rng = random.Random(3)
    half = tx.parse({"type": "latency", "toxicity": 0.5})
    hits = sum(tx.applies(half, rng) for _ in range(1000))
    assert 400 < hits < 600
    assert not any(tx.applies(tx.parse({"type": "latency", "toxicity": 0}), rng) for _ in range(50))
