"""The in-memory pump rig: the production AMQP listener (`spate.gateway.driver.AmqpConnection`)
and a python-qpid-proton client engine wired together in memory, no sockets (the way h11 tests
its protocol: two ends, bytes moved by hand).

Server side: the real `AmqpConnection` over an in-memory stand-in for its asyncio transport
(`MemoryTransport`: write collects bytes, pause/resume/close are recorded), on a private event
loop, in front of a Broker (the in-memory broker; `MemoryBroker(commit_delay_s=None)` holds
appends until `rig.release()`, so a test decides when the "fsync" is done). Client side: a
proton `Connection` + `Transport` (with proton's client SASL) + `Collector`, no reactor.

`rig.pump()` moves bytes both ways and runs the loop's ready callbacks until nothing moves
(bounded by `pump_rounds_max`; a rig that does not settle is a failure, not a hang). Every
step is deterministic: no sleeps, no wall-clock waits.

    rig = PumpRig(MemoryBroker(commit_delay_s=None))
    client = rig.connect()
    sender = client.sender("orders")
    rig.pump()
    delivery = client.send(sender, encode(body=b"x"))
    rig.pump(); assert delivery.remote_state is None   # not durable yet: no outcome
    rig.release(); assert delivery.remote_state == Delivery.ACCEPTED
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine
from typing import Any, TypeVar

from proton import Collector, Connection, Delivery, Link, Message, Receiver, Sender, Transport
from spate.core.backend import Broker
from spate.gateway.driver import AmqpConnection, Context

pump_rounds_max = 1000
"""Rounds one pump may take before the rig calls the exchange livelocked."""
loop_turns_max = 10_000
"""Event-loop iterations one round may run before the rig calls the loop livelocked (the
listener feeds big input to proton in 16 KiB slices, one loop turn each)."""

_T = TypeVar("_T")


class MemoryTransport:
    """What AmqpConnection needs of an asyncio transport, in memory."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False
        self.reading_paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.out += data

    def take(self) -> bytes:
        data, self.out = bytes(self.out), bytearray()
        return data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def get_write_buffer_size(self) -> int:
        return len(self.out)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def encode(body: Any = None, **fields: Any) -> bytes:
    """A message encoded by proton (what an ordinary client puts in a transfer)."""
    return bytes(Message(body=body, **fields).encode())


def decode(data: bytes) -> Message:
    message = Message()
    message.decode(data)
    return message


class Client:
    """One proton client connection, driven by the rig."""

    def __init__(
        self,
        rig: PumpRig,
        *,
        mechanism: str = "ANONYMOUS",
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        self.rig = rig
        self.connection = Connection()
        self.connection.container = "pump-client"
        self.connection.hostname = "localhost"
        if user is not None:
            self.connection.user = user
            self.connection.password = password
        self.transport = Transport()
        self.transport.sasl().allowed_mechs(mechanism)
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport.bind(self.connection)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self._names = itertools.count(1)
        self._tags = itertools.count(1)
        self.server_transport = MemoryTransport()
        self.server: AmqpConnection = rig.run(rig.make_connection(self.server_transport))

    # links

    def sender(self, address: str, *, properties: dict[Any, Any] | None = None) -> Sender:
        link = self.session.sender(f"sender-{next(self._names)}")
        link.target.address = address
        if properties:
            link.properties = properties
        link.open()
        return link

    def receiver(
        self,
        address: str,
        *,
        filters: dict[Any, Any] | None = None,
        properties: dict[Any, Any] | None = None,
        credit: int = 0,
    ) -> Receiver:
        link = self.session.receiver(f"receiver-{next(self._names)}")
        link.source.address = address
        if filters:
            link.source.filter.put_dict(filters)
        if properties:
            link.properties = properties
        link.open()
        if credit:
            link.flow(credit)
        return link

    # transfers

    def send(self, sender: Sender, data: bytes, *, settled: bool = False) -> Delivery:
        delivery = sender.delivery(str(next(self._tags)).encode())
        sender.send(data)
        sender.advance()
        if settled:
            delivery.settle()
        return delivery

    def received(self, receiver: Receiver) -> list[tuple[bytes, Delivery]]:
        """Every complete delivery waiting on the link, read and accepted, oldest first."""
        out = []
        while True:
            delivery = receiver.current
            if delivery is None or delivery.partial or not delivery.readable:
                break
            data = receiver.recv(delivery.pending)
            receiver.advance()
            out.append((bytes(data or b""), delivery))
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
        return out

    def close(self) -> None:
        self.connection.close()

    # bytes

    def move(self) -> int:
        """Client bytes to the server, server bytes to the client; how many moved. Runs on
        the rig's loop (the server schedules callbacks and tasks on it)."""
        moved = 0
        pending = self.transport.pending()
        if pending > 0:
            data = self.transport.peek(pending)
            self.transport.pop(pending)
            moved += len(data)
            self.server.data_received(bytes(data))
        out = self.server_transport.take()
        if out:
            moved += len(out)
            self.transport.push(out)
        return moved


class PumpRig:
    def __init__(
        self, broker: Broker, *, node_id: str = "n1", allow_anonymous: bool = True
    ) -> None:
        self.broker = broker
        self.loop = asyncio.new_event_loop()
        self.context = Context(
            broker=broker,
            node_id=node_id,
            allow_anonymous=allow_anonymous,
            authenticate_plain=None,
            idle_timeout_s=None,
        )
        self.clients: list[Client] = []

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coroutine)

    async def make_connection(self, transport: MemoryTransport) -> AmqpConnection:
        connection = AmqpConnection(self.context)
        connection.connection_made(transport)  # type: ignore[arg-type]
        return connection

    def connect(self, **options: Any) -> Client:
        client = Client(self, **options)
        self.clients.append(client)
        self.pump()
        return client

    def pump(self) -> int:
        """Move bytes and run callbacks until nothing moves; returns the rounds taken."""
        for rounds in range(1, pump_rounds_max + 1):
            if not self.run(self._round()):
                return rounds
        raise AssertionError(f"the exchange did not settle within {pump_rounds_max} rounds")

    async def _round(self) -> int:
        moved = sum(client.move() for client in self.clients)
        await asyncio.sleep(0)
        turns = 1
        # Run every callback that is ready (and those they schedule); timers in the future
        # (heartbeats, an $info interval) are not waited for. `_ready` is the default
        # asyncio loop's queue of ready handles (the rig never runs on uvloop).
        while self.loop._ready:  # type: ignore[attr-defined]
            turns += 1
            assert turns <= loop_turns_max, "the loop keeps scheduling callbacks"
            await asyncio.sleep(0)
        return moved + sum(client.move() for client in self.clients)

    def release(self) -> int:
        """Let held appends commit (MemoryBroker(commit_delay_s=None)), then pump."""
        released: int = self.run(self._release())
        self.pump()
        return released

    async def _release(self) -> int:
        released: int = self.broker.release()  # type: ignore[attr-defined]
        return released

    def close(self) -> None:
        async def lose() -> None:
            for client in self.clients:
                if not client.server.closed:
                    client.server.connection_lost(None)

        self.run(lose())
        self.loop.close()


def condition(link: Link) -> tuple[str | None, str | None, dict[Any, Any]]:
    """(condition name, description, info) of the peer's detach, or Nones."""
    remote = link.remote_condition
    if remote is None:
        return None, None, {}
    return remote.name, remote.description, dict(remote.info or {})
