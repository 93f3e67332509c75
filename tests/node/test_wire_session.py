"""The node's side of the gateway wire, one APPEND at a time (ADR 0045): its outcome is taken
from `Replica.propose`'s callback when the replica applies the entry (no future's loop turn),
and the frame is written at the transport's next flush (`Transport.flush_with`), not a loop
turn later; a refusal inside `propose` is still answered "nothing stored"."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from spate.core import frames, wire
from spate.core.backend import PublishingIds
from spate.core.errors import BrokerError, NotLeader, StorageFailure
from spate.core.ids import NodeId, Offset, PartitionId, StreamName
from spate.node.wire_server import WireSession

KEY = (StreamName("orders"), PartitionId(0))


class _Partition:
    """The replica as the session sees it: `propose` keeps `done`, or answers at once."""

    leader_epoch = 3
    leader = NodeId("n1")

    def __init__(self, at_once: Offset | BrokerError | None = None) -> None:
        self.at_once = at_once
        self.proposed: list[list[bytes]] = []
        self.done: Callable[[Offset | BrokerError], None] | None = None

    def propose(
        self,
        records: Sequence[bytes],
        done: Callable[[Offset | BrokerError], None],
        producer: PublishingIds | None = None,
    ) -> int | None:
        self.proposed.append([bytes(r) for r in records])
        if self.at_once is not None:
            done(self.at_once)
            return None
        self.done = done
        return 1


class _Broker:
    def __init__(self, partition: _Partition) -> None:
        self.the_partition = partition

    def partition(self, name: StreamName, partition: PartitionId, *, write: bool) -> Any:
        assert (name, partition) == KEY and write
        return self.the_partition


class _Writer:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.transport = self

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        pass


class _Transport:
    def __init__(self) -> None:
        self.queued: list[Callable[[], None]] = []

    def flush_with(self, callback: Callable[[], None]) -> None:
        self.queued.append(callback)

    def flush(self) -> None:
        queued, self.queued = self.queued, []
        for callback in queued:
            callback()


def _frames(data: list[bytes]) -> list[tuple[int, memoryview]]:
    out = []
    blob = memoryview(b"".join(data))
    while blob:
        length, kind = frames.FRAME_HEAD.unpack(blob[: frames.FRAME_HEAD_BYTES])
        out.append((kind, blob[frames.FRAME_HEAD_BYTES : frames.FRAME_HEAD_BYTES + length - 1]))
        blob = blob[frames.FRAME_HEAD_BYTES + length - 1 :]
    return out


def _append_frame(request: int, records: list[bytes]) -> tuple[int, memoryview]:
    ((kind, body),) = _frames([wire.encode_append(request, KEY, 3, records)])
    return kind, body


def _session(partition: _Partition) -> tuple[WireSession, _Writer, _Transport]:
    writer, transport = _Writer(), _Transport()
    session = WireSession(_Broker(partition), "g1", writer, transport)  # type: ignore[arg-type]
    return session, writer, transport


def _run(test: Callable[[], None]) -> None:
    async def main() -> None:
        test()

    asyncio.run(main())


def test_appended_is_queued_when_the_replica_applies_it_and_written_at_the_next_flush() -> None:
    def test() -> None:
        partition = _Partition()
        session, writer, transport = _session(partition)
        session.on_frame(*_append_frame(7, [b"a", b"b"]))
        assert partition.proposed == [[b"a", b"b"]] and partition.done is not None
        assert writer.written == [] and transport.queued == []
        partition.done(Offset(41))  # the replica applied the entry
        assert writer.written == [] and len(transport.queued) == 1
        transport.flush()  # the end of the read or batch that applied it
        ((kind, body),) = _frames(writer.written)
        assert kind == wire.APPENDED and wire.decode_appended(body) == (7, 41)
        partition.done(StorageFailure("late"))  # an outcome is taken once
        transport.flush()
        assert len(writer.written) == 1
        session.close()

    _run(test)


def test_a_failure_after_proposing_is_answered_stored_and_one_at_once_not_stored() -> None:
    def test() -> None:
        partition = _Partition()
        session, writer, transport = _session(partition)
        session.on_frame(*_append_frame(1, [b"a"]))
        assert partition.done is not None
        partition.done(NotLeader("lost the lead", leader_node=NodeId("n2")))
        partition.at_once = NotLeader("not the leader", leader_node=NodeId("n2"))
        session.on_frame(*_append_frame(2, [b"b"]))
        partition.at_once = Offset(9)  # every record a duplicate, confirmed at once
        session.on_frame(*_append_frame(3, [b"c"]))
        transport.flush()
        got = _frames(writer.written)
        assert [k for k, _ in got] == [wire.FAILED, wire.FAILED, wire.APPENDED]
        request, error, stored = wire.decode_failed(got[0][1])
        assert (request, stored, type(error)) == (1, True, NotLeader)
        request, error, stored = wire.decode_failed(got[1][1])
        assert (request, stored, type(error)) == (2, False, NotLeader)
        assert wire.decode_appended(got[2][1]) == (3, 9)
        session.close()

    _run(test)


def test_the_frames_of_one_flush_go_out_in_one_write() -> None:
    def test() -> None:
        partition = _Partition()
        session, writer, transport = _session(partition)
        dones = []
        for request in (1, 2, 3):
            session.on_frame(*_append_frame(request, [b"r"]))
            assert partition.done is not None
            dones.append(partition.done)
        for offset, done in enumerate(dones):
            done(Offset(offset))
        assert len(transport.queued) == 1  # one flush asked for the three
        transport.flush()
        assert len(writer.written) == 1
        assert [wire.decode_appended(b) for _, b in _frames(writer.written)] == [
            (1, 0),
            (2, 1),
            (3, 2),
        ]
        session.close()

    _run(test)
