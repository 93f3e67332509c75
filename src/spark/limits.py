"""The connector's limits and defaults, each named once with its unit."""

from spate.core import limits as core_limits

endpoints_max = 64
timeout_ms_default = 30_000
"""Each connect/attach and each wait for the next message of a planned range."""
credit_default = 10_000
"""Messages in flight to one reading task (link credit). research/proton.md: windows of
5,000 and more keep a consumer link streaming; the node refills at half."""
bulk_credit_default = 100_000
"""The same with bulkRead (ADR 0029): 25 bulk deliveries of up to 4,096 messages / 1 MiB each,
so at most ~25 MiB in flight per task. 10,000 (4 deliveries) left the broker short of credit
whenever a task was busy or descheduled: a read blocked 1.4x longer waiting for deliveries and
cost Spark and the broker more per row (benchmarks/RESULTS.md §30)."""
credit_max = 100_000
rows_per_batch = 8_192
"""Rows per Arrow record batch a reading task yields to Spark, at most (Spark's own
spark.sql.execution.arrow.maxRecordsPerBatch is 10,000)."""
batch_bytes_default = 16 * 1024 * 1024
"""The option maxBytesPerBatch: message bytes per Arrow record batch a reading task yields, at
most (a larger message travels alone). Rows of 1 KiB and less still fill `rows_per_batch`;
rows of 16 KiB were cut by rows alone into 128 MiB batches (benchmarks/RESULTS.md §30), held
by the task while Spark's JVM took in the same again. Named after Spark's
spark.sql.execution.arrow.maxBytesPerBatch (unbounded by default)."""
batch_bytes_max = 1024 * 1024 * 1024
"""An Arrow binary column holds under 2 GiB (int32 offsets); half of that, with room."""
write_slice_bytes = 4 * 1024 * 1024
"""A writing task turns Spark's Arrow batches (10,000 rows each, whatever their size) into
messages this many value bytes at a time, so that its Python copies of a batch (values,
encoded messages) stay bounded for large rows. Row boundaries of these slices play no part in
which rows share a sub-entry (`planning.Chunker`: the row index alone)."""
metadata_refresh_ms_default = 250
"""The driver-side runner caches `$info` this long: with the default trigger Spark polls
`latestOffset` ~25 times a second per idle query (research/pyspark.md §3)."""
tasks_per_batch_max = 10_000
"""Input partitions one planned read may have (each costs ~35-55 ms of Spark overhead)."""
window_default = 10_000
"""Unconfirmed messages per destination partition of a writing task."""
window_max = 100_000
producer_prefix_bytes_max = 128
"""The option producerName; the derived name adds at most 86 bytes (a 256-byte name limit,
limits.producer_name_bytes_max in spate.core)."""
reconnect_timeout_s = 60.0
"""How long a task's consumer or producer keeps reconnecting after losing its link (a leader
killed: a new one is elected within ~2 s)."""
test_hang_s = 300.0
"""Tests only: how long a writer told to hang (option _testFailMarker) waits to be stopped."""
rows_per_sub_entry = 1_000
"""A writing task's rows travel in sub-entries (ADR 0019 addendum): row i of a task is in grid
cell i // this, and one cell's rows for one partition are one transfer. 1,000 rows of 100 B
cost the connector ~1/30 of the CPU of as many transfers (benchmarks/RESULTS.md §18d); the
window (`window` rows) becomes window // this transfers in flight."""
sub_entry_bytes = 256 * 1024
"""A sub-entry is cut early when its messages (each + 4 length bytes) would pass this: far
below the 1 MiB message limit of the transfer that carries it. A row larger than this travels
alone."""
assert 0 < rows_per_sub_entry <= core_limits.sub_entry_messages_max
assert 0 < batch_bytes_default <= batch_bytes_max < 2**31
assert sub_entry_bytes <= core_limits.message_bytes_max // 2, "room for the envelope"
