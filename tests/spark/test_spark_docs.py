"""docs/spark.md's two examples run as they are (word count, and an enrichment pipeline
writing to a second stream), so the guide cannot rot."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from spate.client.messages import MessageParts
from support.cluster import Cluster
from support.spark import CONNECT_BACK, endpoints, publish, read_all

pytestmark = pytest.mark.spark
DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"
BLOCK = re.compile(r"```python spark-example\n(.*?)```", re.DOTALL)


def run(code: str, attempts: int = 3) -> str:
    """Run an example as a script; again when its query failed before it started because a
    fresh Python process missed Spark's 10 s connect-back (support.spark.CONNECT_BACK)."""
    for attempt in range(attempts):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, str(DOC), "exec"), {"__name__": "__main__"})
        except Exception as error:
            unstarted = "Current Committed Offsets: {}" in str(error)
            if CONNECT_BACK in str(error) and unstarted and attempt + 1 < attempts:
                continue
            raise
        return out.getvalue()
    raise AssertionError("unreachable")


def test_docs_spark_examples_run(
    spark: Any, spark_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    word_count, enrichment = BLOCK.findall(DOC.read_text())
    for name, partitions in (("sentences", 2), ("orders", 2), ("orders-enriched", 3)):
        spark_cluster.cli("stream", "create", name, "--partitions", str(partitions))
    publish(spark_cluster, "sentences", [b"spate streams", b"spark reads spate"], partition=0)
    publish(spark_cluster, "sentences", [b"spate writes"], partition=1)
    orders = [("c1", 10.0), ("c2", 5.5), ("c1", 7.25), ("c3", 1.0)]
    publish(
        spark_cluster,
        "orders",
        [json.dumps({"customer": c, "amount": a}).encode() for c, a in orders],
        partition=1,
        message=MessageParts,
    )
    monkeypatch.setenv("SPATE_ENDPOINTS", endpoints(spark_cluster))
    monkeypatch.setenv("SPATE_CHECKPOINTS", str(tmp_path))

    assert run(word_count).splitlines() == ["spate 3", "reads 1", "spark 1"]

    assert run(enrichment).strip() == "enriched 4 orders"
    stored = read_all(spark_cluster, "orders-enriched", 3)
    rows = [json.loads(b) for bodies in stored.values() for b in bodies]
    assert sorted(rows, key=lambda r: (r["customer"], r["amount"])) == [
        {"customer": "c1", "name": "Ada", "tier": "gold", "amount": 7.25},
        {"customer": "c1", "name": "Ada", "tier": "gold", "amount": 10.0},
        {"customer": "c2", "name": "Grace", "tier": "silver", "amount": 5.5},
        {"customer": "c3", "amount": 1.0},
    ]
    # keyed by customer: one customer's orders share a partition
    where: dict[str, set[int]] = {}
    for p, bodies in stored.items():
        for b in bodies:
            where.setdefault(json.loads(b)["customer"], set()).add(p)
    assert all(len(partitions) == 1 for partitions in where.values()), where
