"""Arrow columns from bulk frames (spate.spark.columns, ADR 0029): the vectorised cut gives the
rows the per-row reader (`read_columns`) gives, for every message layout; layouts it does not
cut fall back to the per-row reader. Pure: no cluster, no Spark."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, symbol
from spate.client.messages import MessageParts, encode_plain, read_columns
from spate.core import bulk
from spate.spark.columns import Gathered, record_batch, walk
from spate.spark.source import ARROW_TYPES

NAMES = ("key", "value", "stream", "partition", "offset", "timestamp", "properties",
         "application_properties")  # fmt: skip
SCHEMA = pa.schema([pa.field(n, ARROW_TYPES[n], True) for n in NAMES])
DA = b"\x00\x53\x71\xd1\x00\x00\x00\x09\x00\x00\x00\x02\xa3\x01x\x54\x07"
"""A delivery-annotations section (map32 {x: 7}): per-message fallback frames carry them."""


def proton_message(body: Any, **fields: Any) -> bytes:
    message = Message(body=body, **fields)
    return bytes(message.encode())


LAYOUTS = {
    "plain": lambda b, _: encode_plain(b),
    "keyed": encode_plain,
    "delivered": lambda b, k: DA + encode_plain(b, k),
    "header": lambda b, k: b"\x00\x53\x70\xc0\x02\x01\x41" + encode_plain(b, k),
    "footer": lambda b, _: encode_plain(b) + b"\x00\x53\x78\xc1\x01\x00",
    "rich": lambda b, k: MessageParts(b, k, {"subject": "s"}, {"region": "emea"}).envelope(),
    "proton": lambda b, k: proton_message(b, durable=True, annotations={symbol("a"): 1}),
    "text": lambda b, k: proton_message(b.decode("latin-1")),
}


def expected(messages: list[bytes], offsets: list[int], stamps: list[int]) -> pa.RecordBatch:
    values, keys, props, apps = read_columns(messages, properties=True, application_properties=True)
    n = len(messages)
    columns = {
        "key": keys, "value": values, "stream": ["s"] * n, "partition": [3] * n,
        "offset": offsets, "timestamp": [t * 1000 for t in stamps], "properties": props,
        "application_properties": apps,
    }  # fmt: skip
    return pa.RecordBatch.from_arrays(
        [pa.array(columns[n], type=SCHEMA.field(n).type) for n in NAMES], schema=SCHEMA
    )


rows = st.lists(
    st.tuples(
        st.sampled_from(sorted(LAYOUTS)),
        st.binary(max_size=300),
        st.one_of(st.none(), st.text(min_size=1, max_size=40)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=50, deadline=None)
@given(rows, st.integers(0, 5), st.integers(1, 3))
def test_vectorised_rows_are_the_per_row_rows(
    drawn: list[tuple[str, bytes, str | None]], skip: int, pieces: int
) -> None:
    messages = [LAYOUTS[layout](body, key) for layout, body, key in drawn]
    offsets = [10 + 2 * i for i in range(len(messages))]  # gaps: a filtered read's
    stamps = [1_000 + i // 4 for i in range(len(messages))]
    frame = bulk.parse(bulk.encode_rows(offsets, stamps, messages))
    skip = min(skip, len(messages) - 1)  # rows dropped at the front (a range's start)
    cuts = sorted({skip, len(messages), *(skip + (len(messages) - skip) * k // pieces
                                          for k in range(1, pieces))})  # fmt: skip
    frames = [frame.rows(a, b) for a, b in itertools.pairwise(cuts) if a < b]
    got = record_batch(frames, SCHEMA, "s", 3)
    want = expected(messages[skip:], offsets[skip:], stamps[skip:])
    assert got.equals(want), (got.to_pylist()[:3], want.to_pylist()[:3])
    # and a narrower schema, columns in another order
    narrow = pa.schema([SCHEMA.field("value"), SCHEMA.field("offset"), SCHEMA.field("key")])
    assert record_batch(frames, narrow, "s", 3).equals(want.select(["value", "offset", "key"]))


def test_plain_and_keyed_rows_are_cut_without_the_per_row_reader() -> None:
    messages = [
        encode_plain(b"v" * n, None if n % 2 else f"k{n}") for n in (0, 1, 255, 256, 70_000)
    ]
    messages.append(DA + encode_plain(b"delivered", "key"))
    frame = bulk.parse(bulk.encode_rows(range(6), [5] * 6, messages))
    cut = walk(Gathered([frame]))
    assert cut is not None
    got = record_batch([frame], SCHEMA, "s", 3)
    assert got.equals(expected(messages, list(range(6)), [5] * 6))


@pytest.mark.parametrize("layout", ["rich", "proton", "text"])
def test_other_layouts_take_the_per_row_way(layout: str) -> None:
    messages = [encode_plain(b"a"), LAYOUTS[layout](b"b", "k")]
    frame = bulk.parse(bulk.encode_rows([0, 1], [0, 0], messages))
    assert walk(Gathered([frame])) is None
    assert record_batch([frame], SCHEMA, "s", 3).equals(expected(messages, [0, 1], [0, 0]))


def test_damaged_frames_are_refused() -> None:
    a = bulk.parse(bulk.encode_rows([5], [0], [encode_plain(b"a")]))
    b = bulk.parse(bulk.encode_rows([5], [0], [encode_plain(b"b")]))
    with pytest.raises(bulk.FrameError, match="offsets do not increase"):
        record_batch([a, b], SCHEMA, "s", 3)
