"""glibc malloc's thresholds in the server processes (spate.server.allocator; ADR 0046,
RESULTS §57-§58): the gateway's 1 MiB RECORDS buffers must not land on pages glibc has just
given back to the kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from spate.server import allocator

# Rounds of four 1 MiB buffers allocated, filled and freed, as a session's RECORDS frames are;
# four freed at once leave more free heap top than glibc's default trim threshold keeps after
# a 1 MiB block (twice the dynamic mmap threshold), so by default every round's pages are
# given back and touched again.
PROBE = """
import json, resource, sys
from spate.server import allocator
configured = allocator.configure()
def round_():
    held = [bytearray(1 << 20) for _ in range(4)]
    del held
round_(); round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    round_()
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"configured": configured, "faults": after - before}))
"""


def _probe(**env: str) -> dict[str, object]:
    environ = {
        k: v for k, v in os.environ.items() if k != allocator.MALLOC_ENV and "MALLOC_" not in k
    }
    environ.update(env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_thresholds_are_fixed_unless_asked_not_to_or_set_by_the_operator() -> None:
    fixed = allocator.settings({})
    assert fixed == {
        -3: allocator.MMAP_THRESHOLD_BYTES,  # M_MMAP_THRESHOLD
        -1: allocator.TRIM_THRESHOLD_BYTES,  # M_TRIM_THRESHOLD
    }
    assert allocator.settings({"SPATE_MALLOC": "fixed"}) == fixed
    assert allocator.settings({"SPATE_MALLOC": "default"}) == {}
    assert allocator.settings({"MALLOC_TRIM_THRESHOLD_": "131072"}) == {}
    assert allocator.settings({"MALLOC_MMAP_THRESHOLD_": "131072"}) == {}
    assert not allocator.configure({"SPATE_MALLOC": "default"})


def test_fixed_thresholds_keep_large_buffers_pages_in_the_process() -> None:
    fixed = _probe()
    default = _probe(SPATE_MALLOC="default")
    assert fixed["configured"] is True
    assert default["configured"] is False
    # By default each round's 4 MiB come back as new pages: ~1,024 faults a round.
    assert isinstance(default["faults"], int) and default["faults"] >= 20 * 512, default
    assert isinstance(fixed["faults"], int) and fixed["faults"] < default["faults"] // 10, (
        fixed,
        default,
    )


# 200 MiB of 1 MiB blocks from the heap (the thresholds keep them off mmap), then a small block
# above them, then the 200 freed: the free heap is below a live block, so no top trim gives it
# back; only `trim` (malloc_trim(0)) does.
TRIM_PROBE = """
import json, sys
from spate.server import allocator
allocator.configure()
base = allocator.rss_mib()
blocks = [bytearray(1 << 20) for _ in range(200)]
for block in blocks:
    block[::4096] = b"x" * len(block[::4096])  # touch every page
pin = bytearray(100_000)
del blocks
kept = allocator.rss_mib()
trimmed = allocator.trim()
print(json.dumps({"base": base, "kept": kept, "after": allocator.rss_mib(), "trimmed": trimmed}))
"""


def test_trim_gives_back_free_heap_that_the_threshold_keeps() -> None:
    """ADR 0048: after a burst the heap glibc keeps is the burst's high-water mark; `trim`
    hands its free pages back."""
    environ = {k: v for k, v in os.environ.items() if "MALLOC" not in k}
    out = subprocess.run(
        [sys.executable, "-c", TRIM_PROBE], env=environ, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["kept"] - got["base"] > 150, got  # freed, still resident
    assert got["trimmed"] is True
    assert got["kept"] - got["after"] > 150, got


def test_idle_trim_is_due_once_per_quiet_spell_after_traffic() -> None:
    trim = allocator.IdleTrim(idle_s=10.0)
    assert not trim.due(0.0, 0)  # the first look
    assert not trim.due(30.0, 0)  # no traffic yet: nothing to give back
    assert not trim.due(31.0, 500)  # traffic
    assert not trim.due(35.0, 900)
    assert not trim.due(44.9, 900)  # quiet 9.9 s
    assert trim.due(45.0, 900)  # quiet 10 s: once
    assert not trim.due(60.0, 900)
    assert not trim.due(61.0, 901)  # traffic again
    assert not trim.due(70.0, 901)
    assert trim.due(71.0, 901)
