"""TEMPORARY measurement module of RESULTS §50 (copy to src/e2etrace.py and apply
e2e-trace.patch): with $SPATE_E2E_TRACE=DIR, each process appends, for every tenth message
of amqp_load's body layout (u64le sequence, u64le CLOCK_REALTIME ns at send), one row per
step: step, sequence, ms since sent, now (ns) to DIR/e2e-<pid>-<argv>.tsv."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable

_DIR = os.environ.get("SPATE_E2E_TRACE") or None
_MARK = b"\x00\x53\x75\xa0\x64"  # a data section of 100 bytes (vbin8)
_NAME = f"{os.getpid()}-" + "_".join(a.replace("/", "") for a in sys.argv[1:6])[:80]
_rows: list[str] = []


def _flush() -> None:
    if _rows and _DIR is not None:
        with open(os.path.join(_DIR, f"e2e-{_NAME}.tsv"), "a") as f:
            f.write("".join(_rows))
    _rows.clear()


def _row(point: str, data: bytes, at: int, now: int) -> None:
    seq = int.from_bytes(data[at + 5 : at + 13], "little")
    if seq % 10 == 0:
        sent = int.from_bytes(data[at + 13 : at + 21], "little")
        _rows.append(f"{point}\t{seq}\t{(now - sent) / 1e6:.3f}\t{now}\n")


def stamp(point: str, records: Iterable[bytes]) -> None:
    """Each record of a list (messages as received or stored)."""
    if _DIR is None:
        return
    now = time.time_ns()
    for record in records:
        head = bytes(record[:40])
        at = head.find(_MARK)
        if at >= 0:
            _row(point, head, at, now)
    if len(_rows) > 500:
        _flush()


def stamp_blob(point: str, blob: bytes | memoryview) -> None:
    """Every message in a chunk's bytes."""
    if _DIR is None:
        return
    now = time.time_ns()
    data = bytes(blob)
    at = data.find(_MARK)
    while at >= 0:
        _row(point, data, at, now)
        at = data.find(_MARK, at + 105)
    if len(_rows) > 500:
        _flush()


def delay(point: str, started_ns: int) -> None:
    """A wait measured in-process (e.g. send to flush): one row, sequence 0."""
    if _DIR is None:
        return
    now = time.time_ns()
    _rows.append(f"{point}\t0\t{(now - started_ns) / 1e6:.3f}\t{now}\n")
    if len(_rows) > 500:
        _flush()
