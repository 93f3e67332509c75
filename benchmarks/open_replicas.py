"""Opening replicas' stores in-process (issue 16, ADR 0031): N fresh replicas, then the same N
reopened with their logs, either one at a time (`RaftStore(DirectoryFiles(...))`, the way a
node opened them before) or in batches the way `ReplicationHost.open_partitions` does
(`host._open_stores`: syncs deferred, then run on SYNC_THREADS threads). No driver, no
network: the cost of the files alone.

    .venv/bin/python benchmarks/open_replicas.py 1000 seq
    .venv/bin/python benchmarks/open_replicas.py 1000 batch
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spate.node.log import LogConfig
from spate.node.replication import host
from spate.node.replication.files import DirectoryFiles
from spate.node.replication.storage import RaftStore


def open_all(root: Path, count: int, mode: str, syncers: ThreadPoolExecutor) -> list[RaftStore]:
    config = LogConfig()
    places = [(root / "partitions" / "s" / str(i), config) for i in range(count)]
    if mode == "seq":
        return [RaftStore(DirectoryFiles(place), config) for place, config in places]
    stores: list[RaftStore] = []
    for at in range(0, count, host.OPEN_BATCH):
        for store in host._open_stores(places[at : at + host.OPEN_BATCH], syncers):
            assert isinstance(store, RaftStore), store
            stores.append(store)
    return stores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int)
    parser.add_argument("mode", choices=["seq", "batch"])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="spate-open-"))
    try:
        with ThreadPoolExecutor(host.SYNC_THREADS) as syncers:
            for what in ("fresh", "reopen"):
                wall, cpu = time.perf_counter(), time.process_time()
                stores = open_all(root, args.count, args.mode, syncers)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                for store in stores:
                    store.close()
                print(
                    f"{args.mode} {what} {args.count}: {wall * 1000 / args.count:.2f} ms wall, "
                    f"{cpu * 1000 / args.count:.2f} ms CPU per replica"
                )
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
