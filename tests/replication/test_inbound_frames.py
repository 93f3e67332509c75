"""An accepted peer link's receive side (ADR 0039): `inbound.FrameSplitter` gives the frames
`transport.read_frame` over a StreamReader gives, however the bytes are cut; bounds and the
end of a connection mid-frame are handled as before, through a real Transport on asyncio's
loop and uvloop's."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop
from spate.core import frames
from spate.core.ids import NodeId, PartitionId, StreamName, Term
from spate.core.receiver import FrameSplitter
from spate.node.replication import codec, limits
from spate.node.replication.messages import Append, Entry, Heartbeat
from spate.node.replication.transport import Transport, read_frame

A, B = NodeId("n1"), NodeId("n2")
SECRET = "right"
KEY = (StreamName("orders"), PartitionId(7))

# Small limits, so every cut of a stream holding each kind of frame is few enough to try.
SMALL = {"buffer_bytes": 64, "in_place_bytes_min": 20, "bytes_max": 200}
NODE = {"bytes_max": limits.frame_bytes_max}
"""A node's peer links' limits (the transport passes bytes_max; staging and the in-place size
are the receiver's defaults)."""


def _frame(kind: int, body: bytes) -> bytes:
    return frames.FRAME_HEAD.pack(len(body) + 1, kind) + body


def _stream(sizes: list[int]) -> tuple[bytes, list[tuple[int, bytes]]]:
    want = [(1 + i % 8, bytes([i % 251]) * size) for i, size in enumerate(sizes)]
    return b"".join(_frame(kind, body) for kind, body in want), want


def _split(data: bytes, cuts: list[int], **sizes: int) -> list[tuple[int, bytes]]:
    """Frames the splitter hands on when `data` arrives in reads ending at `cuts` (each read
    further cut where the splitter's buffer ends, as the kernel's would be)."""
    got: list[tuple[int, bytes]] = []
    splitter = FrameSplitter(lambda kind, body: got.append((kind, bytes(body))), **sizes)
    at = 0
    for cut in [*cuts, len(data)]:
        while at < cut:
            room = splitter.buffer()
            count = min(len(room), cut - at)
            room[:count] = data[at : at + count]
            splitter.wrote(count)
            at += count
    assert splitter.pending_bytes == 0
    return got


def _read_frames(data: bytes, cuts: list[int], bytes_max: int) -> list[tuple[int, bytes]]:
    """What the StreamReader path (`read_frame`) gives for the same reads."""

    async def main() -> list[tuple[int, bytes]]:
        reader = asyncio.StreamReader()
        at = 0
        for cut in [*cuts, len(data)]:
            if cut > at:
                reader.feed_data(data[at:cut])
                at = cut
        reader.feed_eof()
        got = []
        while not reader.at_eof():
            kind, body = await read_frame(reader, bytes_max)
            got.append((kind, bytes(body)))
        return got

    return asyncio.run(main())


# Empty bodies, small ones, one just under and one at the in-place size, one larger than the
# staging buffer, and one exactly filling it with its head.
SMALL_SIZES = [0, 3, 19, 20, 150, 0, 64 - 5, 1, 47, 20, 0]


def test_frames_split_at_every_boundary_come_out_as_read_frame_gives_them() -> None:
    data, want = _stream(SMALL_SIZES)
    assert _read_frames(data, [], 200) == want
    for cut in range(len(data) + 1):
        assert _split(data, [cut], **SMALL) == want, cut
    assert _split(data, list(range(len(data))), **SMALL) == want  # a byte per read
    for first in range(0, len(data), 7):  # two cuts: every pair at a stride
        for second in range(first, len(data), 5):
            assert _split(data, [first, second], **SMALL) == want, (first, second)


def test_random_cuts_at_the_real_sizes_match_read_frame() -> None:
    rng = random.Random(39)
    in_place = limits.frame_in_place_bytes_min
    sizes = [0, 30, in_place - 1, in_place, 300_000, 5, 1 << 20, 16_384, 0, 200_000, 70_000]
    sizes += [rng.choice([0, 10, 100, 4000, 70_000]) for _ in range(200)]
    data, want = _stream(sizes)
    for _ in range(12):
        cuts = sorted(rng.randrange(len(data)) for _ in range(rng.choice([1, 50, 2000])))
        assert _split(data, cuts, **NODE) == want
        assert _read_frames(data, cuts, limits.frame_bytes_max) == want


def test_a_large_frame_is_read_in_place_and_handed_on_read_only() -> None:
    """The kernel writes a large frame's rest straight into a buffer of the frame's size,
    which is handed on read-only and not referenced by the splitter any more (ADR 0039); a
    frame whole in staging is a bytes copy. (On the StreamReader path every body was bytes.)"""
    bodies: list[memoryview] = []
    splitter = FrameSplitter(lambda kind, body: bodies.append(body), **NODE)
    size = 3 * limits.receive_buffer_bytes
    data = _frame(1, b"a" * 10) + _frame(1, b"b" * size)
    room = splitter.buffer()
    room[:1000] = data[:1000]
    splitter.wrote(1000)
    room = splitter.buffer()
    assert len(room) == len(data) - 1000, "the rest of the large frame, no more"
    assert isinstance(room.obj, bytearray) and len(room.obj) == size
    room[:] = data[1000:]
    splitter.wrote(len(room))
    assert [len(b) for b in bodies] == [10, size]
    assert isinstance(bodies[0].obj, bytes)
    assert bodies[1].readonly and isinstance(bodies[1].obj, bytearray)
    assert bytes(bodies[1]) == b"b" * size
    assert splitter.buffer().obj is not bodies[1].obj


def test_an_append_read_in_place_keeps_its_entries_as_views_of_the_frame() -> None:
    chunk = b"c" * 200_000
    append = Append(Term(4), B, A, 9, Term(3), (Entry(10, Term(4), chunk),), 9)
    data = frames.frame_bytes(codec.encode_raft(KEY, append))
    bodies: list[memoryview] = []
    splitter = FrameSplitter(lambda kind, body: bodies.append(body), **NODE)
    at = 0
    while at < len(data):
        room = splitter.buffer()
        count = min(len(room), len(data) - at, 65_536)
        room[:count] = data[at : at + count]
        splitter.wrote(count)
        at += count
    (body,) = bodies
    _, decoded = codec.decode_raft(body)
    assert decoded == append
    assert isinstance(decoded, Append)
    payload = decoded.entries[0].payload
    assert isinstance(payload, memoryview) and payload.obj is body.obj  # not copied


@pytest.mark.parametrize("length", [0, SMALL["bytes_max"] + 1, 2**32 - 1])
def test_a_frame_out_of_bounds_is_refused_after_the_frames_before_it(length: int) -> None:
    got: list[tuple[int, bytes]] = []
    splitter = FrameSplitter(lambda kind, body: got.append((kind, bytes(body))), **SMALL)
    data = _frame(2, b"ok") + frames.FRAME_HEAD.pack(length, 1) + b"x" * 10
    room = splitter.buffer()
    room[: len(data)] = data
    with pytest.raises(frames.CodecError, match=f"frame of {length} bytes \\(limit 200\\)"):
        splitter.wrote(len(data))
    assert got == [(2, b"ok")]


# -- through a real Transport (the accepting side), with a hand-driven peer


def _run(loop: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


class _Server:
    def __init__(self, on_frame: Callable[[NodeId, int, memoryview], None] | None = None) -> None:
        self.received: list[tuple[NodeId, int, bytes]] = []
        self.closed: list[NodeId] = []
        self.transport = Transport(
            A,
            secret=SECRET,
            host="127.0.0.1",
            port=0,
            peers=lambda node: None,
            on_frame=on_frame or self._received,
            on_link_closed=self.closed.append,
        )

    def _received(self, peer: NodeId, kind: int, body: memoryview) -> None:
        self.received.append((peer, kind, bytes(body)))

    async def welcomed(
        self, *, early: bytes = b""
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection that has passed the handshake as node B (sending `early` with its
        hello, which a peer must not)."""
        port = await self.transport.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        kind, body = await read_frame(reader)
        assert kind == frames.KIND_CHALLENGE
        _, nonce_s = frames.decode_challenge(body)
        nonce_c = os.urandom(frames.NONCE_BYTES)
        mac = frames.mac(SECRET.encode(), b"c", nonce_s, B, A)
        writer.write(frames.encode_hello(B, nonce_c, mac) + early)
        if not early:
            kind, body = await read_frame(reader)
            assert kind == frames.KIND_WELCOME
        return reader, writer

    async def until(self, done: Callable[[], bool]) -> None:
        for _ in range(500):
            if done():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")


async def _closed_by_node(reader: asyncio.StreamReader) -> bool:
    """The node closed the connection: end of stream, or a reset when the node closed with
    bytes of ours unread (the kernel then sends RST instead of FIN)."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


LOOPS = ["asyncio", "uvloop"]
PING = _frame(codec.KIND_PING, b"")
HEARTBEAT = frames.frame_bytes(codec.encode_raft(KEY, Heartbeat(Term(4), B, A, 11)))
LARGE = _frame(codec.KIND_PIECE, b"p" * 300_000)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    "cut",
    [0, 2, len(HEARTBEAT) - 1, 100, 200_000, len(LARGE) - 1],
    ids=["none", "in-a-head", "small-body", "large-body", "large-in-place", "large-last-byte"],
)
def test_a_connection_lost_mid_frame_delivers_the_whole_frames_before_it(
    loop: str, cut: int
) -> None:
    """The peer's process ends (FIN) after two whole frames and `cut` bytes of a third: the
    two arrive, the part is dropped, and the link is reported closed, as with read_frame."""
    partial = (HEARTBEAT if cut < len(HEARTBEAT) else LARGE)[:cut]

    async def main() -> None:
        server = _Server()
        try:
            _, writer = await server.welcomed()
            writer.write(PING + HEARTBEAT + partial)
            await writer.drain()
            writer.close()
            await server.until(lambda: server.closed == [B])
            assert [(p, k, b) for p, k, b in server.received] == [
                (B, codec.KIND_PING, b""),
                (B, codec.KIND_RAFT, HEARTBEAT[frames.FRAME_HEAD_BYTES :]),
            ]
        finally:
            await server.transport.stop()

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_connection_reset_mid_frame_is_a_closed_link(loop: str) -> None:
    async def main() -> None:
        server = _Server()
        try:
            _, writer = await server.welcomed()
            writer.write(PING + LARGE[:150_000])
            await writer.drain()
            await server.until(lambda: len(server.received) == 1)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # a zero linger: the close sends RST
            await server.until(lambda: server.closed == [B])
            assert server.received == [(B, codec.KIND_PING, b"")]
        finally:
            await server.transport.stop()

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_an_oversized_frame_closes_the_link_with_a_warning_naming_the_limit(
    loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    length = limits.frame_bytes_max + 1
    caplog.set_level(logging.WARNING, logger="spate.node.replication.transport")

    async def main() -> None:
        server = _Server()
        try:
            reader, writer = await server.welcomed()
            writer.write(PING + LARGE + frames.FRAME_HEAD.pack(length, codec.KIND_RAFT) + b"x")
            await writer.drain()
            assert await _closed_by_node(reader)
            await server.until(lambda: len(server.received) == 2)
            assert [k for _, k, _ in server.received] == [codec.KIND_PING, codec.KIND_PIECE]
            assert server.closed == []  # refused, not lost
            writer.close()
        finally:
            await server.transport.stop()

    _run(loop, main)
    assert "replication: closing the link from ('127.0.0.1', " in caplog.text
    assert f"frame of {length} bytes (limit {limits.frame_bytes_max})" in caplog.text


@pytest.mark.parametrize("loop", LOOPS)
def test_frames_sent_before_the_welcome_are_refused(
    loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer sends nothing between its hello and the welcome (`_client_handshake`); bytes
    there would be read by neither side of the hand-over, so the link is refused."""
    caplog.set_level(logging.WARNING, logger="spate.node.replication.transport")

    async def main() -> None:
        server = _Server()
        try:
            reader, writer = await server.welcomed(early=PING)
            assert await _closed_by_node(reader)
            assert server.received == [] and server.closed == []
            writer.close()
        finally:
            await server.transport.stop()

    _run(loop, main)
    assert "the peer sent frames before it was welcomed" in caplog.text


@pytest.mark.parametrize("loop", LOOPS)
def test_a_node_stopping_closes_its_inbound_links_without_reporting_them_lost(
    loop: str,
) -> None:
    async def main() -> None:
        server = _Server()
        reader, writer = await server.welcomed()
        writer.write(PING + LARGE[:100_000])
        await writer.drain()
        await server.until(lambda: len(server.received) == 1)
        await asyncio.wait_for(server.transport.stop(), 5)
        assert await _closed_by_node(reader)
        assert server.closed == []
        writer.close()

    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_large_frame_reaches_the_node_in_the_buffer_the_kernel_read_it_into(loop: str) -> None:
    """End to end, a large frame's body is a read-only view of a buffer of exactly its size
    (ADR 0039); on the StreamReader path it was a `bytes` copied out of the reader's buffer."""
    bodies: list[memoryview] = []

    async def main() -> None:
        server = _Server(lambda peer, kind, body: bodies.append(body))
        try:
            _, writer = await server.welcomed()
            writer.write(PING + LARGE + HEARTBEAT)
            await writer.drain()
            await server.until(lambda: len(bodies) == 3)
            writer.close()
        finally:
            await server.transport.stop()

    _run(loop, main)
    large = bodies[1]
    assert large.readonly and isinstance(large.obj, bytearray)
    assert len(large.obj) == len(LARGE) - frames.FRAME_HEAD_BYTES
    assert bytes(large) == LARGE[frames.FRAME_HEAD_BYTES :]
    assert [isinstance(b.obj, bytes) for b in (bodies[0], bodies[2])] == [True, True]


# -- what a read's frames queue leaves at the end of that read (ADR 0045)


def _flush_order_recorder(
    server_transport: Callable[[], Transport], log: list[str]
) -> Callable[[int, memoryview], None]:
    """An on_frame that schedules a loop-turn marker, then queues a `flush_with` marker: the
    flush marker comes first only if the transport flushes at the end of the read."""

    def on_frame(kind: int, body: memoryview) -> None:
        loop = asyncio.get_running_loop()
        loop.call_soon(log.append, f"next turn {kind}")
        server_transport().flush_with(lambda: log.append(f"flushed {kind}"))

    return on_frame


def _flushed_first(log: list[str], kinds: list[int]) -> bool:
    return all(log.index(f"flushed {k}") < log.index(f"next turn {k}") for k in kinds)


@pytest.mark.parametrize("loop", LOOPS)
def test_what_a_peer_read_queues_for_sessions_is_written_at_the_end_of_the_read(loop: str) -> None:
    log: list[str] = []

    async def main() -> None:
        holder: list[Transport] = []
        record = _flush_order_recorder(lambda: holder[0], log)
        server = _Server(on_frame=lambda peer, kind, body: record(kind, body))
        holder.append(server.transport)
        try:
            _reader, writer = await server.welcomed()
            writer.write(PING)
            await writer.drain()
            await server.until(lambda: len(log) == 2)
            writer.close()
        finally:
            await server.transport.stop()

    _run(loop, main)
    assert _flushed_first(log, [codec.KIND_PING])


class _RecordingSession:
    frame_bytes_max = 1024

    def __init__(self, transport: Transport, log: list[str]) -> None:
        self.frames: list[tuple[int, bytes]] = []
        self.closed = 0
        self._record = _flush_order_recorder(lambda: transport, log)

    def on_frame(self, kind: int, body: memoryview) -> None:
        self.frames.append((kind, bytes(body)))
        self._record(kind, body)

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("loop", LOOPS)
def test_a_gateway_session_s_frames_are_handed_over_as_read_and_it_is_closed_once(
    loop: str,
) -> None:
    """A gateway session (KIND_SESSION hello) gets its frames through the FrameReceiver, what
    they queue written at the end of the read (before the next loop turn), a frame over its
    `frame_bytes_max` closes it, and the session is closed once when the connection ends."""
    log: list[str] = []
    sessions: list[_RecordingSession] = []

    async def main() -> None:
        server = _Server()

        def opener(gateway: str, writer: asyncio.StreamWriter, transport: Transport) -> Any:
            assert gateway == B and transport is server.transport
            sessions.append(_RecordingSession(transport, log))
            return sessions[-1]

        server.transport.on_session = opener
        try:
            port = await server.transport.start()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            kind, body = await read_frame(reader)
            _, nonce_s = frames.decode_challenge(body)
            nonce_c = os.urandom(frames.NONCE_BYTES)
            mac = frames.mac(SECRET.encode(), b"c", nonce_s, B, A)
            writer.write(frames.encode_hello(B, nonce_c, mac, kind=frames.KIND_SESSION))
            kind, _ = await read_frame(reader)
            assert kind == frames.KIND_WELCOME
            writer.write(_frame(7, b"one") + _frame(8, b"two"))
            await writer.drain()
            await server.until(lambda: len(log) == 4)
            writer.write(_frame(9, b"x" * 2000))  # over the session's 1,024 bytes
            assert await _closed_by_node(reader)
            await server.until(lambda: sessions[0].closed == 1)
            writer.close()
        finally:
            await server.transport.stop()

    _run(loop, main)
    (session,) = sessions
    assert session.frames == [(7, b"one"), (8, b"two")] and session.closed == 1
    assert _flushed_first(log, [7, 8])


def test_flush_with_runs_at_the_next_flush_once_or_else_at_the_end_of_the_turn() -> None:
    async def main() -> None:
        transport = Transport(
            A, secret=SECRET, host="127.0.0.1", port=0, peers=lambda n: None, on_frame=print
        )
        ran: list[str] = []
        transport.flush_with(lambda: ran.append("a"))
        transport.flush()
        transport.flush()
        assert ran == ["a"]
        transport.flush_with(lambda: ran.append("b"))  # nobody flushes: the turn's end does
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert ran == ["a", "b"]

    asyncio.run(main())
