"""Publish-to-consume latency: cheap to record per message, exact enough to report (pure).

A consumer appends `now_ns - stamp_ns` to an `array('q')` per delivered message (one C call,
~0.05 µs). Once a second the worker sorts that array (C) and folds it into buckets with
`fold`: the bucket of a value is found by one `bisect` per occupied bucket, not per message,
so a second's 100,000 latencies cost a sort and a few hundred bisects. Buckets are HDR-style
(log-linear): values in microseconds keep their top `SUB_BUCKET_BITS` bits, so a bucket is at
most 1/128 (0.8%) of its value wide; every value below 256 µs is its own bucket.

The conductor records the (lowest value, count) pairs into an HdrHistogram
(`hdrh.histogram.HdrHistogram.record_value(value, count)`), which keeps the whole run, answers
percentiles and writes the standard interval log (`--histogram-file`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

SUB_BUCKET_BITS = 8
"""Significant bits a bucket keeps: 256 sub-buckets per power of two, half of them in use
above 256 µs (relative width <= 2**-7)."""

NS_PER_US = 1_000


def bucket_floor_us(value_us: int) -> tuple[int, int]:
    """(the lowest value of `value_us`'s bucket, the bucket's width), both in µs."""
    shift = max(0, value_us.bit_length() - SUB_BUCKET_BITS)
    width = 1 << shift
    return (value_us >> shift) << shift, width


def fold(latencies_ns: array[int]) -> list[tuple[int, int]]:
    """Sort `latencies_ns` in place and return its buckets as (lowest value in µs, count),
    in increasing order. Negative values (clock steps cannot happen on CLOCK_MONOTONIC; a
    defensive floor) count as 0."""
    values = sorted(latencies_ns)
    out: list[tuple[int, int]] = []
    i, n = 0, len(values)
    while i < n:
        floor_us, width = bucket_floor_us(max(0, values[i]) // NS_PER_US)
        j = bisect_left(values, (floor_us + width) * NS_PER_US, i)
        assert j > i, "a bucket holds at least the value that opened it"
        out.append((floor_us, j - i))
        i = j
    return out
