"""The pure pieces behind /metrics and the JSON log lines (ADR 0023)."""

from __future__ import annotations

import io
import json
import logging

import pytest
from spate.core.histogram import Histogram
from spate.server import logs
from spate.server.metrics import histogram_family, lag_messages


def test_histogram_buckets_are_cumulative_and_end_with_inf() -> None:
    histogram = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.002, 0.05, 3.0):
        histogram.observe(value)
    assert histogram.buckets() == [(0.001, 2), (0.01, 3), (0.1, 4), (float("inf"), 5)]
    assert histogram.count == 5
    assert histogram.sum == pytest.approx(3.0535)


def test_histogram_refuses_unordered_bounds() -> None:
    with pytest.raises(AssertionError):
        Histogram((0.1, 0.01))


def test_histogram_family_has_prometheus_bucket_labels() -> None:
    histogram = Histogram((0.5,))
    histogram.observe(0.25)
    family = histogram_family("spate_x_seconds", "x", "n1", histogram)
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets == {"0.5": 1, "+Inf": 1}


@pytest.mark.parametrize(
    ("end", "stored", "retained", "lag"),
    [
        (100, 39, 100, 60),  # done with 0..39: 40..99 left
        (100, 99, 100, 0),  # caught up
        (100, -1, 100, 100),  # stored "none yet"
        (100, 10, 50, 50),  # retention removed some of what it has not read
        (100, 150, 100, 0),  # never negative
    ],
)
def test_lag_is_end_minus_stored_minus_one_within_retention(
    end: int, stored: int, retained: int, lag: int
) -> None:
    assert lag_messages(end, stored, retained) == lag


def test_json_log_lines_carry_node_and_ids() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter("n7"))
    logger = logging.getLogger("spate.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(
            "hosting %s/%d",
            "orders",
            3,
            extra=logs.log_ids(stream="orders", partition=3, link=None),
        )
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # a traceback stays inside its one JSON line
    first, second = (json.loads(line) for line in lines)
    assert first["node"] == "n7" and first["level"] == "WARNING"
    assert first["msg"] == "hosting orders/3"
    assert (first["stream"], first["partition"]) == ("orders", 3)
    assert "link" not in first
    assert first["ts"].endswith("Z")
    assert second["msg"] == "failed" and "ValueError: boom" in second["exc"]
