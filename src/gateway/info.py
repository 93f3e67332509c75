"""`<stream>/$info`: the runtime-information message of 000 §6, encoded without proton.

The message is one `amqp-value` section holding a map (string keys):

    stream: str            partition-count: long            node: str (who answered)
    partitions: list of maps, one per partition, in partition order:
        partition: symbol            earliest-offset: symbol | null   latest-offset: symbol | null
        end-offset: symbol | null    first-timestamp: timestamp | null
        last-timestamp: timestamp | null    messages: long    bytes: long
        leader: str | null           available: bool (false: served by another node; then
                                     only partition, leader and available are meaningful)

A super stream's `$info` (ADR 0014) names its partition streams instead, each a stream with its
own `$info`:

    super-stream: str        partition-count: long      node: str     routing: "hash" | "key"
    partition-streams: list of str, in partition order
    binding-keys: list of str (binding-keys[i] binds partition-streams[i])
"""

from __future__ import annotations

from typing import Any

from spate.core.backend import Broker
from spate.core.errors import BrokerError, NotFound, NotLeader, Unavailable
from spate.core.ids import Offset, PartitionId, StreamName, offset_to_symbol
from spate.gateway import codec
from spate.gateway.links import partition_symbol

INTERVAL_S = 1.0
"""Spacing between $info messages when a consumer grants more than one credit (000 §6)."""
_AMQP_VALUE = b"\x00\x53\x77"


def _offset(value: int | None) -> codec.Symbol | None:
    return None if value is None else codec.Symbol(offset_to_symbol(Offset(value)))


def _ts(value: int | None) -> codec.Timestamp | None:
    return None if value is None else codec.Timestamp(value)


async def runtime_information(broker: Broker, stream: StreamName, node: str) -> dict[str, Any]:
    try:
        config = await broker.lookup(stream)
    except NotFound as unknown:
        try:
            topology = await broker.super_stream(stream)
        except BrokerError:
            raise unknown from None
        return {
            "super-stream": stream,
            "partition-count": len(topology.partitions),
            "node": node,
            "routing": topology.routing.value,
            "partition-streams": [str(p) for p in topology.partitions],
            "binding-keys": list(topology.binding_keys),
        }
    partitions: list[dict[str, Any]] = []
    for p in range(config.partitions):
        pid = PartitionId(p)
        entry: dict[str, Any] = {"partition": codec.Symbol(partition_symbol(pid))}
        try:
            partition = broker.partition(stream, pid, write=False)
            try:
                info = await partition.describe()
            finally:
                partition.detach()
        except (NotLeader, Unavailable) as err:
            entry |= {
                "earliest-offset": None,
                "latest-offset": None,
                "available": False,
                "leader": err.leader_node if isinstance(err, NotLeader) else None,
            }
            partitions.append(entry)
            continue
        entry |= {
            "earliest-offset": _offset(info.first_offset),
            "latest-offset": _offset(info.last_offset),
            "end-offset": _offset(info.end_offset),
            "first-timestamp": _ts(info.first_timestamp_ms),
            "last-timestamp": _ts(info.last_timestamp_ms),
            "messages": info.messages,
            "bytes": info.bytes,
            "leader": info.leader,
            "leader-epoch": info.leader_epoch,
            "available": True,
        }
        partitions.append(entry)
    return {
        "stream": stream,
        "partition-count": config.partitions,
        "node": node,
        "partitions": partitions,
    }


def encode_info_message(info: dict[str, Any]) -> bytes:
    return _AMQP_VALUE + codec.encode(info)
