"""spate.spark: the PySpark connector (format `spate`), on Spark's Python Data Source API.

    import spate.spark
    spate.spark.register(spark)         # or nothing: the pyspark_spate module registers it
    df = (spark.readStream.format("spate").option("endpoints", "127.0.0.1:5672")
          .option("stream", "orders").option("startingOffsets", "earliest").load())

Needs the extra: `pip install "spate[spark]"` (pyspark >= 4.2, pyarrow). Layout: `options`
(parsing and checks), `planning` (offset arithmetic), both pure; `broker` (Spate through
spate.client.aio); `source` (the classes Spark calls). docs/spark.md is the guide.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register format `spate` on a SparkSession (idempotent)."""
    from spate.spark.source import SpateDataSource

    spark.dataSource.register(SpateDataSource)


__all__ = ["register"]
