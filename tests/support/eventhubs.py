"""Event Hubs dialect tests (ADR 0021): the hubs of a dev cluster, and running the SDK samples."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.eventhub import (
    CheckpointStore,
    EventData,
    EventHubConsumerClient,
    EventHubProducerClient,
)
from spate.gateway.auth import hash_password
from spate.server.devcluster import DevCluster

from support.amqp_clients import self_signed_cert
from support.cluster import Cluster, spate

KEY_NAME = "RootManageSharedAccessKey"


@dataclass
class Hubs:
    cluster: Cluster
    key: str
    host: str
    port: int
    tls_ca: Path | None = None
    """TLS listeners: the CA (here the self-signed certificate) the clients must trust."""

    def conn_str(self, key: str | None = None, name: str = KEY_NAME) -> str:
        """The only thing an Event Hubs application changes: its connection string. Plain TCP:
        `UseDevelopmentEmulator=true` is how the SDKs skip TLS (and take the port from it)."""
        if self.tls_ca is not None:
            return (
                f"Endpoint=sb://localhost/;SharedAccessKeyName={name};"
                f"SharedAccessKey={key or self.key}"
            )
        return (
            f"Endpoint=sb://{self.host}:{self.port}/;SharedAccessKeyName={name};"
            f"SharedAccessKey={key or self.key};UseDevelopmentEmulator=true"
        )

    def client_kwargs(self) -> dict[str, Any]:
        """TLS: the Python SDK's documented keywords to trust a private CA and to reach a port
        other than 5671 (`connection_verify`, `custom_endpoint_address`)."""
        if self.tls_ca is None:
            return {}
        return {
            "connection_verify": str(self.tls_ca),
            "custom_endpoint_address": f"sb://localhost:{self.port}",
        }

    def create(self, hub: str, partitions: int = 2) -> str:
        self.cluster.cli("stream", "create", hub, "--partitions", str(partitions))
        return hub


@contextmanager
def running_hubs(
    root: Path, *, tls: bool = False, nodes: int = 1, gateways: int = 0
) -> Iterator[Hubs]:
    """A dev cluster speaking the Event Hubs dialect, with a SAS key in its users file (and a
    self-signed certificate when `tls`). Clients talk to node 1, or with `gateways` to the
    first gateway (proxy mode: the Event Hubs SDKs do not follow link redirects)."""
    users = root / "users.json"
    users.write_text(json.dumps({"users": {"app": hash_password("pw")}}))
    # the key as an operator makes it: `spate user add-sas-key` prints a connection string
    made = spate("user", "add-sas-key", KEY_NAME, "--users-file", str(users)).stdout
    key = made.split("SharedAccessKey=")[1].split(";")[0]
    args: tuple[str, ...] = ("--dialect", "eventhubs", "--users-file", str(users))
    ca = None
    if tls:
        ca, tls_key = self_signed_cert(root)
        args += ("--tls-cert", str(ca), "--tls-key", str(tls_key))
    data_dir = root / "cluster"
    try:
        state = DevCluster(data_dir, node_args=args, gateway_args=args).up(nodes, gateways)
        front = state["gateways"][0] if gateways else state["nodes"][0]
        host, port = front["amqp"].split(":")
        yield Hubs(Cluster(data_dir, state), key, host, int(port), ca)
    finally:
        spate("dev", "down", "--data-dir", str(data_dir), check=False)


def run_sample(path: Path, env: dict[str, str], timeout_s: float = 60) -> str:
    """Run one of the SDK's own sample scripts, as is, in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


JS_DIR = Path(__file__).resolve().parents[1] / "js"


def run_js(
    connection_string: str,
    hub: str,
    steps: list[dict[str, Any]],
    *,
    ca: Path | None = None,
    custom_endpoint: str | None = None,
    timeout_s: float = 60,
) -> list[dict[str, Any]]:
    """@azure/event-hubs (tests/js/eventhubs.js): each step's result; fails on an error."""
    request: dict[str, Any] = {"connection_string": connection_string, "hub": hub, "steps": steps}
    env = dict(os.environ)
    if custom_endpoint is not None:
        request["custom_endpoint"] = custom_endpoint
    if ca is not None:
        request["ca"] = str(ca)
        env["NODE_EXTRA_CA_CERTS"] = str(ca)  # how Node trusts a private CA, read at start
    proc = subprocess.run(
        ["node", str(JS_DIR / "eventhubs.js")],
        input=json.dumps(request),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, f"node failed:\n{proc.stdout}\n{proc.stderr}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in out, out["error"]
    steps_out: list[dict[str, Any]] = out["steps"]
    return steps_out


def collect(
    conn_str: str,
    hub: str,
    count: int,
    timeout_s: float = 30,
    client_kwargs: dict[str, Any] | None = None,
    **receive_kwargs: Any,
) -> list[tuple[str, EventData]]:
    """Receive until `count` events arrived (the SDK's documented `receive` with `on_event`)."""
    got: list[tuple[str, EventData]] = []
    errors: list[BaseException] = []
    client = EventHubConsumerClient.from_connection_string(
        conn_str, consumer_group="$Default", eventhub_name=hub, **(client_kwargs or {})
    )
    done = threading.Event()

    def on_event(context: Any, event: EventData) -> None:
        got.append((context.partition_id, event))
        if len(got) >= count:
            done.set()

    def on_error(context: Any, error: BaseException) -> None:
        errors.append(error)

    worker = threading.Thread(
        target=client.receive,
        kwargs={"on_event": on_event, "on_error": on_error, **receive_kwargs},
        daemon=True,
    )
    worker.start()
    done.wait(timeout_s)
    client.close()
    worker.join(10)
    assert len(got) >= count, f"got {len(got)} of {count} events; errors {errors!r}"
    return got


def send(
    conn_str: str,
    hub: str,
    bodies: list[str],
    client_kwargs: dict[str, Any] | None = None,
    **batch_kwargs: Any,
) -> None:
    producer = EventHubProducerClient.from_connection_string(
        conn_str, eventhub_name=hub, **(client_kwargs or {})
    )
    with producer:
        batch = producer.create_batch(**batch_kwargs)
        for body in bodies:
            batch.add(EventData(body))
        producer.send_batch(batch)


class FileCheckpointStore(CheckpointStore):  # type: ignore[misc]
    """A small file-based CheckpointStore for the SDK's EventProcessor pattern (the SDK's own
    blob store needs Azure Storage, unavailable here): ownerships and checkpoints in one JSON
    file, claims by last-modified time like the blob store's etags."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"ownership": {}, "checkpoints": {}}
        loaded: dict[str, Any] = json.loads(self.path.read_text())
        return loaded

    def _save(self, doc: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, default=str))
        tmp.replace(self.path)

    @staticmethod
    def _key(item: dict[str, Any]) -> str:
        return "/".join(
            str(item[k])
            for k in (
                "fully_qualified_namespace",
                "eventhub_name",
                "consumer_group",
                "partition_id",
            )
        )

    def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> list[dict[str, Any]]:
        prefix = f"{fully_qualified_namespace}/{eventhub_name}/{consumer_group}/"
        with self.lock:
            owned = self._load()["ownership"]
        return [
            {**o, "last_modified_time": float(o["last_modified_time"])}
            for k, o in owned.items()
            if k.startswith(prefix)
        ]

    def claim_ownership(self, ownership_list: Any, **_: Any) -> list[dict[str, Any]]:
        claimed = []
        with self.lock:
            doc = self._load()
            for ownership in ownership_list:
                key = self._key(ownership)
                current = doc["ownership"].get(key)
                if current is not None and current.get("etag") != ownership.get("etag"):
                    continue  # someone else claimed it since it was listed
                entry = {
                    **ownership,
                    "last_modified_time": time.time(),
                    "etag": secrets.token_hex(8),
                }
                doc["ownership"][key] = entry
                claimed.append(entry)
            self._save(doc)
        return claimed

    def update_checkpoint(self, checkpoint: dict[str, Any], **_: Any) -> None:
        with self.lock:
            doc = self._load()
            doc["checkpoints"][self._key(checkpoint)] = checkpoint
            self._save(doc)

    def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, **_: Any
    ) -> list[dict[str, Any]]:
        prefix = f"{fully_qualified_namespace}/{eventhub_name}/{consumer_group}/"
        with self.lock:
            points = self._load()["checkpoints"]
        return [c for k, c in points.items() if k.startswith(prefix)]
