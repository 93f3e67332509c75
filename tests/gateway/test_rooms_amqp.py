"""Rooms over AMQP (`$rooms/<room>`, ADR 0018): python-qpid-proton and rhea against a gateway
listener whose rooms are a `SynapService` over the test's broker (in memory, the node's, and
the proxy's), so the room offsets, start filters, ring bound and refusals are the same on all
three. Synap's commands run through `SynapService.handle`, the code under its HTTP and
WebSocket endpoint (tests/integration/test_synap.py drives that endpoint itself)."""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from proton import Message, symbol
from proton.utils import LinkDetached
from spate.core.ids import Offset, offset_to_symbol
from spate.core.streams import StreamConfig
from spate.gateway.rooms import RoomsConfig, room_partition
from spate.gateway.server import GatewayServer, ListenerConfig
from spate.gateway.synap_service import SynapService
from support.amqp_clients import (
    LoopThread,
    RunningGateway,
    blocking,
    da,
    offset_filter,
    receive,
    run_doc_examples,
    run_rhea,
    unique,
)
from support.memory_broker import MemoryBroker
from support.node_broker import NodeBroker
from support.proxy_broker import ProxyBroker

AnyBroker = MemoryBroker | NodeBroker | ProxyBroker


class LocalAdmin:
    """The metadata requests a SynapService makes (synap_service.Admin), on the test broker."""

    def __init__(self, broker: AnyBroker) -> None:
        self.broker = broker

    async def create_stream(self, config: StreamConfig) -> None:
        created = self.broker.create_stream(dataclasses.replace(config, replicas=1))
        if inspect.isawaitable(created):
            await created

    async def refresh(self) -> object:
        if isinstance(self.broker, ProxyBroker):
            self.broker.refresh()
        return True

    # Rooms never reach the group commands; a test that did would fail here, loudly.
    async def create_group(self, definition: Any) -> None:
        raise AssertionError("the room tests make no consumer groups")

    async def find_group(self, group: str) -> Any:
        raise AssertionError("the room tests make no consumer groups")

    async def committed(self, stream: str, group: str) -> dict[int, int]:
        raise AssertionError("the room tests make no consumer groups")


@dataclasses.dataclass
class Rooms:
    gateway: RunningGateway
    service: SynapService
    loop_thread: LoopThread
    skew_ms: list[int]
    """Added to the service's clock (ages events past the ring's max age)."""

    def synap(self, command: str, **payload: Any) -> Any:
        return self.loop_thread.call(self.service.handle(command, payload, None), 30)


@pytest.fixture
def start_rooms(loop_thread: LoopThread, broker: AnyBroker) -> Iterator[Callable[..., Rooms]]:
    started: list[tuple[GatewayServer, SynapService]] = []

    def start(**config: Any) -> Rooms:
        skew = [0]
        settings = RoomsConfig(partitions=2, **config)

        def make() -> SynapService:
            service = SynapService(
                broker,
                LocalAdmin(broker),
                settings,
                clock_ms=lambda: int(time.time() * 1000) + skew[0],
            )
            service.start()
            return service

        service = loop_thread.run(make)
        server = GatewayServer(broker, ListenerConfig(node_id="n1"), rooms=service)
        port = loop_thread.call(server.start())
        started.append((server, service))
        return Rooms(RunningGateway(port=port), service, loop_thread, skew)

    yield start
    for server, service in started:
        loop_thread.call(server.close())
        loop_thread.call(service.close())


@pytest.fixture
def rooms(start_rooms: Callable[..., Rooms]) -> Rooms:
    return start_rooms()


def room_offsets(messages: list[Message]) -> list[int]:
    found = [da(m, "event-streams-offset") for m in messages]
    assert all(isinstance(o, symbol) and len(o) == 20 for o in found), found
    return [int(o) for o in found]


def send(rooms: Rooms, address: str, bodies: list[Any], event_type: str = "chat") -> None:
    with blocking(rooms.gateway) as conn:
        sender = conn.create_sender(address, name=unique("tx"))
        for body in bodies:
            sender.send(Message(body=body, properties={"event_type": event_type}))


def test_proton_publishes_and_reads_a_room_in_room_offsets_across_synap(rooms: Rooms) -> None:
    """A sender to `$rooms/<room>` stores room events (auto-created, room offsets 0..), read
    back over AMQP with the ROOM's offsets in `event-streams-offset` and by Synap's history;
    a neighbour room on the same partition keeps its own count; an event Synap publishes
    reaches a live AMQP reader, and AMQP events reach Synap's history."""
    room = unique("chat")
    other = next(  # on the same partition: the partition offsets interleave
        name
        for name in (unique("other") for _ in range(100))
        if room_partition(name, 2) == room_partition(room, 2)
    )
    with blocking(rooms.gateway) as conn:
        to_room = conn.create_sender(f"$rooms/{room}", name=unique("tx"))
        to_other = conn.create_sender(f"$rooms/{other}", name=unique("tx"))
        for k in range(4):
            to_room.send(Message(body=f"hello {k}", properties={"event_type": "chat"}))
            to_other.send(Message(body={"n": k}, properties={"event_type": "tick"}))
        live = conn.create_receiver(f"$rooms/{room}", name=unique("live"), credit=10)
        everything = conn.create_receiver(
            f"$rooms/{room}", name=unique("rx"), credit=10, options=[offset_filter("first")]
        )
        got = receive(everything, 4)
        assert [m.body for m in got] == [f"hello {k}" for k in range(4)]
        assert room_offsets(got) == [0, 1, 2, 3]
        assert all(m.annotations[symbol("x-stream-filter-value")] == room for m in got)
        assert isinstance(da(got[0], "event-streams-timestamp"), int)
        assert da(got[0], "event-streams-source-partition") is None

        answer = rooms.synap("stream.publish", room=room, event_type="joined", data={"user": "ana"})
        assert answer["offset"] == 4
        assert answer["subscribers_notified"] == 2  # the two AMQP readers here
        for receiver in (live, everything):
            (message,) = receive(receiver, 1)
            assert room_offsets([message]) == [4]
            assert message.body == b'{"user":"ana"}'
            assert message.properties["event_type"] == "joined"

    history = rooms.synap("stream.history", room=room)
    assert [e["offset"] for e in history["events"]] == [0, 1, 2, 3, 4]
    assert [e["data"] for e in history["events"]] == [f"hello {k}" for k in range(4)] + [
        {"user": "ana"}
    ]
    assert [e["type"] for e in history["events"]] == ["chat"] * 4 + ["joined"]
    assert all(e["event_id"] for e in history["events"])
    neighbour = rooms.synap("stream.history", room=other)
    assert [e["offset"] for e in neighbour["events"]] == [0, 1, 2, 3]
    assert [e["data"] for e in neighbour["events"]] == [{"n": k} for k in range(4)]


def test_start_filters_in_room_offsets_bounded_by_the_ring(
    start_rooms: Callable[..., Rooms],
) -> None:
    """first / last / next / N / -N / timestamp as for streams, in room offsets and within the
    ring: with max_events 5 of 8 events, `first` is offset 3 and an offset below it is
    clamped there; once the events are older than the ring's max age, `first` waits for new
    ones."""
    rooms = start_rooms(max_events=5, retention_ms=60_000)
    room = unique("ring")
    address = f"$rooms/{room}"
    send(rooms, address, [f"e{k}" for k in range(8)])
    mid = int(time.time() * 1000) + 1
    time.sleep(0.01)
    send(rooms, address, ["e8", "e9"])

    from proton import timestamp

    with blocking(rooms.gateway) as conn:

        def start_of(spec: Any, count: int) -> list[int]:
            receiver = conn.create_receiver(
                address, name=unique("rx"), credit=20, options=[offset_filter(spec)]
            )
            got = room_offsets(receive(receiver, count))
            receiver.close()
            return got

        assert start_of("first", 5) == [5, 6, 7, 8, 9]  # the ring keeps the last 5 of 10
        assert start_of("last", 1) == [9]
        assert start_of(7, 3) == [7, 8, 9]
        assert start_of(0, 5) == [5, 6, 7, 8, 9]  # clamped to the oldest kept
        assert start_of(-2, 2) == [8, 9]
        assert start_of(timestamp(mid), 2) == [8, 9]
        nexts = conn.create_receiver(
            address, name=unique("rx"), credit=20, options=[offset_filter("next")]
        )
        send(rooms, address, ["e10"])
        (message,) = receive(nexts, 1)
        assert (message.body, room_offsets([message])) == ("e10", [10])

    rooms.skew_ms[0] = 120_000  # every kept event is now older than the ring's max age
    with blocking(rooms.gateway) as conn:
        first = conn.create_receiver(
            address, name=unique("rx"), credit=20, options=[offset_filter("first")]
        )
        send(rooms, address, ["e11"])
        (message,) = receive(first, 1)
        assert (message.body, room_offsets([message])) == ("e11", [11])


def test_bad_room_addresses_are_refused_and_the_connection_goes_on(rooms: Rooms) -> None:
    """Bad names: amqp:invalid-field naming the rule; links that do not fit a room (a
    partition, a consumer name, a value filter): amqp:invalid-field; the connection's other
    links keep working (rhea, one connection)."""
    room = unique("ok")
    value_filter = {"v": {"descriptor": "rabbitmq:stream-filter", "type": "string", "value": "x"}}
    report = run_rhea(
        rooms.gateway,
        [
            {"op": "attach", "address": "$rooms/", "role": "receiver"},
            {"op": "attach", "address": "$rooms/bad\u0001name", "role": "sender"},
            {"op": "attach", "address": "$rooms/" + "x" * 300, "role": "receiver"},
            {
                "op": "attach",
                "address": f"$rooms/{room}",
                "role": "receiver",
                "properties": {"event-streams-partition": "0"},
            },
            {
                "op": "attach",
                "address": f"$rooms/{room}",
                "role": "sender",
                "properties": {"spate:producer-name": "p"},
            },
            {
                "op": "attach",
                "address": f"$rooms/{room}",
                "role": "receiver",
                "filter": value_filter,
            },
            {"op": "publish", "address": f"$rooms/{room}", "bodies": ["still", "fine"]},
            {
                "op": "consume",
                "address": f"$rooms/{room}",
                "count": 2,
                "filter": {"f": {"descriptor": 0x200, "type": "symbol", "value": "first"}},
            },
        ],
    )
    assert "error" not in report, report
    *refused, published, consumed = report["steps"]
    assert [r["error"]["condition"] for r in refused] == ["amqp:invalid-field"] * 6, refused
    assert "'$rooms/'" in refused[0]["error"]["description"]
    assert "control characters" in refused[1]["error"]["description"]
    assert "256 UTF-8 bytes" in refused[2]["error"]["description"]
    assert "event-streams-partition" in refused[3]["error"]["description"]
    assert "start filters only" in refused[5]["error"]["description"]
    assert published["outcomes"] == ["accepted", "accepted"]
    assert [m["body"] for m in consumed["messages"]] == ["still", "fine"]
    assert [m["offset"] for m in consumed["messages"]] == [
        offset_to_symbol(Offset(0)),
        offset_to_symbol(Offset(1)),
    ]


def test_rhea_publishes_and_reads_rooms_with_start_filters(rooms: Rooms) -> None:
    """rhea: publish to a room (application property event_type), read it with `first`, an
    offset, `-N` and the 0x200 map form (strictly after an offset), in room offsets."""
    room = unique("rhea")
    address = f"$rooms/{room}"
    after_1 = {
        "f": {
            "descriptor": "amqp:event-streams-delivery-annotations-filter",
            "type": "map",
            "value": {"event-streams-offset": {"type": "symbol", "value": offset_to_symbol(1)}},
        }
    }
    report = run_rhea(
        rooms.gateway,
        [
            {
                "op": "publish",
                "address": address,
                "bodies": ["r0", "r1", "r2", "r3"],
                "application_properties": [{"event_type": "move"}] * 4,
            },
            {
                "op": "consume",
                "address": address,
                "count": 4,
                "filter": {"f": {"descriptor": 0x200, "type": "symbol", "value": "first"}},
            },
            {
                "op": "consume",
                "address": address,
                "count": 2,
                "filter": {"f": {"descriptor": 0x200, "type": "long", "value": 2}},
            },
            {
                "op": "consume",
                "address": address,
                "count": 1,
                "filter": {"f": {"descriptor": 0x200, "type": "long", "value": -1}},
            },
            {"op": "consume", "address": address, "count": 2, "filter": after_1},
        ],
    )
    assert "error" not in report, report
    published, first, from_2, last_1, after = report["steps"]
    assert published["outcomes"] == ["accepted"] * 4
    assert [m["body"] for m in first["messages"]] == ["r0", "r1", "r2", "r3"]
    assert [int(m["offset"]) for m in first["messages"]] == [0, 1, 2, 3]
    assert [int(m["offset"]) for m in from_2["messages"]] == [2, 3]
    assert [m["body"] for m in last_1["messages"]] == ["r3"]
    assert [int(m["offset"]) for m in after["messages"]] == [2, 3]
    assert first["echoed_filter_keys"] == ["f"]
    history = rooms.synap("stream.history", room=room)
    assert [(e["offset"], e["type"], e["data"]) for e in history["events"]] == [
        (k, "move", f"r{k}") for k in range(4)
    ]


def test_a_node_without_rooms_says_not_found(gateway: RunningGateway) -> None:
    """A listener without rooms (a node's) refuses `$rooms/<room>` with amqp:not-found."""
    with blocking(gateway) as conn, pytest.raises(LinkDetached, match="amqp:not-found"):
        conn.create_receiver("$rooms/lobby", name=unique("rx"))


def test_the_docs_examples_run_as_written(rooms: Rooms) -> None:
    """docs/amqp.md "Rooms": the python-qpid-proton and rhea examples, as written."""
    python, js = run_doc_examples("rooms", rooms.gateway.host, rooms.gateway.port)
    assert python.split("\n")[:3] == ["0 hello", "1 hi", "2 bye"]
    assert js.split("\n")[:2] == ["1 hi", "2 bye"]


def test_the_cleanup_timer_forgets_idle_rooms_but_not_watched_ones(
    start_rooms: Callable[..., Rooms],
) -> None:
    """003 "Room Cleanup", by the service's own timer (inactive timeout 300 ms, a tick every
    100 ms; a room is forgotten idle past the timeout plus its clock margin, 300 ms more): an
    idle room without subscribers disappears (history: RoomNotFound; its next event starts
    a new room at offset 0); a room with a Synap subscriber and one with an AMQP reader
    stay, events and all."""
    from spate.gateway.synap import SynapError
    from spate.gateway.synap_service import Connection

    rooms = start_rooms(inactive_timeout_ms=300, cleanup_interval_ms=100)
    idle, watched, read = unique("idle"), unique("watched"), unique("read")
    pushed: list[str] = []

    async def collect(text: str) -> None:
        pushed.append(text)

    connection = rooms.loop_thread.run(lambda: Connection(collect))
    answer = rooms.loop_thread.call(
        rooms.service.handle("stream.subscribe", {"room": watched}, connection)
    )
    assert answer["success"]
    with blocking(rooms.gateway) as conn:
        reader = conn.create_receiver(f"$rooms/{read}", name=unique("rx"), credit=10)
        for room in (idle, watched, read):
            for k in range(3):
                published = rooms.synap("stream.publish", room=room, event_type="t", data=k)
                assert published["offset"] == k
        assert room_offsets(receive(reader, 3)) == [0, 1, 2]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                rooms.synap("stream.history", room=idle)
            except SynapError as error:
                assert error.code == "RoomNotFound"
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"room {idle!r} was not cleaned up in 10 s")
        time.sleep(0.3)  # a few more ticks
        for room in (watched, read):
            history = rooms.synap("stream.history", room=room)
            assert [e["offset"] for e in history["events"]] == [0, 1, 2], room
        assert rooms.loop_thread.run(rooms.service.room_count) == 2  # watched and read
    assert rooms.synap("stream.publish", room=idle, event_type="t", data="again")["offset"] == 0
    rooms.loop_thread.call(connection.close())
