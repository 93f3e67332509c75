"""glibc malloc's thresholds in the server processes (issue 16, ADR 0046, RESULTS §58).

The gateway reads its sessions with the nodes through `spate.core.receiver` (ADR 0045): a
RECORDS frame of up to 1 MiB is read into a buffer of its own, allocated per frame. glibc's
default thresholds are dynamic: a block above the mmap threshold (128 KiB at start) is mmap'd
and unmapped when freed, which raises the threshold to that block's size, and the top of the
heap is given back to the kernel (trimmed) whenever more than twice that is free there. A
stream of 1 MiB buffers then keeps landing on pages the kernel has just taken back: measured
~40,000 more minor faults per 100,000 1 KiB messages consumed through the gateway, and W2
through the gateway 20% slower (RESULTS §57). With the thresholds fixed, buffers up to
`MMAP_THRESHOLD_BYTES` come from the heap and up to `TRIM_THRESHOLD_BYTES` of free heap top is
kept for the next ones.

What it costs is memory the process keeps: at most `TRIM_THRESHOLD_BYTES` of free heap top
beyond what it uses (RSS measured in RESULTS §58), and free chunks below the top, which glibc
only gives back when asked (`trim`): after a burst the heap stays at the burst's high-water
mark. A process that went quiet gives it back once (`IdleTrim`, ADR 0048; RESULTS §59), as
jemalloc's decay purging returns unused dirty pages over ~10 s.

`$SPATE_MALLOC=default` leaves glibc's defaults; glibc's own `MALLOC_MMAP_THRESHOLD_` /
`MALLOC_TRIM_THRESHOLD_` in the environment win over these. Not glibc (musl, macOS): nothing
is changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

MALLOC_ENV = "SPATE_MALLOC"
MMAP_THRESHOLD_BYTES = 8 * 1024 * 1024
"""Blocks below this come from the heap (the largest frame a gateway session reads is 1 MiB
of records; a client connection's read, ADR 0047, 1 MiB too)."""
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
"""Free heap top kept before it is given back to the kernel."""

IDLE_TRIM_S = 10.0
"""Quiet this long (no bytes through the listener), a process gives its free heap back once."""

_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_THRESHOLD = -3
_GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def settings(environ: Mapping[str, str]) -> dict[int, int]:
    """The mallopt(3) parameters to set for this environment (empty: leave glibc's)."""
    if environ.get(MALLOC_ENV, "fixed") == "default":
        return {}
    if any(name in environ for name in _GLIBC_ENV):
        return {}  # the operator set glibc's own: theirs
    return {_M_MMAP_THRESHOLD: MMAP_THRESHOLD_BYTES, _M_TRIM_THRESHOLD: TRIM_THRESHOLD_BYTES}


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Set the thresholds in this process (at start, before the loop runs); False when nothing
    was set (asked not to, the operator's glibc settings, or no glibc mallopt)."""
    wanted = settings(os.environ if environ is None else environ)
    if not wanted:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.info("malloc thresholds left as they are: no glibc mallopt in this process")
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    for param, value in wanted.items():
        if mallopt(param, value) != 1:
            log.warning("mallopt(%d, %d) refused; malloc thresholds partly default", param, value)
            return False
    return True


def rss_mib() -> int:
    """This process's resident set, MiB (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)


def trim() -> bool:
    """Give the free heap's whole pages back to the kernel, in every arena (glibc's
    malloc_trim(0)); False where there is no malloc_trim or it found nothing to give."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))


class IdleTrim:
    """When to `trim`: once `idle_s` have passed with the activity count unchanged, once per
    quiet spell (a burst leaves the heap at its high-water mark; trimming while traffic flows
    would hand pages back that the next reads fault in again, what the thresholds avoid)."""

    def __init__(self, idle_s: float = IDLE_TRIM_S) -> None:
        self.idle_s = idle_s
        self._activity: int | None = None
        self._since = 0.0
        self._trimmed = True  # nothing to give back before the first traffic

    def due(self, now: float, activity: int) -> bool:
        if activity != self._activity:
            if self._activity is not None:
                self._trimmed = False
            self._activity, self._since = activity, now
            return False
        if self._trimmed or now - self._since < self.idle_s:
            return False
        self._trimmed = True
        return True
