"""RESULTS §52: the CPU of Spate's replication core alone — three production
`ReplicationDriver`s with production `Replica`s and `RaftStore`s on real directories (write,
fdatasync), in ONE process, frames handed over by hand (tests/replication/drivers.py): no
sockets, no event loop, no threads. One 100 B record at a time, proposed at the leader and
settled everywhere.

    .venv/bin/python benchmarks/results/2026-11-27/q52/inprocess.py [--ops 2000] [--profile]

Prints the process CPU per operation (all three replicas), and with --profile the top
functions by own time (cProfile; its overhead triples the time).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "tests"))

from replication import drivers  # noqa: E402
from spate.core.ids import PartitionId  # noqa: E402
from spate.node.log import LogConfig  # noqa: E402
from spate.node.replication.files import DirectoryFiles  # noqa: E402
from spate.node.replication.raft import RaftConfig  # noqa: E402
from spate.node.replication.replica import Replica  # noqa: E402
from spate.node.replication.storage import RaftStore  # noqa: E402


def on_disk(directory: Path) -> drivers.Nodes:
    """drivers.Nodes with each simulated-disk replica replaced by one on a real directory."""
    nodes = drivers.Nodes()
    for node in drivers.IDS:
        driver = nodes.drivers[node]
        driver.remove(drivers.STREAM, PartitionId(0)).close()
        replica = Replica(
            node,
            stream=drivers.STREAM,
            partition=PartitionId(0),
            replicas=drivers.IDS,
            store=RaftStore(DirectoryFiles(directory / node), LogConfig()),
            raft_config=RaftConfig(),
            rng=random.Random(f"raft/{node}"),
            wake=lambda: None,
            clock_ms=lambda: 1_700_000_000_000,
            monotonic_ms=lambda: 0.0,
        )
        driver.add(replica)
        nodes.replicas[node] = replica
    return nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=30)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        nodes = on_disk(Path(directory))
        leader = nodes.replicas[nodes.elect()[0]]
        got: list[object] = []

        def one() -> None:
            leader.propose([b"x" * 100], got.append)  # type: ignore[arg-type]
            nodes.settle()

        for _ in range(a.ops // 10):
            one()
        started, wall = time.process_time(), time.perf_counter()
        for _ in range(a.ops):
            one()
        cpu_us = (time.process_time() - started) / a.ops * 1e6
        wall_us = (time.perf_counter() - wall) / a.ops * 1e6
        print(f"{a.ops} ops: {cpu_us:.0f} us CPU and {wall_us:.0f} us wall per op (3 replicas)")
        if a.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(a.ops):
                one()
            profile.disable()
            pstats.Stats(profile).sort_stats(a.sort).print_stats(a.top)
        assert len(got) == a.ops + a.ops // 10 + (a.ops if a.profile else 0), len(got)


if __name__ == "__main__":
    main()
