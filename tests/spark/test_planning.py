"""The connector's pure parts, no Spark and no broker: options, offset planning, and the
section codec checked against proton (the real encoder and decoder)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from proton import Message, symbol
from spate.client.messages import (
    MessageDamaged,
    MessageParts,
    encode_plain,
    read_bodies,
    read_columns,
    read_parts,
)
from spate.core.superstreams import GROUP_KEY_ANNOTATION
from spate.gateway import codec as amqp
from spate.gateway import sections
from spate.spark import planning
from spate.spark.options import OptionError, read_options, write_options
from spate.spark.planning import Loss, PartitionState, Range
from support.amqp_clients import self_signed_cert

EP = {"endpoints": "127.0.0.1:5672", "stream": "orders"}


def test_options_arrive_lower_cased_and_parse() -> None:
    options = read_options(
        {
            "endpoints": "amqp://a:1, b:2",
            "stream": "orders,refunds",
            "startingoffsets": '{"orders": {"0": 23, "1": -2}}',
            "maxmessagespertrigger": "100",
            "failondataloss": "false",
        },
        streaming=True,
    )
    assert options.connection.urls == ("amqp://a:1", "amqp://b:2")
    assert options.streams == ("orders", "refunds")
    assert options.starting == {"orders": {"0": 23, "1": -2}}
    assert options.max_messages_per_trigger == 100
    assert options.fail_on_data_loss is False
    assert read_options(EP, streaming=True).starting == "latest"
    assert read_options(EP, streaming=False).starting == "earliest"


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({**EP, "startingoffset": "earliest"}, True, "'startingoffset'"),
        ({**EP, "endingoffsets": "latest"}, True, "endingOffsets"),
        ({**EP, "maxmessagespertrigger": "5"}, False, "maxMessagesPerTrigger"),
        (
            {**EP, "startingoffsets": "earliest", "startingtimestamp": "5"},
            True,
            "startingTimestamp",
        ),
        ({**EP, "startingoffsets": "latest"}, False, "startingOffsets"),
        ({**EP, "startingoffsets": '{"other": {"0": 1}}'}, True, "startingOffsets"),
        ({**EP, "startingoffsets": "{oops"}, True, "startingOffsets"),
        ({**EP, "maxmessagespertrigger": "0"}, True, "maxMessagesPerTrigger"),
        ({**EP, "failondataloss": "maybe"}, True, "failOnDataLoss"),
        ({"stream": "orders"}, True, "endpoints"),
        ({**EP, "endpoints": "https://h:5671"}, True, "endpoints"),
        ({**EP, "tlscafile": "/etc/ssl/certs/ca-certificates.crt"}, True, "tlsCaFile"),
        ({**EP, "endpoints": "amqps://h:5671", "tlscafile": "/nonexistent.pem"}, True, "tlsCaFile"),
        ({**EP, "endpoints": "amqps://h:5671", "tlscertfile": "c.pem"}, True, "tlsKeyFile"),
        (
            {**EP, "endpoints": "amqps://h:5671", "tlshostnameverification": "no"},
            True,
            "tlsHostnameVerification",
        ),
        ({**EP, "superstream": "x"}, True, "superStream"),
        ({**EP, "username": "u"}, True, "username"),
    ],
)
def test_bad_options_fail_naming_the_option(
    options: dict[str, str], streaming: bool, named: str
) -> None:
    with pytest.raises(OptionError, match=named):
        read_options(options, streaming=streaming)


def test_amqps_endpoints_carry_what_the_executors_need_to_verify(tmp_path: Path) -> None:
    """Paths, not a context, travel to the executors (a context does not pickle); the
    context is built and checked at planning, and once per process."""
    cert, _ = self_signed_cert(tmp_path)
    options = read_options(
        {**EP, "endpoints": "amqps://gw:5671,h2:7", "tlscafile": str(cert)}, streaming=True
    )
    connection = pickle.loads(pickle.dumps(options.connection))
    assert connection.urls == ("amqps://gw:5671", "amqp://h2:7")
    assert connection.tls is not None and connection.tls.ca_file == str(cert)
    context = connection.ssl_context()
    assert context is not None and context.check_hostname
    assert connection.ssl_context() is context
    plain = read_options({**EP, "endpoints": "amqps://gw:5671"}, streaming=False).connection
    assert plain.tls is not None and plain.tls.ca_file is None  # the system's CAs
    assert read_options(EP, streaming=True).connection.ssl_context() is None


def test_write_options() -> None:
    assert write_options({**EP, "producername": "job"}).producer_name == "job"
    with pytest.raises(OptionError, match="'startingoffsets'"):
        write_options({**EP, "startingoffsets": "earliest"})
    with pytest.raises(OptionError, match="stream"):
        write_options({"endpoints": "h:1", "stream": "a,b"})


META = {
    ("s", 0): PartitionState(first=0, end=10, last_timestamp_ms=None),
    ("s", 1): PartitionState(first=5, end=8, last_timestamp_ms=None),
}


def test_resolve_like_kafka() -> None:
    assert planning.resolve("earliest", META, name="x", default=-2) == {("s", 0): 0, ("s", 1): 5}
    assert planning.resolve("latest", META, name="x", default=-2) == {("s", 0): 10, ("s", 1): 8}
    assert planning.resolve({"s": {"0": 3, "1": -1}}, META, name="x", default=-2) == {
        ("s", 0): 3,
        ("s", 1): 8,
    }
    assert planning.resolve({"s": {"0": -1}}, META, name="x", default=-2)[("s", 1)] == 5
    with pytest.raises(OptionError, match="no partition 7"):
        planning.resolve({"s": {"7": 1}}, META, name="x", default=-2)
    assert planning.to_json({("s", 1): 4, ("s", 0): 2}) == {"s": {"0": 2, "1": 4}}
    assert planning.from_json({"s": {"0": 2}}) == {("s", 0): 2}


def test_rate_limit_shares_the_budget_by_backlog() -> None:
    start = {("s", 0): 0, ("s", 1): 0, ("s", 2): 10}
    latest = {("s", 0): 30, ("s", 1): 10, ("s", 2): 10}
    end = planning.limit(start, latest, 8)
    assert sum(end[k] - start[k] for k in start) == 8
    assert end == {("s", 0): 6, ("s", 1): 2, ("s", 2): 10}
    assert planning.limit(start, latest, None) == latest
    assert planning.limit(start, latest, 1000) == latest
    # never backwards, even if the broker reports less (a follower behind)
    assert planning.limit({("s", 0): 5}, {("s", 0): 3}, None) == {("s", 0): 5}


def test_new_partitions_start_at_their_first_offset() -> None:
    assert planning.with_new_partitions({("s", 0): 7}, META) == {("s", 0): 7, ("s", 1): 5}


def test_losses_name_the_partition_and_range() -> None:
    (loss,) = planning.losses({("s", 0): 0, ("s", 1): 2}, META)
    assert loss == Loss("s", 1, 2, 5)
    assert "partition 1 of stream 's': offsets [2, 5) were deleted" in loss.describe()


def test_ranges_split_lagging_partitions() -> None:
    start = {("s", 0): 0, ("s", 1): 0}
    end = {("s", 0): 100, ("s", 1): 3}
    assert planning.ranges(start, end) == [Range("s", 0, 0, 100), Range("s", 1, 0, 3)]
    split = planning.ranges(start, end, max_records_per_partition=40)
    assert split == [
        Range("s", 0, 0, 34),
        Range("s", 0, 34, 67),
        Range("s", 0, 67, 100),
        Range("s", 1, 0, 3),
    ]
    several = planning.ranges(start, end, min_partitions=5)
    assert len(several) == 5
    assert sum(r.count for r in several) == 103
    assert [r for r in several if r.partition == 1] == [Range("s", 1, 0, 3)]
    # empty ranges make no task; a range is never split below one message
    assert planning.ranges({("s", 0): 5}, {("s", 0): 5}) == []
    assert len(planning.ranges({("s", 0): 0}, {("s", 0): 2}, min_partitions=9)) == 2


def test_sections_match_proton_both_ways() -> None:
    """What MessageParts builds, proton reads back; what proton builds, read_parts reads."""
    built = MessageParts(
        b"\x00body",
        "customer-7",
        {"message-id": "m1", "subject": "s", "content-type": "text/plain", "creation-time": "5"},
        {"region": "emea"},
    ).envelope(41)
    decoded = Message()
    decoded.decode(built)
    assert bytes(decoded.body) == b"\x00body"
    assert decoded.annotations == {
        symbol("event-streams-group-key"): "customer-7",
        symbol("x-opt-publishing-id"): 41,
    }
    assert (decoded.id, decoded.subject, decoded.content_type) == ("m1", "s", "text/plain")
    assert decoded.properties == {"region": "emea"}

    message = Message(
        body="text body",
        id=7,
        subject="hello",
        creation_time=1.5,
        properties={"n": 3, "ok": True},
        annotations={symbol("event-streams-group-key"): "k"},
    )
    parts = read_parts(
        message.encode(), annotations=True, properties=True, application_properties=True
    )
    assert parts.body == b"text body"
    assert parts.group_key == b"k"
    assert parts.properties == {"message-id": "7", "subject": "hello", "creation-time": "1500"}
    assert parts.application_properties == {"n": "3", "ok": "true"}
    # only what is asked for is decoded
    assert read_parts(message.encode()).properties is None
    big = Message(body=b"x" * 70_000, inferred=True).encode()
    assert read_parts(big).body == b"x" * 70_000


def test_encode_plain_is_the_envelope_byte_for_byte() -> None:
    """The writer's fast encoder builds what the generic encoder builds (short and long forms
    of body, key and map), and proton reads it back."""
    for body in (b"", b"a", b"x" * 255, b"x" * 256, b"x" * 70_000):
        for key in (None, "", "k", "\u00e9" * 100, "k" * 230, "k" * 231, "k" * 300):
            fast = encode_plain(body, key)
            parts = MessageParts(body, key)
            slow = bytearray()
            if key is not None:
                slow += amqp.encode(
                    amqp.Described(amqp.ULong(0x72), {amqp.Symbol(GROUP_KEY_ANNOTATION): key})
                )
            slow += amqp.encode(amqp.Described(amqp.ULong(0x75), body))
            assert fast == bytes(slow) == parts.envelope(), (len(body), key)
    decoded = Message()
    decoded.decode(encode_plain(b"v", "k"))
    assert bytes(decoded.body) == b"v"
    assert decoded.annotations == {symbol("event-streams-group-key"): "k"}


def _cut(chunker: planning.Chunker, rows: list[tuple[int, int]], last_id: int = -1) -> list[Any]:
    """(row, partition) in order, ids row + 1; rows at or below last_id left out as the
    writer does."""
    out = []
    for row, partition in rows:
        if row + 1 <= last_id:
            continue
        chunk = chunker.add(partition, row, row + 1, b"m%d" % row)
        if chunk is not None:
            out.append(chunk)
    return out + chunker.drain()


def test_chunks_follow_the_row_grid_and_a_retry_stores_nothing_twice() -> None:
    rows = [(i, i % 2) for i in range(25)]
    chunks = _cut(planning.Chunker(10, 1 << 20), rows)
    # one chunk per (grid cell of 10 rows, partition); its id is its last row's
    assert [(c.partition, c.publishing_id, len(c.messages)) for c in chunks] == [
        (0, 9, 5), (1, 10, 5), (0, 19, 5), (1, 20, 5), (0, 25, 3), (1, 24, 2),
    ]  # fmt: skip

    # a first attempt stored rows 0..12 (flushed mid-cell), then died; the retry reads each
    # partition's last stored id and sends only the rows above it: every row stored once
    first = _cut(planning.Chunker(10, 1 << 20), rows[:13])
    stored = {p: [m for c in first if c.partition == p for m in c.messages] for p in (0, 1)}
    last = {p: max(c.publishing_id for c in first if c.partition == p) for p in (0, 1)}
    retry = planning.Chunker(10, 1 << 20)
    for row, partition in rows:
        if row + 1 <= last[partition]:
            continue
        chunk = retry.add(partition, row, row + 1, b"m%d" % row)
        if chunk is not None:
            stored[chunk.partition] += chunk.messages
            assert chunk.publishing_id > last[chunk.partition]
    for chunk in retry.drain():
        stored[chunk.partition] += chunk.messages
    assert sorted(stored[0] + stored[1]) == sorted(b"m%d" % i for i in range(25))

    # bytes cut a cell early; a message over the budget travels alone
    sized = planning.Chunker(100, 20)
    out = [sized.add(0, i, i + 1, b"x" * n) for i, n in enumerate((6, 6, 30, 2))]
    assert [None if c is None else len(c.messages) for c in out] == [None, None, 2, 1]
    assert [len(c.messages) for c in sized.drain()] == [1]


def test_read_bodies_slices_what_read_parts_decodes() -> None:
    """The reader's bulk body path gives read_parts' answer for every layout: delivered (with
    Spate's delivery annotations) or not, short and long data, keys, other sections."""
    messages = [
        encode_plain(b"x" * n, k) for n in (0, 1, 100, 255, 256, 70_000) for k in (None, "k")
    ]
    messages += [
        MessageParts(b"p", "k", {"subject": "s"}, {"a": "b"}).envelope(),
        Message(body="text", inferred=False).encode(),
        b"\x00\x53\x75\xa0",  # cut short
    ]
    delivered = [
        sections.encode_delivery_annotations("00000000000000000007", 5) + m for m in messages
    ]
    messages.insert(-1, MessageParts(b"v", "k" * 300).envelope())  # a str32 key
    for raws in (messages[:-1], delivered[:-1]):
        assert read_bodies(raws) == [read_parts(r).body for r in raws]
        for wanted in (False, True):
            slow = [
                read_parts(r, annotations=True, properties=wanted, application_properties=wanted)
                for r in raws
            ]
            assert read_columns(raws, properties=wanted, application_properties=wanted) == (
                [p.body for p in slow],
                [p.group_key for p in slow],
                [p.properties for p in slow],
                [p.application_properties for p in slow],
            )
    with pytest.raises(MessageDamaged):
        read_bodies([delivered[-1]])


def test_planning_processes_do_not_load_the_client() -> None:
    """Spark starts fresh Python processes per query that only plan (lookup, create, plan
    read): importing the source there must not load spate.client and proton (~0.23 CPU-s a
    process, benchmarks/RESULTS.md §30); the calls that talk to the broker import it."""
    import os
    import subprocess
    import sys

    probe = (
        "import sys, spate.spark.source as s, pyspark_spate\n"
        "reader = s.SpateDataSource({'endpoints': '127.0.0.1:1', 'stream': 'x'})"
        ".streamReader(s.SCHEMA)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('spate.client', 'proton')))\n"
        "assert not loaded, loaded\n"
        "import pickle; pickle.loads(pickle.dumps(reader))\n"
        "assert 'proton' not in sys.modules\n"
        "from spate.spark import broker\n"
        "assert 'proton' in sys.modules and broker.Columns is s.Columns\n"
    )
    site = Path(__file__).resolve().parents[2] / "src" / "spark"  # pyspark_spate's directory
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60, env=env)


def test_credit_default_is_larger_for_bulk_reads() -> None:
    """bulkRead's default window is 25 bulk deliveries, not 4 (benchmarks/RESULTS.md §30)."""
    assert read_options(EP, streaming=True).credit == 100_000
    assert read_options({**EP, "bulkread": "false"}, streaming=True).credit == 10_000
    assert read_options({**EP, "credit": "5000"}, streaming=True).credit == 5000


def test_option_names_are_case_insensitive_in_a_direct_call() -> None:
    """Spark lower-cases option keys; a direct call (a test, a benchmark, a wrapper) passes
    them as spelled. Both must mean the same: before, `startingOffsets` given camel-cased to
    read_options was accepted and silently ignored (the read started at latest)."""
    spelled = read_options(
        {
            "Endpoints": "a:1",
            "STREAM": "orders",
            "startingOffsets": "earliest",
            "maxMessagesPerTrigger": "100",
            "failOnDataLoss": "false",
            "bulkRead": "false",
            "maxBytesPerBatch": "4096",
        },
        streaming=True,
    )
    lowered = read_options(
        {
            "endpoints": "a:1",
            "stream": "orders",
            "startingoffsets": "earliest",
            "maxmessagespertrigger": "100",
            "failondataloss": "false",
            "bulkread": "false",
            "maxbytesperbatch": "4096",
        },
        streaming=True,
    )
    assert spelled == lowered
    assert spelled.starting == "earliest" and spelled.max_messages_per_trigger == 100
    assert not spelled.fail_on_data_loss and not spelled.bulk_read
    assert spelled.batch_bytes_max == 4096 and spelled.credit == 10_000
    written = write_options({**EP, "producerName": "job", "Window": "7"})
    assert (written.producer_name, written.window) == ("job", 7)
    # still refused at planning, named as given
    with pytest.raises(OptionError, match="unknown option 'startingOffset'"):
        read_options({**EP, "startingOffset": "earliest"}, streaming=True)
    with pytest.raises(OptionError, match="option endingOffsets is for batch reads"):
        read_options({**EP, "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="unknown option 'startingOffsets' for a Spate sink"):
        write_options({**EP, "startingOffsets": "earliest"})
    # one option spelled twice: the same value is one option, two values are refused
    assert read_options({**EP, "Stream": "orders"}, streaming=True).streams == ("orders",)
    with pytest.raises(OptionError, match="option stream is given twice"):
        read_options({**EP, "Stream": "refunds"}, streaming=True)


def test_max_bytes_per_batch() -> None:
    assert read_options(EP, streaming=False).batch_bytes_max == 16 * 1024 * 1024
    assert read_options({**EP, "maxbytesperbatch": "1"}, streaming=False).batch_bytes_max == 1
    for bad in ("0", "2147483648", "1MiB"):
        with pytest.raises(OptionError, match="option maxBytesPerBatch"):
            read_options({**EP, "maxbytesperbatch": bad}, streaming=False)


def _frame(offsets: list[int], sizes: list[int]) -> Any:
    from spate.core import bulk

    messages = [bytes([65 + i % 26]) * n for i, n in enumerate(sizes)]
    return bulk.parse(bulk.encode_rows(offsets, [0] * len(offsets), messages))


def test_frame_buffer_cuts_batches_by_rows_and_bytes() -> None:
    """Each batch holds at most rows_max rows and bytes_max bytes (one larger row alone);
    the batches, in order, hold every row once."""
    sizes = [10, 10, 10, 50, 10, 10, 10, 10, 10, 10, 10, 10]
    frames = [
        _frame(list(range(0, 5)), sizes[0:5]),
        _frame(list(range(5, 12)), sizes[5:12]).rows(1, 7),  # row 5 dropped: a range's start
    ]
    buffer = planning.FrameBuffer(rows_max=4, bytes_max=30)
    for frame in frames:
        buffer.add(frame)
    assert (buffer.rows, buffer.bytes, buffer.full()) == (11, 150, True)
    batches = []
    while buffer.rows:
        taken = buffer.take()
        rows = [zip(f.offset_list(), f.messages(), strict=True) for f in taken]
        batches.append([(o, len(m)) for pairs in rows for o, m in pairs])
    assert batches == [
        [(0, 10), (1, 10), (2, 10)],
        [(3, 50)],  # over bytes_max: alone
        [(4, 10), (6, 10), (7, 10)],
        [(8, 10), (9, 10), (10, 10)],
        [(11, 10)],
    ]
    assert buffer.bytes == 0 and not buffer.frames
    by_rows = planning.FrameBuffer(rows_max=4, bytes_max=1 << 20)
    by_rows.add(frames[0])
    by_rows.add(frames[1])
    assert [sum(len(f) for f in by_rows.take()) for _ in range(3)] == [4, 4, 3]


def test_row_buffer_cuts_batches_by_rows_and_bytes() -> None:
    buffer = planning.RowBuffer(rows_max=3, bytes_max=25)
    buffer.add([0, 1, 2, 3], [7] * 4, [b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 40])
    buffer.add([4, 5, 6, 7], [8] * 4, [b"e"] * 4)
    assert buffer.full() and buffer.bytes == 74
    assert buffer.take() == ([0, 1], [7, 7], [b"a" * 10, b"b" * 10])
    assert buffer.take() == ([2], [7], [b"c" * 10])
    assert buffer.take() == ([3], [7], [b"d" * 40])
    assert buffer.take() == ([4, 5, 6], [8] * 3, [b"e"] * 3)
    assert buffer.take() == ([7], [8], [b"e"]) and buffer.bytes == 0 and not buffer.rows
    assert planning.rows_that_fit([], 5, 5) == 0


def test_writer_slices_large_batches_by_bytes() -> None:
    """A writing task turns Spark's batches into messages a few MiB at a time (views); the
    rows, in order, are the batch's."""
    import pyarrow as pa
    from spate.spark import source

    values = [b"v" * n for n in (5, 5, 5, 30, 5, 5, 0, 5)]
    keys = [None, "kk", None, None, "k", None, None, None]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(values, pa.binary()), pa.array(keys, pa.string())], names=["value", "key"]
    )
    pieces = list(source.slices(batch, 12))
    assert [p.num_rows for p in pieces] == [2, 1, 1, 3, 1]
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches([batch]))
    assert list(source.slices(batch, 1 << 20)) == [batch]
    assert list(source.slices(batch.slice(0, 0), 12)) == []
