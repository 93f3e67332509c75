"""The floor of a replicated commit in Python on this machine: the shape of Spate's commit
(client -> leader -> two followers -> leader -> client, a majority's fdatasync before the
answer) with none of Spate's work in it — no AMQP, no Raft, no log format, no metadata
service. Issue 8 asks for an offset commit p99 < 2 ms (../shared/BRIEF.md §4); this says
what three uvloop processes and a client on this machine's two cores and one disk can do at
best, so Spate's figure (RESULTS §51: p50 ~2.3 ms, p99 ~7 ms) can be read against it.

    .venv/bin/python benchmarks/commit_floor.py [--ops 6000] [--runs 3] [--modes inline,thread]

Four processes (spawned, each its own uvloop event loop on 127.0.0.1, port 0): a leader, two
followers, a client. The client sends one 100 B request at a time (8-byte header: length,
sequence) and waits for its answer. The leader appends it to its file (os.write), sends it to
both followers, syncs its own file; each follower appends and syncs, then acks; the leader
answers once two of the three have synced (itself and one follower, or both followers), as
Spate's leader does. Modes: `inline` (every fdatasync on the loop thread), `thread` (the
leader's fdatasync on a thread, the followers' inline: Spate's defaults for small batches on
a busy leader), `nosync` (no fdatasync: the processes and sockets alone).

Prints one line per run and one JSON object: per mode, the client's latency p50 / p90 / p99 /
max in ms (medians over runs) and the processes' CPU per operation in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

HEADER = struct.Struct(">II")  # payload length, sequence


def _loop() -> asyncio.AbstractEventLoop:
    import uvloop

    return uvloop.new_event_loop()


class _Framed(asyncio.Protocol):
    """Frames of HEADER + payload; `on_frame(sequence, payload)` for each."""

    def __init__(self, on_frame: Any) -> None:
        self.on_frame = on_frame
        self.buffer = bytearray()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        buffer = self.buffer
        while len(buffer) >= HEADER.size:
            length, sequence = HEADER.unpack_from(buffer)
            if len(buffer) < HEADER.size + length:
                break
            payload = bytes(buffer[HEADER.size : HEADER.size + length])
            del buffer[: HEADER.size + length]
            self.on_frame(self, sequence, payload)

    def send(self, sequence: int, payload: bytes) -> None:
        self.transport.write(HEADER.pack(len(payload), sequence) + payload)


def _follower(directory: str, ready: Any, mode: str) -> None:
    loop = _loop()
    fd = os.open(os.path.join(directory, "follower"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def on_frame(link: _Framed, sequence: int, payload: bytes) -> None:
        os.write(fd, payload)
        if mode != "nosync":
            os.fdatasync(fd)
        link.send(sequence, b"")

    server = loop.run_until_complete(loop.create_server(lambda: _Framed(on_frame), "127.0.0.1", 0))
    ready.put(server.sockets[0].getsockname()[1])
    loop.run_forever()


def _leader(directory: str, followers: list[int], ready: Any, mode: str) -> None:
    loop = _loop()
    fd = os.open(os.path.join(directory, "leader"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    votes: dict[int, int] = {}
    clients: dict[int, _Framed] = {}
    links: list[_Framed] = []

    def vote(sequence: int) -> None:
        count = votes.get(sequence, 0) + 1
        if count == 2:
            clients.pop(sequence).send(sequence, b"ok")
        votes[sequence] = count
        if count == 3:
            del votes[sequence]

    def on_ack(_: _Framed, sequence: int, payload: bytes) -> None:
        vote(sequence)

    def on_request(client: _Framed, sequence: int, payload: bytes) -> None:
        clients[sequence] = client
        os.write(fd, payload)
        for link in links:
            link.send(sequence, payload)
        if mode == "thread":
            future = loop.run_in_executor(None, os.fdatasync, fd)
            future.add_done_callback(lambda _f, s=sequence: vote(s))
        else:
            if mode == "inline":
                os.fdatasync(fd)
            vote(sequence)

    async def start() -> int:
        for port in followers:
            _, link = await loop.create_connection(lambda: _Framed(on_ack), "127.0.0.1", port)
            links.append(link)
        server = await loop.create_server(lambda: _Framed(on_request), "127.0.0.1", 0)
        return int(server.sockets[0].getsockname()[1])

    ready.put(loop.run_until_complete(start()))
    loop.run_forever()


def _client(port: int, ops: int, out: Any) -> None:
    loop = _loop()

    async def run() -> list[float]:
        answers: asyncio.Queue[int] = asyncio.Queue()
        _, link = await loop.create_connection(
            lambda: _Framed(lambda _l, s, _p: answers.put_nowait(s)), "127.0.0.1", port
        )
        payload = b"x" * 100
        samples = []
        for sequence in range(ops + ops // 10):  # the first tenth warms up
            started = time.perf_counter()
            link.send(sequence, payload)
            got = await answers.get()
            assert got == sequence, (got, sequence)
            if sequence >= ops // 10:
                samples.append((time.perf_counter() - started) * 1000)
        return samples

    out.put(loop.run_until_complete(run()))


def _cpu_us(pids: list[int]) -> float:
    tick = 1_000_000 / os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
        total += int(fields[11]) + int(fields[12])
    return total * tick


def one_run(mode: str, ops: int) -> dict[str, Any]:
    spawn = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(dir=os.environ.get("FLOOR_DIR")) as directory:
        ready = spawn.Queue()
        processes = []
        followers = []
        for _ in range(2):
            p = spawn.Process(target=_follower, args=(directory, ready, mode), daemon=True)
            p.start()
            processes.append(p)
            followers.append(ready.get(timeout=30))
        leader = spawn.Process(target=_leader, args=(directory, followers, ready, mode))
        leader.daemon = True
        leader.start()
        processes.append(leader)
        port = ready.get(timeout=30)
        out = spawn.Queue()
        client = spawn.Process(target=_client, args=(port, ops, out), daemon=True)
        pids = [p.pid for p in processes if p.pid is not None]
        before = _cpu_us(pids)
        client.start()
        samples = sorted(out.get(timeout=600))
        after = _cpu_us(pids)
        client.join(timeout=30)
        for p in processes:
            p.kill()
            p.join(timeout=10)

    def at(q: float) -> float:
        return round(samples[min(len(samples) - 1, int(q * len(samples)))], 3)

    return {
        "answered": len(samples),
        "p50_ms": at(0.5),
        "p90_ms": at(0.9),
        "p99_ms": at(0.99),
        "max_ms": round(samples[-1], 3),
        "nodes_cpu_us_per_op": round((after - before) / (ops + ops // 10)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=6000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="inline,thread,nosync")
    a = parser.parse_args()
    modes = a.modes.split(",")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for run in range(a.runs):
        for mode in modes:  # alternated, so drift in the machine touches every mode alike
            result = one_run(mode, a.ops)
            runs[mode].append(result)
            print(run, mode, result, "load", os.getloadavg()[0], flush=True)
    summary = {
        mode: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for mode, results in runs.items()
    }
    print(json.dumps({"ops": a.ops, "runs": a.runs, "medians": summary}))


if __name__ == "__main__":
    main()
