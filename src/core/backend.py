"""The contract between the AMQP listener (spate.gateway) and the partitions that serve it.

spate.node implements it; spate.gateway consumes it; the process that hosts both (spate.server)
wires them together. Neither side imports the other (see the import contracts in pyproject.toml).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from spate.core.errors import InvalidArgument
from spate.core.filtering import ChunkFilter, ValueFilter
from spate.core.groups import GroupDefinition
from spate.core.ids import LeaderEpoch, NodeId, Offset, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.superstreams import SuperStream

if TYPE_CHECKING:
    from spate.core.coordinator import GroupCoordinator


class OffsetSpecKind(Enum):
    FIRST = "first"  # the earliest retained message
    LAST = "last"  # the first message of the last chunk (RabbitMQ Streams' `last`)
    NEXT = "next"  # only messages appended after the link attached (000 §3.2 default)
    OFFSET = "offset"  # absolute offset, inclusive; clamped to the retained range
    TIMESTAMP = "timestamp"  # the first message whose timestamp is >= value (ms since epoch)
    RELATIVE = "relative"  # value messages before the end (`-50` in 003's rooms)


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    kind: OffsetSpecKind
    value: int = 0

    @staticmethod
    def first() -> OffsetSpec:
        return OffsetSpec(OffsetSpecKind.FIRST)

    @staticmethod
    def last() -> OffsetSpec:
        return OffsetSpec(OffsetSpecKind.LAST)

    @staticmethod
    def next() -> OffsetSpec:
        return OffsetSpec(OffsetSpecKind.NEXT)

    @staticmethod
    def offset(offset: int) -> OffsetSpec:
        return OffsetSpec(OffsetSpecKind.OFFSET, offset)

    @staticmethod
    def timestamp(timestamp_ms: int) -> OffsetSpec:
        return OffsetSpec(OffsetSpecKind.TIMESTAMP, timestamp_ms)

    @staticmethod
    def relative(count: int) -> OffsetSpec:
        assert count >= 0
        return OffsetSpec(OffsetSpecKind.RELATIVE, count)


@dataclass(frozen=True, slots=True)
class ChunkView:
    """Records of one chunk as stored: record i has offset first_offset + i.

    The records are the producers' encoded AMQP messages, byte for byte; nothing decodes them.
    """

    first_offset: Offset
    timestamp_ms: int
    records: Sequence[bytes | memoryview]
    filter: ChunkFilter | None = None
    """The chunk's Bloom filter of filter values (ADR 0016), when it has one and the reader
    has it (a view pushed over the gateway wire does not: the node already chose).

    A view with no records is a *skip mark* (from reads that pass over chunks a consumer's
    filter rules out): nothing before `first_offset` is for that reader."""


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    stream: StreamName
    partition: PartitionId
    first_offset: Offset | None  # earliest retained message; None when empty
    last_offset: Offset | None  # latest committed message; None when empty
    end_offset: Offset  # offset the next appended message will get
    first_timestamp_ms: int | None
    last_timestamp_ms: int | None
    messages: int  # retained messages
    bytes: int  # retained bytes on disk
    segments: int
    leader: NodeId | None
    leader_epoch: LeaderEpoch | None = None
    """Increases whenever the partition gets a new leader: a client that sees it change knows
    the partition changed leader (None where the partition has no replication group)."""


@dataclass(frozen=True, slots=True)
class PublishingIds:
    """A named producer's append (deduplication, ADR 0011): `ids[i]` is the publishing id of
    record i, strictly increasing; records whose id is not above the name's last stored id
    are not stored again (their append still succeeds)."""

    name: bytes  # the producer name, UTF-8
    ids: Sequence[int]


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    """What a partition knows of one producer name."""

    name: str
    last_publishing_id: int
    last_offset: Offset  # of the last record stored for it
    timestamp_ms: int  # when that record was stored


@dataclass(frozen=True, slots=True)
class ConsumerOffset:
    """A consumer name's stored offset on one partition (offset tracking, ADR 0012)."""

    name: str
    offset: int
    """The last offset the consumer is done with; it resumes at offset + 1 (-1: from the
    start)."""
    timestamp_ms: int
    """When it was stored."""
    attached: int = 0
    """Links of this name attached at the partition's leader now (0 elsewhere)."""
    group: int = 0
    """Single active consumer: the members of the name's group at the leader (0: no group);
    one of them is active."""


@dataclass(frozen=True, slots=True)
class Attached:
    """A named consumer link's place at the leader (ADR 0012, 0013)."""

    stored: ConsumerOffset | None
    """The name's stored offset now (None: never stored)."""
    member: int = 0
    """Single active consumer: the link's member number in its group (0: a plain link)."""
    active: bool = True
    """Single active consumer: whether it is the group's active member now."""
    epoch: int | None = None
    """Consumer groups (ADR 0015): the epoch the partition was claimed with."""


def check_reset(stream: str, partition: int, offset: int, end: int) -> None:
    """An operator's offset reset names a message the partition has (or -1: before the
    first); InvalidArgument past the last one, where the consumer would skip messages not
    written yet."""
    if offset > end - 1:
        last = f"its last message is {end - 1}" if end else "it holds no message yet"
        raise InvalidArgument(
            f"offset {offset} is past the end of {stream}/{partition}: {last}; store "
            f"{max(end - 1, -1)} to resume at the next message"
        )


class Partition(Protocol):
    """One partition as the listener sees it on the node that serves it."""

    @property
    def stream(self) -> StreamName: ...

    @property
    def partition(self) -> PartitionId: ...

    def append(
        self, records: Sequence[bytes], producer: PublishingIds | None = None
    ) -> Awaitable[Offset]:
        """Append records as one chunk; resolves to the first record's offset once durable.

        Durable means fsynced (on a majority once replication exists). Concurrent appends share
        one fsync. Raises StorageFailure, NotLeader or Unavailable through the awaitable. With
        `producer`, duplicates are dropped; a batch of duplicates only resolves once what
        stored their originals is durable (to the end offset at the time).
        """
        ...

    def last_publishing_id(self, name: bytes) -> Awaitable[ProducerInfo | None]:
        """The producer name's last durable publishing id (None: it never stored one); the
        leader answers (NotLeader elsewhere)."""
        ...

    def consumer_attach(
        self, name: bytes, *, single_active: bool = False, spread: int | None = None
    ) -> Awaitable[Attached]:
        """A named consumer's link attaches: counted at the leader (an operator's reset is
        refused while any is), and answered with the name's committed stored offset. With
        `single_active` it joins the name's group (ADR 0013) and learns whether it is the
        active member; `spread`: the partition's index in its super stream (members take
        partitions by index modulo the group's size). FailedPrecondition when the name is
        used the other way. NotLeader elsewhere (the link is redirected to the leader)."""
        ...

    def in_contact(self) -> bool:
        """False while the node holding this link's consumer-group claim (ADR 0015) has been
        silent too long to know the claim is still ours (a remote leader over a session quiet
        past its liveness limit, ADR 0008): the link sends nothing of the partition until it
        hears from it again or drops the partition. True without a claim, or in-process."""
        ...

    def until_deposed(self, name: bytes, member: int) -> Awaitable[Attached]:
        """Resolves when the active member must step down (`active` False: another member is
        designated) or has left the group (`active` True)."""
        ...

    def step_down(self, name: bytes, member: int, offset: int | None) -> Awaitable[None]:
        """The active member stopped receiving: store `offset` (if not None), then hand the
        partition to the designated member."""
        ...

    def until_active(self, name: bytes, member: int) -> Awaitable[Attached]:
        """Resolves when the group member becomes active, with the stored offset then (after
        what the member before it stored on leaving); `active` False when it left first."""
        ...

    def store_offset(self, name: bytes, offset: int, member: int = 0) -> Awaitable[None]:
        """Store the consumer's offset through the partition's Raft group; resolves once
        committed. The leader answers (NotLeader elsewhere). A consumer group's offset
        (`$group/<g>`, ADR 0015) is stored only for its current owner `member`
        (FailedPrecondition otherwise: fenced)."""
        ...

    def claim(
        self, name: bytes, epoch: int | None, generation: int | None = None
    ) -> Awaitable[Attached]:
        """A consumer group's link claims the partition (ADR 0015; `name` is `$group/<g>`):
        counted like a named consumer and answered with the granted epoch (stored durably
        first) and the group's committed offset. `active` False: the owner it displaces
        (`epoch` above the group's) is stepping down — wait with `until_active`. Raises
        AlreadyExists (owned, epoch not above the group's) or FailedPrecondition (stale
        epoch). `generation`: the claim of a coordinator's member, fenced by generation (a
        newer generation takes over; an older one is refused) with a new epoch per grant."""
        ...

    def consumer_detach(self, name: bytes, offset: int | None, member: int = 0) -> Awaitable[None]:
        """The named consumer's link is going: store `offset` (if not None), then stop counting
        the link and, for a group `member`, leave the group (the next member becomes active
        after the offset is committed). Resolves once it is."""
        ...

    def reset_offset(self, name: bytes, offset: int) -> Awaitable[None]:
        """An operator's reset of the name's stored offset, at the leader; FailedPrecondition
        while a link of that name is attached there."""
        ...

    def begin(
        self, specs: Sequence[OffsetSpec], values: ValueFilter | None = None
    ) -> Awaitable[Offset]:
        """Where a consumer attaching now with these start filters begins: the largest of
        their resolved offsets (all must hold, 000 §5.2.1). A remote partition starts
        streaming records from there; `read` serves what has arrived. `values`: the link's
        filter values (ADR 0016); a remote partition's node then passes over the chunks that
        hold none of them (skip marks tell where they end)."""
        ...

    def read(self, start: Offset, max_bytes: int) -> list[ChunkView]:
        """Committed chunks from the one holding `start`; at least one chunk if any is here.

        The first chunk may begin before `start`: callers skip the records below it. A remote
        partition hands each record out once: its reader keeps what it read.
        """
        ...

    def end_offset(self) -> Offset:
        """The offset after the last committed message that `read` can serve now."""
        ...

    def describe(self) -> Awaitable[PartitionInfo]:
        """The partition's figures now (for `$info` and the leader epoch answered on attach)."""
        ...

    def detach(self) -> None:
        """The link using this partition is gone (a remote one stops streaming)."""
        ...

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the event loop) whenever the committed end advances."""
        ...

    def remove_listener(self, callback: Callable[[], None]) -> None: ...


class LocalPartition(ABC):
    """`start`, `describe` and `detach` for a partition held in this process, whose `resolve`
    and `info` answer at once (the node's replicas, the in-memory test broker)."""

    @abstractmethod
    def resolve(self, spec: OffsetSpec) -> Offset:
        """The offset a consumer attaching now with `spec` starts at."""

    @abstractmethod
    def info(self) -> PartitionInfo: ...

    async def begin(self, specs: Sequence[OffsetSpec], values: ValueFilter | None = None) -> Offset:
        return max(self.resolve(spec) for spec in specs)

    async def describe(self) -> PartitionInfo:
        return self.info()

    def detach(self) -> None:  # nothing to let go of in-process
        return None


class Broker(Protocol):
    """Streams and partitions served through this process: held here (a node) or reached over
    the gateway wire (a gateway in proxy mode, spate.core.wire)."""

    def lookup(self, name: StreamName) -> Awaitable[StreamConfig]:
        """The stream's configuration; raises NotFound for an unknown stream."""
        ...

    def super_stream(self, name: StreamName) -> Awaitable[SuperStream]:
        """A super stream's topology (ADR 0014); raises NotFound for an unknown one, and
        NotImplementedFeature where this broker cannot route its messages."""
        ...

    def super_stream_of(self, stream: StreamName) -> Awaitable[SuperStream | None]:
        """The super stream `stream` is a partition of, if any (single active consumer
        groups spread over its partitions by their index, ADR 0013)."""
        ...

    def super_stream_version(self, name: StreamName) -> int | None:
        """The version of the super stream's topology as this broker knows it now (None: not
        known, e.g. deleted). A link routing by another version is stale (ADR 0014)."""
        ...

    @property
    def groups_required(self) -> bool:
        """The listener's setting `require_defined_groups` (ADR 0015): an attach naming a
        consumer group that `consumer_group` does not know is refused (amqp:not-found)."""
        ...

    def consumer_group(self, stream: StreamName, group: str) -> Awaitable[GroupDefinition | None]:
        """The group's definition in the metadata service (None: not defined, which is fine
        unless `groups_required`)."""
        ...

    def group_coordinator(self, stream: StreamName) -> GroupCoordinator:
        """The coordinator of `stream`'s consumer groups (ADR 0015), at the leader of its
        partition 0: here, or reached over the gateway wire. Its calls raise NotLeader when
        that leadership moves (members end their links and attach again)."""
        ...

    def partition(
        self, name: StreamName, partition: PartitionId, *, write: bool, relay: bool = False
    ) -> Partition:
        """A partition of a stream looked up before (`lookup`), for one link.

        `write=True` (producers) needs the leader; `write=False` (consumers, `$info`) is served
        by any replica up to its commit index. Raises NotFound (unknown stream or partition) or
        NotLeader (served elsewhere; the error names where). `relay=True` (partition-agnostic
        links, which cannot be redirected to one place): a broker that can reach a partition
        served elsewhere does so (a node or redirect gateway through the gateway wire) instead
        of raising NotLeader. Each call may return a new object: the link calls `detach` on it
        when it goes.
        """
        ...
