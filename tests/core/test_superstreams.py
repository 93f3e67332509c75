"""spate.core.superstreams: the topology, hash and key routing, the routing-key contract."""

from __future__ import annotations

import uuid

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st
from spate.core.errors import InvalidArgument, NotFound
from spate.core.superstreams import (
    HASH_SEED,
    Routing,
    define,
    hash_partition,
    routing_key,
)

# rabbitmq-stream-go-client, pkg/stream/super_stream_producer_test.go ("Partitioning using
# Murmur3", commit 541aa9d967a107391ea641508c02e4b330ea3e59): partitions invoices-01..03; "the
# table is the same for .NET, Python, Java stream clients". Here as 0-based partition indexes.
RABBITMQ_TABLE = {
    "hello2": 0,
    "hello1": 1,
    "hello3": 1,
    "hello4": 2,
    "hello5": 0,
    "hello6": 2,
    "hello7": 0,
    "hello8": 1,
    "hello9": 0,
    "hello10": 2,
    "hello88": 1,
}


@pytest.mark.parametrize(("key", "partition"), sorted(RABBITMQ_TABLE.items()))
def test_hash_routing_matches_rabbitmq_clients(key: str, partition: int) -> None:
    assert hash_partition(key, 3) == partition
    assert define("invoices", partitions=3).route(key) == partition


def test_the_signed_hash_would_not_match() -> None:
    """Why unsigned: the signed 32-bit value modulo 3 puts 3 of the 11 keys elsewhere."""
    wrong = [k for k, p in RABBITMQ_TABLE.items() if mmh3.hash(k.encode(), HASH_SEED) % 3 != p]
    assert sorted(wrong) == ["hello10", "hello2", "hello6"]


@given(st.text(max_size=64), st.integers(min_value=1, max_value=256))
def test_hash_routing_is_in_range_and_stable(key: str, partitions: int) -> None:
    index = hash_partition(key, partitions)
    assert 0 <= index < partitions
    assert index == hash_partition(key, partitions)
    expected = mmh3.hash(key.encode("utf-8"), HASH_SEED, signed=False) % partitions
    assert index == expected


def test_define_by_partition_count() -> None:
    topology = define("invoices", partitions=3)
    assert topology.partitions == ("invoices-0", "invoices-1", "invoices-2")
    assert topology.binding_keys == ("0", "1", "2")
    assert topology.routing is Routing.HASH
    assert topology.version == 0


def test_define_by_binding_keys_routes_by_key() -> None:
    topology = define("invoices", binding_keys=("amer", "emea", "apac"))
    assert topology.partitions == ("invoices-amer", "invoices-emea", "invoices-apac")
    assert topology.routing is Routing.KEY
    assert [topology.route(k) for k in ("amer", "emea", "apac")] == [0, 1, 2]
    with pytest.raises(NotFound, match=r"'invoices' has no binding key 'asia'.*amer, emea, apac"):
        topology.route("asia")


def test_routing_can_be_chosen() -> None:
    assert define("s", partitions=2, routing=Routing.KEY).route("1") == 1
    hashed = define("s", binding_keys=("a", "b", "c"), routing=Routing.HASH)
    assert hashed.route("hello4") == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of partitions"),
        ({"partitions": 2, "binding_keys": ("a",)}, "exactly one of partitions"),
        ({"partitions": 0}, "partitions must be between 1 and 256, got 0"),
        ({"partitions": 257}, "partitions must be between 1 and 256"),
        ({"binding_keys": ()}, "binding-keys must list between 1 and 256 keys, got 0"),
        ({"binding_keys": ("a", "")}, "binding-keys: a binding key must not be empty"),
        ({"binding_keys": ("a", "b", "a")}, "binding-keys: 'a' is given twice"),
        ({"binding_keys": ("a b",)}, "binding-keys: key 'a b' makes the partition stream name"),
    ],
)
def test_define_refuses_bad_arguments_naming_the_field(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        define("invoices", **kwargs)  # type: ignore[arg-type]


def test_define_refuses_a_bad_name() -> None:
    with pytest.raises(InvalidArgument, match="invalid stream name"):
        define("in voices", partitions=1)
    with pytest.raises(InvalidArgument, match="not a valid stream name"):
        define("x" * 199, partitions=10)  # "x...x-9" fits, but the name limit is 200 bytes


def test_routing_key_prefers_the_group_key_annotation() -> None:
    assert routing_key("eu", "m-1") == "eu"
    assert routing_key(None, "m-1") == "m-1"
    assert routing_key(None, 42) == "42"
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert routing_key(None, ident) == "12345678-1234-5678-1234-567812345678"
    assert routing_key(None, b"bin") == "bin"


@pytest.mark.parametrize(
    ("group_key", "message_id", "message"),
    [
        (None, None, "no routing key: set the 'event-streams-group-key' message annotation"),
        (True, None, "'event-streams-group-key' message annotation must be a string"),
        (None, b"\xff", "message-id property is binary that is not UTF-8"),
        (None, 1.5, "message-id property must be a string"),
    ],
)
def test_routing_key_refusals(group_key: object, message_id: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        routing_key(group_key, message_id)
