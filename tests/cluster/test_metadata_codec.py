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
    CreateConsumerGroup,
    CreateStream,
    CreateSuperStream,
    DeleteConsumerGroup,
    DeleteStream,
    DeleteSuperStream,
    Heartbeat,
    LeaderReport,
    LegacyCreateStream,
    MetadataSnapshot,
    MetadataState,
    NodeRecord,
    PartitionLeader,
    PartitionRecord,
    RegisterNode,
    Rejected,
    ReportLeader,
    ReportLeaders,
    RequestId,
    StreamRecord,
)
from spate.core.errors import ErrorCode
from spate.core.groups import GroupDefinition, Strategy
from spate.core.groups import define as define_group
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import Retention, StreamConfig
from spate.core.superstreams import Routing, SuperStream, define

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
super_streams = st.integers(min_value=0, max_value=4).flatmap(
    lambda n: st.builds(
        SuperStream,
        name=texts.map(StreamName),
        partitions=st.lists(texts.map(StreamName), min_size=n, max_size=n).map(tuple),
        binding_keys=st.lists(texts, min_size=n, max_size=n).map(tuple),
        routing=st.sampled_from(Routing),
        version=ints,
    )
)
group_definitions = st.builds(
    GroupDefinition,
    stream=texts.map(StreamName),
    name=texts,
    strategy=st.sampled_from(Strategy),
    session_timeout_ms=ints,
    rebalance_delay_ms=ints,
    version=ints,
)
commands = st.one_of(
    st.builds(CreateConsumerGroup, request_id=request_ids, group=group_definitions),
    st.builds(
        DeleteConsumerGroup, request_id=request_ids, stream=texts.map(StreamName), name=texts
    ),
    st.builds(
        CreateSuperStream,
        request_id=request_ids,
        topology=super_streams,
        config=configs,
        now_ms=ints,
        default_replicas=st.booleans(),
    ),
    st.builds(DeleteSuperStream, request_id=request_ids, name=texts.map(StreamName)),
    st.builds(
        CreateStream,
        request_id=request_ids,
        config=configs,
        now_ms=ints,
        default_replicas=st.booleans(),
    ),
    st.builds(LegacyCreateStream, request_id=request_ids, config=configs),
    st.builds(DeleteStream, request_id=request_ids, name=texts.map(StreamName)),
    st.builds(
        RegisterNode,
        request_id=request_ids,
        node=texts.map(NodeId),
        amqp=texts,
        admin=texts,
        replication=st.none() | texts,
        metadata=st.none() | texts,
        now_ms=ints,
        failure_domain=st.none() | texts,
    ),
    st.builds(Heartbeat, request_id=request_ids, node=texts.map(NodeId), now_ms=ints),
    st.builds(
        ReportLeader,
        request_id=request_ids,
        stream=texts.map(StreamName),
        partition=ints.map(PartitionId),
        leader=texts.map(NodeId),
        epoch=ints.map(LeaderEpoch),
    ),
    st.builds(
        ReportLeaders,
        request_id=request_ids,
        reports=st.lists(
            st.builds(
                LeaderReport,
                stream=texts.map(StreamName),
                partition=ints.map(PartitionId),
                leader=texts.map(NodeId),
                epoch=ints.map(LeaderEpoch),
            ),
            max_size=4,
        ).map(tuple),
    ),
    st.builds(Barrier, request_id=request_ids),
)
results = st.one_of(
    st.builds(Applied, version=ints),
    st.builds(Rejected, code=st.sampled_from(ErrorCode), message=texts),
)
partitions = st.builds(
    PartitionRecord,
    replicas=st.lists(texts.map(NodeId), max_size=3).map(tuple),
    leader=st.none()
    | st.builds(PartitionLeader, node=texts.map(NodeId), epoch=ints.map(LeaderEpoch)),
)
snapshots = st.builds(
    MetadataSnapshot,
    version=ints,
    streams=st.lists(
        st.integers(min_value=0, max_value=4).flatmap(
            lambda n: st.builds(
                StreamRecord,
                config=configs.map(lambda c: StreamConfig(c.name, n, c.replicas, c.retention)),
                created_version=ints,
                partitions=st.lists(partitions, min_size=n, max_size=n).map(tuple),
            )
        ),
        max_size=5,
    ).map(tuple),
    nodes=st.lists(
        st.builds(
            NodeRecord,
            node=texts.map(NodeId),
            amqp=texts,
            admin=texts,
            replication=st.none() | texts,
            metadata=st.none() | texts,
            heartbeat_ms=ints,
            failure_domain=st.none() | texts,
        ),
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
        b"\x03" + good[1:],  # unknown format version
        b"\x01\x05" + good[2:],  # Heartbeat does not exist in format 1
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
        b'\x02\x01{"config":{"name":"a","partitions":true,"replicas":1,"retention":'
        b'{"max_age_ms":null,"max_bytes":null,"max_messages":null},"segment_bytes":1},'
        b'"default_replicas":false,"now_ms":1,"request_id":"r"}'
    )
    with pytest.raises(CodecError):  # a boolean is not an integer
        decode_command(create)


def test_create_stream_layout_is_stable() -> None:
    """The bytes are the contract with journals: format 2 as written now, and format 1 (written
    by earlier builds) still decodes, to what it meant then: a stream without placement."""
    config = StreamConfig(
        StreamName("orders"), partitions=3, retention=Retention(max_age_ms=21_600_000)
    )
    assert encode_command(CreateStream(RequestId("r1"), config, 1_700_000_000_000)) == (
        b'\x02\x01{"config":{"name":"orders","partitions":3,"replicas":1,"retention":'
        b'{"max_age_ms":21600000,"max_bytes":null,"max_messages":null},'
        b'"segment_bytes":67108864},"default_replicas":false,"now_ms":1700000000000,'
        b'"request_id":"r1"}'
    )
    format_1 = (
        b'\x01\x01{"config":{"name":"orders","partitions":3,"replicas":1,"retention":'
        b'{"max_age_ms":21600000,"max_bytes":null,"max_messages":null},'
        b'"segment_bytes":67108864},"request_id":"r1"}'
    )
    assert decode_command(format_1) == LegacyCreateStream(RequestId("r1"), config)
    assert encode_command(LegacyCreateStream(RequestId("r1"), config)) == format_1


def test_format_1_journal_and_dump_still_load() -> None:
    """An old journal replays: its streams exist unplaced (every node hosts them, as before),
    its nodes have no replication or metadata endpoint; an old dump loads the same way."""
    register_1 = (
        b'\x01\x03{"admin":"h:7600","amqp":"h:5672","node":"n1","now_ms":5,"request_id":"a"}'
    )
    create_1 = (
        b'\x01\x01{"config":{"name":"old","partitions":2,"replicas":1,"retention":'
        b'{"max_age_ms":null,"max_bytes":null,"max_messages":null},'
        b'"segment_bytes":67108864},"request_id":"b"}'
    )
    state = MetadataState()
    assert [state.apply(decode_command(r)) for r in (register_1, create_1)] == [
        Applied(1),
        Applied(2),
    ]
    record = state.view.streams[StreamName("old")]
    assert not record.placed and record.partitions == (PartitionRecord(()),) * 2
    node = state.view.nodes[NodeId("n1")]
    assert (node.amqp, node.replication, node.metadata) == ("h:5672", None, None)

    body = (
        b'{"raft":{"entries":[{"command":"","index":1,"term":1},{"command":"","index":2,'
        b'"term":1}],"voters":["127.0.0.1:1"]},"state":{"nodes":[{"admin":"h:7600",'
        b'"amqp":"h:5672","heartbeat_ms":5,"node":"n1"}],"requests":[],"streams":[{"config":'
        b'{"name":"old","partitions":2,"replicas":1,"retention":{"max_age_ms":null,'
        b'"max_bytes":null,"max_messages":null},"segment_bytes":67108864},'
        b'"created_version":2}],"version":2}}'
    )
    dump_1 = DUMP_MAGIC + b"\x01" + len(body).to_bytes(4, "big") + body
    _, snapshot = decode_dump(dump_1 + zlib.crc32(body).to_bytes(4, "big"))
    restored = MetadataState(snapshot)
    assert restored.view.streams == state.view.streams
    assert restored.view.nodes == state.view.nodes


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
    newer = data[:4] + b"\x03" + data[5:]
    for bad in (bytes(flipped), torn, wrong_magic, newer, b"", pickle.dumps({"a": 1})):
        with pytest.raises(CodecError):
            decode_dump(bad)
    body = (
        b'{"raft":{"entries":[],"voters":[]},"state":{"nodes":[],"requests":[],'
        b'"streams":[],"version":0}}'
    )
    header = DUMP_MAGIC + b"\x02" + len(body).to_bytes(4, "big")
    with pytest.raises(CodecError, match="2 log entries"):
        decode_dump(header + body + zlib.crc32(body).to_bytes(4, "big"))


def test_super_stream_layout_is_stable() -> None:
    topology = define("invoices", binding_keys=("amer", "emea"))
    command = CreateSuperStream(
        RequestId("r1"), topology, StreamConfig(StreamName("invoices"), replicas=3), 5
    )
    assert encode_command(command) == (
        b'\x02\x07{"config":{"name":"invoices","partitions":1,"replicas":3,"retention":'
        b'{"max_age_ms":null,"max_bytes":null,"max_messages":null},"segment_bytes":67108864},'
        b'"default_replicas":false,"now_ms":5,"request_id":"r1","super_stream":'
        b'{"binding_keys":["amer","emea"],"name":"invoices","partitions":["invoices-amer",'
        b'"invoices-emea"],"routing":"key","version":0}}'
    )
    assert encode_command(DeleteSuperStream(RequestId("r2"), StreamName("invoices"))) == (
        b'\x02\x08{"name":"invoices","request_id":"r2"}'
    )
    with pytest.raises(CodecError):  # super streams do not exist in format 1
        decode_command(b"\x01" + encode_command(command)[1:])


def test_dump_with_super_streams_round_trips_and_refuses_dangling_partitions() -> None:
    state = MetadataState()
    state.apply(RegisterNode(RequestId("n"), NodeId("n1"), "h:1", "h:2", "h:3", "h:4", 5))
    topology = define("invoices", partitions=2)
    config = StreamConfig(StreamName("invoices"))
    assert state.apply(CreateSuperStream(RequestId("c"), topology, config, 5)) == Applied(2)
    snapshot = state.snapshot()
    assert [t.name for t in snapshot.super_streams] == ["invoices"]
    entry = LogEntry(b"", 1, 1)
    checkpoint = RaftCheckpoint((entry, entry), ("127.0.0.1:1",))
    decoded = decode_dump(encode_dump(checkpoint, snapshot))[1]
    assert decoded == snapshot
    assert MetadataState(decoded).view == state.view
    dangling = MetadataSnapshot(
        snapshot.version, snapshot.streams[:1], snapshot.nodes, (), snapshot.super_streams
    )
    with pytest.raises(CodecError, match="invoices-1"):
        decode_dump(encode_dump(checkpoint, dangling))


def test_consumer_group_layout_is_stable() -> None:
    group = define_group("orders", "billing", strategy="sticky", session_timeout_ms=10_000)
    command = CreateConsumerGroup(RequestId("r1"), group)
    assert encode_command(command) == (
        b'\x02\x09{"group":{"name":"billing","pending_max":16,"rebalance_delay_ms":3000,'
        b'"session_timeout_ms":10000,"strategy":"sticky","stream":"orders","version":0},'
        b'"request_id":"r1"}'
    )
    # written before pending_max existed: still read, with the default
    older = (
        b'\x02\x09{"group":{"name":"billing","rebalance_delay_ms":3000,'
        b'"session_timeout_ms":10000,"strategy":"sticky","stream":"orders","version":0},'
        b'"request_id":"r1"}'
    )
    assert decode_command(older) == command
    delete = DeleteConsumerGroup(RequestId("r2"), StreamName("orders"), "billing")
    assert encode_command(delete) == (
        b'\x02\x0a{"name":"billing","request_id":"r2","stream":"orders"}'
    )
    assert decode_command(encode_command(command)) == command
    assert decode_command(encode_command(delete)) == delete
    with pytest.raises(CodecError):  # consumer groups do not exist in format 1
        decode_command(b"\x01" + encode_command(command)[1:])
    with pytest.raises(CodecError, match="strategy"):
        decode_command(encode_command(command).replace(b"sticky", b"random"))


def _groups_state() -> MetadataState:
    state = MetadataState()
    state.apply(RegisterNode(RequestId("n"), NodeId("n1"), "h:1", "h:2", "h:3", "h:4", 5))
    for name in ("orders", "clicks"):
        state.apply(CreateStream(RequestId(f"c-{name}"), StreamConfig(StreamName(name)), 5))
    for stream, group in (("orders", "billing"), ("orders", "audit"), ("clicks", "billing")):
        command = CreateConsumerGroup(RequestId(f"g-{stream}-{group}"), define_group(stream, group))
        assert isinstance(state.apply(command), Applied)
    return state


def _rewrite_dump(data: bytes, edit: object) -> bytes:
    """The dump with its JSON body changed by `edit` (header and CRC recomputed)."""
    import json
    import struct

    length = struct.unpack_from(">I", data, 5)[0]
    body = json.loads(data[9 : 9 + length])
    assert callable(edit)
    edit(body)
    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("ascii")
    return data[:5] + struct.pack(">I", len(raw)) + raw + struct.pack(">I", zlib.crc32(raw))


def test_dump_with_consumer_groups_round_trips_and_old_dumps_still_load() -> None:
    state = _groups_state()
    snapshot = state.snapshot()
    assert [(g.stream, g.name) for g in snapshot.groups] == [
        ("clicks", "billing"),
        ("orders", "audit"),
        ("orders", "billing"),
    ]
    entry = LogEntry(b"", 1, 1)
    checkpoint = RaftCheckpoint((entry, entry), ("127.0.0.1:1",))
    data = encode_dump(checkpoint, snapshot)
    decoded = decode_dump(data)[1]
    assert decoded == snapshot
    assert MetadataState(decoded).view == state.view

    # A dump written before consumer groups (and one before super streams too) still loads.
    def drop(*keys: str) -> object:
        return lambda body: [body["state"].pop(key) for key in keys]

    for keys in (("consumer_groups",), ("consumer_groups", "super_streams")):
        old = decode_dump(_rewrite_dump(data, drop(*keys)))[1]
        assert old.groups == ()
        assert old.streams == snapshot.streams
        assert MetadataState(old).view.groups == {}


def test_dump_refuses_a_group_without_its_stream_or_defined_twice() -> None:
    snapshot = _groups_state().snapshot()
    entry = LogEntry(b"", 1, 1)
    checkpoint = RaftCheckpoint((entry, entry), ("127.0.0.1:1",))
    orphan = MetadataSnapshot(
        snapshot.version,
        tuple(s for s in snapshot.streams if s.config.name == "orders"),
        snapshot.nodes,
        (),
        (),
        snapshot.groups,
    )
    with pytest.raises(CodecError, match="'clicks'"):
        decode_dump(encode_dump(checkpoint, orphan))
    twice = MetadataSnapshot(
        snapshot.version, snapshot.streams, snapshot.nodes, (), (), snapshot.groups * 2
    )
    with pytest.raises(CodecError, match="twice"):
        decode_dump(encode_dump(checkpoint, twice))


def test_a_stream_s_filter_size_is_written_only_when_it_is_not_the_default() -> None:
    """ADR 0016: `filter_size_bytes` joined the stream config later; the default is not
    written (journals stay byte for byte as before), any other value round-trips."""
    config = StreamConfig(StreamName("orders"), filter_size_bytes=64)
    data = encode_command(CreateStream(RequestId("r1"), config, 1))
    assert b'"filter_size_bytes":64' in data
    decoded = decode_command(data)
    assert isinstance(decoded, CreateStream) and decoded.config.filter_size_bytes == 64
    plain = encode_command(CreateStream(RequestId("r2"), StreamConfig(StreamName("o")), 1))
    assert b"filter_size_bytes" not in plain


def test_a_node_s_failure_domain_is_written_only_when_set_and_old_records_still_load() -> None:
    """ADR 0032: an unsharded node's registration and dump entry are byte for byte what
    earlier builds wrote (so they read them); a sharded node's carry `failure_domain`."""
    plain = RegisterNode(RequestId("r"), NodeId("n1"), "h:1", "h:2", "h:3", "h:4", 5)
    old_bytes = (
        b'\x02\x03{"admin":"h:2","amqp":"h:1","metadata":"h:4","node":"n1","now_ms":5,'
        b'"replication":"h:3","request_id":"r"}'
    )
    assert encode_command(plain) == old_bytes
    assert decode_command(old_bytes) == plain
    sharded = RegisterNode(
        RequestId("r2"), NodeId("n1-s1"), "h:1", "h:2", "h:3", None, 5, failure_domain="hostA"
    )
    encoded = encode_command(sharded)
    assert b'"failure_domain":"hostA"' in encoded
    assert decode_command(encoded) == sharded
    with pytest.raises(CodecError, match="keys"):
        decode_command(encoded.replace(b'"failure_domain"', b'"failure_domainX"'))
    state = MetadataState()
    state.apply(plain)
    state.apply(sharded)
    entry = LogEntry(b"", 1, 1)
    checkpoint = RaftCheckpoint((entry, entry), ("h:4",))
    dump = encode_dump(checkpoint, state.snapshot())
    _, loaded = decode_dump(dump)
    assert {n.node: n.failure_domain for n in loaded.nodes} == {"n1": None, "n1-s1": "hostA"}
    # a dump written before the field (no key in its node entries) loads with None
    old_state = MetadataState()
    old_state.apply(plain)
    _, old = decode_dump(encode_dump(checkpoint, old_state.snapshot()))
    assert old.nodes[0].failure_domain is None
