"""Round trips and refusals of the metadata codec (layout: src/cluster/metadata/codec.py)."""

from __future__ import annotations

import pickle
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spate.cluster.metadata.codec import (
    DUMP_MAGIC,
    CodecError,
    LogEntry,
    RaftCheckpoint,
    decode_command,
    decode_dump,
    decode_result,
    encode_command,
    encode_dump,
    encode_result,
)
from spate.cluster.metadata.state import (
    Applied,
    Barrier,
    CreateStream,
    DeleteStream,
    MetadataSnapshot,
    NodeRecord,
    RegisterNode,
    Rejected,
    RequestId,
    StreamRecord,
)
from spate.core.errors import ErrorCode
from spate.core.ids import NodeId, StreamName
from spate.core.streams import Retention, StreamConfig

ints = st.integers(min_value=-(2**70), max_value=2**70)
texts = st.text(max_size=40)  # any code points, lone surrogates included
request_ids = texts.map(RequestId)

configs = st.builds(
    StreamConfig,
    name=texts.map(StreamName),
    partitions=ints,
    replicas=ints,
    segment_bytes=ints,
    retention=st.builds(
        Retention,
        max_age_ms=st.none() | ints,
        max_bytes=st.none() | ints,
        max_messages=st.none() | ints,
    ),
)
commands = st.one_of(
    st.builds(CreateStream, request_id=request_ids, config=configs),
    st.builds(DeleteStream, request_id=request_ids, name=texts.map(StreamName)),
    st.builds(
        RegisterNode,
        request_id=request_ids,
        node=texts.map(NodeId),
        amqp=texts,
        admin=texts,
        now_ms=ints,
    ),
    st.builds(Barrier, request_id=request_ids),
)
results = st.one_of(
    st.builds(Applied, version=ints),
    st.builds(Rejected, code=st.sampled_from(ErrorCode), message=texts),
)
snapshots = st.builds(
    MetadataSnapshot,
    version=ints,
    streams=st.lists(st.builds(StreamRecord, config=configs, created_version=ints), max_size=5).map(
        tuple
    ),
    nodes=st.lists(
        st.builds(NodeRecord, node=texts.map(NodeId), amqp=texts, admin=texts, heartbeat_ms=ints),
        max_size=5,
    ).map(tuple),
    requests=st.lists(st.tuples(request_ids, results), max_size=5).map(tuple),
)
entries = st.builds(LogEntry, command=st.binary(max_size=64), index=ints, term=ints)
checkpoints = st.builds(
    RaftCheckpoint,
    entries=st.tuples(entries, entries),
    voters=st.lists(texts, max_size=3).map(tuple),
)


@given(commands)
def test_command_round_trip(command: object) -> None:
    data = encode_command(command)  # type: ignore[arg-type]
    assert decode_command(data) == command
    assert encode_command(decode_command(data)) == data  # canonical: one encoding per value


@given(results)
def test_result_round_trip(result: object) -> None:
    data = encode_result(result)  # type: ignore[arg-type]
    assert decode_result(data) == result


@settings(max_examples=50)
@given(checkpoints, snapshots)
def test_dump_round_trip(checkpoint: RaftCheckpoint, snapshot: MetadataSnapshot) -> None:
    data = encode_dump(checkpoint, snapshot)
    assert data.startswith(DUMP_MAGIC)
    assert decode_dump(data) == (checkpoint, snapshot)


@given(st.binary(max_size=200))
def test_garbage_is_refused_with_codec_error_or_decodes_to_a_command(data: bytes) -> None:
    try:
        command = decode_command(data)
    except CodecError:
        return
    assert decode_command(encode_command(command)) == command


@given(commands, st.data())
def test_any_truncation_or_bit_flip_of_a_command_is_refused_or_well_formed(
    command: object, data: st.DataObject
) -> None:
    encoded = bytearray(encode_command(command))  # type: ignore[arg-type]
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(CodecError):
        decode_command(bytes(encoded[:cut]))
    index = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    encoded[index] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
    try:
        flipped = decode_command(bytes(encoded))
    except CodecError:
        return
    assert decode_command(encode_command(flipped)) == flipped


def test_specific_refusals() -> None:
    good = encode_command(Barrier(RequestId("x")))
    refused = [
        b"",
        b"\x01",
        b"\x02" + good[1:],  # unknown format version
        b"\x01\x7f" + good[2:],  # unknown tag
        b"\x01\x04{}",  # missing field
        b'\x01\x04{"request_id":"x","extra":1}',  # unknown field
        b'\x01\x04{"request_id":1}',  # wrong type
        b'\x01\x04{"request_id":"x","request_id":"y"}',  # duplicate key
        b"\x01\x04" + b"[" * 100_000,  # nesting bomb
        b"\x01\x02" + b'{"name":"a","request_id":NaN}',
        pickle.dumps(Barrier(RequestId("x"))),  # a pickle is never accepted
    ]
    for data in refused:
        with pytest.raises(CodecError):
            decode_command(data)
    with pytest.raises(CodecError):
        decode_result(b'\x01\x42{"code":"no-such-code","message":"m"}')
    create = (
        b'\x01\x01{"config":{"name":"a","partitions":true,"replicas":1,"retention":'
        b'{"max_age_ms":null,"max_bytes":null,"max_messages":null},"segment_bytes":1},'
        b'"request_id":"r"}'
    )
    with pytest.raises(CodecError):  # a boolean is not an integer
        decode_command(create)


def test_create_stream_layout_is_stable() -> None:
    """The bytes are the contract with journals written by earlier builds."""
    config = StreamConfig(
        StreamName("orders"), partitions=3, retention=Retention(max_age_ms=21_600_000)
    )
    assert encode_command(CreateStream(RequestId("r1"), config)) == (
        b'\x01\x01{"config":{"name":"orders","partitions":3,"replicas":1,"retention":'
        b'{"max_age_ms":21600000,"max_bytes":null,"max_messages":null},'
        b'"segment_bytes":67108864},"request_id":"r1"}'
    )


def test_dump_refuses_corruption() -> None:
    entry = LogEntry(b"\x00\x80\x02", 7, 1)
    data = encode_dump(
        RaftCheckpoint((entry, entry), ("127.0.0.1:1",)), MetadataSnapshot(0, (), (), ())
    )
    assert decode_dump(data)[0].entries[0] == entry
    flipped = bytearray(data)
    flipped[20] ^= 0x01
    torn = data[:-3]
    wrong_magic = b"XXXX" + data[4:]
    newer = data[:4] + b"\x02" + data[5:]
    for bad in (bytes(flipped), torn, wrong_magic, newer, b"", pickle.dumps({"a": 1})):
        with pytest.raises(CodecError):
            decode_dump(bad)
    body = (
        b'{"raft":{"entries":[],"voters":[]},"state":{"nodes":[],"requests":[],'
        b'"streams":[],"version":0}}'
    )
    header = DUMP_MAGIC + b"\x01" + len(body).to_bytes(4, "big")
    with pytest.raises(CodecError, match="2 log entries"):
        decode_dump(header + body + zlib.crc32(body).to_bytes(4, "big"))
