#!/usr/bin/env python3
"""The gateway-to-node wire, two ways, for 100-byte records (ADR 0008, issue 7).

A gateway needs the Broker/Partition contract remote: appends pipelined (many in flight, each
answered with its first offset once committed) and reads streamed (the node pushes committed
records from an offset, the gateway grants credit). This measures the two candidates on the
hot operations only, with an in-memory partition behind the server (the wire, not fsync):

  framed  our length-prefixed binary frames on asyncio TCP, the replication transport's framing
          (spate.node.replication.codec.frame), records carried as length-prefixed bytes;
  grpc    grpc.aio bidirectional streams, records as `repeated bytes` in protobuf messages.

Server and client run in separate processes (both on the default asyncio loop). Per run:
publish COUNT records in appends of BATCH records with at most WINDOW records in flight, then
consume them all from offset 0 with WINDOW records of credit. Figures: msg/s, and CPU µs per
message of the server (utime+stime from /proc/PID/stat) and of the client (getrusage).

  python benchmarks/gateway_wire.py [--count 200000] [--batches 1,100] [--runs 3]

Prints one line per run and a summary of medians, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from spate.core.frames import FRAME_HEAD, frame

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
CHUNK_RECORDS_MAX = 256
"""Records one pushed read message carries at most (both wires)."""

# -- the framed wire ---------------------------------------------------------------------------
#
#   APPEND     1  request u64 | partition u32 | count u32 | (length u32 | record)*
#   APPENDED   2  request u64 | first offset u64
#   SUBSCRIBE  3  partition u32 | from offset u64 | credit u32
#   RECORDS    4  first offset u64 | count u32 | (length u32 | record)*
#   CREDIT     5  records u32

APPEND, APPENDED, SUBSCRIBE, RECORDS, CREDIT = 1, 2, 3, 4, 5
_APPEND_HEAD = struct.Struct(">QII")
_APPENDED = struct.Struct(">QQ")
_SUBSCRIBE = struct.Struct(">IQI")
_RECORDS_HEAD = struct.Struct(">QI")
_U32 = struct.Struct(">I")


def _records(records: list[bytes]) -> bytes:
    return b"".join(_U32.pack(len(r)) + r for r in records)


def _unrecords(body: memoryview, at: int, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        (length,) = _U32.unpack_from(body, at)
        at += 4
        out.append(bytes(body[at : at + length]))
        at += length
    return out


class Frames(asyncio.Protocol):
    """Splits the byte stream into (kind, body) frames."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        view = memoryview(self.buffer)
        at = 0
        while len(view) - at >= FRAME_HEAD.size:
            length, kind = FRAME_HEAD.unpack_from(view, at)
            end = at + 4 + length
            if end > len(view):
                break
            self.on_frame(kind, view[at + FRAME_HEAD.size : end])
            at = end
        view.release()
        del self.buffer[:at]

    def on_frame(self, kind: int, body: memoryview) -> None:
        raise NotImplementedError


class MemoryLog:
    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.listeners: list[asyncio.Event] = []

    def append(self, records: list[bytes]) -> int:
        first = len(self.records)
        self.records.extend(records)
        for event in self.listeners:
            event.set()
        return first


class FramedServer(Frames):
    def __init__(self, log: MemoryLog) -> None:
        super().__init__()
        self.log = log
        self.credit = 0
        self.position = 0
        self.subscribed = False

    def on_frame(self, kind: int, body: memoryview) -> None:
        assert self.transport is not None
        if kind == APPEND:
            request, _, count = _APPEND_HEAD.unpack_from(body, 0)
            first = self.log.append(_unrecords(body, _APPEND_HEAD.size, count))
            self.transport.write(frame(APPENDED, _APPENDED.pack(request, first)))
        elif kind == SUBSCRIBE:
            _, self.position, self.credit = _SUBSCRIBE.unpack_from(body, 0)
            self.subscribed = True
            self.push()
        elif kind == CREDIT:
            self.credit += _U32.unpack_from(body, 0)[0]
            self.push()

    def push(self) -> None:
        assert self.transport is not None
        records = self.log.records
        while self.credit > 0 and self.position < len(records):
            take = min(self.credit, CHUNK_RECORDS_MAX, len(records) - self.position)
            batch = records[self.position : self.position + take]
            head = _RECORDS_HEAD.pack(self.position, take)
            self.transport.write(frame(RECORDS, head, _records(batch)))
            self.position += take
            self.credit -= take


async def serve_framed() -> None:
    log = MemoryLog()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FramedServer(log), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Future()


class FramedClient(Frames):
    def __init__(self) -> None:
        super().__init__()
        self.confirmed = 0
        self.received = 0
        self.wake = asyncio.Event()

    def on_frame(self, kind: int, body: memoryview) -> None:
        if kind == APPENDED:
            self.confirmed += 1
        elif kind == RECORDS:
            _, count = _RECORDS_HEAD.unpack_from(body, 0)
            _unrecords(body, _RECORDS_HEAD.size, count)
            self.received += count
        self.wake.set()


async def client_framed(phase: str, port: int, count: int, batch: int, window: int) -> Timed:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(FramedClient, "127.0.0.1", port)
    assert client.transport is not None
    timed = Timed()
    if phase == "publish":
        record = b"x" * 100
        appends = count // batch
        in_flight_max = max(1, window // batch)
        payload = _records([record] * batch)
        sent = 0
        while client.confirmed < appends:
            while sent < appends and sent - client.confirmed < in_flight_max:
                head = _APPEND_HEAD.pack(sent, 0, batch)
                client.transport.write(frame(APPEND, head, payload))
                sent += 1
            client.wake.clear()
            await client.wake.wait()
    else:
        client.transport.write(frame(SUBSCRIBE, _SUBSCRIBE.pack(0, 0, window)))
        granted = window
        while client.received < count:
            if granted - client.received < window // 2:
                client.transport.write(frame(CREDIT, _U32.pack(window // 2)))
                granted += window // 2
            client.wake.clear()
            await client.wake.wait()
    timed.stop()
    client.transport.close()
    return timed


# -- the gRPC wire -------------------------------------------------------------------------------

PROTO = """
syntax = "proto3";
package wire;
service Partition {
  rpc Append(stream AppendRequest) returns (stream AppendReply);
  rpc Read(stream ReadRequest) returns (stream Records);
}
message AppendRequest { uint64 request = 1; uint32 partition = 2; repeated bytes records = 3; }
message AppendReply { uint64 request = 1; uint64 first_offset = 2; }
message ReadRequest { uint32 partition = 1; uint64 from_offset = 2; uint32 credit = 3; }
message Records { uint64 first_offset = 1; repeated bytes records = 2; }
"""


def grpc_modules() -> tuple[ModuleType, ModuleType]:
    """Generate the benchmark's protobuf and gRPC modules into a temporary directory."""
    from grpc_tools import protoc

    out = Path(tempfile.mkdtemp(prefix="spate-wire-"))
    (out / "wire.proto").write_text(PROTO)
    code = protoc.main(
        ["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}", "wire.proto"]
    )
    assert code == 0, "protoc failed"
    sys.path.insert(0, str(out))
    return importlib.import_module("wire_pb2"), importlib.import_module("wire_pb2_grpc")


async def serve_grpc() -> None:
    import grpc

    pb, rpc = grpc_modules()
    log = MemoryLog()

    class Partition(rpc.PartitionServicer):  # type: ignore[misc, name-defined]
        async def Append(self, requests: Any, context: Any) -> Any:
            async for request in requests:
                first = log.append(list(request.records))
                yield pb.AppendReply(request=request.request, first_offset=first)

        async def Read(self, requests: Any, context: Any) -> Any:
            credit = 0
            position = 0
            more = asyncio.Event()

            async def grants() -> None:
                nonlocal credit, position
                async for request in requests:
                    if request.credit and not credit and not position:
                        position = request.from_offset
                    credit += request.credit
                    more.set()

            task = asyncio.ensure_future(grants())
            try:
                while True:
                    while credit > 0 and position < len(log.records):
                        take = min(credit, CHUNK_RECORDS_MAX, len(log.records) - position)
                        yield pb.Records(
                            first_offset=position, records=log.records[position : position + take]
                        )
                        position += take
                        credit -= take
                    more.clear()
                    await more.wait()
            finally:
                task.cancel()

    server = grpc.aio.server()
    rpc.add_PartitionServicer_to_server(Partition(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


async def client_grpc(phase: str, port: int, count: int, batch: int, window: int) -> Timed:
    import grpc

    pb, rpc = grpc_modules()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
        stub = rpc.PartitionStub(channel)
        timed = Timed()
        if phase == "consume":
            await _read_grpc(stub, pb, count, window)
            timed.stop()
            return timed
        records = [b"x" * 100] * batch
        appends = count // batch
        room = asyncio.Semaphore(max(1, window // batch))
        call = stub.Append()

        async def writer() -> None:
            for request in range(appends):
                await room.acquire()
                await call.write(pb.AppendRequest(request=request, partition=0, records=records))
            await call.done_writing()

        task = asyncio.ensure_future(writer())
        confirmed = 0
        async for _ in call:
            confirmed += 1
            room.release()
            if confirmed == appends:
                break
        await task
        timed.stop()
        return timed


async def _read_grpc(stub: Any, pb: ModuleType, count: int, window: int) -> None:
    read = stub.Read()
    await read.write(pb.ReadRequest(partition=0, from_offset=0, credit=window))
    granted, received = window, 0
    async for message in read:
        received += len(message.records)
        if received >= count:
            break
        if granted - received < window // 2:
            await read.write(pb.ReadRequest(credit=window // 2))
            granted += window // 2
    read.cancel()


class Timed:
    """Wall and CPU seconds of the timed section of a client (not its start-up)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.cpu_started = _cpu_s()
        self.seconds = self.cpu_seconds = 0.0

    def stop(self) -> None:
        self.seconds = time.perf_counter() - self.started
        self.cpu_seconds = _cpu_s() - self.cpu_started


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- orchestration -------------------------------------------------------------------------------


def proc_cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15 of stat)


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_once(wire: str, count: int, batch: int, window: int) -> dict[str, Any]:
    script = str(Path(__file__).resolve())
    server = subprocess.Popen(
        [sys.executable, script, "serve", wire], stdout=subprocess.PIPE, text=True
    )
    row: dict[str, Any] = {"wire": wire, "batch": batch, "count": count, "window": window}
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        row["load"] = loadavg()
        for phase in ("publish", "consume"):
            before = proc_cpu_ticks(server.pid)
            done = subprocess.run(
                [
                    sys.executable,
                    script,
                    "client",
                    wire,
                    phase,
                    str(port),
                    str(count),
                    str(batch),
                    str(window),
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            )
            server_s = (proc_cpu_ticks(server.pid) - before) / CLOCK_TICKS_PER_S
            client = json.loads(done.stdout.strip().splitlines()[-1])
            row[f"{phase}_per_s"] = count / client["seconds"]
            row[f"{phase}_server_us"] = server_s * 1e6 / count
            row[f"{phase}_client_us"] = client["cpu_seconds"] * 1e6 / count
    finally:
        server.kill()
        server.wait()
    return row


def client_main(argv: list[str]) -> None:
    wire, phase = argv[0], argv[1]
    port, count, batch, window = map(int, argv[2:6])
    run = client_framed if wire == "framed" else client_grpc
    timed = asyncio.run(run(phase, port, count, batch, window))
    print(json.dumps({"seconds": timed.seconds, "cpu_seconds": timed.cpu_seconds}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        asyncio.run(serve_framed() if sys.argv[2] == "framed" else serve_grpc())
        return
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        client_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--batches", default="1,100", help="records per append, comma-separated")
    parser.add_argument("--window", type=int, default=10_000, help="records in flight / credit")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--wires", default="framed,grpc")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for batch in map(int, args.batches.split(",")):
        for wire in args.wires.split(","):
            for run in range(args.runs):
                row = run_once(wire, args.count, batch, args.window)
                row["run"] = run
                rows.append(row)
                print(f"run {run}: {_line(row)}", file=sys.stderr, flush=True)
    summary = list(_medians(rows))
    for line in summary:
        print(f"median: {_line(line)}", file=sys.stderr)
    print(json.dumps({"benchmark": "gateway_wire", "rows": rows, "medians": summary}))


FIELDS = (
    "publish_per_s",
    "publish_server_us",
    "publish_client_us",
    "consume_per_s",
    "consume_server_us",
    "consume_client_us",
    "load",
)


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['wire']:6} batch {row['batch']:3}: publish {row['publish_per_s']:8.0f}/s "
        f"(server {row['publish_server_us']:5.1f} µs/msg, client {row['publish_client_us']:5.1f})"
        f"  consume {row['consume_per_s']:8.0f}/s (server {row['consume_server_us']:5.1f}, "
        f"client {row['consume_client_us']:5.1f})  load {row['load']:.2f}"
    )


def _medians(rows: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    keys = sorted({(r["wire"], r["batch"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for wire, batch in keys:
        group = [r for r in rows if (r["wire"], r["batch"]) == (wire, batch)]
        yield {
            "wire": wire,
            "batch": batch,
            **{field: statistics.median(r[field] for r in group) for field in FIELDS},
        }


if __name__ == "__main__":
    main()
