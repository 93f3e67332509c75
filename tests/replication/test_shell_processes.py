"""Three replicas in three OS processes (tests/replication/replica_process.py), real sockets
and files: kill -9 the leader mid-append, restart it, wipe a replica and rebuild it.

Brief §2.3 and §4 (reliability): zero acknowledged appends lost, none duplicated or reordered.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).with_name("replica_process.py")
IDS = ["n1", "n2", "n3"]
WAIT_S = 20.0
log = logging.getLogger(__name__)


class Replica:
    def __init__(self, node: str, data_dir: Path) -> None:
        self.node = node
        self.data_dir = data_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            self.node,
            str(self.data_dir),
            "20",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,
        )
        assert self.proc.stdout is not None
        started = json.loads(await self.proc.stdout.readline())
        self.port = started["port"]
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                message = json.loads(line)
                future = self._waiting.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(message)
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"{self.node} exited"))
            self._waiting.clear()

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        self.proc.stdin.write((json.dumps({"op": op, "id": request_id, **fields}) + "\n").encode())
        await self.proc.stdin.drain()
        return await asyncio.wait_for(future, WAIT_S)

    def kill(self) -> None:
        """SIGKILL: no chance to flush or sync anything."""
        if self.proc is not None and self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    async def wait(self) -> None:
        if self.proc is not None:
            await self.proc.wait()
        if self._reader is not None:
            await self._reader


class ProcessCluster:
    def __init__(self, root: Path) -> None:
        self.replicas = {n: Replica(n, root / n) for n in IDS}
        self.up: set[str] = set()

    async def start(self, node: str, *, segment_bytes: int, max_bytes: int | None) -> None:
        await self.replicas[node].start()
        self.up.add(node)
        await self.publish_peers()
        await self.replicas[node].call(
            "open",
            stream="s",
            partition=0,
            replicas=IDS,
            segment_bytes=segment_bytes,
            max_bytes=max_bytes,
        )

    async def publish_peers(self) -> None:
        peers = {n: ["127.0.0.1", self.replicas[n].port] for n in self.up}
        for node in self.up:
            await self.replicas[node].call("peers", peers=peers)

    async def kill(self, node: str) -> None:
        self.up.discard(node)
        self.replicas[node].kill()
        await self.replicas[node].wait()

    async def status(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = (await self.replicas[node].call("status"))["partitions"][0]
        return result

    async def leader(self) -> str:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            for node in sorted(self.up):
                try:
                    if (await self.status(node))["role"] == "leader":
                        return node
                except ConnectionError:
                    continue  # being killed
            await asyncio.sleep(0.05)
        raise AssertionError("no leader elected")

    async def records(self, node: str) -> list[str]:
        result: list[str] = (await self.replicas[node].call("read", stream="s", partition=0))[
            "records"
        ]
        return result

    async def until_end(self, node: str, end: int) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while (await self.status(node))["end_offset"] < end:
            assert asyncio.get_running_loop().time() < deadline, f"{node} did not reach {end}"
            await asyncio.sleep(0.05)

    async def stop_all(self) -> None:
        for replica in self.replicas.values():
            replica.kill()
        for replica in self.replicas.values():
            await replica.wait()


async def produce(
    cluster: ProcessCluster, acked: list[str], stop: asyncio.Event, counter: itertools.count[int]
) -> None:
    """Append one record at a time to whoever leads; remember only acknowledged ones."""
    target = await cluster.leader()
    while not stop.is_set():
        payload = f"rec-{next(counter)}".encode().hex()
        try:
            reply = await cluster.replicas[target].call(
                "append", stream="s", partition=0, records=[payload]
            )
        except (ConnectionError, TimeoutError):
            reply = {"ok": False, "retryable": True, "leader": None}
        if reply["ok"]:
            acked.append(payload)
            continue
        assert reply["retryable"], reply
        hint = reply.get("leader")
        target = hint if hint in cluster.up else await cluster.leader()
        await asyncio.sleep(0.01)


async def wait_for_acks(acked: list[str], count: int, producer: asyncio.Task[None]) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while len(acked) < count:
        if producer.done():
            producer.result()  # raises what stopped it
            raise AssertionError("the producer stopped")
        assert asyncio.get_running_loop().time() < deadline, f"{len(acked)} of {count} acked"
        await asyncio.sleep(0.02)


def check_history(records: list[str], acked: list[str], *, after_retention: bool = False) -> None:
    """Every acknowledged record exactly once, in acknowledgement order (after retention:
    every one after the oldest retained one)."""
    positions = {record: i for i, record in enumerate(records)}
    if after_retention:
        first = next(i for i, a in enumerate(acked) if a in positions)
        assert first > 0
        acked = acked[first:]
    assert len(positions) == len(records), "a record is duplicated"
    missing = [a for a in acked if a not in positions]
    assert not missing, f"acknowledged but lost: {missing[:5]}"
    order = [positions[a] for a in acked]
    assert order == sorted(order), "acknowledged records reordered"


@pytest.mark.long
def test_kill_leader_mid_append_then_wipe_and_rebuild(tmp_path: Path) -> None:
    asyncio.run(_kill_and_rebuild(tmp_path))


async def _kill_and_rebuild(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path)
    layout = {"segment_bytes": 64 * 1024, "max_bytes": 256 * 1024}
    try:
        for node in IDS:
            await cluster.start(node, **layout)
        acked: list[str] = []
        counter = itertools.count()
        stop = asyncio.Event()
        producer = asyncio.get_running_loop().create_task(produce(cluster, acked, stop, counter))
        await wait_for_acks(acked, 100, producer)
        log.info("phase: kill the leader")
        old_leader = await cluster.leader()
        await cluster.kill(old_leader)  # mid-append: the producer has one in flight
        new_leader = await cluster.leader()
        assert new_leader != old_leader
        acked_at_kill = len(acked)
        await wait_for_acks(acked, acked_at_kill + 100, producer)
        log.info("phase: restart %s", old_leader)
        await cluster.start(old_leader, **layout)
        stop.set()
        await producer
        end = (await cluster.status(new_leader))["end_offset"]
        for node in IDS:
            await cluster.until_end(node, end)
            check_history(await cluster.records(node), acked)
        assert len({tuple(await cluster.records(n)) for n in IDS}) == 1

        log.info("phase: wipe and replay")
        # Wipe a follower: rebuilt by Append replay (the leader still has the entries).
        victim = next(n for n in IDS if n != new_leader)
        await cluster.kill(victim)
        shutil.rmtree(tmp_path / victim)
        await cluster.start(victim, **layout)
        await cluster.until_end(victim, end)
        check_history(await cluster.records(victim), acked)

        # Grow the log past retention, kill -9 and restart every replica (a restarted core's
        # in-memory window starts at its commit point), wipe a follower: rebuilt by segment
        # transfer.
        log.info("phase: retention, restart all, wipe and transfer")
        stop.clear()
        producer = asyncio.get_running_loop().create_task(produce(cluster, acked, stop, counter))
        leader = await cluster.leader()
        for i in range(120):
            big = (f"big-{i}-" + "y" * 3000).encode().hex()
            reply = await cluster.replicas[leader].call(
                "append", stream="s", partition=0, records=[big]
            )
            assert reply["ok"], reply
            acked.append(big)
        stop.set()
        await producer
        for node in IDS:
            await cluster.replicas[node].call("retention")
        assert (await cluster.status(leader))["first_offset"] > 0
        for node in IDS:
            await cluster.kill(node)
        for node in IDS:
            await cluster.start(node, **layout)
        leader = await cluster.leader()
        victim = next(n for n in IDS if n != leader)
        await cluster.kill(victim)
        shutil.rmtree(tmp_path / victim)
        await cluster.start(victim, **layout)
        end = (await cluster.status(leader))["end_offset"]
        await cluster.until_end(victim, end)
        status = await cluster.status(victim)
        assert status["first_offset"] == (await cluster.status(leader))["first_offset"] > 0
        assert await cluster.records(victim) == await cluster.records(leader)

        log.info("phase: majority down")
        # Two of three down: appends fail with a retryable error; back up, they succeed.
        others = [n for n in IDS if n != leader]
        for node in others:
            await cluster.kill(node)
        reply = await cluster.replicas[leader].call(
            "append", stream="s", partition=0, records=[b"lonely".hex()]
        )
        assert not reply["ok"] and reply["retryable"], reply
        for node in others:
            await cluster.start(node, **layout)
        final: list[str] = []
        stop.clear()
        producer = asyncio.get_running_loop().create_task(produce(cluster, final, stop, counter))
        await wait_for_acks(final, 1, producer)
        stop.set()
        await producer
        leader = await cluster.leader()
        check_history(await cluster.records(leader), acked + final, after_retention=True)
    finally:
        await cluster.stop_all()
