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
