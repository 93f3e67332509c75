"""A follower's receive path alone: CPU per MiB of Append frames read off a peer link (ADR 0039).

This process runs a replication `Transport` on uvloop and accepts one link; a sender process
(this script with `--send`) passes the handshake as a peer and writes `--mib` of Append frames,
each holding one entry of `--chunk-bytes` (W1 at 16 KiB makes ~4 chunks per MiB: ~256 KiB),
a Heartbeat after each. Every frame is decoded (`codec.decode_raft`, as the driver does), and
nothing else is done with it, so the figure is the receive path: the kernel's recv, the
transport's reads and copies, the decode. The receiver's CPU (user and system, getrusage) from
the first frame to the last is printed per MiB, as one JSON line; the sender's is not counted.
CPU time, unlike MiB/s, holds up on a shared machine.

    .venv/bin/python benchmarks/peer_receive.py --mib 1024 --label after --out results.jsonl

Run it with another build's `src/node/replication/transport.py` checked out for a before/after
(RESULTS §45).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

from loadclient import emit, loadavg
from spate.core import frames
from spate.core.ids import NodeId, PartitionId, StreamName, Term
from spate.node.replication import codec
from spate.node.replication.messages import Append, Entry, Heartbeat
from spate.node.replication.transport import Transport

RECEIVER, SENDER = NodeId("n1"), NodeId("n2")
SECRET = "bench"
KEY = (StreamName("bench"), PartitionId(0))
SEND_BYTES = 8 * 1024 * 1024
"""Frames written per sendall."""


def _frames(chunk_bytes: int, index: int) -> bytes:
    chunk = bytes((index + i) % 251 for i in range(251)) * (chunk_bytes // 251 + 1)
    append = Append(
        Term(2),
        SENDER,
        RECEIVER,
        index,
        Term(2),
        (Entry(index + 1, Term(2), chunk[:chunk_bytes]),),
        index,
    )
    heartbeat = Heartbeat(Term(2), SENDER, RECEIVER, index)
    return frames.frame_bytes(codec.encode_raft(KEY, append)) + frames.frame_bytes(
        codec.encode_raft(KEY, heartbeat)
    )


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            more = sock.recv(count - len(data))
            if not more:
                raise SystemExit("receiver closed the link")
            data += more
        return data

    length, kind = frames.FRAME_HEAD.unpack(exactly(frames.FRAME_HEAD_BYTES))
    return kind, exactly(length - 1)


def send(port: int, total_bytes: int, chunk_bytes: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    kind, body = _read_frame(sock)
    assert kind == frames.KIND_CHALLENGE
    _, nonce_s = frames.decode_challenge(body)
    nonce_c = os.urandom(frames.NONCE_BYTES)
    sock.sendall(
        frames.encode_hello(
            SENDER, nonce_c, frames.mac(SECRET.encode(), b"c", nonce_s, SENDER, RECEIVER)
        )
    )
    kind, _ = _read_frame(sock)
    assert kind == frames.KIND_WELCOME
    pair = len(_frames(chunk_bytes, 0))
    block = b"".join(_frames(chunk_bytes, i) for i in range(max(1, SEND_BYTES // pair)))
    sent = 0
    try:
        while sent < total_bytes:
            sock.sendall(block)
            sent += len(block)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the receiver had what it counts and stopped
    sock.close()


async def receive(total_bytes: int, chunk_bytes: int) -> dict[str, float]:
    done = asyncio.get_running_loop().create_future()
    got = {"bytes": 0, "frames": 0}
    start: list[resource.struct_rusage | float] = []

    def on_frame(peer: NodeId, kind: int, body: memoryview) -> None:
        if not start:
            start.extend((resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()))
        if kind == codec.KIND_RAFT:
            codec.decode_raft(body)
        got["bytes"] += frames.FRAME_HEAD_BYTES + len(body)
        got["frames"] += 1
        if got["bytes"] >= total_bytes and not done.done():
            done.set_result((resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()))

    transport = Transport(
        RECEIVER,
        secret=SECRET,
        host="127.0.0.1",
        port=0,
        peers=lambda node: None,
        on_frame=on_frame,
    )
    port = await transport.start()
    command = [sys.executable, __file__, "--send", str(port), "--bytes", str(total_bytes)]
    sender = subprocess.Popen([*command, "--chunk-bytes", str(chunk_bytes)])
    try:
        usage1, wall1 = await asyncio.wait_for(done, 600)
    finally:
        await transport.stop()
        sender.wait(60)
    usage0, wall0 = start
    assert isinstance(usage0, resource.struct_rusage) and isinstance(wall0, float)
    mib = got["bytes"] / (1 << 20)
    user = usage1.ru_utime - usage0.ru_utime
    system = usage1.ru_stime - usage0.ru_stime
    return {
        "mib": round(mib, 1),
        "frames": got["frames"],
        "cpu_ms_per_mib": round(1000 * (user + system) / mib, 4),
        "user_ms_per_mib": round(1000 * user / mib, 4),
        "sys_ms_per_mib": round(1000 * system / mib, 4),
        "mib_per_s": round(mib / (wall1 - wall0), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB of frames to receive")
    parser.add_argument("--chunk-bytes", type=int, default=256 * 1024, help="entry size")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=None, help="append the JSON line here")
    parser.add_argument("--send", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.send:
        send(a.send, a.bytes, a.chunk_bytes)
        return
    import uvloop  # the node's loop

    load = loadavg()
    row = uvloop.run(receive(a.mib << 20, a.chunk_bytes))
    emit(
        {
            "benchmark": "peer_receive",
            "label": a.label,
            "chunk_bytes": a.chunk_bytes,
            **row,
            "loadavg_before": load,
            "loadavg_after": loadavg(),
        },
        a.out,
    )


if __name__ == "__main__":
    main()
