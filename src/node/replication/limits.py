"""Every limit of the partition Raft core, named once with its unit, related limits asserted.

Memory held by one Raft group is bounded by these numbers: the in-memory log never holds more
than `log_unapplied_bytes_max` of entries above the applied index plus `log_cache_bytes_max` of
applied entries kept to feed slow followers without a snapshot; each follower has at most
`inflight_appends_max` append messages of at most `append_bytes_max` bytes outstanding.
"""

from __future__ import annotations

from spate.core import limits as core_limits

entry_bytes_max = core_limits.chunk_bytes_max
"""Largest entry payload: one entry is one storage chunk."""

append_bytes_max = 1024 * 1024
"""Entry bytes batched into one Append message (at least one entry is always sent, so a single
larger entry travels alone)."""

append_entries_max = 4096
"""Entries batched into one Append message."""

inflight_appends_max = 64
"""Append messages a leader keeps outstanding to one follower in the replicate state."""

log_unapplied_bytes_max = 64 * 1024 * 1024
"""Entry bytes above the applied index. A leader refuses proposals past it (backpressure); a
follower drops appends that would pass it (the leader resends after the next heartbeat)."""

log_cache_bytes_max = 16 * 1024 * 1024
"""Applied entry bytes kept in memory so a lagging follower can be fed without a snapshot."""

apply_bytes_max = 8 * 1024 * 1024
"""Committed entry bytes handed to the shell in one Ready (at least one entry per Ready)."""

messages_per_ready_max = 4096
"""Messages one Ready may carry; past it the core drops what it would send (a slow shell looks
like a lossy network, which Raft tolerates)."""

peers_max = core_limits.replicas_max
"""Voters in one group, including this node."""

assert append_bytes_max <= log_unapplied_bytes_max
assert entry_bytes_max <= log_unapplied_bytes_max, "one maximal entry must be proposable"
assert apply_bytes_max <= log_unapplied_bytes_max
assert messages_per_ready_max >= peers_max * (inflight_appends_max + 4), "a full pipeline fits"
