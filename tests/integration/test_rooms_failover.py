"""Rooms survive a leader kill (ADR 0018) on three nodes: kill -9 of the leader of the room's
`spate.rooms` partition; publishing resumes through the same gateway, the subscriber goes on
in order with no gap, and the room's history is intact."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from spate.gateway import rooms
from support.cluster import Cluster

ROOM = "failover-room"
WAIT_S = 30.0


async def publish(session: aiohttp.ClientSession, url: str, data: int) -> dict[str, Any]:
    """Publish, retrying what the gateway says is retryable (a leader change)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        command = {
            "command": "stream.publish",
            "payload": {"room": ROOM, "event_type": "n", "data": data},
        }
        async with session.post(url, json=command) as response:
            answer: dict[str, Any] = await response.json()
        if "error" not in answer:
            return answer
        assert answer["retryable"], answer
        assert time.monotonic() < deadline, answer
        await asyncio.sleep(0.2)


def test_rooms_survive_a_leader_kill(cluster3: Cluster) -> None:
    ws_url: str = cluster3.state["gateways"][0]["synap"]
    http = "http://" + ws_url.removeprefix("ws://")

    async def go() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
            await ws.send_json({"command": "stream.subscribe", "payload": {"room": ROOM}})
            assert (await ws.receive_json(timeout=WAIT_S))["success"] is True
            for i in range(10):
                assert (await publish(session, http, i))["offset"] == i
            partition = rooms.room_partition(ROOM, 8)
            leader = cluster3.leader_of("spate.rooms", partition)
            cluster3.kill9(cluster3.index_of(leader))
            for i in range(10, 20):
                await publish(session, http, i)
            got = []
            while len(got) < 20 or {e["data"] for e in got} != set(range(20)):
                got.append(await ws.receive_json(timeout=WAIT_S))
            offsets = [e["offset"] for e in got]
            assert offsets == list(range(len(got))), offsets  # in order, no gap, no repeat
            data = [e["data"] for e in got]
            assert data[:10] == list(range(10))
            # a publish whose outcome the gateway could not know was retried: stored twice
            # at most, never out of order
            assert [d for i, d in enumerate(data) if d not in data[:i]] == list(range(20))
            command = {"command": "stream.history", "payload": {"room": ROOM, "from_offset": 0}}
            async with session.post(http, json=command) as response:
                history = await response.json()
            assert [e["offset"] for e in history["events"]] == offsets
            assert [e["data"] for e in history["events"]] == data

    asyncio.run(asyncio.wait_for(go(), 120))
