"""Source filters that select where a consumer starts (000_e36e0ffc94de3955.txt §5.2).

The decision (which form says which start) is `core.start_spec`, pure; the proton values are
built by the adapter, `engine.offset_filter`, re-exported here for code that attaches links
with proton directly (tests/gateway).
"""

from spate.client.core import Start, StartSpec, start_spec
from spate.client.engine import offset_filter

__all__ = ["Start", "StartSpec", "offset_filter", "start_spec"]
