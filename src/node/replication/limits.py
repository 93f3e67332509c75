"""Every limit of the partition Raft core, named once with its unit, related limits asserted.

Memory held by one Raft group is bounded by these numbers: the in-memory log never holds more
than `log_unapplied_bytes_max` of entries above the applied index plus `log_cache_bytes_max` of
applied entries kept to feed slow followers without a snapshot (`follower_log_cache_bytes_max`
on a follower, `node_log_cache_bytes_max` over a node's groups); each follower has at most
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
"""Applied entry bytes a leader keeps in memory so a lagging follower can be fed without a
snapshot: only entries some peer still lacks (every peer's acknowledged index, ADR 0049)."""

follower_log_cache_bytes_max = 4 * 1024 * 1024
"""Applied entry bytes a follower keeps (none while its group is quiet): what it would feed the
third replica, a little behind it, if it were elected (ADR 0049)."""

node_log_cache_bytes_max = 128 * 1024 * 1024
"""Applied entry bytes kept over all of a node's groups: past it, a sweep once a second lowers
the largest caches to one level that fits (ADR 0049). A soft bound: between two sweeps, groups
may hold more, each within its own limit above."""

apply_bytes_max = 8 * 1024 * 1024
"""Committed entry bytes handed to the shell in one Ready (at least one entry per Ready)."""

messages_per_ready_max = 4096
"""Messages one Ready may carry; past it the core drops what it would send (a slow shell looks
like a lossy network, which Raft tolerates)."""

peers_max = core_limits.replicas_max
"""Voters in one group, including this node."""

members_max = peers_max + 2
"""Voters and learners in one group: a full group plus learners catching up to replace some
(a move adds one learner at a time; ADR 0022)."""

assert append_bytes_max <= log_unapplied_bytes_max
assert follower_log_cache_bytes_max <= log_cache_bytes_max <= node_log_cache_bytes_max
assert entry_bytes_max <= log_unapplied_bytes_max, "one maximal entry must be proposable"
assert apply_bytes_max <= log_unapplied_bytes_max
assert messages_per_ready_max >= members_max * (inflight_appends_max + 4), "a full pipeline fits"

# -- the shell (host.py, transport.py, catchup.py, partition.py)

frame_bytes_max = 2 * entry_bytes_max + append_bytes_max + 64 * 1024
"""Largest node-to-node frame: an Append carries at least one entry (up to entry_bytes_max) plus
up to append_bytes_max of others; catch-up pieces are far smaller."""

peer_send_queue_bytes_max = 64 * 1024 * 1024
"""Encoded frames waiting to be written to one peer; past it frames are dropped (a lossy
network: Raft retransmits)."""

peer_write_bytes_max = 4 * 1024 * 1024
"""Frames joined into one socket write (many Raft messages, of many partitions, per write)."""

receive_buffer_bytes = core_limits.frame_receive_buffer_bytes
"""The staging buffer an accepted peer link's reads go into (spate.core.receiver's default)."""

frame_in_place_bytes_min = core_limits.frame_in_place_bytes_min
"""A frame body at least this large that a read leaves incomplete is read in place (ADR 0039;
spate.core.receiver's default)."""

reconnect_delay_ms_min = 20
reconnect_delay_ms_max = 1000
"""Backoff between attempts to dial a peer, doubling from min to max."""

handshake_timeout_ms = 5000
"""A peer must finish the authentication handshake within this time."""

catchup_piece_bytes = 1024 * 1024
"""Segment bytes fetched per catch-up request (one request in flight per partition)."""

catchup_request_timeout_ms = 5000
"""A catch-up request unanswered after this long is retried (the transfer resumes)."""

pending_appends_max = core_limits.partition_pending_appends_max
"""Producer appends waiting for their commit, per partition; past it appends are refused
(ResourceLimitExceeded, retryable)."""

append_commit_timeout_ms = 10_000
"""An append whose entry is neither committed nor overwritten within this time fails with
Unavailable (retryable): the replica lost touch with the group."""

restart_window_bytes_max = 2 * log_unapplied_bytes_max
"""Uncommitted entry bytes read back from disk into the core on restart."""

vote_embargo_ticks = 2 * 10
"""A replica whose partition directory is new grants no vote for this many ticks unless it
hears from a leader first (a wiped replica has forgotten its vote; ADR 0005)."""

assert frame_bytes_max > catchup_piece_bytes + 64 * 1024
assert peer_send_queue_bytes_max >= frame_bytes_max

liveness_ticks = 10
"""A peer node silent (no frame, not even a PING) for this many ticks is *silent* (what a leader
here decides on: ADR 0026) and, if it has been punctual, suspected: the quiet groups it leads
wake to elect another leader. One election timeout at the default 10 ticks."""

liveness_ticks_max = 4 * liveness_ticks
"""The longest silence after which a peer that has been late lately is suspected (liveness.py;
issue 16, RESULTS §42): 2 s at the default 50 ms tick. A node late by more than this, or
silent for good, loses its leaderships as a dead one does."""

assert 0 < liveness_ticks <= liveness_ticks_max
