"""Limits of the metadata service, each named once with its unit.

They live here rather than in spate.core.limits because only the metadata service reads them.
"""

from __future__ import annotations

request_ids_remembered_max = 10_000
"""Applied request ids (with their results) kept to deduplicate retried commands, oldest out first.
A client retrying a command after more than this many newer commands may see it applied twice."""

nodes_max = 1024
"""Nodes the registry holds; registering one more is refused with ResourceLimitExceeded."""

streams_max = 100_000
"""Stream definitions the metadata state holds; creating one more is refused."""

consumer_groups_max = 100_000
"""Consumer group definitions (ADR 0015) the metadata state holds, over every stream."""

command_bytes_max = 64 * 1024
"""Largest encoded command. pysyncobj splits entries at appendEntriesBatchSizeBytes (default
64 KiB) with a chunking bug (research/pysyncobj.md §6.1), so commands stay well below it."""

leader_reports_max = 200
"""Leader changes carried by one ReportLeaders command (~40 bytes each, ~8 KiB: kept well
below pysyncobj's 64 KiB append batches, research/pysyncobj.md §6.1)."""

leader_report_window_ms = 50
"""A node gathers the leader changes of this long into one ReportLeaders command (issue 16):
a stream of 1,000 partitions gets its leaders in a few commands, not 1,000."""

command_timeout_ms = 5_000
"""How long the service waits for a command to commit before reporting Unavailable."""

ready_timeout_ms = 30_000
"""How long start() waits for the local replica to be elected or to catch up with a leader."""

raft_min_timeout_s = 1.0
raft_max_timeout_s = 2.0
"""Election timeouts; 0.4/1.4 s caused spurious elections on a busy 2-core box, 1/2 s none
(research/pysyncobj.md §1.2, §6.6)."""

connection_retry_s = 1.0
"""Reconnect interval between voters; the default 5 s leaves a late starter isolated for 5 s."""

connection_stuck_s = 5.0
"""A metadata connection whose handshake has not finished, or which holds part of a message
and has read nothing more, for this long is closed so pysyncobj dials again (raft.py: pysyncobj
checks its own read timeout only when the socket has an event, so a silent one waits forever)."""

compaction_min_entries = 1_000
"""Journal entries after which the state is written to the full dump and the journal truncated."""

compaction_min_time_s = 300
"""Longest time between two full dumps while commands arrive."""

assert raft_max_timeout_s > raft_min_timeout_s
assert command_timeout_ms > raft_max_timeout_s * 1000, "a command must survive one election"
assert compaction_min_entries >= 2

# Node registry and placement ---------------------------------------------------------------------

heartbeat_interval_ms = 3_000
"""How often a node should call `MetadataService.heartbeat`: one small Raft command per node per
interval (about one per second for three nodes)."""

heartbeat_min_interval_ms = 1_000
"""`heartbeat()` skips the Raft command when this replica already shows a heartbeat of the node
younger than this, so a caller looping too fast cannot flood the log."""

node_alive_ms = 10_000
"""A node is alive while its last heartbeat is younger than this (judged at read time by the
reader's clock, and at stream creation by the creating command's clock). Three missed intervals
plus clock skew between nodes: wall clocks must agree to well within this."""

default_replicas_max = 3
"""`--replicas` not given: min(this, registered nodes)."""

assert heartbeat_min_interval_ms < heartbeat_interval_ms
assert node_alive_ms >= 3 * heartbeat_interval_ms, "a node is not dead after one lost heartbeat"

rejoin_check_ms = 3_000
"""A starting voter without a leader after this long asks the other nodes whether it is still
a voter (it may have been removed while it was down; ADR 0025)."""
assert rejoin_check_ms < ready_timeout_ms

operations_kept_max = 256
"""Cluster operations the metadata service remembers (the oldest published is dropped first;
ADR 0025)."""
operation_log_lines_max = 50
"""Steps of one operation kept in its metadata record (the last ones)."""
operation_text_max = 512
"""Characters of one operation field or step in its metadata record."""
