"""Installed as the top-level module `pyspark_spate`: Spark >= 4 looks for modules named
`pyspark_*` exposing `DefaultSource` and registers them, so `format("spate")` works with no
`register` call (research/pyspark.md §2d)."""

from spate.spark.source import SpateDataSource as DefaultSource

__all__ = ["DefaultSource"]
