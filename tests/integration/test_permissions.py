"""Users x permissions x operations on real processes (issue 14, ADR 0023).

One node (`spate node run` with a users file, anonymous off, admin tokens required) and a proxy
gateway (`spate gateway run` with the same users file and an admin token of its own). Every
user publishes, consumes and administers, over AMQP through the gateway and the node, and over
the node's admin gRPC API; each refusal must carry its condition or status and name the missing
permission.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from proton import Message
from proton.utils import BlockingConnection, LinkDetached
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc as pb_grpc
from spate.core.permissions import token_hash
from spate.gateway.auth import hash_password
from support.ports import port_picker

pytestmark = pytest.mark.slow

STREAM = "orders"
OTHER = "audit"


@dataclass(frozen=True)
class User:
    name: str
    configure: str
    write: str
    read: str

    @property
    def password(self) -> str:
        return f"{self.name}-password"

    @property
    def token(self) -> str:
        return f"{self.name}-token-0123456789abcdef0123456789abcdef"


USERS = (
    User("admin", ".*", ".*", ".*"),
    User("producer", "", "^orders$", ""),
    User("consumer", "", "", "^orders$"),
    User("owner", "^orders$", "^orders$", "^orders$"),
    User("nobody", "", "", ""),
)


@dataclass
class Rig:
    node_amqp: str
    gateway_amqp: str
    admin: str
    users_file: Path
    pids: tuple[int, ...]  # the node's and the gateway's


def _wait_file(path: Path, proc: subprocess.Popen[bytes], log: Path) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    time.sleep(0.1)
    endpoints: dict[str, str] = json.loads(path.read_text())
    return endpoints


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    root = tmp_path_factory.mktemp("permissions")
    users = {
        u.name: {
            "password": hash_password(u.password, n=2**10),
            "token_sha256": token_hash(u.token),
            "configure": u.configure,
            "write": u.write,
            "read": u.read,
        }
        for u in USERS
    }
    users["gateway"] = {"token_sha256": token_hash("gateway-token"), "read": ".*"}
    users_file = root / "users.json"
    users_file.write_text(json.dumps({"users": users}))
    ports = port_picker()
    config = root / "node.toml"
    config.write_text(
        f"""[node]
node_id = "n1"
data_dir = "{root / "n1"}"
amqp_port = 0
admin_port = 0
metadata_port = {ports()}
replication_port = 0
metrics_port = 0
users_file = "{users_file}"
allow_anonymous = false
admin_require_token = true
admin_token = "{USERS[0].token}"
"""
    )
    env = dict(os.environ, SPATE_METADATA_PASSWORD="permissions-test-secret")
    cli = [sys.executable, "-m", "spate.cli.main"]
    node_log = root / "node.log"
    with open(node_log, "wb") as out:
        node = subprocess.Popen(
            [*cli, "node", "run", "--config", str(config)], env=env, stdout=out, stderr=out
        )
    gateway = None
    try:
        endpoints = _wait_file(root / "n1" / "node.json", node, node_log)
        admin = endpoints["admin"]
        for name in (STREAM, OTHER):
            request = pb.CreateStreamRequest(stream=pb.StreamConfig(name=name))
            _admin_call(USERS[0], "CreateStream", request, admin)
        gateway_log = root / "gateway.log"
        with open(gateway_log, "wb") as out:
            gateway = subprocess.Popen(
                [
                    *cli,
                    "gateway",
                    "run",
                    "--admin",
                    admin,
                    "--data-dir",
                    str(root / "g1"),
                    "--port",
                    "0",
                    "--users-file",
                    str(users_file),
                    "--no-anonymous",
                ],
                env=dict(env, SPATE_ADMIN_TOKEN="gateway-token"),
                stdout=out,
                stderr=out,
            )
        gateway_endpoints = _wait_file(root / "g1" / "gateway.json", gateway, gateway_log)
        yield Rig(
            endpoints["amqp"],
            gateway_endpoints["amqp"],
            admin,
            users_file,
            (node.pid, gateway.pid),
        )
    finally:
        if gateway is not None:
            _stop(gateway)
        _stop(node)


def _admin_call(user: User | None, method: str, request: object, address: str) -> object:
    metadata = (("authorization", f"Bearer {user.token}"),) if user is not None else None
    with grpc.insecure_channel(address) as channel:
        return getattr(pb_grpc.AdminStub(channel), method)(request, timeout=10, metadata=metadata)


def _allowed(user: User, permission: str, stream: str) -> bool:
    pattern = getattr(user, permission)
    return bool(pattern) and re.fullmatch(pattern, stream) is not None


def _publish(address: str, user: User, stream: str) -> None:
    connection = BlockingConnection(
        f"amqp://{address}",
        user=user.name,
        password=user.password,
        allowed_mechs="PLAIN",
        timeout=10,
    )
    try:
        sender = connection.create_sender(stream)
        assert sender.send(Message(body=f"from {user.name}")).remote_state == 36  # accepted
    finally:
        connection.close()


def _consume(address: str, user: User, stream: str) -> None:
    connection = BlockingConnection(
        f"amqp://{address}",
        user=user.name,
        password=user.password,
        allowed_mechs="PLAIN",
        timeout=10,
    )
    try:
        connection.create_receiver(stream)
    finally:
        connection.close()


@pytest.mark.parametrize("via", ["gateway", "node"])
@pytest.mark.parametrize("user", USERS, ids=[u.name for u in USERS])
@pytest.mark.parametrize(
    ("operation", "permission"),
    [(_publish, "write"), (_consume, "read")],
    ids=["publish", "consume"],
)
def test_amqp_publish_and_consume(
    rig: Rig, via: str, user: User, operation: object, permission: str
) -> None:
    address = rig.gateway_amqp if via == "gateway" else rig.node_amqp
    assert callable(operation)
    for stream in (STREAM, OTHER):
        if _allowed(user, permission, stream):
            operation(address, user, stream)
            continue
        with pytest.raises(LinkDetached) as refused:
            operation(address, user, stream)
        text = str(refused.value)
        assert "amqp:unauthorized-access" in text, text
        assert f"no {permission} permission on stream '{stream}'" in text, text
        assert f"user '{user.name}'" in text, text


ADMIN_OPERATIONS = [
    # (method, request for a stream, permission; None: any authenticated user)
    ("DescribeStream", lambda s: pb.DescribeStreamRequest(name=s), "read"),
    ("ListPartitions", lambda s: pb.ListPartitionsRequest(stream=s), "read"),
    ("ListConsumers", lambda s: pb.ListConsumersRequest(stream=s), "read"),
    (
        "CreateConsumerGroup",
        lambda s: pb.CreateConsumerGroupRequest(stream=s, name="g"),
        "configure",
    ),
    ("ListStreams", lambda s: pb.ListStreamsRequest(), None),
    ("ClusterStatus", lambda s: pb.ClusterStatusRequest(), None),
]


@pytest.mark.parametrize("user", USERS, ids=[u.name for u in USERS])
@pytest.mark.parametrize(
    ("method", "request_of", "permission"),
    ADMIN_OPERATIONS,
    ids=[m for m, _, _ in ADMIN_OPERATIONS],
)
def test_admin_grpc(
    rig: Rig, user: User, method: str, request_of: object, permission: str | None
) -> None:
    assert callable(request_of)
    for stream in (STREAM, OTHER):
        if permission is None or _allowed(user, permission, stream):
            try:
                _admin_call(user, method, request_of(stream), rig.admin)
            except grpc.RpcError as error:  # allowed: only an ALREADY_EXISTS (group made before)
                assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error
            continue
        with pytest.raises(grpc.RpcError) as refused:
            _admin_call(user, method, request_of(stream), rig.admin)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
        assert f"no {permission} permission on stream '{stream}'" in refused.value.details()
        trailing = dict(refused.value.trailing_metadata() or ())
        assert trailing.get("spate-error-code") == "unauthorized"


def test_admin_grpc_without_or_with_a_bad_token_is_unauthenticated(rig: Rig) -> None:
    stranger = User("stranger", "", "", "")
    for user in (None, stranger):
        with pytest.raises(grpc.RpcError) as refused:
            _admin_call(user, "ListStreams", pb.ListStreamsRequest(), rig.admin)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
    # health checking stays open
    with grpc.insecure_channel(rig.admin) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_cli_sends_the_token_from_the_environment(rig: Rig) -> None:
    cli = [sys.executable, "-m", "spate.cli.main", "stream", "list", "--admin", rig.admin]
    denied = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=False)
    assert denied.returncode != 0 and "needs a token" in denied.stderr, denied.stderr
    env = dict(os.environ, SPATE_ADMIN_TOKEN=USERS[0].token)
    listed = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert listed.returncode == 0 and STREAM in listed.stdout, listed.stderr


def test_sighup_reloads_the_users_file_and_keeps_it_when_the_new_one_is_broken(rig: Rig) -> None:
    """Online change of users and permissions (SIGHUP to the node and the gateway): a user
    added to the file publishes and administers at once; a file that does not parse is refused
    and the users in force stay; the original file is back at the end."""
    late = User("late", ".*", "^orders$", "")
    original = rig.users_file.read_text()
    document = json.loads(original)
    document["users"]["late"] = {
        "password": hash_password(late.password, n=2**10),
        "token_sha256": token_hash(late.token),
        "configure": late.configure,
        "write": late.write,
        "read": late.read,
    }

    def hup() -> None:
        for pid in rig.pids:
            os.kill(pid, signal.SIGHUP)

    def eventually(check: object) -> None:
        assert callable(check)
        deadline = time.monotonic() + 20
        while True:
            try:
                check()
                return
            except Exception as error:  # not reloaded yet (RpcError, LinkDetached, ...)
                assert time.monotonic() < deadline, error
                time.sleep(0.2)

    try:
        with pytest.raises(grpc.RpcError):  # not a user yet
            _admin_call(late, "ListStreams", pb.ListStreamsRequest(), rig.admin)
        rig.users_file.write_text(json.dumps(document))
        hup()
        eventually(lambda: _admin_call(late, "ListStreams", pb.ListStreamsRequest(), rig.admin))
        eventually(lambda: _publish(rig.node_amqp, late, STREAM))
        eventually(lambda: _publish(rig.gateway_amqp, late, STREAM))
        with pytest.raises(Exception):  # noqa: B017 - refused: read is not granted
            _consume(rig.node_amqp, late, STREAM)
        rig.users_file.write_text("{not json")
        hup()
        time.sleep(1)  # the handlers log the refusal and keep the users in force
        _admin_call(late, "ListStreams", pb.ListStreamsRequest(), rig.admin)
        _publish(rig.node_amqp, late, STREAM)
    finally:
        rig.users_file.write_text(original)
        hup()
    eventually(lambda: _expect_unauthenticated(late, rig.admin))


def _expect_unauthenticated(user: User, admin: str) -> None:
    try:
        _admin_call(user, "ListStreams", pb.ListStreamsRequest(), admin)
    except grpc.RpcError as refused:
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED, refused
    else:
        raise AssertionError(f"{user.name} is still accepted")


def test_an_operation_calls_the_nodes_admin_api_with_the_nodes_token(rig: Rig) -> None:
    """A cluster operation calls the nodes' admin APIs (here the node's own: GetLocalReplica)
    with the node's `admin_token` (ADR 0025); with tokens required it would fail
    UNAUTHENTICATED without one (tests/cluster/test_admin_server.py shows the refusal)."""
    started = _admin_call(
        USERS[0], "TransferLeader", pb.TransferLeaderRequest(stream=STREAM, to_node="n1"), rig.admin
    )
    assert isinstance(started, pb.Operation)
    deadline = time.monotonic() + 30
    while True:
        found = _admin_call(
            USERS[0], "GetOperation", pb.GetOperationRequest(id=started.id), rig.admin
        )
        assert isinstance(found, pb.Operation)
        if found.state != "running":
            break
        assert time.monotonic() < deadline, found
        time.sleep(0.1)
    assert found.state == "succeeded", found
