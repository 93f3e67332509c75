"""Every limit in one place, named with its unit. Related limits are asserted together below."""

from __future__ import annotations

# Messages and chunks
message_bytes_max = 1024 * 1024
"""Largest encoded AMQP message a producer may publish (amqp:link:message-size-exceeded above)."""
chunk_records_max = 10_000
"""Most records one chunk (the unit of append, fsync, replication and read) may carry."""
chunk_bytes_max = 8 * 1024 * 1024
"""Largest chunk payload; one producer batch is cut into chunks no bigger than this."""

sub_entry_messages_max = 10_000
"""Most messages one sub-entry (ADR 0017) may hold: it becomes one chunk, so at most
chunk_records_max; RabbitMQ's layout has room for 65535 (u16)."""
sub_entry_uncompressed_bytes_max = 8 * 1024 * 1024
"""Largest uncompressed size a sub-entry may declare: what unpacking it for a plain consumer may
allocate (the compressed transfer itself is at most message_bytes_max)."""

partition_pending_appends_max = 100_000
"""Appends written but waiting for their fsync, per partition; past it, appends are refused
(ResourceLimitExceeded, retryable)."""

# Segments
segment_bytes_default = 64 * 1024 * 1024
segment_bytes_min = 64 * 1024
segment_bytes_max = 4 * 1024 * 1024 * 1024 - 1
index_interval_bytes = 4096
"""A sparse-index entry is written at most once per this many segment bytes."""
producer_names_max = 4096
"""Producer names whose last publishing id a partition remembers (deduplication, ADR 0011);
past it the name written least recently is forgotten."""
producer_name_bytes_max = 256
consumer_names_max = 4096
"""Consumer names whose stored offset a partition remembers (offset tracking, ADR 0012); past
it the name stored least recently is forgotten."""
consumer_name_bytes_max = 256
"""A `spate:consumer-name` (and an operator's offset reset names one of those)."""
group_name_bytes_max = 256
"""A consumer group's name (`event-streams-consumer-group`, `spate group create`)."""
tracked_name_bytes_max = consumer_name_bytes_max + 16
"""A name in a partition's offset table: a consumer name, or a group's reserved name
(`$group/<g>`, `$epoch/<g>`, `$generation/<g>`: ADR 0015), whose prefix takes up to 12 bytes
on top of the group's name."""
offset_commit_messages = 1000
"""A named consumer's accepted offset is stored after at most this many settled messages..."""
offset_commit_interval_ms = 200
"""...or this long after the first one not stored yet, whichever comes first; and always
when its link detaches (`spate node run --offset-commit-messages/--offset-commit-ms`)."""

# Streams
stream_name_bytes_max = 200
partitions_max = 1024
replicas_max = 5
super_stream_partitions_max = 256
"""Partition streams of one super stream (each is a stream: they count against the metadata
service's stream limit too)."""

# Consumer groups (ADR 0015)
group_members_max = 1024
"""Members one consumer group may have; the coordinator refuses the next join (GroupFull)."""
group_session_timeout_ms_default = 30_000
group_session_timeout_ms_min = 1_000
group_session_timeout_ms_max = 30 * 60_000
"""A member silent this long leaves its group (Kafka's bounds: 6 s..30 min; 1 s here so tests
can exercise an expiry): a crashed member holds its partitions at most this long."""
group_rebalance_delay_ms_default = 3_000
group_rebalance_delay_ms_max = 5 * 60_000
group_pending_max_default = 16
group_pending_max_max = 1000
"""Members beyond the partition count a group keeps waiting for a partition (000 §4.5.1
scenario 2); the next is refused with `amqp:link:detach-forced`. 0: refuse at once."""
"""Joins and leaves within this long of the first one are coalesced into one rebalance
(Kafka's group.initial.rebalance.delay.ms, 3 s by default), so a fleet starting up rebalances
once."""
group_sync_wait_ms_max = 60_000
"""One member poll (`sync`) waits at most this long at the coordinator (a gateway's poll over
the wire adds its request timeout on top); members poll well within their session timeout."""

# AMQP
link_credit_max = 5000
"""Credit granted to a producer link; 000/research: windows >= 5000 matter for throughput."""
link_credit_bytes = 16 * 1024 * 1024
"""A producer link's credit window covers at most this many bytes of its messages (ADR 0048):
`link_credit_max` credits for messages up to ~3.3 KiB, fewer for larger ones (1024 at 16 KiB),
never fewer than `link_credit_min`. Before its first message a link's messages are taken to be
`message_bytes_max` long, so its first window is `link_credit_min`."""
link_credit_min = 16
producer_unconfirmed_max = 20_000
"""Deliveries a connection may hold unsettled while they wait for durability; past it, no credit."""
producer_in_flight_bytes_max = 32 * 1024 * 1024
"""Bytes of a connection's messages handed to partitions and not answered yet, pre-settled ones
included (ADR 0048); past it, no credit. With the credit windows above, what a connection holds
is at most this plus one window per producer link."""
consumer_send_batch_max = 2000
"""Deliveries written to one consumer link per pump, so one link cannot starve the others."""
bulk_delivery_messages_max = 4096
"""Messages one bulk delivery (`spate.core.bulk`, ADR 0029) carries at most; a bulk link's
credit counts deliveries, so its reader holds at most credit x this many messages."""
bulk_delivery_bytes = 1024 * 1024
"""A bulk delivery stops taking messages once its data passes this (one message may take it
over, up to message_bytes_max more)."""
socket_read_slice_bytes = 64 * 1024
"""Input handed to proton per loop turn (research/proton.md §1: slicing cut loop stalls 6x).
64 KiB since ADR 0047 (16 KiB before): a 1 KiB or 16 KiB producer's read in a quarter of the
loop turns took 6-10% less of the leader's CPU per message (RESULTS §58); a slice holds the
loop ~0.45 ms at p50 (0.12 before)."""
socket_read_bytes = 1024 * 1024
"""The most one read of a client connection takes (ADR 0047: the loop reads into a buffer of
this size; uvloop's own reads were 256 KiB): a flooding producer's read is one chunk, so 1 MiB
of its messages costs one chunk's work through Raft instead of four."""
ingress_hold_bytes_max = 1024 * 1024
"""Input of one large read whose messages a connection holds across slices before appending
them (one chunk per read, not per slice; a flooding client's reads are `socket_read_bytes`)."""
frame_bytes_max = 1024 * 1024 + 64 * 1024
"""AMQP max-frame-size offered to peers."""
frame_receive_buffer_bytes = 256 * 1024
"""Spate's own framed links (peer links, gateway sessions at either end; spate.core.receiver):
the staging buffer a connection's reads go into, reused: many small frames per recv(2), as the
event loop's own read buffer held (uvloop: 256 KiB)."""
frame_in_place_bytes_min = 64 * 1024
"""On those links, a frame body at least this large that a read leaves incomplete is read into
a buffer of its own, in place, instead of being copied out of staging once whole (ADR 0039)."""
connections_max = 4096
listen_backlog = 1024

assert chunk_bytes_max >= message_bytes_max, "one maximal message must fit in a chunk"
assert sub_entry_messages_max <= min(chunk_records_max, 65535), "a sub-entry is one chunk (u16)"
assert sub_entry_uncompressed_bytes_max >= message_bytes_max, "one maximal message fits"
assert segment_bytes_min >= 4096
assert segment_bytes_max >= chunk_bytes_max + 4096, "a maximal chunk must fit in an empty segment"
assert frame_bytes_max > message_bytes_max
assert link_credit_bytes // message_bytes_max == link_credit_min <= link_credit_max
assert socket_read_slice_bytes <= ingress_hold_bytes_max <= chunk_bytes_max
assert socket_read_slice_bytes <= socket_read_bytes, "a read is pushed in one or more slices"
assert 0 < frame_in_place_bytes_min <= frame_receive_buffer_bytes // 2
assert len("$generation/") + group_name_bytes_max <= tracked_name_bytes_max
assert consumer_name_bytes_max <= tracked_name_bytes_max
assert group_session_timeout_ms_min <= group_session_timeout_ms_default
assert group_session_timeout_ms_default <= group_session_timeout_ms_max
assert group_rebalance_delay_ms_default <= group_rebalance_delay_ms_max
assert group_sync_wait_ms_max <= group_session_timeout_ms_max

# Rooms and the Synap command API (ADR 0018, 003 "Configuration")
rooms_partitions_default = 8
"""Partitions of the internal `spate.rooms` stream that every room hashes onto."""
room_name_bytes_max = 256
room_events_max_default = 100_000
"""003 `max_events_per_room`: a room's history never holds more (the oldest go first)."""
room_retention_ms_default = 24 * 3600 * 1000
"""003 `retention_hours`: a room's history never holds older events."""
rooms_max_default = 100_000
"""003 `max_rooms`: rooms this gateway knows (by events or subscribers) before refusing new ones."""
room_inactive_timeout_ms_default = 24 * 3600 * 1000
"""003 `room_inactive_timeout_hours`: a room idle this long is a new room at its next event."""
room_cleanup_interval_ms_default = 60 * 60 * 1000
"""003 `room_cleanup_interval_mins`."""
room_appends_inflight_max = 4
"""Appends to one `spate.rooms` partition a gateway has in flight; room publishes arriving
meanwhile wait and go together into the next (group commit, ADR 0018)."""
room_subscribers_max_default = 10_000
"""003 `max_subscribers_per_room` (per gateway)."""
room_history_limit_default = 100
room_history_limit_max = 10_000
"""Events one `stream.history` answers at most (003: default 100)."""
subscriber_queue_events_max = 10_000
"""Events waiting to be sent to one WebSocket subscriber; past it the subscriber is dropped
(BroadcastFailed) rather than growing the gateway."""
synap_command_bytes_max = 1024 * 1024
"""Largest JSON command a Synap client may send (WebSocket message or HTTP body)."""
topic_consume_limit_max = 10_000
synap_members_max = 100_000
"""Consumer-group members one gateway tracks for Synap (member id -> coordinator member)."""

assert room_history_limit_default <= room_history_limit_max
assert synap_command_bytes_max <= message_bytes_max
