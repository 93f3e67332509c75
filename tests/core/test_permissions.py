"""Users' permissions and the users file's layout (spate.core.permissions), and the admin API's
method table (spate.cluster.admin.auth), without processes."""

from __future__ import annotations

import pytest
from spate.api.v1 import admin_pb2 as pb
from spate.cluster.admin.auth import RULES, AdminAuth, _peer_is_loopback
from spate.core.errors import InvalidArgument, Unauthenticated, Unauthorized
from spate.core.permissions import ANONYMOUS, FULL, NONE, Grants, Permission, UserStore, token_hash


def test_patterns_match_the_whole_name() -> None:
    grants = Grants.of(configure="", write="^orders$", read="orders|audit-.*")
    assert grants.allows(Permission.WRITE, "orders")
    assert not grants.allows(Permission.WRITE, "orders2")
    assert grants.allows(Permission.READ, "audit-eu") and not grants.allows(
        Permission.READ, "xorders"
    )
    assert not grants.allows(Permission.CONFIGURE, "") and not grants.allows(
        Permission.CONFIGURE, "x"
    )
    with pytest.raises(Unauthorized, match=r"user 'u' has no write permission on stream 'logs'"):
        grants.check("u", Permission.WRITE, "logs")


def test_the_users_file_old_and_new_layouts() -> None:
    store = UserStore.parse(
        {
            "users": {
                "old": "scrypt$1$1$1$a$b",
                "new": {
                    "password": "scrypt$1$1$1$a$b",
                    "write": "^o$",
                    "token_sha256": token_hash("t"),
                },
                "anonymous": {"read": "^public$"},
            }
        },
        "users.json",
    )
    assert store.grants_of("old") == FULL
    assert store.grants_of("new").allows(Permission.WRITE, "o")
    assert not store.grants_of("new").allows(Permission.READ, "o")  # left out: nothing
    assert store.grants_of("stranger") == NONE
    assert store.grants_of(ANONYMOUS).allows(Permission.READ, "public")
    assert store.user_of_token("t") == "new" and store.user_of_token("u") is None
    assert set(store.passwords) == {"old", "new"}
    assert UserStore.parse({"users": {}}, "f").grants_of(ANONYMOUS) == FULL


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"password": "plain"}, "password must be a scrypt hash"),
        ({"read": "("}, "read pattern '(' is not a regular expression"),
        ({"write": 3}, "write must be a regular expression string"),
        ({"token_sha256": "abc"}, "token_sha256 must be 64 lowercase hex digits"),
        ({"reed": ".*"}, "unknown field(s) reed"),
        (7, "must be a password hash or an object"),
    ],
)
def test_users_file_errors_name_the_user_and_field(entry: object, message: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        UserStore.parse({"users": {"bob": entry}}, "users.json")
    assert message in error.value.message and "users.json" in error.value.message


def test_loopback_peers() -> None:
    assert _peer_is_loopback("ipv4:127.0.0.1:5000")
    assert _peer_is_loopback("ipv6:[::1]:5000")
    assert not _peer_is_loopback("ipv4:10.0.0.2:5000")
    assert not _peer_is_loopback("ipv6:[fd00::2]:5000")


def test_admin_identity_and_rules() -> None:
    store = UserStore.parse(
        {"users": {"ops": {"token_sha256": token_hash("tok"), "read": "^orders$"}}}, "f"
    )
    auth = AdminAuth(store, require_token=False, allow_remote_anonymous=False)
    bearer = (("authorization", "Bearer tok"),)
    assert auth.identify(bearer, "ipv4:10.0.0.9:1") == "ops"
    assert auth.identify((), "ipv4:127.0.0.1:1") == ANONYMOUS
    with pytest.raises(Unauthenticated, match="loopback only"):
        auth.identify((), "ipv4:10.0.0.9:1")
    with pytest.raises(Unauthenticated, match="unknown admin token"):
        auth.identify((("authorization", "Bearer nope"),), "ipv4:127.0.0.1:1")
    with pytest.raises(Unauthenticated, match="Bearer"):
        auth.identify((("authorization", "Basic xyz"),), "ipv4:127.0.0.1:1")
    auth.authorize("DescribeStream", pb.DescribeStreamRequest(name="orders"), "ops")
    auth.authorize("ListStreams", pb.ListStreamsRequest(), "ops")
    with pytest.raises(Unauthorized, match="configure permission on stream 'orders'"):
        auth.authorize("DeleteStream", pb.DeleteStreamRequest(name="orders"), "ops")
    with pytest.raises(Unauthorized, match=r"configure permission on stream '\$cluster'"):
        auth.authorize("MovePartition", object(), "ops")  # a method not in the table
    strict = AdminAuth(store, require_token=True)
    with pytest.raises(Unauthenticated, match="needs a token"):
        strict.identify((), "ipv4:127.0.0.1:1")


def test_every_rule_names_a_method_and_its_stream_field() -> None:
    """Methods without a rule (cluster operations) need configure on $cluster: safe by default;
    a rule must name a real method and a real field of its request."""
    service = pb.DESCRIPTOR.services_by_name["Admin"]
    methods = {m.name: m for m in service.methods}
    for name, rule in RULES.items():
        assert name in methods, f"RULES names {name}, which the Admin service does not have"
        if rule is not None:
            request = getattr(pb, methods[name].input_type.name)()
            for part in rule[1].split("."):
                request = getattr(request, part)  # AttributeError: the field does not exist
