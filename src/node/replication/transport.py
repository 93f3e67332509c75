"""Node-to-node transport: framed asyncio TCP (optionally TLS), authenticated by HMAC.

Each node dials one connection to every peer it sends to and accepts the connections its peers
dial: a node *sends* on the connection it dialed and *receives* on those it accepted, so there
is no simultaneous-open race to break and a slow receiver only ever back-pressures its own
inbound socket. Every partition's Raft traffic between two nodes shares that one connection
(frames carry the group id, see codec.py).

Sending never blocks and never raises: `send` queues an encoded frame for the peer's writer
task; frames queued during one loop turn go out in one vectored write (`writelines`, up to
`limits.peer_write_bytes_max`), so many small Raft messages cost one syscall, and a frame in
pieces (an Append's chunks, `frames.FrameParts`) is never joined: the kernel reads each large
piece where it is (ADR 0037). The queue is bounded by `limits.peer_send_queue_bytes_max`: past
it frames are dropped, as a lossy network would drop them (Raft retransmits). While a peer is
unreachable its frames are dropped and the writer redials with backoff.

Receiving: once an accepted connection's peer is authenticated, the connection is handed from
the handshake's StreamReader to a `FrameReceiver` (spate.core.receiver), which has the kernel
read frames into buffers it owns (a large frame into one of its own size) instead of copying
every byte three times on the way (ADR 0039); every frame goes to `on_frame` on the loop as it
is read, and what a read's frames queued for gateway sessions is written at the end of that
read (ADR 0045). A gateway's session (a KIND_SESSION hello) is handed to a FrameReceiver the
same way: `on_session` opens it, its frames go to `Session.on_frame`, and `flush_with` has its
replies written at this transport's next flush.

Handshake (codec.py kinds 10-12), both sides proving they hold the cluster secret:

```
server -> client  CHALLENGE(server_id, nonce_s)
client -> server  HELLO(client_id, nonce_c, HMAC-SHA256(secret, "c" | nonce_s | client | server))
server -> client  WELCOME(HMAC-SHA256(secret, "s" | nonce_c | server | client))
```

A peer that fails it is refused with a log line naming its address (and claimed id).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import ssl
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Protocol

from spate.core import frames
from spate.core.ids import NodeId
from spate.core.receiver import FrameReceiver
from spate.node.replication import limits

log = logging.getLogger(__name__)

FrameHandler = Callable[[NodeId, int, memoryview], None]
"""Called on the loop for every frame received: (peer, kind, body)."""
PeerAddress = Callable[[NodeId], tuple[str, int] | None]
LinkClosed = Callable[[NodeId], None]
"""Called on the loop when a peer's process closed the connection it dialed to this node."""


class Session(Protocol):
    """One authenticated gateway session (frames.KIND_SESSION), opened by `SessionOpener`: its
    frames come to `on_frame` as the loop reads them (ADR 0045); `close` once it ended."""

    frame_bytes_max: int
    """The largest frame the session takes (a larger one closes it: CodecError)."""

    def on_frame(self, kind: int, body: memoryview) -> None: ...

    def close(self) -> None: ...


SessionOpener = Callable[[str, asyncio.StreamWriter, "Transport"], Session]
"""Opens a session for (gateway id, its writer, this transport: `Transport.flush_with`)."""
_mac = frames.mac


async def read_frame(
    reader: asyncio.StreamReader, bytes_max: int = limits.frame_bytes_max
) -> tuple[int, memoryview]:
    head = await reader.readexactly(frames.FRAME_HEAD_BYTES)
    length, kind = frames.FRAME_HEAD.unpack(head)
    if length < 1 or length > bytes_max:
        raise frames.CodecError(f"frame of {length} bytes (limit {bytes_max})")
    body = await reader.readexactly(length - 1) if length > 1 else b""
    return kind, memoryview(body)


JOIN_BYTES_MAX = 4096
"""Pieces up to this size are joined into their neighbours before a write (a copy cheaper
than an iovec each: many partitions' heartbeats make many small frames a turn); larger ones,
an Append's chunks, are handed to the kernel where they are."""


def _write_some(peer: _Peer, writer: asyncio.StreamWriter) -> None:
    """Write up to `peer_write_bytes_max` of the queued frames with one vectored write (uvloop's
    `writelines` hands the pieces to one `writev` and keeps what the socket did not take
    without copying it): runs of small pieces joined, large ones as they are."""
    batch: list[bytes | memoryview] = []
    small: list[bytes | memoryview] = []
    size = 0
    queued, sizes = peer.frames, peer.sizes
    while queued and size < limits.peer_write_bytes_max:
        data = queued.popleft()
        size += sizes.popleft()
        for piece in (data,) if isinstance(data, bytes) else data:
            if len(piece) <= JOIN_BYTES_MAX:
                small.append(piece)
                continue
            if small:
                batch.append(b"".join(small) if len(small) > 1 else small[0])
                small = []
            batch.append(piece)
    if small:
        batch.append(b"".join(small) if len(small) > 1 else small[0])
    peer.queued_bytes -= size
    if len(batch) == 1:
        writer.write(batch[0])
    else:
        writer.writelines(batch)


class _Peer:
    def __init__(self, node: NodeId) -> None:
        self.node = node
        self.frames: deque[frames.Frame] = deque()
        self.sizes: deque[int] = deque()
        """`frames[i]`'s bytes."""
        self.queued_bytes = 0
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        self.writer: asyncio.StreamWriter | None = None
        """The connected writer while the write loop is not waiting for it to drain."""


class Transport:
    def __init__(
        self,
        node: NodeId,
        *,
        secret: str,
        host: str,
        port: int,
        peers: PeerAddress,
        on_frame: FrameHandler,
        ssl_server: ssl.SSLContext | None = None,
        ssl_client: ssl.SSLContext | None = None,
        on_session: SessionOpener | None = None,
        on_link_closed: LinkClosed | None = None,
    ) -> None:
        self.node = node
        self._secret = secret.encode()
        self._host = host
        self._port = port
        self._address_of = peers
        self._on_frame = on_frame
        self._ssl_server = ssl_server
        self._ssl_client = ssl_client
        self.on_session = on_session
        """Serves gateway sessions (ADR 0008); None refuses them."""
        self.on_link_closed = on_link_closed
        """Told when a peer closes its connection here (a dead process's sockets close: node
        liveness need not wait for what it learned of that peer's lateness)."""
        self._peers: dict[NodeId, _Peer] = {}
        self._server: asyncio.Server | None = None
        self._inbound: set[asyncio.Task[None]] = set()
        self._inbound_writers: set[asyncio.StreamWriter] = set()
        self._closing = False
        self._flush_soon = False
        self._flush_also: list[Callable[[], None]] = []
        """`flush_with`'s callbacks: run by the next `flush`."""
        self.frames_dropped = 0
        self.refused = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, ssl=self._ssl_server
        )
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = [p.task for p in self._peers.values() if p.task is not None]
        for task in tasks:
            task.cancel()
        for writer in list(self._inbound_writers):
            writer.close()  # the reading tasks end on their own (no cancel: see asyncio streams)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._inbound:
            await asyncio.wait(list(self._inbound), timeout=1.0)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    # -- sending

    def send(self, peer: NodeId, data: frames.Frame) -> bool:
        """Queue one encoded frame (whole or in pieces); False when it was dropped (queue full
        or closing)."""
        assert peer != self.node
        if self._closing:
            return False
        state = self._peers.get(peer)
        if state is None:
            state = self._peers[peer] = _Peer(peer)
            state.task = asyncio.get_running_loop().create_task(
                self._dial_loop(state), name=f"replication-send-{peer}"
            )
        size = frames.frame_size(data)
        if not state.connected or (state.queued_bytes + size > limits.peer_send_queue_bytes_max):
            self.frames_dropped += 1
            return False
        state.frames.append(data)
        state.sizes.append(size)
        state.queued_bytes += size
        if state.writer is None:
            state.wake.set()  # the write loop is draining or not writing yet: it sends this
        elif not self._flush_soon:
            # Written at the end of this loop turn (or by an earlier `flush`), every frame of
            # the turn in one write per peer, without waking the write loop task: an idle
            # node's PINGs woke each peer's writer task 20 times a second (issue 16).
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush_later)
        return True

    def _flush_later(self) -> None:
        self._flush_soon = False
        self.flush()

    def flush_with(self, callback: Callable[[], None]) -> None:
        """Run `callback` (a gateway session's write of its queued frames) at the next
        `flush` or `flush_sessions`: the end of the read (of a peer's link or a session),
        batch or early send under way, or else at the end of this loop turn (ADR 0045). A
        session's replies and pushes made while the node applies a commit leave with it, not
        a loop turn later (on a busy node a turn can take a millisecond)."""
        self._flush_also.append(callback)
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush_later)

    def flush_sessions(self) -> None:
        """Run the `flush_with` callbacks (gateway sessions write what they queued); the end
        of every read of an accepted link does (ADR 0045)."""
        if self._flush_also:
            also, self._flush_also = self._flush_also, []
            for callback in also:
                callback()

    def flush(self) -> None:
        """Write every queued frame now, on this loop turn, to each link whose socket buffer is
        below `peer_write_bytes_max`; the rest stays queued for the link's write loop (which
        waits for the socket to drain). Saves the loop turns of waking the writer task. Runs
        the `flush_with` callbacks too."""
        self.flush_sessions()
        for peer in self._peers.values():
            writer = peer.writer
            while (
                peer.frames
                and writer is not None
                and not writer.transport.is_closing()
                and writer.transport.get_write_buffer_size() < limits.peer_write_bytes_max
            ):
                _write_some(peer, writer)
            if peer.frames:
                peer.wake.set()  # the socket is backed up: the write loop waits for it to drain

    def connected(self, peer: NodeId) -> bool:
        state = self._peers.get(peer)
        return state is not None and state.connected

    def dial(self, peer: NodeId) -> None:
        """Start connecting to `peer` ahead of the first send."""
        if peer not in self._peers and not self._closing:
            state = self._peers[peer] = _Peer(peer)
            state.task = asyncio.get_running_loop().create_task(
                self._dial_loop(state), name=f"replication-send-{peer}"
            )

    async def _dial_loop(self, peer: _Peer) -> None:
        delay_ms = limits.reconnect_delay_ms_min
        while not self._closing:
            address = self._address_of(peer.node)
            opened: asyncio.StreamWriter | None = None
            try:
                if address is None:
                    raise OSError(f"no replication address known for {peer.node}")
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(address[0], address[1], ssl=self._ssl_client),
                    limits.handshake_timeout_ms / 1000,
                )
                opened = writer
                await asyncio.wait_for(
                    self._client_handshake(reader, writer, peer.node),
                    limits.handshake_timeout_ms / 1000,
                )
                delay_ms = limits.reconnect_delay_ms_min
                peer.connected = True
                await self._write_loop(peer, reader, writer)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, frames.CodecError) as error:
                log.debug("replication link %s -> %s down: %s", self.node, peer.node, error)
            finally:
                peer.connected = False
                self.frames_dropped += len(peer.frames)
                peer.frames.clear()
                peer.sizes.clear()
                peer.queued_bytes = 0
                if opened is not None:
                    opened.close()
            await asyncio.sleep(delay_ms / 1000)
            delay_ms = min(2 * delay_ms, limits.reconnect_delay_ms_max)

    async def _client_handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, expected: NodeId
    ) -> None:
        kind, body = await read_frame(reader)
        if kind != frames.KIND_CHALLENGE:
            raise frames.CodecError(f"expected a challenge, got frame kind {kind}")
        server, nonce_s = frames.decode_challenge(body)
        if server != expected:
            raise frames.CodecError(f"dialed {expected} but {server} answered")
        nonce_c = os.urandom(frames.NONCE_BYTES)
        mac = _mac(self._secret, b"c", nonce_s, self.node, server)
        writer.write(frames.encode_hello(self.node, nonce_c, mac))
        await writer.drain()
        kind, body = await read_frame(reader)
        if kind != frames.KIND_WELCOME:
            raise frames.CodecError(f"expected a welcome, got frame kind {kind}")
        want = _mac(self._secret, b"s", nonce_c, server, self.node)
        if not hmac.compare_digest(frames.decode_welcome(body), want):
            log.warning(
                "replication: refusing peer %s: it does not hold the cluster secret", server
            )
            raise frames.CodecError("peer failed authentication")

    async def _write_loop(
        self, peer: _Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # The dialed connection only carries our frames; reading it detects the peer closing.
        closed = asyncio.ensure_future(reader.read(1))
        peer.writer = writer
        try:
            while not self._closing:
                if not peer.frames:
                    peer.wake.clear()
                    waiter = asyncio.ensure_future(peer.wake.wait())
                    done, _ = await asyncio.wait(
                        {waiter, closed}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if closed in done:
                        waiter.cancel()
                        raise OSError("peer closed the connection")
                    continue
                _write_some(peer, writer)
                peer.writer = None  # flush() must not write past the backpressure
                await writer.drain()
                peer.writer = writer
        finally:
            peer.writer = None
            closed.cancel()

    # -- receiving

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._inbound.add(task)
        self._inbound_writers.add(writer)
        where = writer.get_extra_info("peername")
        try:
            hello = await asyncio.wait_for(
                self._server_handshake(reader, writer, where), limits.handshake_timeout_ms / 1000
            )
            if hello is None:
                return
            peer, session, welcome = hello
            if session:
                await self._session(peer, reader, writer, welcome)
                return
            await self._receive(NodeId(peer), reader, writer, welcome)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as error:
            log.debug("replication link from %s closed: %s", where, error)
        except frames.CodecError as error:
            log.warning("replication: closing the link from %s: %s", where, error)
        finally:
            self._inbound.discard(task)
            self._inbound_writers.discard(writer)
            writer.close()

    async def _receive(
        self,
        node: NodeId,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        welcome: bytes,
    ) -> None:
        """Hand the connection to a FrameReceiver (ADR 0039), welcome the peer, and wait until
        the connection is lost. What the frames of one read queue for gateway sessions (a
        commit's APPENDED answers and pushes) is written at the end of that read (ADR 0045);
        Raft frames at the end of the turn, as before."""
        receiver = FrameReceiver(
            writer.transport,
            partial(self._on_frame, node),
            bytes_max=limits.frame_bytes_max,
            after_read=self.flush_sessions,
        )
        reason = await self._welcome(receiver, reader, writer, welcome)
        lost = reason is None or isinstance(reason, ConnectionResetError)
        if lost and not self._closing and self.on_link_closed is not None:
            self.on_link_closed(node)
        if reason is not None:
            raise reason

    async def _session(
        self,
        gateway: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        welcome: bytes,
    ) -> None:
        """A gateway session: its frames handed to the session as the loop reads them (a
        FrameReceiver, as a peer link's: no reading task, so no loop turn between a read and
        its frames; ADR 0045), what they queue written at the end of the read."""
        assert self.on_session is not None
        session = self.on_session(gateway, writer, self)
        try:
            receiver = FrameReceiver(
                writer.transport,
                session.on_frame,
                bytes_max=session.frame_bytes_max,
                after_read=self.flush_sessions,
            )
            reason = await self._welcome(receiver, reader, writer, welcome)
            if reason is not None and not isinstance(reason, ConnectionResetError):
                raise reason
        finally:
            session.close()

    @staticmethod
    async def _welcome(
        receiver: FrameReceiver,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        welcome: bytes,
    ) -> BaseException | None:
        """Take the connection from the handshake's StreamReader to `receiver`, welcome the
        client and wait until the connection is lost: None for its end of stream or a close
        here, else the error (a frame out of bounds raises its CodecError). The client sends
        nothing between its hello and our welcome, so the StreamReader holds no frame when
        its transport is taken from it."""
        transport = writer.transport
        transport.set_protocol(receiver)
        reason: BaseException | None
        if reader.exception() is not None:
            reason = reader.exception()
        elif reader.at_eof() or transport.is_closing():
            reason = None
        else:
            reader.feed_eof()  # nothing more reaches it: what it holds came before the welcome
            if not reader.at_eof():
                raise frames.CodecError("the peer sent frames before it was welcomed")
            writer.write(welcome)
            reason = await receiver.closed
        if receiver.error is not None:
            raise receiver.error
        return reason

    async def _server_handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: object
    ) -> tuple[str, bool, bytes] | None:
        """(client id, whether it opened a gateway session, the welcome to send it), or None
        when refused."""
        nonce_s = os.urandom(frames.NONCE_BYTES)
        writer.write(frames.encode_challenge(self.node, nonce_s))
        await writer.drain()
        kind, body = await read_frame(reader)
        session = kind == frames.KIND_SESSION
        if kind != frames.KIND_HELLO and not (session and self.on_session is not None):
            raise frames.CodecError(f"expected a hello, got frame kind {kind}")
        client, nonce_c, mac = frames.decode_hello(body)
        want = _mac(self._secret, b"c", nonce_s, client, self.node)
        if not hmac.compare_digest(mac, want) or client == self.node:
            self.refused += 1
            log.warning(
                "replication: refusing a connection from %s claiming to be node %r: "
                "it does not hold the cluster secret",
                where,
                client,
            )
            return None
        welcome = frames.encode_welcome(_mac(self._secret, b"s", nonce_c, self.node, client))
        return client, session, welcome
