"""Event Hubs dialect tests (ADR 0021): the hubs of a dev cluster, and running the SDK samples."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cluster import Cluster, spate

from spate.gateway.auth import hash_password
from spate.server.devcluster import DevCluster

KEY_NAME = "RootManageSharedAccessKey"


@dataclass
class Hubs:
    cluster: Cluster
    key: str
    host: str
    port: int

    def conn_str(self, key: str | None = None, name: str = KEY_NAME) -> str:
        """The only thing an Event Hubs application changes: its connection string (plain
        TCP: `UseDevelopmentEmulator=true` is how the SDKs skip TLS)."""
        return (
            f"Endpoint=sb://{self.host}:{self.port}/;SharedAccessKeyName={name};"
            f"SharedAccessKey={key or self.key};UseDevelopmentEmulator=true"
        )

    def create(self, hub: str, partitions: int = 2) -> str:
        self.cluster.cli("stream", "create", hub, "--partitions", str(partitions))
        return hub


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
