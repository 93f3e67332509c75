"""Every refusal is an AMQP error condition with a readable description (proton and rhea), and a
misbehaving client never affects another connection."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
from proton import Condition, Message, symbol, ulong
from proton.utils import LinkDetached
from spate.core import limits
from support.amqp_clients import (
    RawExchange,
    RunningGateway,
    blocking,
    offset_filter,
    partition_option,
    receive,
    run_rhea,
    unique,
)
from support.memory_broker import MemoryBroker, RemoteLeader


def attach_error(
    gateway: RunningGateway, address: str | None, *, sender: bool = False, **kwargs: Any
) -> Condition:
    with blocking(gateway) as conn:
        with pytest.raises(LinkDetached) as refused:
            if sender:
                conn.create_sender(address, name=unique("tx"), **kwargs)
            else:
                conn.create_receiver(address, name=unique("rx"), **kwargs)
        condition: Condition = refused.value.link.remote_condition
        # the connection survives a refused link
        assert conn.conn.state & conn.conn.REMOTE_ACTIVE
        return condition


@pytest.mark.parametrize("sender", [False, True])
def test_unknown_stream_is_not_found(gateway: RunningGateway, sender: bool) -> None:
    condition = attach_error(gateway, "no-such-stream", sender=sender)
    assert condition.name == "amqp:not-found"
    assert "no-such-stream" in condition.description


@pytest.mark.parametrize("partition", ["7", "x"])
def test_invalid_partition_is_not_found(
    gateway: RunningGateway, make_stream: Callable[..., str], partition: str
) -> None:
    """000 §4.1/§4.3: a request for a partition that does not exist is attached and detached."""
    stream = make_stream(partitions=2)
    for sender in (False, True):
        condition = attach_error(
            gateway, stream, sender=sender, options=partition_option(partition)
        )
        assert condition.name == "amqp:not-found"
        assert "'0'..'1'" in condition.description


@pytest.mark.parametrize(
    "value,descriptor",
    [
        ("bogus", ulong(0x200)),
        ({symbol("event-streams-offset"): symbol("not-an-offset")}, ulong(0x200)),
        ({symbol("colour"): "red"}, symbol("amqp:event-streams-delivery-annotations-filter")),
        ("d.event-streams-offset < ", ulong(0x201)),
        ("SELECT *", symbol("amqp:event-streams-sql-filter")),
    ],
)
def test_unparsable_filter_is_invalid_field(
    gateway: RunningGateway, make_stream: Callable[..., str], value: Any, descriptor: Any
) -> None:
    stream = make_stream()
    condition = attach_error(gateway, stream, options=offset_filter(value, descriptor=descriptor))
    assert condition.name == "amqp:invalid-field"
    assert "accepted:" in condition.description  # says which forms are accepted


@pytest.mark.parametrize("suffix", ["$foo", "/$bar", "/sub"])
def test_unknown_special_nodes_are_not_found(
    gateway: RunningGateway, make_stream: Callable[..., str], suffix: str
) -> None:
    address = suffix if suffix.startswith("$") else make_stream() + suffix
    assert attach_error(gateway, address).name == "amqp:not-found"


def test_target_without_address_is_invalid_field(gateway: RunningGateway) -> None:
    condition = attach_error(gateway, None, sender=True)
    assert condition.name == "amqp:invalid-field"
    assert "no address" in condition.description


def test_sending_to_info_is_refused(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    condition = attach_error(gateway, make_stream() + "/$info", sender=True)
    assert condition.name == "amqp:invalid-field"
    assert "$info" in condition.description


def test_dynamic_nodes_are_not_implemented(gateway: RunningGateway) -> None:
    assert attach_error(gateway, None, dynamic=True).name == "amqp:not-implemented"


@pytest.mark.memory_broker_only
def test_not_leader_redirects(
    gateway: RunningGateway, broker: MemoryBroker, make_stream: Callable[..., str], loop_thread: Any
) -> None:
    """AMQP 1.0 §2.8.18 via 000 §4: attach + detach(amqp:link:redirect) with the leader's
    address in the info map. (Uses the in-memory broker's `set_remote`.)"""
    stream = make_stream(partitions=2)
    loop_thread.run(lambda: broker.set_remote(stream, 1, RemoteLeader("n2", "127.0.0.2", 5999)))
    condition = attach_error(gateway, stream, options=partition_option("1"))
    assert condition.name == "amqp:link:redirect"
    assert condition.info == {
        symbol("hostname"): "127.0.0.2",  # the advertised host (open.hostname, SNI), not "n2"
        symbol("network-host"): "127.0.0.2",
        symbol("port"): 5999,
        symbol("address"): stream,
    }
    # an agnostic link cannot be redirected to one partition: a retryable refusal instead
    agnostic = attach_error(gateway, stream)
    assert agnostic.name == "amqp:resource-locked"
    assert "event-streams-partition" in agnostic.description
    report = run_rhea(
        gateway,
        [
            {
                "op": "attach",
                "address": stream,
                "role": "receiver",
                "properties": {"event-streams-partition": "1"},
            }
        ],
    )
    error = report["steps"][0]["error"]
    assert error["condition"] == "amqp:link:redirect"
    assert error["info"]["network-host"] == "127.0.0.2" and error["info"]["port"] == 5999


def test_oversize_message_is_rejected_and_the_link_stays_usable(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """limits.message_bytes_max: rejected with amqp:link:message-size-exceeded."""
    stream = make_stream()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        big = Message(body=b"x" * (limits.message_bytes_max + 1000))
        delivery = sender.link.send(big)
        conn.wait(lambda: delivery.settled, timeout=10)
        assert delivery.remote_state == delivery.REJECTED
        assert delivery.remote.condition.name == "amqp:link:message-size-exceeded"
        assert sender.send(Message(body="small")).remote_state == delivery.ACCEPTED
        receiver = conn.create_receiver(stream, name=unique("rx"), options=offset_filter("first"))
        assert [m.body for m in receive(receiver, 1)] == ["small"]


def test_malformed_message_bytes_are_rejected_with_decode_error(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    stream = make_stream()
    good = Message(body="ok").encode()
    exchange = RawExchange(
        gateway.url, stream, [b"\x00\x53\x77\xa1\xff", b"garbage", good], expect=1
    ).run()
    conditions = [c.name if c else None for _, c in exchange.outcomes]
    assert conditions == ["amqp:decode-error", "amqp:decode-error", None]
    assert len(exchange.received) == 1


def _garbage_session(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_garbage_bytes_close_only_that_connection(
    gateway: RunningGateway, make_stream: Callable[..., str]
) -> None:
    """Garbage before the protocol header: our SASL header, then close. Garbage frames after
    it: close with a framing error. A concurrent well-behaved client carries on."""
    stream = make_stream()
    with blocking(gateway) as conn:
        sender = conn.create_sender(stream, name=unique("tx"))
        receiver = conn.create_receiver(stream, name=unique("rx"), credit=10)
        sender.send(Message(body="before"))
        assert _garbage_session(gateway.port, b"GET / HTTP/1.1\r\n\r\n") == b"AMQP\x03\x01\x00\x00"
        reply = _garbage_session(gateway.port, b"AMQP\x00\x01\x00\x00" + b"\xff" * 64)
        assert b"amqp:connection:framing-error" in reply
        with blocking(gateway) as other:  # an oversize producer on another connection
            big = other.create_sender(stream, name=unique("tx")).link.send(
                Message(body=b"x" * (limits.message_bytes_max + 1))
            )
            other.wait(lambda: big.settled, timeout=10)
            assert big.remote.condition.name == "amqp:link:message-size-exceeded"
        sender.send(Message(body="after"))
        assert [m.body for m in receive(receiver, 2)] == ["before", "after"]


def test_rhea_sees_refusals(gateway: RunningGateway, make_stream: Callable[..., str]) -> None:
    stream = make_stream()
    report = run_rhea(
        gateway,
        [
            {"op": "attach", "address": "missing", "role": "receiver"},
            {
                "op": "attach",
                "address": stream,
                "role": "receiver",
                "filter": {"f": {"descriptor": 0x200, "type": "string", "value": "bogus"}},
            },
            {"op": "attach", "address": stream + "/$info", "role": "sender"},
            {"op": "publish", "address": stream, "bodies": ["still works"]},
        ],
    )
    steps = report["steps"]
    assert steps[0]["error"]["condition"] == "amqp:not-found"
    assert steps[1]["error"]["condition"] == "amqp:invalid-field"
    assert "accepted:" in steps[1]["error"]["description"]
    assert steps[2]["error"]["condition"] == "amqp:invalid-field"
    assert steps[3]["outcomes"] == ["accepted"]
