"""The Spark stage: one SparkSession and one real three-node cluster (with a gateway) for the
whole module set. Marked `spark`; part of `make test`. No skips: without pyspark or Java
these tests fail (the extra and Java are part of the install, tools/bootstrap.sh)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cluster import Cluster, running_cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("spark") / "cluster", nodes=3) as c:
        yield c


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """local[2,4]: two cores, a failed task retried (up to 4 attempts), as on a cluster.

    The connector is not registered by hand: `pyspark_spate` (what `pip install spate[spark]`
    puts in site-packages) is put on the workers' path, and Spark finds it by itself. The
    editable dev install maps packages through an import hook, which Spark's module scan does
    not see, hence the symlink."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # A Python worker has 15 s to connect back to the JVM by default; on a loaded 2-core
    # machine (load average 12-15 measured) starting one took longer and failed the query.
    os.environ["SPARK_AUTH_SOCKET_TIMEOUT"] = "120"
    auto = tmp_path_factory.mktemp("autoregister")
    (auto / "pyspark_spate").symlink_to(ROOT / "src" / "spark" / "pyspark_spate")
    # benchmarks/spark_null.py (format spate_null), tested in test_null_sink.py: its classes
    # are pickled by reference, so the workers import it by name, as in benchmarks/spark.py
    (auto / "spark_null.py").symlink_to(ROOT / "benchmarks" / "spark_null.py")
    # Test speed only: Spark puts pyspark.zip first on the path of every Python process it
    # starts, and a zip import compiles pyspark each time (1.6 CPU-s per process, measured;
    # 0.4 from the installed package, the same version, with its bytecode). Each query starts
    # several such processes, each with 10 s to connect back (support.spark.CONNECT_BACK).
    (auto / "sitecustomize.py").write_text(
        "import sys\nsys.path.sort(key=lambda entry: entry.endswith('pyspark.zip'))\n"
    )
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(auto), os.environ.get("PYTHONPATH")) if p
    )
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("spate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        # C1 only and the serial GC: about half the JVM's start-up CPU on 2 cores
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.python.task.killTimeout", "2s")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
