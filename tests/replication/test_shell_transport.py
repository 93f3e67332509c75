"""The replication wire codec and transport: every message round-trips; strangers without the
cluster secret are refused with a log line; TLS works with a self-signed certificate; many
partitions share one link."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import pytest
import uvloop
from spate.core import frames
from spate.core.frames import Frame
from spate.core.ids import NodeId, PartitionId, StreamName, Term
from spate.node.log import LogConfig
from spate.node.replication import codec
from spate.node.replication.host import ReplicationHost
from spate.node.replication.messages import (
    Append,
    AppendResponse,
    Entry,
    Heartbeat,
    HeartbeatResponse,
    Message,
    SnapshotMeta,
    SnapshotNeeded,
    VoteRequest,
    VoteResponse,
)
from spate.node.replication.transport import Transport
from support.amqp_clients import self_signed_cert

A, B = NodeId("n1"), NodeId("n2")
KEY = (StreamName("orders"), PartitionId(7))

MESSAGES: list[Message] = [
    VoteRequest(Term(3), A, B, 10, Term(2), True),
    VoteRequest(Term(3), A, B, 0, Term(0), False),
    VoteResponse(Term(3), B, A, True, False),
    Append(Term(4), A, B, 9, Term(3), (), 8),
    Append(
        Term(4),
        A,
        B,
        9,
        Term(3),
        (Entry(10, Term(4), b""), Entry(11, Term(4), b"chunk" * 20_000)),
        10,
    ),
    AppendResponse(Term(4), B, A, 11),
    AppendResponse(Term(4), B, A, 9, rejected=True, hint_index=5, hint_term=Term(2)),
    AppendResponse(Term(4), B, A, 0, rejected=True, hint_index=0, lost=True),
    AppendResponse(Term(4), B, A, 11, readers=True),  # wants commit updates (ADR 0044)
    Heartbeat(Term(4), A, B, 11),
    Heartbeat(Term(4), A, B, 11, quiesce=True),
    Heartbeat(Term(4), A, B, 11, round=7),  # a leadership check (Raft.confirm_leadership)
    Heartbeat(Term(4), A, B, 11, quiesce=True, round=2**40),
    HeartbeatResponse(Term(4), B, A),
    HeartbeatResponse(Term(4), B, A, round=7),
    SnapshotNeeded(Term(4), A, B, SnapshotMeta(1000, Term(3))),
    Append(Term(4), A, B, 9, Term(3), (), 8, quiet=True),  # a commit update (ADR 0042)
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_raft_message_round_trips(message: Message) -> None:
    data = frames.frame_bytes(codec.encode_raft(KEY, message))
    length, kind = frames.FRAME_HEAD.unpack_from(data)
    assert kind == codec.KIND_RAFT and length == len(data) - 4
    assert codec.decode_raft(data[frames.FRAME_HEAD_BYTES :]) == (KEY, message)


def test_an_append_is_encoded_around_its_payloads_not_through_them() -> None:
    """RESULTS §41: the leader sends a chunk to each follower without copying it; the pieces
    hold the entries' payloads themselves, and join to the frame a whole encoding would be."""
    chunks = [b"a" * 300_000, b"", b"b" * 70_000]
    message = Append(
        Term(4), A, B, 9, Term(3), tuple(Entry(10 + i, Term(4), c) for i, c in enumerate(chunks)), 9
    )
    parts = codec.encode_raft(KEY, message)
    assert isinstance(parts, tuple)
    assert parts[1] is chunks[0] and parts[3] is chunks[2]
    assert all(len(p) < 100 for i, p in enumerate(parts) if i % 2 == 0)
    data = frames.frame_bytes(parts)
    assert frames.frame_size(parts) == len(data)
    length, kind = frames.FRAME_HEAD.unpack_from(data)
    assert (kind, length) == (codec.KIND_RAFT, len(data) - 4)  # the length counts the kind
    assert codec.decode_raft(data[frames.FRAME_HEAD_BYTES :]) == (KEY, message)


def test_truncated_or_padded_frames_are_refused() -> None:
    body = frames.frame_bytes(codec.encode_raft(KEY, MESSAGES[4]))[frames.FRAME_HEAD_BYTES :]
    for cut in (0, 3, 20, len(body) - 1):
        with pytest.raises(frames.CodecError):
            codec.decode_raft(body[:cut])
    with pytest.raises(frames.CodecError):
        codec.decode_raft(body + b"\0")


def test_catchup_frames_round_trip() -> None:
    head = frames.FRAME_HEAD_BYTES
    assert codec.decode_fetch_manifest(codec.encode_fetch_manifest(KEY, 5, 99)[head:]) == (
        KEY,
        5,
        99,
    )
    files = [("00000000000000000000.segment", 65536), ("00000000000000000144.segment", 10)]
    assert codec.decode_manifest(codec.encode_manifest(6, files)[head:]) == (6, files)
    assert codec.decode_fetch_piece(
        codec.encode_fetch_piece(KEY, 7, files[0][0], 1 << 20, 4096)[head:]
    ) == (KEY, 7, files[0][0], 1 << 20, 4096)
    request_id, data = codec.decode_reply(codec.encode_piece(8, b"bytes")[head:])
    assert (request_id, bytes(data)) == (8, b"bytes")


async def _pair(
    secret_b: str,
    ssl_server: ssl.SSLContext | None = None,
    ssl_client: ssl.SSLContext | None = None,
) -> tuple[Transport, Transport, list[tuple[NodeId, int, bytes]]]:
    received: list[tuple[NodeId, int, bytes]] = []
    addresses: dict[NodeId, tuple[str, int]] = {}
    a = Transport(
        A,
        secret="right",
        host="127.0.0.1",
        port=0,
        peers=addresses.get,
        on_frame=lambda peer, kind, body: received.append((peer, kind, bytes(body))),
        ssl_server=ssl_server,
        ssl_client=ssl_client,
    )
    b = Transport(
        B,
        secret=secret_b,
        host="127.0.0.1",
        port=0,
        peers=addresses.get,
        on_frame=lambda *args: None,
        ssl_server=ssl_server,
        ssl_client=ssl_client,
    )
    addresses[A] = ("127.0.0.1", await a.start())
    addresses[B] = ("127.0.0.1", await b.start())
    return a, b, received


async def _send_until_delivered(
    b: Transport, received: list[tuple[NodeId, int, bytes]], frames: list[Frame]
) -> bool:
    b.dial(A)
    for _ in range(300):
        if b.connected(A):
            break
        await asyncio.sleep(0.01)
    else:
        return False
    for data in frames:
        assert b.send(A, data)
    for _ in range(300):
        if len(received) >= len(frames):
            return True
        await asyncio.sleep(0.01)
    return False


def test_a_peer_without_the_secret_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        a, b, received = await _pair("wrong")
        try:
            frame = codec.encode_raft(KEY, MESSAGES[0])
            assert not await _send_until_delivered(b, received, [frame])
            assert received == [] and a.refused >= 1
        finally:
            await b.stop()
            await a.stop()

    caplog.set_level(logging.WARNING, logger="spate.node.replication.transport")
    asyncio.run(main())
    assert "claiming to be node 'n2': it does not hold the cluster secret" in caplog.text


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_appends_in_pieces_arrive_whole_and_in_order(loop: str) -> None:
    """Appends sent in pieces (a 1 MiB chunk, small ones, barriers) between whole frames, more
    than one write takes and than the socket buffers (partial vectored writes), arrive byte for
    byte and in order, on the node's loop (uvloop) and asyncio's."""
    chunks = [bytes([i % 251]) * size for i, size in enumerate([1 << 20, 100, 16_384, 0, 70_000])]
    sent: list[Message] = []
    for n in range(24):
        entries = tuple(
            Entry(10 + n * 8 + i, Term(4), c) for i, c in enumerate(chunks[n % 5 :] or chunks)
        )
        sent.append(Append(Term(4), B, A, 9 + n * 8, Term(3), entries, n))
        sent.append(Heartbeat(Term(4), B, A, n))

    async def main() -> None:
        a, b, received = await _pair("right")
        try:
            encoded = [codec.encode_raft(KEY, m) for m in sent]
            assert await _send_until_delivered(b, received, encoded)
            assert [codec.decode_raft(body)[1] for _, _, body in received] == sent
        finally:
            await b.stop()
            await a.stop()

    if loop == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


def test_frames_of_many_partitions_share_one_link_in_order() -> None:
    async def main() -> None:
        a, b, received = await _pair("right")
        try:
            frames = [
                codec.encode_raft(
                    (StreamName("s"), PartitionId(i % 16)), Heartbeat(Term(1), B, A, i)
                )
                for i in range(2000)
            ]
            assert await _send_until_delivered(b, received, frames)
            decoded = [codec.decode_raft(body) for _, _, body in received]
            assert [m.commit for _, m in decoded if isinstance(m, Heartbeat)] == list(range(2000))
            assert {peer for peer, _, _ in received} == {B}
        finally:
            await b.stop()
            await a.stop()

    asyncio.run(main())


def _self_signed(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert_path, key_path = self_signed_cert(directory)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_path, key_path)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(cert_path))
    return server, client


def test_replication_over_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    """Two hosts replicate a partition over TLS (TLS-capable transport, brief §2.3)."""
    server_ctx, client_ctx = _self_signed(tmp_path)

    async def main() -> None:
        addresses: dict[NodeId, tuple[str, int]] = {}
        ids = [A, B]
        hosts = [
            ReplicationHost(
                n,
                tmp_path / n,
                host="127.0.0.1",
                port=0,
                secret="s",
                peers=addresses.get,
                ssl_server=server_ctx,
                ssl_client=client_ctx,
                tick_ms=20,
            )
            for n in ids
        ]
        try:
            for node, host in zip(ids, hosts, strict=True):
                addresses[node] = ("127.0.0.1", await host.start())
            parts = [
                await h.open_partition(StreamName("tls"), PartitionId(0), ids, LogConfig())
                for h in hosts
            ]
            for _ in range(1000):
                if any(p.is_leader for p in parts):
                    break
                await asyncio.sleep(0.01)
            leader = next(p for p in parts if p.is_leader)
            assert await leader.append([b"secret payload"]) == 0
            for _ in range(500):
                if all(p.end_offset() == 1 for p in parts):
                    break
                await asyncio.sleep(0.01)
            assert all(p.end_offset() == 1 for p in parts)
        finally:
            for host in hosts:
                await host.stop()

    asyncio.run(main())
