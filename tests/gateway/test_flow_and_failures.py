"""Credit flow with volume, and failed appends (rejected, never accepted)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from proton import Message
from spate.core import limits
from spate.core.errors import StorageFailure, Unavailable
from spate.core.ids import Offset, offset_to_symbol
from support.amqp_clients import RunningGateway, blocking, run_rhea, unique
from support.memory_broker import MemoryBroker


def test_volume_beyond_credit_windows(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """More messages than limits.link_credit_max and consumer_send_batch_max: credit is topped
    up, every message is accepted and consumed once, in order."""
    count = 3 * limits.link_credit_max
    stream = make_stream()
    report = run_rhea(
        gateway,
        [
            {"op": "publish", "address": stream, "bodies": {"prefix": "v", "count": count}},
            {
                "op": "consume",
                "address": stream,
                "count": count,
                "filter": {"f": {"descriptor": 0x200, "type": "string", "value": "first"}},
            },
        ],
        timeout_s=60,
    )
    published, consumed = report["steps"]
    assert published["outcomes"] == ["accepted"] * count
    assert [m["body"] for m in consumed["messages"]] == [f"v{i}" for i in range(count)]
    assert consumed["messages"][-1]["offset"] == offset_to_symbol(Offset(count - 1))


@pytest.mark.memory_broker_only
def test_failed_append_is_rejected_never_accepted(
    gateway: RunningGateway, broker: MemoryBroker, loop_thread: Any, make_stream: Callable[..., str]
) -> None:
    """Partition.append failing (StorageFailure, Unavailable) rejects the deliveries with the
    mapped condition; later appends succeed. (Failure injection of the in-memory broker.)"""
    stream = make_stream()
    loop_thread.run(
        lambda: broker.fail_appends(
            stream, 0, StorageFailure("disk full"), Unavailable("no quorum")
        )
    )
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        conditions = []
        for body in ("a", "b", "c"):
            delivery = sender.link.send(Message(body=body))
            conn.wait(lambda d=delivery: d.settled, timeout=10)
            condition = delivery.remote.condition
            conditions.append(
                (
                    delivery.remote_state,
                    condition.name if condition else None,
                    condition.description if condition else None,
                )
            )
    assert conditions == [
        (37, "amqp:internal-error", "disk full"),
        (37, "amqp:resource-locked", "no quorum"),
        (36, None, None),
    ]
