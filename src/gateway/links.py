"""Link decisions without I/O: what an attach means, which partition a message goes to, what a
consumer sends next. The driver feeds these from proton events and acts on the results.

Addresses: `<stream>` is the event log node; `<stream>/$info` its runtime-information source
(000 §6); `$rooms/<room>` a room (ADR 0018), served by a gateway's `Rooms` (`plan_room_producer`,
`plan_room_consumer`, `RoomCursor`). Anything else starting with `$` or holding a `/` is an
unknown node (amqp:not-found).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from spate.core import groups, limits
from spate.core.backend import (
    Attached,
    Broker,
    ConsumerOffset,
    OffsetSpec,
    OffsetSpecKind,
    Partition,
)
from spate.core.coordinator import STRATEGIES, Assignment, GroupCoordinator, GroupSettings
from spate.core.errors import (
    AlreadyExists,
    BrokerError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotImplementedFeature,
    NotLeader,
    Unavailable,
)
from spate.core.ids import Offset, PartitionId, StreamName
from spate.core.streams import StreamConfig
from spate.core.subentry import SubEntryRecords
from spate.core.superstreams import SuperStream
from spate.gateway import rooms
from spate.gateway.filters import MessageFilter, StartSelection, chunk_filter_of, parse_filters

INFO_NODE = "$info"
ROOMS_NODE = "$rooms"
"""`$rooms/<room>`: a room's address (ADR 0018)."""
PARTITION_PROPERTY = "event-streams-partition"
TARGET_PARTITION_ANNOTATION = "event-streams-target-partition"
PRODUCER_NAME_PROPERTY = "spate:producer-name"
"""Sender link property (string): deduplicate this producer's messages (ADR 0011)."""
LAST_PUBLISHING_ID_PROPERTY = "spate:last-publishing-id"
"""Answered on a named producer's attach (ulong) when the name has stored a message."""
PUBLISHING_ID_ANNOTATION = "x-opt-publishing-id"
CONSUMER_NAME_PROPERTY = "spate:consumer-name"
"""Receiver link property (string): store the offset of what this consumer accepted (ADR 0012)."""
STORED_OFFSET_PROPERTY = "spate:stored-offset"
"""Answered on a named consumer's attach (long) when the name has a stored offset."""
SINGLE_ACTIVE_PROPERTY = "spate:single-active-consumer"
"""Receiver link property (boolean, with a consumer name): one active link per (stream,
partition, name), the others idle until it goes (ADR 0013)."""
ACTIVE_PROPERTY = "spate:active"
"""Answered on a single-active-consumer attach (boolean); also the delivery annotation (true) on
the first delivery a link gets as the group's active member."""
CONSUMER_GROUP_PROPERTY = "event-streams-consumer-group"
"""Receiver link property (string, 000 §4.6.2): the link is its group's receiver of the
partition (ADR 0015)."""
EPOCH_PROPERTY = "event-streams-epoch"
"""Receiver link property (000 §4.5.2, §4.6.3): the ownership epoch asked for (any integer
type) and granted (ulong)."""
STRATEGY_PROPERTY = "spate:group-strategy"
"""Receiver link property (string: round-robin, range, sticky): how the coordinator assigns
partitions to an undefined group's members (a defined group's definition decides)."""
ACTIVE_PARTITIONS_PROPERTY = "spate:active-partitions"
"""Answered on a super-stream consumer's attach (ADR 0034): a list of the partition streams
(strings) where the link is its group's active member at attach."""
PARTITION_STREAMS_PROPERTY = "spate:partition-streams"
"""Answered on a super-stream consumer's attach (ADR 0034): the super stream's partition
streams in index order (`event-streams-source-partition` and
`event-streams-associated-partitions-changed` name partitions by that index)."""
STREAM_ANNOTATION = "spate:stream"
"""Delivery annotation (string) on a super-stream consumer's deliveries (ADR 0034): the
partition stream the message was read from (`event-streams-source-partition` is its index)."""
ASSOCIATED_ANNOTATION = "event-streams-associated-partitions-changed"
"""Delivery annotation (000 §4.6.5; the seed also spells it
`event-streams-assigned-partitions-changed`): the partitions a partition-agnostic group link
is associated with, on the first transfer after they changed."""
EPOCH_MAX = 2**63 - 1
"""Epochs are stored like offsets (signed 64-bit)."""
CONSUMER_READ_BYTES = 1024 * 1024
"""Bytes asked of Partition.read per refill of a consumer cursor."""
assert limits.message_bytes_max <= CONSUMER_READ_BYTES


@dataclass(frozen=True, slots=True)
class Address:
    stream: StreamName
    info: bool
    room: str | None = None
    """`$rooms/<room>`: the room (`stream` is then the rooms stream's name)."""


def parse_address(address: str | None, *, terminus: str) -> Address:
    """`orders`, `orders/$info` or `$rooms/<room>`; raises NotFound / InvalidArgument with a
    readable reason."""
    if not address:
        raise InvalidArgument(
            f"the {terminus} has no address: name a stream (e.g. 'orders') "
            "or its runtime information ('orders/$info')"
        )
    if address.startswith(ROOMS_NODE + "/"):
        room = address[len(ROOMS_NODE) + 1 :]
        try:
            rooms.validate_room(room)
        except InvalidArgument as error:
            raise InvalidArgument(
                f"{address!r} is no room's address ('$rooms/<room>'): {error.message}"
            ) from None
        return Address(StreamName(rooms.ROOMS_STREAM), False, room)
    if "/" in address:
        stream, _, node = address.partition("/")
        if node == INFO_NODE and stream and not stream.startswith("$"):
            return Address(StreamName(stream), True)
        raise NotFound(f"no node {address!r}: addresses are '<stream>' or '<stream>/$info'")
    if address.startswith("$"):
        raise NotFound(f"no node {address!r}: the only special node is '<stream>/$info'")
    return Address(StreamName(address), False)


def partition_symbol(partition: PartitionId) -> str:
    """Partition identifiers are opaque symbols (000 §4); ours are the decimal number."""
    return str(int(partition))


def parse_partition(value: Any, stream: StreamName, partitions: int) -> PartitionId:
    """The `event-streams-partition` property (symbol or string; an integer is accepted too)."""
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.isdigit() and len(value) <= 9:
        number = int(value)
    else:
        number = None
    if number is None or not 0 <= number < partitions:
        raise NotFound(
            f"stream {stream!r} has no partition {value!r}: its partitions are "
            f"'0'..'{partitions - 1}' (ask '{stream}/$info')"
        )
    return PartitionId(number)


def check_terminus(dynamic: bool, terminus: str) -> None:
    if dynamic:
        raise NotImplementedFeature(
            f"dynamic {terminus}s are not supported: attach to a stream's address"
        )


# Producers --------------------------------------------------------------------------------------


@dataclass
class ProducerPlan:
    stream: StreamName
    partitions: int
    bound: PartitionId | None
    """Partition the link is bound to (000 §4.1), requested or, on a one-partition stream,
    chosen by us; answered in `event-streams-partition`. None = partition-agnostic."""
    targets: dict[PartitionId, Partition] = field(default_factory=dict)
    round_robin: int = 0
    producer: bytes | None = None
    """The `spate:producer-name` (UTF-8) of a deduplicating link; it is partition-bound."""
    super_stream: SuperStream | None = None
    """A link to a super stream (ADR 0014): each message is routed by its routing key;
    `targets[i]` is partition 0 of the partition stream `super_stream.partitions[i]`."""
    current_version: Callable[[], int | None] | None = None
    """Super-stream links: the topology's version as the broker knows it now; the link is
    stale (ended before its next batch) when it differs from `super_stream.version`."""

    def stale(self) -> BrokerError | None:
        """Why a super-stream link may not route by its topology any more (None: it may)."""
        topology = self.super_stream
        if topology is None or self.current_version is None:
            return None
        version = self.current_version()
        if version == topology.version:
            return None
        if version is None:
            return NotFound(f"super stream {topology.name!r} was deleted")
        return FailedPrecondition(
            f"super stream {topology.name!r} was recreated (version {version}; this link routes "
            f"by version {topology.version}): attach again"
        )

    def route(self, target: Any) -> PartitionId:
        """Partition for one message; `target` is its event-streams-target-partition or None.

        Raises NotFound / InvalidArgument (the transfer is rejected, 000 §4.2, §4.6.6)."""
        if target is None:
            if self.bound is not None:
                return self.bound
            return PartitionId(self.round_robin % self.partitions)
        wanted = parse_partition(target, self.stream, self.partitions)
        if self.bound is not None and wanted != self.bound:
            raise InvalidArgument(
                f"{TARGET_PARTITION_ANNOTATION} {target!r} does not match the "
                f"link's partition {partition_symbol(self.bound)!r}"
            )
        return wanted

    def next_batch(self) -> None:
        """Unannotated messages on an agnostic link go round-robin, one partition per batch."""
        self.round_robin += 1


async def plan_producer(
    broker: Broker, address: Address, properties: dict[Any, Any]
) -> ProducerPlan:
    if address.info:
        raise InvalidArgument(f"'{address.stream}/$info' is a source: it cannot be sent to")
    try:
        config = await broker.lookup(address.stream)
    except NotFound:
        return await plan_super_producer(
            broker, await broker.super_stream(address.stream), properties
        )
    requested = properties.get(PARTITION_PROPERTY)
    plan = ProducerPlan(address.stream, config.partitions, None)
    if requested is not None:
        plan.bound = parse_partition(requested, address.stream, config.partitions)
    elif config.partitions == 1:
        plan.bound = PartitionId(0)
    plan.producer = producer_name(properties)
    if plan.producer is not None and plan.bound is None:
        raise InvalidArgument(
            f"'{PRODUCER_NAME_PROPERTY}' needs a partition-bound link: stream "
            f"{address.stream!r} has {config.partitions} partitions, so name one with the "
            f"'{PARTITION_PROPERTY}' link property (deduplication is per partition)"
        )
    for pid in [plan.bound] if plan.bound is not None else range(config.partitions):
        plan.targets[PartitionId(pid)] = partition_or_agnostic_error(
            broker, address.stream, PartitionId(pid), plan.bound is None, write=True
        )
    return plan


async def plan_super_producer(
    broker: Broker, topology: SuperStream, properties: dict[Any, Any]
) -> ProducerPlan:
    """A sender on a super stream: partition-agnostic over its partition streams, each
    served here when led here and relayed otherwise (like an agnostic link's partitions)."""
    name = topology.name
    for key in (PARTITION_PROPERTY, PRODUCER_NAME_PROPERTY):
        if properties.get(key) is not None:
            raise InvalidArgument(
                f"'{key}' is not taken on super stream {name!r}: the broker routes each message "
                "by its routing key; to publish to one partition, attach to its stream "
                f"({topology.partitions[0]!r}, ...)"
            )
    plan = ProducerPlan(name, len(topology.partitions), None, super_stream=topology)
    plan.current_version = lambda: broker.super_stream_version(name)
    try:
        for index, stream in enumerate(topology.partitions):
            try:
                await broker.lookup(stream)
            except NotFound as missing:  # the topology is newer than this broker's streams
                raise Unavailable(
                    f"super stream {name!r} was just created or deleted: its partition stream "
                    f"{stream!r} is not known here yet; retry"
                ) from missing
            plan.targets[PartitionId(index)] = partition_or_agnostic_error(
                broker, stream, PartitionId(0), True, write=True
            )
    except BaseException:
        for target in plan.targets.values():
            target.detach()
        raise
    return plan


async def lookup_source(broker: Broker, name: StreamName) -> StreamConfig | SuperStream:
    """broker.lookup for a consumer; a super stream's topology for a super stream's name
    (NotFound for neither)."""
    try:
        return await broker.lookup(name)
    except NotFound as unknown:
        try:
            return await broker.super_stream(name)
        except NotFound:
            raise unknown from None


def producer_name(properties: dict[Any, Any]) -> bytes | None:
    """The link's `spate:producer-name` as UTF-8, None without one; InvalidArgument when it is
    not a non-empty string of at most `limits.producer_name_bytes_max` bytes."""
    return _link_name(properties, PRODUCER_NAME_PROPERTY, limits.producer_name_bytes_max)


def consumer_name(properties: dict[Any, Any]) -> bytes | None:
    """The link's `spate:consumer-name` as UTF-8, like `producer_name`; names starting with
    `$` are reserved (a consumer group's offsets are stored as `$group/<group>`)."""
    name = _link_name(properties, CONSUMER_NAME_PROPERTY, limits.consumer_name_bytes_max)
    if name is not None and name.startswith(groups.RESERVED_PREFIX.encode()):
        raise InvalidArgument(
            f"'{CONSUMER_NAME_PROPERTY}' {name.decode(errors='replace')!r}: names starting with "
            f"'{groups.RESERVED_PREFIX}' are reserved for consumer groups (a group's link "
            f"uses '{CONSUMER_GROUP_PROPERTY}')"
        )
    return name


def consumer_group(properties: dict[Any, Any]) -> str | None:
    """The link's `event-streams-consumer-group` (a non-empty string of at most
    `limits.group_name_bytes_max` UTF-8 bytes, not starting with `$`)."""
    name = _link_name(properties, CONSUMER_GROUP_PROPERTY, limits.group_name_bytes_max)
    if name is None:
        return None
    if name.startswith(groups.RESERVED_PREFIX.encode()):
        raise InvalidArgument(
            f"'{CONSUMER_GROUP_PROPERTY}' must not start with '{groups.RESERVED_PREFIX}'"
        )
    return name.decode()


def group_epoch(properties: dict[Any, Any], group: str | None) -> int | None:
    """The link's `event-streams-epoch`: any integer type (the seed says ulong in §4.5.2 and
    long in §4.6.3), 0 .. 2**63-1, only with a consumer group."""
    value = properties.get(EPOCH_PROPERTY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"'{EPOCH_PROPERTY}' must be an integer (ulong), not {value!r}")
    if not 0 <= value <= EPOCH_MAX:
        raise InvalidArgument(f"'{EPOCH_PROPERTY}' {value} is outside 0..{EPOCH_MAX}")
    if group is None:
        raise InvalidArgument(
            f"'{EPOCH_PROPERTY}' needs '{CONSUMER_GROUP_PROPERTY}': the epoch is the group's "
            "ownership counter of the partition (000 §4.5.2)"
        )
    return int(value)


def single_active(properties: dict[Any, Any], name: bytes | None) -> bool:
    """The link's `spate:single-active-consumer` (a boolean; needs a consumer name)."""
    value = properties.get(SINGLE_ACTIVE_PROPERTY)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidArgument(f"'{SINGLE_ACTIVE_PROPERTY}' must be a boolean, not {value!r}")
    if value and name is None:
        raise InvalidArgument(
            f"'{SINGLE_ACTIVE_PROPERTY}' needs '{CONSUMER_NAME_PROPERTY}': the group is the "
            "consumers of one name (and its stored offset is where the next active one resumes)"
        )
    return value


def _link_name(properties: dict[Any, Any], key: str, bytes_max: int) -> bytes | None:
    value = properties.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"'{key}' must be a non-empty string, not {value!r}")
    name = value.encode()
    if len(name) > bytes_max:
        raise InvalidArgument(f"'{key}' is {len(name)} bytes long; the limit is {bytes_max}")
    return name


def partition_or_agnostic_error(
    broker: Broker, stream: StreamName, pid: PartitionId, agnostic: bool, *, write: bool
) -> Partition:
    """broker.partition, but an agnostic link cannot be redirected to one partition's leader.

    Producers (`write`) need the partition's leader; consumers are served by any local replica.
    """
    try:
        return broker.partition(stream, pid, write=write, relay=agnostic)
    except NotLeader as err:
        if not agnostic:
            raise
        raise Unavailable(
            f"partition {int(pid)} of {stream!r} is served by another node, so a "
            "partition-agnostic link cannot be served here; bind the link with the "
            f"'{PARTITION_PROPERTY}' property to be redirected"
        ) from err


def producer_credit(
    credit: int, unconfirmed: int, in_flight_bytes: int = 0, message_bytes: int = 0
) -> int:
    """Credit to grant a producer link now: none while its connection has
    `limits.producer_unconfirmed_max` deliveries waiting for durability or
    `limits.producer_in_flight_bytes_max` bytes of messages not answered yet (admission
    control), else top it up to its window (`producer_window`) once it fell below half."""
    if (
        unconfirmed >= limits.producer_unconfirmed_max
        or in_flight_bytes >= limits.producer_in_flight_bytes_max
    ):
        return 0
    window = producer_window(message_bytes)
    if credit >= window // 2:
        return 0
    return window - credit


def producer_window(message_bytes: int) -> int:
    """A producer link's credit window for messages of `message_bytes` (0: none seen yet, taken
    as `limits.message_bytes_max`): as many as `limits.link_credit_bytes` holds, within
    `limits.link_credit_min`..`limits.link_credit_max` (ADR 0048)."""
    fits = limits.link_credit_bytes // (message_bytes or limits.message_bytes_max)
    return max(limits.link_credit_min, min(limits.link_credit_max, fits))


# Consumers --------------------------------------------------------------------------------------

CONSUMER_UNSETTLED_MAX = 10_000
"""Deliveries one consumer link may hold unsettled (credit beyond this waits for settlements)."""


def consumer_room(credit: int, unsettled: int, presettled: bool) -> int:
    """Deliveries to send a consumer link in one pump: its credit, bounded by
    `CONSUMER_UNSETTLED_MAX` unsettled (unless pre-settled) and `limits.consumer_send_batch_max`
    (then the pump yields to other connections)."""
    room = credit if presettled else min(credit, CONSUMER_UNSETTLED_MAX - unsettled)
    return min(room, limits.consumer_send_batch_max)


@dataclass(slots=True)
class Run:
    """Consecutive records of one chunk: offsets `first_offset` .. `first_offset + len - 1`.

    The unit the egress hot path works in: everything but the offset digits of a delivery's
    annotations is the same for a run (`sections.delivery_annotation_parts`)."""

    cursor: Cursor
    first_offset: int
    timestamp_ms: int
    records: Sequence[bytes | memoryview]


@dataclass
class Cursor:
    """One partition's read position for a consumer link."""

    partition: Partition
    symbol: str
    next_offset: Offset
    pending: deque[Run] = field(default_factory=deque)
    """Runs read but not sent yet, in log order (whole chunks from `Partition.read`, trimmed)."""
    owner: Partition | None = None
    """A coordinator member's partition (ADR 0015): where it holds the claim and stores the
    group's offset (the leader; `partition` may be another replica it reads from)."""
    member: int = 0
    """A coordinator member's place in the partition's exclusive group (its claim)."""
    resumed: bool = False
    """A coordinator member's partition: it began after the group's committed offset (False:
    nothing was committed, it began at its start filter or `next`)."""

    def available(self) -> bool:
        if not (self.owner or self.partition).in_contact():
            return False  # the claim's node is silent: nothing until it is heard (ADR 0008)
        return bool(self.pending) or self.next_offset < self.partition.end_offset()

    def take(
        self, count: int, chosen: MessageFilter | None = None, whole: bool = False
    ) -> list[Run]:
        """Runs holding up to `count` records from the next offset on, in log order; none
        while a consumer group's claim cannot be known to be ours (`Partition.in_contact`).
        With `chosen` (ADR 0016), only the messages it selects: a run is consecutive offsets,
        so a chunk may give several. `whole`: a run of a stored sub-entry (ADR 0017) counts as
        one and is never cut (its consumer receives it as is; never with `chosen`)."""
        if not (self.owner or self.partition).in_contact():
            return []
        pending = self.pending
        if not pending and self.next_offset < self.partition.end_offset():
            start = int(self.next_offset)
            for chunk in self.partition.read(self.next_offset, CONSUMER_READ_BYTES):
                first = int(chunk.first_offset)
                records = chunk.records
                if not records:  # a skip mark: nothing before it for this link
                    start = max(start, first)
                    continue
                end = first + len(records)
                if chosen is not None:
                    for begun, selected in chosen.select(chunk, start):
                        pending.append(Run(self, begun, chunk.timestamp_ms, selected))
                    start = max(start, end)
                    continue
                if first < start:
                    records = records[start - first :]
                    first = start
                if records:
                    pending.append(Run(self, first, chunk.timestamp_ms, records))
                    start = first + len(records)
            self.next_offset = Offset(start)
        out: list[Run] = []
        while pending and count > 0:
            run = pending[0]
            size = 1 if whole and isinstance(run.records, SubEntryRecords) else len(run.records)
            if size <= count:
                out.append(pending.popleft())
                count -= size
            else:
                out.append(Run(self, run.first_offset, run.timestamp_ms, run.records[:count]))
                run.records = run.records[count:]
                run.first_offset += count
                count = 0
        return out


@dataclass
class Membership:
    """A super-stream consumer's place in the single-active-consumer group of its name on one
    partition stream (ADR 0034; the group is ADR 0013's spread group of that stream)."""

    index: int
    """The partition stream's index in the super stream (its `event-streams-source-partition`
    and the group's spread)."""
    stream: StreamName
    owner: Partition
    """The partition stream at its leader (here, or relayed): the group and the stores."""
    member: int = 0
    """Its member number in the group (0: not joined yet)."""
    cursor: Cursor | None = None
    """While it is the active member: its reader (`owner` holds the place)."""
    step: Awaitable[None] | None = None
    """A step-down in flight (the link's detach waits for it before leaving the group; a
    future, awaited shielded)."""


@dataclass
class ConsumerPlan:
    stream: StreamName
    bound: PartitionId | None
    """Partition the link is bound to (000 §4.3), requested or, on a one-partition stream,
    chosen by us; answered in `event-streams-partition`. None = partition-agnostic."""
    cursors: list[Cursor]
    selection: StartSelection
    tag_source_partition: bool
    """Add event-streams-source-partition to each delivery (partitioned streams, 000 §4.6.4)."""
    turn: int = 0
    name: bytes | None = None
    """A named consumer's name (offset tracking, ADR 0012): its link is bound to one partition,
    counted at the leader from `consumer_attach` until `consumer_detach`."""
    stored: ConsumerOffset | None = None
    """The name's stored offset when the link attached."""
    member: int = 0
    """Single active consumer (ADR 0013): the link's member number in its group (0: none)."""
    active: bool = True
    """Single active consumer: False while the link is a standby; its cursor begins when it
    becomes active (`start_when_active`)."""
    spread: int | None = None
    """Single active consumer on a super stream's partition: the partition's index there
    (members take partitions by index modulo the group's size; ADR 0013)."""
    group: str | None = None
    """Consumer groups (ADR 0015): the link owns its partition for this group (`name` is
    `$group/<group>`, `member` its place at the leader)."""
    epoch: int | None = None
    """Consumer groups: the epoch the partition was granted with."""
    shared: bool = False
    """An Event Hubs receiver without owner level in its group (ADR 0021 addendum): it reads
    beside others like it, commits nothing, and gives way to a receiver with an owner level."""
    coordinator: GroupCoordinator | None = None
    """A partition-agnostic group link (ADR 0015): the group's coordinator, whose member
    `member_id` it is; its cursors are the partitions it holds now."""
    member_id: int = 0
    settings: GroupSettings | None = None
    assignment: Assignment | None = None
    """The coordinator's last answer the link acted on."""
    broker: Broker | None = None
    """A group member: the broker its partitions come from (it claims more later)."""
    super_stream: SuperStream | None = None
    """A single active consumer of a super stream (ADR 0034): `memberships[i]` is its place in
    the group of the name on partition stream i; its cursors are the partitions where it is
    the active member now."""
    memberships: list[Membership] = field(default_factory=list)

    def available(self) -> bool:
        return any(c.available() for c in self.cursors)

    def take(self, count: int, whole: bool = False) -> list[Run]:
        """Runs holding up to `count` records in all, taking turns between partitions
        (`whole`: as in `Cursor.take`)."""
        out: list[Run] = []
        taken = 0
        idle = 0
        while taken < count and idle < len(self.cursors):
            cursor = self.cursors[self.turn % len(self.cursors)]
            self.turn += 1
            share = max((count - taken) // len(self.cursors), 1)
            got = cursor.take(share, self.selection.filter, whole)
            idle = 0 if got else idle + 1
            for run in got:
                taken += (
                    1 if whole and isinstance(run.records, SubEntryRecords) else len(run.records)
                )
            out += got
        return out


async def plan_consumer(
    broker: Broker,
    address: Address,
    properties: dict[Any, Any],
    filters: dict[Any, Any] | None,
) -> ConsumerPlan:
    config = await lookup_source(broker, address.stream)
    if isinstance(config, SuperStream):
        return await plan_super_consumer(broker, config, properties, filters)
    selection = parse_filters(filters)
    requested = properties.get(PARTITION_PROPERTY)
    bound: PartitionId | None = None
    if requested is not None:
        bound = parse_partition(requested, address.stream, config.partitions)
    elif config.partitions == 1:
        bound = PartitionId(0)
    name = consumer_name(properties)
    sac = single_active(properties, name)
    group = consumer_group(properties)
    epoch = group_epoch(properties, group)
    if group is not None:
        if name is not None or sac:
            raise InvalidArgument(
                f"a '{CONSUMER_GROUP_PROPERTY}' link stores the group's offsets: it carries "
                f"neither '{CONSUMER_NAME_PROPERTY}' nor '{SINGLE_ACTIVE_PROPERTY}'"
            )
        return await _plan_group(
            broker, address, config, selection, group, epoch, bound, properties
        )
    spread: int | None = None
    if sac:
        owner = await broker.super_stream_of(address.stream)
        if owner is not None:  # a super stream's partition: groups spread by its index
            spread = owner.partitions.index(address.stream)
    if name is not None and bound is None:
        raise InvalidArgument(
            f"'{CONSUMER_NAME_PROPERTY}' needs a partition-bound link: stream "
            f"{address.stream!r} has {config.partitions} partitions, so name one with the "
            f"'{PARTITION_PROPERTY}' link property (offsets are stored per partition)"
        )
    if name is not None:
        assert bound is not None
        # offsets are stored at the leader: a broker that does not reach it says where it is
        broker.partition(address.stream, bound, write=True).detach()
    pids = [bound] if bound is not None else [PartitionId(p) for p in range(config.partitions)]
    cursors: list[Cursor] = []
    stored: ConsumerOffset | None = None
    attached = Attached(None)
    counted = False
    try:
        for pid in pids:
            part = partition_or_agnostic_error(
                broker, address.stream, pid, bound is None, write=False
            )
            cursors.append(Cursor(part, partition_symbol(pid), Offset(0)))
            specs = selection.specs
            if name is not None:
                # at the leader (NotLeader: redirect)
                attached = await part.consumer_attach(name, single_active=sac, spread=spread)
                stored, counted = attached.stored, True
                if not selection.accepted_keys:  # no start filter: resume after the stored one
                    specs = resume_specs(stored)
            if attached.active:
                # all start filters must hold: the partition starts at the largest (000 §5.2.1)
                cursors[-1].next_offset = await part.begin(specs, chunk_filter_of(selection))
    except BaseException:
        if counted and name is not None:
            await cursors[0].partition.consumer_detach(name, None, attached.member)
        for cursor in cursors:
            cursor.partition.detach()
        raise
    return ConsumerPlan(
        address.stream,
        bound,
        cursors,
        selection,
        tag_source_partition=config.partitions > 1,
        name=name,
        stored=stored,
        member=attached.member,
        active=attached.active,
        spread=spread if sac else None,
    )


async def _plan_group(  # noqa: PLR0917 (the attach's parts, in order)
    broker: Broker,
    address: Address,
    config: StreamConfig,
    selection: StartSelection,
    group: str,
    epoch: int | None,
    bound: PartitionId | None,
    properties: dict[Any, Any],
) -> ConsumerPlan:
    """A consumer group's link (ADR 0015). Bound (000 §4.5.2): claim the partition at its
    leader, wait while the holder it displaces steps down, and start after the group's
    committed offset (an explicit start filter wins, as for named consumers). Unbound on a
    stream of several partitions (000 §4.5.1): a member of the group's coordinator, its attach
    pending until the coordinator gives it a partition."""
    name = groups.committed_name(group).encode()
    definition = await broker.consumer_group(address.stream, group)
    if definition is None and broker.groups_required:
        raise NotFound(
            f"consumer group {group!r} of {address.stream!r} is not defined, and this "
            f"cluster requires defined groups: spate group create {address.stream} {group}"
        )
    if bound is None:
        if epoch is not None:
            raise InvalidArgument(
                f"'{EPOCH_PROPERTY}' is per partition: bind the link with '{PARTITION_PROPERTY}' "
                f"(stream {address.stream!r} has {config.partitions} partitions)"
            )
        settings = group_settings(definition, properties)
        return await _plan_member(broker, address, selection, group, settings)
    # claimed at the leader: a broker that does not reach it says where it is (redirect)
    broker.partition(address.stream, bound, write=True).detach()
    part = broker.partition(address.stream, bound, write=False)
    try:
        attached = await part.claim(name, epoch)
    except BaseException:
        part.detach()
        raise
    try:
        granted = attached.epoch
        if not attached.active:  # the owner it displaces steps down first
            attached = await part.until_active(name, attached.member)
            if not attached.active:
                raise AlreadyExists(
                    f"consumer group {group!r} on {address.stream}/{int(bound)}: a claim "
                    "with a greater epoch (or, for an Event Hubs group, an equal one) arrived "
                    "while this one waited"
                )
        specs = selection.specs if selection.accepted_keys else resume_specs(attached.stored)
        start = await part.begin(specs, chunk_filter_of(selection))
    except BaseException:
        await part.consumer_detach(name, None, attached.member)
        part.detach()
        raise
    return ConsumerPlan(
        address.stream,
        bound,
        [Cursor(part, partition_symbol(bound), start)],
        selection,
        tag_source_partition=config.partitions > 1,
        name=name,
        stored=attached.stored,
        member=attached.member,
        group=group,
        epoch=granted,
        shared=epoch is None and groups.takes_over_at_equal_epoch(group),
    )


SUPER_REFUSED_PROPERTIES = (
    PARTITION_PROPERTY,
    CONSUMER_GROUP_PROPERTY,
    EPOCH_PROPERTY,
    STRATEGY_PROPERTY,
)


def _partition_streams(topology: SuperStream) -> str:
    shown = ", ".join(repr(p) for p in topology.partitions[:3])
    return shown + (", ..." if len(topology.partitions) > 3 else "")


async def plan_super_consumer(
    broker: Broker,
    topology: SuperStream,
    properties: dict[Any, Any],
    filters: dict[Any, Any] | None,
) -> ConsumerPlan:
    """A receiver on a super stream's address (ADR 0034): with `spate:consumer-name` and
    `spate:single-active-consumer` = true it joins the name's single-active-consumer group on
    every partition stream (ADR 0013's spread groups: partition i's active member is member
    i % size in joining order) and is sent the partitions where it is active. Each group is
    at its partition stream's leader, reached here or relayed (like a super-stream sender's
    partitions). A start filter applies to a partition whose group has no stored offset;
    an offset names one partition's message, so it is refused."""
    name_text = topology.name
    streams = _partition_streams(topology)
    name = consumer_name(properties)
    sac = single_active(properties, name)
    if name is None or not sac:
        missing = (
            f"'{CONSUMER_NAME_PROPERTY}' and '{SINGLE_ACTIVE_PROPERTY}' = true"
            if name is None
            else f"'{SINGLE_ACTIVE_PROPERTY}' = true"
        )
        raise InvalidArgument(
            f"{name_text!r} is a super stream: consume from its partition streams ({streams}), "
            f"one link each, or attach here with {missing} (one active consumer per partition "
            "stream among the links of that name)"
        )
    for key in SUPER_REFUSED_PROPERTIES:
        if properties.get(key) is not None:
            raise InvalidArgument(
                f"'{key}' is not taken on super stream {name_text!r}: its single active "
                f"consumers are spread over the partition streams by the broker; to choose a "
                f"partition, attach to its stream ({streams})"
            )
    selection = parse_filters(filters)
    if any(spec.kind is OffsetSpecKind.OFFSET for spec in selection.specs):
        raise InvalidArgument(
            f"an offset filter names a message of one partition stream, and super stream "
            f"{name_text!r} has {len(topology.partitions)}: start at first, last, next, -N or a "
            f"timestamp here, or attach to a partition stream ({streams}) with the offset"
        )
    plan = ConsumerPlan(
        name_text,
        None,
        [],
        selection,
        tag_source_partition=True,
        name=name,
        broker=broker,
        super_stream=topology,
    )
    try:
        for index, stream in enumerate(topology.partitions):
            try:
                await broker.lookup(stream)
            except NotFound as missing_stream:  # the topology is newer than these streams
                raise Unavailable(
                    f"super stream {name_text!r} was just created or deleted: its partition "
                    f"stream {stream!r} is not known here yet; retry"
                ) from missing_stream
            owner = partition_or_agnostic_error(broker, stream, PartitionId(0), True, write=True)
            membership = Membership(index, stream, owner)
            plan.memberships.append(membership)
            attached = await owner.consumer_attach(name, single_active=True, spread=index)
            membership.member = attached.member
            if attached.active:
                membership.cursor = await begin_membership(plan, membership, attached.stored)
                plan.cursors.append(membership.cursor)
    except BaseException:
        await leave_memberships(plan)
        raise
    return plan


async def begin_membership(
    plan: ConsumerPlan, membership: Membership, stored: ConsumerOffset | None
) -> Cursor:
    """A super-stream consumer became the active member on one partition stream: its reader
    (any replica, relayed when none is here) begins after the group's stored offset, else at
    the link's start filter, else `next` — and then, when the group had stored nothing, the
    offset before where it began is stored at once, so a later member goes on from there
    rather than from its own `next` (nothing between is skipped; as ADR 0015's first holder)."""
    assert plan.broker is not None and plan.name is not None
    if stored is not None:
        specs = resume_specs(stored)
    else:
        specs = plan.selection.specs if plan.selection.accepted_keys else (OffsetSpec.next(),)
    reader = partition_or_agnostic_error(
        plan.broker, membership.stream, PartitionId(0), True, write=False
    )
    try:
        start = await reader.begin(specs, chunk_filter_of(plan.selection))
        if stored is None:
            await membership.owner.store_offset(plan.name, int(start) - 1, membership.member)
    except BaseException:
        reader.detach()
        raise
    return Cursor(
        reader,
        partition_symbol(PartitionId(membership.index)),
        start,
        owner=membership.owner,
        member=membership.member,
        resumed=True,  # the group has a stored offset now (above)
    )


async def leave_memberships(plan: ConsumerPlan) -> None:
    """A super-stream consumer's link that never opened: leave each group it joined and stop
    reading (one partition at a time; an open link's are let go by the consumer's shell,
    `spate.gateway.consumer.release_memberships`, after its stores)."""
    assert plan.name is not None
    for membership in plan.memberships:
        try:
            if membership.member:
                with contextlib.suppress(BrokerError):
                    await membership.owner.consumer_detach(plan.name, None, membership.member)
        finally:
            membership.owner.detach()
            if membership.cursor is not None:
                membership.cursor.partition.detach()
                membership.cursor = None


def group_settings(definition: Any, properties: dict[Any, Any]) -> GroupSettings:
    """A defined group's settings; an undefined one's defaults, with the link's
    `spate:group-strategy` if it has one."""
    settings = GroupSettings.of(definition)
    asked = properties.get(STRATEGY_PROPERTY)
    if asked is None:
        return settings
    if not isinstance(asked, str) or asked not in STRATEGIES:
        raise InvalidArgument(f"'{STRATEGY_PROPERTY}' must be one of {', '.join(STRATEGIES)}")
    if definition is not None and asked != settings.strategy:
        raise FailedPrecondition(
            f"consumer group {definition.name!r} is defined with strategy "
            f"{settings.strategy!r}, not {asked!r}"
        )
    chosen: GroupSettings = dataclasses.replace(settings, strategy=asked)
    return chosen


def poll_s(settings: GroupSettings) -> float:
    """How long a member's poll may wait at the coordinator: well inside its session."""
    return max(0.2, settings.session_timeout_ms / 3000)


async def _plan_member(
    broker: Broker,
    address: Address,
    selection: StartSelection,
    group: str,
    settings: GroupSettings,
) -> ConsumerPlan:
    coordinator = broker.group_coordinator(address.stream)
    member = await coordinator.join(group, settings)
    plan = ConsumerPlan(
        address.stream,
        None,
        [],
        selection,
        tag_source_partition=True,
        name=groups.committed_name(group).encode(),
        group=group,
        coordinator=coordinator,
        member_id=member,
        settings=settings,
        broker=broker,
    )
    try:
        assignment = await coordinator.sync(group, member, None, 0)
        while not assignment.partitions:  # pending (000 §4.5.1): until it gets a partition
            assignment = await coordinator.sync(group, member, assignment, poll_s(settings))
        for pid in sorted(assignment.partitions):
            cursor = await claim_partition(broker, plan, pid, assignment.generation)
            if cursor is not None:
                plan.cursors.append(cursor)
        plan.assignment = assignment
    except BaseException:
        for cursor in plan.cursors:
            cursor.partition.detach()
        await coordinator.leave(group, member)
        raise
    return plan


async def claim_partition(
    broker: Broker, plan: ConsumerPlan, pid: PartitionId, generation: int
) -> Cursor | None:
    """A coordinator's member claims a partition it was given (at its leader, fenced by
    `generation`) and begins after the group's committed offset (else its start filter, else
    `next`). None: held by another link of the group still (the member tries again later)."""
    assert plan.name is not None
    owner = broker.partition(plan.stream, pid, write=True, relay=True)
    try:
        attached = await owner.claim(plan.name, None, generation)
    except AlreadyExists:
        owner.detach()
        return None
    except BaseException:
        owner.detach()
        raise
    try:
        if not attached.active:  # a holder of an older generation steps down first
            attached = await owner.until_active(plan.name, attached.member)
    except BaseException:
        await owner.consumer_detach(plan.name, None, attached.member)
        owner.detach()
        raise
    if not attached.active:  # a newer claim displaced it: the leader counts it still
        await owner.consumer_detach(plan.name, None, attached.member)
        owner.detach()
        return None
    reader = owner
    try:
        if attached.stored is not None:
            specs = resume_specs(attached.stored)
        else:
            specs = plan.selection.specs if plan.selection.accepted_keys else (OffsetSpec.next(),)
        reader = broker.partition(plan.stream, pid, write=False, relay=True)
        start = await reader.begin(specs, chunk_filter_of(plan.selection))
        if attached.stored is None:
            # the group's first holder of the partition fixes where the group begins: a later
            # holder (after a hand-over, or this one's link dying) goes on from there rather
            # than from its own `next`
            await owner.store_offset(plan.name, int(start) - 1, attached.member)
    except BaseException:
        await owner.consumer_detach(plan.name, None, attached.member)
        owner.detach()
        if reader is not owner:
            reader.detach()
        raise
    return Cursor(
        reader,
        partition_symbol(pid),
        start,
        owner=owner,
        member=attached.member,
        resumed=attached.stored is not None,
    )


def resume_specs(stored: ConsumerOffset | None) -> tuple[OffsetSpec, ...]:
    """Where a named consumer without a start filter begins: after its stored offset, else
    `next`."""
    return (OffsetSpec.offset(stored.offset + 1),) if stored is not None else (OffsetSpec.next(),)


async def start_when_active(plan: ConsumerPlan, now: Attached) -> None:
    """A standby became its group's active member (ADR 0013): its cursor begins after the
    group's stored offset (what the member before it stored on leaving); only a group with
    none uses the link's own start filter."""
    cursor = plan.cursors[0]
    if now.stored is None and plan.selection.accepted_keys:
        specs = plan.selection.specs
    else:
        specs = resume_specs(now.stored)
    cursor.next_offset = await cursor.partition.begin(specs, chunk_filter_of(plan.selection))
    cursor.pending.clear()
    plan.active = True


async def plan_info(broker: Broker, address: Address) -> StreamName:
    """A stream's or a super stream's `$info` (NotFound for neither)."""
    if not address.info:
        raise AssertionError("plan_info needs an $info address")
    try:
        await broker.lookup(address.stream)
    except NotFound as unknown:
        try:
            await broker.super_stream(address.stream)
        except BrokerError:
            raise unknown from None
    return address.stream


# Rooms (ADR 0018) --------------------------------------------------------------------------------

ROOM_READS_PER_TAKE_MAX = 64
"""Reads of the rooms partition one `RoomCursor.take` makes to find its room's next events
(other rooms' chunks mostly arrive as skip marks: the node's Bloom filter passes them over)."""
ROOM_REFUSED_PROPERTIES = (
    PARTITION_PROPERTY,
    PRODUCER_NAME_PROPERTY,
    CONSUMER_NAME_PROPERTY,
    SINGLE_ACTIVE_PROPERTY,
    CONSUMER_GROUP_PROPERTY,
)


@dataclass(frozen=True, slots=True)
class RoomStart:
    """What a gateway's `Rooms` answers a room reader: its reader of the room's partition,
    begun at `partition_offset` with the room as its value filter, and a one-room index
    seeded to number the room's events from there as the gateway's tail does."""

    reader: Partition
    partition_offset: int
    index: rooms.RoomIndex
    room_offset: int
    """The room offset the reader starts at (echoed nowhere; for tests and logs)."""


class Rooms(Protocol):
    """A gateway's rooms (spate.gateway.synap_service.SynapService)."""

    def room_start(self, room: str, specs: tuple[OffsetSpec, ...]) -> Awaitable[RoomStart]:
        """A reader of the room from where the specs say (auto-creates the room)."""
        ...

    def room_target(self, room: str) -> Awaitable[Partition]:
        """A Partition whose `append` takes AMQP messages (delivery annotations cut) and
        stores them as the room's events (`rooms.amqp_event`), batched with the room
        partition's other publishes (auto-creates the room)."""
        ...


@dataclass
class RoomCursor(Cursor):
    """A `$rooms/<room>` reader: runs carry ROOM offsets (consecutive within the room), so the
    consumer's hot path puts the room's offsets in `event-streams-offset`. `next_offset` is
    the partition offset it reads from; `index` numbers the room's events."""

    room: str = ""
    index: rooms.RoomIndex | None = None

    def take(
        self, count: int, chosen: MessageFilter | None = None, whole: bool = False
    ) -> list[Run]:
        assert chosen is None and self.index is not None
        pending = self.pending
        reads = 0
        while not pending and self.next_offset < self.partition.end_offset():
            reads += 1
            if reads > ROOM_READS_PER_TAKE_MAX:
                break
            start = int(self.next_offset)
            chunks = self.partition.read(self.next_offset, CONSUMER_READ_BYTES)
            if not chunks:
                break
            for chunk in chunks:
                first = int(chunk.first_offset)
                records = chunk.records
                if not records:  # a skip mark
                    start = max(start, first)
                    continue
                run: Run | None = None
                run_records: list[bytes | memoryview] = []
                for i, record in enumerate(records):
                    offset = first + i
                    if offset < start:
                        continue
                    found = rooms.room_of(record)
                    if found is None or found[0] != self.room:
                        self.index.skip(offset)
                        continue
                    room_offset = self.index.apply(self.room, offset, chunk.timestamp_ms, found[1])
                    if run is None or run.first_offset + len(run_records) != room_offset:
                        run_records = []
                        run = Run(self, room_offset, chunk.timestamp_ms, run_records)
                        pending.append(run)
                    run_records.append(record)
                start = max(start, first + len(records))
            self.next_offset = Offset(start)
        out: list[Run] = []
        while pending and count > 0:
            run = pending[0]
            if len(run.records) <= count:
                out.append(pending.popleft())
                count -= len(run.records)
            else:
                out.append(Run(self, run.first_offset, run.timestamp_ms, run.records[:count]))
                run.records = run.records[count:]
                run.first_offset += count
                count = 0
        return out


def _room_properties(properties: dict[Any, Any], address: Address) -> None:
    for key in ROOM_REFUSED_PROPERTIES:
        if key in properties:
            raise InvalidArgument(
                f"'{key}' does not apply to a room: '$rooms/{address.room}' is one ordered "
                "stream of events (ADR 0018)"
            )


async def plan_room_producer(
    host: Rooms, address: Address, properties: dict[Any, Any]
) -> ProducerPlan:
    """A sender to `$rooms/<room>`: one target (the room's), bound nowhere (no partition is
    echoed: a room has none)."""
    assert address.room is not None
    _room_properties(properties, address)
    target = await host.room_target(address.room)
    return ProducerPlan(address.stream, 1, None, {PartitionId(0): target})


async def plan_room_consumer(
    host: Rooms, address: Address, properties: dict[Any, Any], filters: dict[Any, Any] | None
) -> ConsumerPlan:
    """A receiver from `$rooms/<room>`: start filters as for streams, in room offsets;
    filters that choose messages (values, SQL predicates) are refused."""
    assert address.room is not None
    _room_properties(properties, address)
    selection = parse_filters(filters)
    if selection.filter is not None:
        raise InvalidArgument(
            f"'$rooms/{address.room}' takes start filters only (first, last, next, an offset, "
            "-N, a timestamp): a room is already one room's events"
        )
    start = await host.room_start(address.room, selection.specs)
    cursor = RoomCursor(
        start.reader, "0", Offset(start.partition_offset), room=address.room, index=start.index
    )
    return ConsumerPlan(address.stream, None, [cursor], selection, tag_source_partition=False)
