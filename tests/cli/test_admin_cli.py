"""The real `spate` console script against a real host process (metadata voter + admin server).

Every error path must end as `spate: <message>` on stderr with its exit code and no traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.ports import free_port

# One admin host serves the whole module (`admin`, scope="module"): its tests go to one xdist
# worker, so the host starts once and they meet the registry state they would meet serially.
pytestmark = pytest.mark.xdist_group("cli-admin-host")

SPATE = str(Path(sys.executable).with_name("spate"))
HOST_SCRIPT = Path(__file__).with_name("admin_host.py")


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("host")
    proc = subprocess.Popen(
        [sys.executable, str(HOST_SCRIPT), str(data_dir), "--also-register", "n2,n3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the host process exited before serving"
        yield str(json.loads(line)["admin"])
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def spate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("SPATE_ADMIN", "SPATE_DATA_DIR")}
    proc = subprocess.run(
        [SPATE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def ok(*args: str) -> str:
    proc = spate(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--output", "json"))


def fails(code: int, *args: str, env: dict[str, str] | None = None) -> str:
    proc = spate(*args, env=env)
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.startswith("spate: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def test_create_in_both_formats(admin: str) -> None:
    text = ok(
        "stream",
        "create",
        "orders",
        "--partitions",
        "3",
        "--max-age",
        "6h",
        "--max-bytes",
        "10GB",
        "--admin",
        admin,
    )
    assert "Created stream 'orders'." in text
    assert "max-age 6h, max-bytes 10.0GB" in text
    document = ok_json(
        "stream",
        "create",
        "clicks",
        "--replicas",
        "2",
        "--max-messages",
        "1000000",
        "--segment-bytes",
        "64MB",
        "--filter-size-bytes",
        "32",
        "--admin",
        admin,
    )
    assert document == {
        "stream": {
            "name": "clicks",
            "partitions": 1,
            "replicas": 2,
            "retention": {"max_age_ms": None, "max_bytes": None, "max_messages": 1_000_000},
            "segment_bytes": 64_000_000,
            "filter_size_bytes": 32,
        }
    }


def test_list_in_both_formats(admin: str) -> None:
    ok("stream", "create", "list-a", "--partitions", "2", "--max-age", "7d", "--admin", admin)
    ok("stream", "create", "list-b", "--admin", admin)
    streams = {s["name"]: s for s in ok_json("stream", "list", "--admin", admin)["streams"]}
    assert streams["list-a"]["partitions"] == 2
    assert streams["list-a"]["retention"]["max_age_ms"] == 7 * 86_400_000
    assert streams["list-b"]["segment_bytes"] == 64 * 1024 * 1024
    lines = ok("stream", "list", "--admin", admin).splitlines()
    assert lines[0].split() == [
        "NAME",
        "PARTITIONS",
        "REPLICAS",
        "MAX-AGE",
        "MAX-BYTES",
        "MAX-MESSAGES",
        "SEGMENT",
    ]
    row = next(line for line in lines if line.startswith("list-a "))
    # --replicas not given: min(3, registered nodes) = 3
    assert row.split() == ["list-a", "2", "3", "1w", "-", "-", "64MiB"]
    # Aligned columns: the numbers of PARTITIONS end where its header ends.
    end = lines[0].index("PARTITIONS") + len("PARTITIONS")
    assert row[:end].endswith(" 2") and row[end] == " "


def test_describe_in_both_formats(admin: str) -> None:
    ok("stream", "create", "described", "--partitions", "2", "--admin", admin)
    document = ok_json("stream", "describe", "described", "--admin", admin)
    assert document["stream"]["name"] == "described"
    first, second = document["partitions"]
    placement = {
        p["partition"]: p
        for p in ok_json("partition", "list", "described", "--admin", admin)["partitions"]
    }
    assert sorted(first["replicas"]) == ["n1", "n2", "n3"]
    assert first["replicas"] == placement[0]["replicas"]
    assert second["replicas"] == placement[1]["replicas"]
    assert first["leader"] == "n1"  # reported by the host at epoch 1, or its local stats
    assert first["leader_epoch"] in (None, 1)
    assert {k: v for k, v in first.items() if k not in ("replicas", "leader_epoch")} == {
        "partition": 0,
        "available": True,
        "leader": "n1",
        "first_offset": 0,
        "last_offset": 9,
        "end_offset": 10,
        "messages": 10,
        "bytes": 1500,
        "segments": 1,
        "first_timestamp_ms": 1_700_000_000_000,
        "last_timestamp_ms": 1_700_000_001_000,
    }
    assert second["partition"] == 1 and second["available"] is False
    assert second["messages"] is None
    text = ok("stream", "describe", "described", "--admin", admin)
    table = text.split("\n\n")[1].splitlines()
    assert table[0].split() == [
        "PARTITION",
        "REPLICAS",
        "LEADER",
        "EPOCH",
        "FIRST",
        "LAST",
        "END",
        "MESSAGES",
        "SIZE",
        "SEGMENTS",
    ]
    row = table[1].split()
    assert row[:3] == ["0", ",".join(first["replicas"]), "n1"]
    assert row[4:] == ["0", "9", "10", "10", "1.5KB", "1"]
    assert table[2].split()[:2] == ["1", ",".join(second["replicas"])]
    assert table[2].split()[4:] == ["-"] * 6


def test_partition_list_in_both_formats(admin: str) -> None:
    """Three partitions over three nodes: every node is preferred leader once; the host (n1)
    reports itself leader at epoch 1 of the partition it is preferred for."""
    ok("stream", "create", "placed", "--partitions", "3", "--admin", admin)
    for _ in range(100):  # the host reports asynchronously; bounded wait
        partitions = ok_json("partition", "list", "placed", "--admin", admin)["partitions"]
        if any(p["leader"] for p in partitions):
            break
    assert [p["partition"] for p in partitions] == [0, 1, 2]
    assert sorted(p["replicas"][0] for p in partitions) == ["n1", "n2", "n3"]
    assert all(sorted(p["replicas"]) == ["n1", "n2", "n3"] for p in partitions)
    mine = next(p for p in partitions if p["replicas"][0] == "n1")
    assert mine == {
        "stream": "placed",
        "partition": mine["partition"],
        "replicas": mine["replicas"],
        "leader": "n1",
        "leader_epoch": 1,
        "leader_alive": True,
    }
    others = [p for p in partitions if p is not mine]
    assert all(p["leader"] is None and p["leader_epoch"] is None for p in others)
    lines = ok("partition", "list", "placed", "--admin", admin).splitlines()
    assert lines[0].split() == ["STREAM", "PARTITION", "REPLICAS", "LEADER", "EPOCH"]
    row = lines[1 + mine["partition"]].split()
    assert row == ["placed", str(mine["partition"]), ",".join(mine["replicas"]), "n1", "1"]
    ok("stream", "create", "placed-too", "--admin", admin)  # not another test's stream
    every = ok_json("partition", "list", "--admin", admin)["partitions"]
    assert {p["stream"] for p in every} >= {"placed", "placed-too"}
    assert fails(3, "partition", "list", "ghost", "--admin", admin) == (
        "spate: stream 'ghost' does not exist\n"
    )
    assert "invalid stream name" in fails(2, "partition", "list", "bad/name", "--admin", admin)


def test_too_few_nodes_is_refused_with_advice(admin: str) -> None:
    for output in ("table", "json"):
        message = fails(
            2, "stream", "create", "wide", "--replicas", "4", "--admin", admin, "-o", output
        )
        assert message == (
            "spate: stream needs 4 replicas but the cluster has 3 registered nodes: "
            "start more nodes or use --replicas 3\n"
        )


def test_delete_in_both_formats_then_gone(admin: str) -> None:
    ok("stream", "create", "doomed", "--admin", admin)
    ok("stream", "create", "doomed-json", "--admin", admin)
    assert ok("stream", "delete", "doomed", "--admin", admin) == "Deleted stream 'doomed'.\n"
    assert ok_json("stream", "delete", "doomed-json", "--admin", admin) == {
        "deleted": "doomed-json"
    }
    names = [s["name"] for s in ok_json("stream", "list", "--admin", admin)["streams"]]
    assert "doomed" not in names and "doomed-json" not in names
    message = fails(3, "stream", "delete", "doomed", "--admin", admin)
    assert message == "spate: stream 'doomed' does not exist\n"


def test_duplicate_create_is_already_exists(admin: str) -> None:
    ok("stream", "create", "twice", "--admin", admin)
    for output in ("table", "json"):
        message = fails(4, "stream", "create", "twice", "--admin", admin, "--output", output)
        assert message == "spate: stream 'twice' already exists\n"


def test_describe_unknown_is_not_found(admin: str) -> None:
    for output in ("table", "json"):
        message = fails(3, "stream", "describe", "ghost", "--admin", admin, "--output", output)
        assert message == "spate: stream 'ghost' does not exist\n"


def test_invalid_arguments_are_refused_before_any_call(admin: str) -> None:
    message = fails(2, "stream", "create", "x", "--max-age", "6x", "--admin", admin)
    assert message.startswith("spate: --max-age: cannot read duration '6x'")
    message = fails(2, "stream", "create", "x", "--max-bytes", "lots", "--admin", admin)
    assert message.startswith("spate: --max-bytes: cannot read size 'lots'")
    message = fails(2, "stream", "create", "x", "--partitions", "0", "--admin", admin)
    assert "partitions must be between 1 and 1024, got 0" in message
    message = fails(2, "stream", "create", "bad name!", "--admin", admin)
    assert "invalid stream name 'bad name!'" in message
    message = fails(2, "stream", "describe", "bad/name", "--admin", admin)
    assert "invalid stream name" in message
    fails(2, "stream", "create", "--admin", admin)  # NAME missing: argparse, same shape
    fails(2, "stream", "create", "x", "--partitions", "many", "--admin", admin)
    fails(2, "stream", "list", "--admin", "no-port-here")
    fails(2, "stream", "list", "--admin", admin, "--output", "yaml")
    names = [s["name"] for s in ok_json("stream", "list", "--admin", admin)["streams"]]
    assert "x" not in names


def test_unreachable_admin_says_what_to_do() -> None:
    port = free_port()  # a port nothing listens on (this xdist worker's own: none will)
    message = fails(5, "stream", "list", "--admin", f"127.0.0.1:{port}")
    assert message.startswith(f"spate: cannot reach the admin API at 127.0.0.1:{port}")
    assert "spate dev up" in message and "--admin" in message
    fails(5, "cluster", "status", "--admin", f"127.0.0.1:{port}", "--output", "json")


def test_cluster_status_in_both_formats(admin: str) -> None:
    document = ok_json("cluster", "status", "--admin", admin)
    metadata = document["metadata"]
    assert metadata["leader"] == metadata["self_address"] and metadata["is_leader"] is True
    assert metadata["voters"] == [metadata["self_address"]]
    assert metadata["ready"] is True and metadata["has_quorum"] is True
    process = document["processes"][0]
    assert process["node_id"] == "n1" and process["role"] == "node"
    assert process["endpoints"]["admin"] == admin and process["pid"] > 0
    nodes = {n["node_id"]: n for n in document["nodes"]}
    assert sorted(nodes) == ["n1", "n2", "n3"]
    n1 = nodes["n1"]
    assert n1["alive"] is True and n1["heartbeat_age_ms"] >= 0 and n1["heartbeat_ms"] > 0
    assert sorted(n1["endpoints"]) == ["admin", "amqp", "metadata", "replication"]
    assert n1["endpoints"]["admin"] == admin
    assert n1["endpoints"]["metadata"] == metadata["self_address"]
    assert nodes["n2"]["endpoints"]["replication"] == "n2.invalid:7700"
    assert all(
        isinstance(n["partitions_hosted"], int) and isinstance(n["partitions_led"], int)
        for n in nodes.values()
    )
    text = ok("cluster", "status", "--admin", admin)
    assert f"metadata leader  {metadata['leader']}" in text
    assert "quorum           yes" in text
    assert f"admin={admin}" in text
    registered = text.split("\n\n")[-1].splitlines()
    assert registered[0].split() == [
        "REGISTERED",
        "NODE",
        "DOMAIN",
        "METADATA",
        "ALIVE",
        "HOSTS",
        "LEADS",
        "ENDPOINTS",
    ]
    row = next(line for line in registered if line.startswith("n2 "))
    assert row.split()[1:4] == ["n2", "non-voting", "yes"]
    assert "replication=n2.invalid:7700" in row


def test_admin_address_from_environment_and_endpoints_file(admin: str, tmp_path: Path) -> None:
    assert "streams" in json.loads(
        spate("stream", "list", "-o", "json", env={"SPATE_ADMIN": admin}).stdout
    )
    (tmp_path / "endpoints.json").write_text(json.dumps({"admin": admin, "nodes": []}))
    proc = spate("stream", "list", "-o", "json", env={"SPATE_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 0 and "streams" in json.loads(proc.stdout)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "endpoints.json").write_text("{not json")
    message = fails(2, "stream", "list", env={"SPATE_DATA_DIR": str(broken)})
    assert "endpoints.json" in message and "--admin" in message


def test_help_texts() -> None:
    top = ok("--help")
    assert "stream" in top and "cluster" in top and "partition" in top and "exit codes" in top
    assert "min(3, registered nodes)" in ok("stream", "create", "--help").replace("\n", " ")
    partition_list = ok("partition", "list", "--help")
    assert "STREAM" in partition_list and "leader epoch" in partition_list
    create = ok("stream", "create", "--help")
    for option in (
        "--partitions",
        "--replicas",
        "--max-age",
        "--max-bytes",
        "--max-messages",
        "--segment-bytes",
        "--admin",
        "--output",
    ):
        assert option in create
    for command in (
        ("stream", "list"),
        ("stream", "describe"),
        ("stream", "delete"),
        ("cluster", "status"),
        ("partition", "list"),
        ("group", "create"),
        ("group", "list"),
        ("group", "describe"),
        ("group", "delete"),
    ):
        assert "--output" in ok(*command, "--help")
    group_create = ok("group", "create", "--help")
    for option in ("--strategy", "--session-timeout-ms", "--rebalance-delay-ms", "round-robin"):
        assert option in group_create
    assert "'$'" in ok("consumer", "list", "--help")
    assert fails(2, "stream").startswith("spate: the following arguments are required")


def test_superstream_create_list_describe_delete(admin: str) -> None:
    text = ok(
        "superstream", "create", "invoices", "--partitions", "3", "--max-age", "6h",
        "--admin", admin,
    )  # fmt: skip
    assert "Created super stream 'invoices' with 3 partition streams." in text
    assert "invoices-0, invoices-1, invoices-2" in text
    created = ok_json(
        "superstream", "create", "regions", "--binding-keys", "amer,emea,apac",
        "--replicas", "2", "--admin", admin,
    )  # fmt: skip
    version = created["super_stream"]["version"]
    assert version > 0
    assert created == {
        "super_stream": {
            "name": "regions",
            "partitions": ["regions-amer", "regions-emea", "regions-apac"],
            "binding_keys": ["amer", "emea", "apac"],
            "routing": "key",
            "version": version,
        }
    }
    listed = ok_json("superstream", "list", "--admin", admin)["super_streams"]
    assert [t["name"] for t in listed] == ["invoices", "regions"]
    assert listed[0]["routing"] == "hash" and listed[0]["binding_keys"] == ["0", "1", "2"]
    table = ok("superstream", "list", "--admin", admin)
    assert "invoices  hash" in table and "regions-amer,regions-emea,regions-apac" in table
    streams = {s["name"]: s for s in ok_json("stream", "list", "--admin", admin)["streams"]}
    assert streams["invoices-1"]["partitions"] == 1
    assert streams["invoices-1"]["retention"]["max_age_ms"] == 6 * 3_600_000
    assert streams["regions-emea"]["replicas"] == 2

    described = ok_json("superstream", "describe", "regions", "--admin", admin)
    assert described["super_stream"] == created["super_stream"]
    assert described["stream"]["replicas"] == 2
    assert [(p["stream"], p["binding_key"]) for p in described["partitions"]] == [
        ("regions-amer", "amer"),
        ("regions-emea", "emea"),
        ("regions-apac", "apac"),
    ]
    assert all(len(p["replicas"]) == 2 for p in described["partitions"])
    text = ok("superstream", "describe", "invoices", "--admin", admin)
    assert "routing" in text and "PARTITION  STREAM" in text and "invoices-2" in text

    assert ok_json("superstream", "delete", "regions", "--admin", admin) == {"deleted": "regions"}
    names = [s["name"] for s in ok_json("stream", "list", "--admin", admin)["streams"]]
    assert not [n for n in names if n.startswith("regions")]
    assert "invoices-0" in names
    ok("superstream", "delete", "invoices", "--admin", admin)


def test_superstream_misuse_has_clear_errors(admin: str) -> None:
    ok("stream", "create", "ledger", "--admin", admin)
    ok("stream", "create", "bills-1", "--admin", admin)
    message = fails(1, "superstream", "create", "ledger", "--partitions", "2", "--admin", admin)
    assert message.startswith("spate: a stream named 'ledger' exists")
    message = fails(1, "superstream", "create", "bills", "--partitions", "2", "--admin", admin)
    assert "'bills-1', already taken by a stream" in message
    ok("superstream", "create", "bills2", "--partitions", "2", "--admin", admin)
    message = fails(1, "stream", "delete", "bills2-0", "--admin", admin)
    assert "partition of super stream 'bills2'" in message
    message = fails(1, "stream", "create", "bills2", "--admin", admin)
    assert "'bills2' is a super stream" in message
    message = fails(4, "superstream", "create", "bills2", "--partitions", "2", "--admin", admin)
    assert message == "spate: super stream 'bills2' already exists\n"
    message = fails(3, "superstream", "describe", "ghost", "--admin", admin)
    assert message == "spate: super stream 'ghost' does not exist\n"
    fails(3, "superstream", "delete", "ghost", "--admin", admin, "--output", "json")
    message = fails(2, "superstream", "create", "x", "--partitions", "0", "--admin", admin)
    assert message.startswith("spate: --partitions must be between 1 and 256, got 0")
    message = fails(2, "superstream", "create", "x", "--binding-keys", "a,,b", "--admin", admin)
    assert "--binding-keys: a binding key must not be empty" in message
    message = fails(2, "superstream", "create", "x", "--binding-keys", "a,b,a", "--admin", admin)
    assert "--binding-keys: 'a' is given twice" in message
    fails(2, "superstream", "create", "x", "--admin", admin)  # neither: argparse
    fails(2, "superstream", "create", "x", "--partitions", "2", "--binding-keys", "a")
    fails(2, "superstream", "create", "x", "--partitions", "2", "--routing", "random")
    names = [t["name"] for t in ok_json("superstream", "list", "--admin", admin)["super_streams"]]
    assert names == ["bills2"]
    ok("superstream", "delete", "bills2", "--admin", admin)


def test_superstream_grpc_refusals_name_the_field(admin: str) -> None:
    """What the CLI checks first, the server checks again (other gRPC clients)."""
    import grpc
    from spate.api.v1 import admin_pb2 as pb
    from spate.api.v1 import admin_pb2_grpc

    with grpc.insecure_channel(admin) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        cases = [
            (pb.CreateSuperStreamRequest(name="y"), "exactly one of partitions"),
            (
                pb.CreateSuperStreamRequest(name="y", partitions=2, routing="round-robin"),
                "routing must be 'hash' or 'key'",
            ),
            (
                pb.CreateSuperStreamRequest(
                    name="y", partitions=2, stream=pb.StreamConfig(partitions=4)
                ),
                "stream.partitions: each partition stream",
            ),
            (pb.CreateSuperStreamRequest(name="y", binding_keys=["a b"]), "binding-keys: key"),
        ]
        for request, text in cases:
            with pytest.raises(grpc.RpcError) as caught:
                stub.CreateSuperStream(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            assert text in caught.value.details()  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as caught:
            stub.DeleteSuperStream(pb.DeleteSuperStreamRequest(name="nope"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_group_create_list_describe_delete(admin: str) -> None:
    ok("stream", "create", "ledger-g", "--partitions", "2", "--replicas", "1", "--admin", admin)
    text = ok(
        "group", "create", "ledger-g", "billing", "--strategy", "sticky",
        "--session-timeout-ms", "10000", "--admin", admin,
    )  # fmt: skip
    assert "Defined consumer group 'billing' on stream 'ledger-g'" in text
    assert "sticky" in text and "10s" in text
    created = ok_json("group", "create", "ledger-g", "audit", "--admin", admin)["group"]
    assert created == {
        "stream": "ledger-g",
        "name": "audit",
        "strategy": "round-robin",
        "session_timeout_ms": 30000,
        "rebalance_delay_ms": 3000,
        "pending_max": 16,
        "version": created["version"],
    }
    # list: defined groups and the one seen only by its committed offset (admin_host.py)
    listed = ok_json("group", "list", "ledger-g", "--admin", admin)
    assert listed["partitions_here"] == [0]
    by_name = {g["name"]: g for g in listed["groups"]}
    assert sorted(by_name) == ["audit", "billing", "seen"]
    assert by_name["seen"]["defined"] is False and by_name["seen"]["definition"] is None
    assert (by_name["seen"]["links_attached"], by_name["seen"]["lag"]) == (1, 6)  # 10 - 3 - 1
    assert (by_name["billing"]["links_attached"], by_name["billing"]["lag"]) == (0, 3)
    assert by_name["audit"]["lag"] == 10  # nothing committed: every retained message
    assert by_name["billing"]["definition"]["strategy"] == "sticky"
    table = ok("group", "list", "ledger-g", "--admin", admin)
    assert table.splitlines()[0].split() == [
        "GROUP", "STRATEGY", "STATE", "MEMBERS", "GENERATION", "ATTACHED", "LAG",
    ]  # fmt: skip
    assert "not defined" in table and "unknown" in table
    assert "The coordinator could not be asked" in table
    assert by_name["seen"]["state"] is None and by_name["seen"]["members"] == 0
    # describe: per partition, partition 1 is not hosted by the answering process
    described = ok_json("group", "describe", "ledger-g", "seen", "--admin", admin)
    assert described["defined"] is False and described["definition"] is None
    assert described["partitions"] == [
        {
            "partition": 0,
            "available": True,
            "owner_attached": True,
            "epoch": 2,
            "committed_offset": 3,
            "end_offset": 10,
            "lag": 6,
            "member": None,
        },
        {
            "partition": 1,
            "available": False,
            "owner_attached": False,
            "epoch": None,
            "committed_offset": None,
            "end_offset": None,
            "lag": None,
            "member": None,
        },
    ]
    # admin_host.py runs no partitions, so no coordinator: reported, not a failure
    assert described["state"] is None and described["members"] == []
    assert described["generation"] is None
    assert "does not reach consumer-group coordinators" in described["coordinator_unavailable"]
    assert (described["links_attached"], described["lag"]) == (1, 6)
    text = ok("group", "describe", "ledger-g", "billing", "--admin", admin)
    assert "strategy" in text and "sticky" in text
    assert "PARTITION  OWNER  EPOCH  COMMITTED  END  LAG  MEMBER" in text
    assert "unknown: the coordinator could not be asked" in text
    assert "total lag        3" in text
    assert "not defined" in ok("group", "describe", "ledger-g", "seen", "--admin", admin)
    # `spate consumer list` no longer shows the groups' reserved names
    consumers = ok_json("consumer", "list", "ledger-g", "--admin", admin)["consumers"]
    assert [c["name"] for c in consumers] == ["app"]
    # delete
    deleted = ok_json("group", "delete", "ledger-g", "billing", "--admin", admin)
    assert deleted == {"deleted": {"stream": "ledger-g", "name": "billing"}}
    assert "Deleted the definition" in ok("group", "delete", "ledger-g", "audit", "--admin", admin)
    names = [g["name"] for g in ok_json("group", "list", "ledger-g", "--admin", admin)["groups"]]
    assert names == ["billing", "seen"]  # billing's committed offset is still stored
    # deleting the stream deletes its definitions
    ok("group", "create", "ledger-g", "audit", "--admin", admin)
    ok("stream", "delete", "ledger-g", "--admin", admin)
    ok("stream", "create", "ledger-g", "--replicas", "1", "--admin", admin)
    message = fails(3, "group", "describe", "ledger-g", "audit", "--admin", admin)
    assert "'audit' is not defined on stream 'ledger-g'" in message
    ok("stream", "delete", "ledger-g", "--admin", admin)


def test_group_misuse_has_clear_errors(admin: str) -> None:
    message = fails(3, "group", "create", "nowhere", "g", "--admin", admin)
    assert "stream 'nowhere' does not exist" in message
    ok("stream", "create", "misuse-g", "--replicas", "1", "--admin", admin)
    ok("group", "create", "misuse-g", "g", "--admin", admin)
    message = fails(4, "group", "create", "misuse-g", "g", "--admin", admin)
    assert "already defined" in message
    message = fails(3, "group", "delete", "misuse-g", "other", "--admin", admin)
    assert "'other' is not defined on stream 'misuse-g'" in message
    message = fails(2, "group", "create", "misuse-g", "$g", "--admin", admin)
    assert "reserved" in message
    message = fails(2, "group", "create", "misuse-g", "x" * 257, "--admin", admin)
    assert "the limit is 256" in message
    message = fails(2, "group", "create", "misuse-g", "h", "--session-timeout-ms", "5")
    assert message.startswith("spate: --session-timeout-ms must be between 1000")
    message = fails(2, "group", "create", "misuse-g", "h", "--rebalance-delay-ms", "-1")
    assert message.startswith("spate: --rebalance-delay-ms")
    fails(2, "group", "create", "misuse-g", "h", "--strategy", "fair")  # argparse
    fails(2, "group", "describe", "misuse-g")  # argparse: GROUP missing
    message = fails(3, "group", "describe", "misuse-g", "ghost", "--admin", admin)
    assert "no committed offset on its partitions hosted here (0)" in message
    assert "its coordinator could not be asked" in message
    message = fails(3, "group", "list", "ghost-stream", "--admin", admin)
    assert "'ghost-stream' does not exist" in message
    ok("stream", "delete", "misuse-g", "--admin", admin)


def test_group_grpc_refusals_name_the_field(admin: str) -> None:
    """What the CLI checks first, the server checks again (other gRPC clients)."""
    import grpc
    from spate.api.v1 import admin_pb2 as pb
    from spate.api.v1 import admin_pb2_grpc

    with grpc.insecure_channel(admin) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        cases = [
            (pb.CreateConsumerGroupRequest(stream="s", name=""), "non-empty"),
            (pb.CreateConsumerGroupRequest(stream="s", name="g", strategy="fair"), "strategy"),
            (
                pb.CreateConsumerGroupRequest(stream="s", name="g", session_timeout_ms=0),
                "session-timeout-ms",
            ),
            (pb.CreateConsumerGroupRequest(stream="bad name", name="g"), "stream name"),
        ]
        for request, text in cases:
            with pytest.raises(grpc.RpcError) as caught:
                stub.CreateConsumerGroup(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            assert text in caught.value.details()  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as caught:
            stub.DescribeConsumerGroup(
                pb.DescribeConsumerGroupRequest(stream="s", name="$group/x"), timeout=10
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        ok("stream", "create", "grpc-g", "--replicas", "1", "--admin", admin)
        ok("group", "create", "grpc-g", "g", "--admin", admin)
        everything = stub.ListConsumerGroups(pb.ListConsumerGroupsRequest(), timeout=10)
        assert [(g.stream, g.name) for g in everything.groups] == [("grpc-g", "g")]
        assert everything.groups[0].definition.strategy == "round-robin"
        ok("stream", "delete", "grpc-g", "--admin", admin)


def test_a_filter_size_outside_its_range_is_refused_before_any_call(admin: str) -> None:
    text = fails(2, "stream", "create", "f", "--filter-size-bytes", "8", "--admin", admin)
    assert "filter size must be between 16 and 255 bytes, got 8" in text
