"""Super streams (004 "Super Streams", ADR 0014): the topology and the routing decision, pure.

A super stream `invoices` is a name over ordinary streams, its partitions, each bound by a
binding key: created with `--partitions 3` the keys are "0", "1", "2" and the streams
`invoices-0` .. `invoices-2`; with `--binding-keys amer,emea,apac` the streams are
`invoices-amer`, ... . Partition i of the super stream is partition 0 of stream
`partitions[i]` (a partition stream has one partition).

Routing a message (the listener does it, per message, ADR 0014):

- routing key: the `event-streams-group-key` message annotation (000 §4.3) when present, else
  the `message-id` property (004's default extractor); neither: InvalidArgument.
- key text: a string or symbol as is; an integer (ulong, ...) in decimal; a uuid in its
  36-character hex form; binary as UTF-8 (else InvalidArgument).
- hash routing: `mmh3.hash(key UTF-8, seed 104729, unsigned) % partitions` — the unsigned
  value, as RabbitMQ's stream clients compute it (rabbitmq-stream-go-client:
  `Sum32() % uint32(len(partitions))`), so a key lands where it lands with them.
- key routing: the partition whose binding key equals the key; none: NotFound naming the
  super stream and the key.

The topology never changes after creation; `version` is the metadata version that created
it, so (name, version) identifies it (a router holding another version is stale).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import mmh3
from spate.core import limits
from spate.core.errors import InvalidArgument, NotFound
from spate.core.ids import StreamName
from spate.core.streams import validate_stream_name

HASH_SEED = 104729
"""MurmurHash3 seed of RabbitMQ's stream clients (Java, .NET, Go, Python): do not change it."""
GROUP_KEY_ANNOTATION = "event-streams-group-key"
"""Message annotation carrying the routing key (000 §4.3)."""


class Routing(Enum):
    HASH = "hash"  # MurmurHash3 of the routing key modulo the partition count
    KEY = "key"  # the partition whose binding key is the routing key


@dataclass(frozen=True, slots=True)
class SuperStream:
    """A super stream's topology as the metadata service stores it."""

    name: StreamName
    partitions: tuple[StreamName, ...]
    """The partition streams, in partition order."""
    binding_keys: tuple[str, ...]
    """`binding_keys[i]` binds `partitions[i]`."""
    routing: Routing
    version: int
    """The metadata version that created it (0 before it is stored)."""

    def route(self, key: str) -> int:
        """The partition (index into `partitions`) for a routing key; NotFound when key
        routing finds no binding."""
        if self.routing is Routing.HASH:
            return hash_partition(key, len(self.partitions))
        try:
            return self.binding_keys.index(key)
        except ValueError:
            shown = ", ".join(self.binding_keys[:10]) + (
                ", ..." if len(self.binding_keys) > 10 else ""
            )
            raise NotFound(
                f"super stream {self.name!r} has no binding key {key!r} (its keys: {shown})"
            ) from None

    def route_utf8(self, key: bytes) -> int:
        """`route` for a key given as its UTF-8 bytes (the listener's fast path; the bytes
        are hashed as they are, which is what `route` hashes)."""
        text = key.decode("utf-8")  # UnicodeDecodeError: not a valid AMQP string
        if self.routing is Routing.HASH:
            value: int = mmh3.hash(key, HASH_SEED, signed=False)
            return value % len(self.partitions)
        return self.route(text)


def hash_partition(key: str, partitions: int) -> int:
    """32-bit MurmurHash3 (unsigned) of the key's UTF-8 bytes, modulo `partitions`."""
    assert partitions > 0
    value: int = mmh3.hash(key.encode("utf-8"), HASH_SEED, signed=False)
    return value % partitions


def define(
    name: str,
    *,
    partitions: int | None = None,
    binding_keys: tuple[str, ...] | None = None,
    routing: Routing | None = None,
) -> SuperStream:
    """The topology for `spate superstream create` (version 0), or InvalidArgument naming the
    field: exactly one of `partitions` (keys "0".."N-1") and `binding_keys`. Routing defaults
    to hash for `partitions` and key for `binding_keys`."""
    validate_stream_name(name)
    if (partitions is None) == (binding_keys is None):
        raise InvalidArgument(
            "give exactly one of partitions (a count) and binding-keys (a list) for super "
            f"stream {name!r}"
        )
    if partitions is not None:
        if not 1 <= partitions <= limits.super_stream_partitions_max:
            raise InvalidArgument(
                f"partitions must be between 1 and {limits.super_stream_partitions_max}, "
                f"got {partitions}"
            )
        keys = tuple(str(i) for i in range(partitions))
        default = Routing.HASH
    else:
        assert binding_keys is not None
        keys = tuple(binding_keys)
        if not 1 <= len(keys) <= limits.super_stream_partitions_max:
            raise InvalidArgument(
                f"binding-keys must list between 1 and {limits.super_stream_partitions_max} "
                f"keys, got {len(keys)}"
            )
        for key in keys:
            if not key:
                raise InvalidArgument("binding-keys: a binding key must not be empty")
        seen: set[str] = set()
        for key in keys:
            if key in seen:
                raise InvalidArgument(f"binding-keys: {key!r} is given twice")
            seen.add(key)
        default = Routing.KEY
    streams = []
    for key in keys:
        stream = f"{name}-{key}"
        try:
            validate_stream_name(stream)
        except InvalidArgument as error:
            raise InvalidArgument(
                f"binding-keys: key {key!r} makes the partition stream name {stream!r}, which "
                f"is not a valid stream name ({error.message})"
            ) from None
        streams.append(StreamName(stream))
    return SuperStream(StreamName(name), tuple(streams), keys, routing or default, 0)


def unknown(name: str) -> NotFound:
    """The refusal for an address that is neither a stream nor a super stream."""
    return NotFound(
        f"stream or super stream {name!r} does not exist; create it with `spate stream create "
        f"{name}` or `spate superstream create {name} --partitions N`"
    )


def find(topologies: Mapping[StreamName, SuperStream], name: StreamName) -> SuperStream:
    """The topology named `name`; NotFound (`unknown`) when there is none."""
    topology = topologies.get(name)
    if topology is None:
        raise unknown(name)
    return topology


def version_of(topologies: Mapping[StreamName, SuperStream], name: StreamName) -> int | None:
    """The version of `name`'s topology (None: not known)."""
    topology = topologies.get(name)
    return None if topology is None else topology.version


def owner_of(
    topologies: Mapping[StreamName, SuperStream], stream: StreamName
) -> SuperStream | None:
    """The super stream whose partition `stream` is (None: an ordinary stream)."""
    for topology in topologies.values():
        if stream in topology.partitions:
            return topology
    return None


def routing_key(group_key: object | None, message_id: object | None) -> str:
    """The routing key of a message from its `event-streams-group-key` annotation and its
    `message-id` property (None when absent), as the module docstring's table says."""
    if group_key is not None:
        return _key_text(group_key, f"the '{GROUP_KEY_ANNOTATION}' message annotation")
    if message_id is not None:
        return _key_text(message_id, "the message-id property")
    raise InvalidArgument(
        f"the message has no routing key: set the '{GROUP_KEY_ANNOTATION}' message annotation "
        "(a string) or the message-id property"
    )


def _key_text(value: object, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise InvalidArgument(f"{where} must be a string, not a boolean")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(f"{where} is binary that is not UTF-8") from None
    raise InvalidArgument(
        f"{where} must be a string (or an integer, uuid or UTF-8 binary), not "
        f"{type(value).__name__}"
    )
