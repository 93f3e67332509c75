"""What a page of memory costs on this machine (RESULTS §55): read this before comparing CPU
figures from different sessions.

    .venv/bin/python benchmarks/page_cost.py

On this kind of VM (Firecracker; a virtio balloon with free page reporting) the guest hands
pages it has freed back to the host within seconds, and a page the host does not back costs
many microseconds when the guest touches it again (~5-45 us, against ~1.6 us for a page freed
a moment ago). Every new page of page cache — every byte a broker appends to its log — is
such a page, and so is a process's heap growth. Prints, in us per 4 KiB page:

- `fresh`: 256 MiB of anonymous memory populated (MADV_POPULATE_WRITE) for the first time;
- `again`: the same size populated right after unmapping the first (pages just freed);
- `after_4s`: the same after four idle seconds (pages the host may have taken back);
- `page_cache`: CPU (system time) per page of a 64 MiB write(2) to a new file, no sync, and
  `page_cache_again` the same file written again (its pages cached: no new page).

Touches only anonymous memory and one file in a temporary directory beside this script.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import tempfile
import time
from pathlib import Path

PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
ANON = 256 << 20
FILE = 64 << 20


def populate_us() -> float:
    region = mmap.mmap(-1, ANON, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        started = time.perf_counter()
        region.madvise(MADV_POPULATE_WRITE, 0, ANON)
        return (time.perf_counter() - started) / (ANON // PAGE) * 1e6
    finally:
        region.close()


def write_sys_us(path: Path) -> float:
    block = b"x" * (1 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for _ in range(FILE // len(block)):
            os.write(fd, block)
    finally:
        os.close(fd)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_stime - before) / (FILE // PAGE) * 1e6


def measure() -> dict[str, float]:
    """The figures above, us per page, rounded (~5 s; other benchmarks print them beside
    their CPU figures: w1_cpu.py)."""
    figures = {"fresh": populate_us(), "again": populate_us()}
    time.sleep(4.0)
    figures["after_4s"] = populate_us()
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as directory:
        path = Path(directory) / "pages"
        figures["page_cache"] = write_sys_us(path)
        figures["page_cache_again"] = write_sys_us(path)
    return {k: round(v, 2) for k, v in figures.items()}


def main() -> int:
    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    print(json.dumps({"us_per_page": measure()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
