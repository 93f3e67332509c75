"""A writer for the kill -9 test: appends to a partition log forever, printing each offset only
after the fsync covering it has returned. Usage: python log_writer_process.py DIRECTORY"""

from __future__ import annotations

import sys
from pathlib import Path

from spate.core.ids import Offset
from spate.node.log import FileStorage, LogConfig, PartitionLog

CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024)


def record(offset: Offset | int) -> bytes:
    """The bytes stored at `offset`: they name their offset, with varying lengths."""
    return f"<{offset}>".encode() * (1 + offset % 13)


def main() -> None:
    log = PartitionLog.open(FileStorage(Path(sys.argv[1])), CONFIG)
    out = sys.stdout
    batch = 1
    while True:
        first = log.end_offset
        log.append([record(first + i) for i in range(batch)], 1_000 + first)
        log.sync()
        out.write("".join(f"{first + i}\n" for i in range(batch)))
        out.flush()
        batch = batch % 17 + 1


if __name__ == "__main__":
    main()
