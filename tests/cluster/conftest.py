"""Fixtures for the metadata service and admin server tests."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest


def pick_free_port() -> int:
    """A port that was free a moment ago: bind port 0 on 127.0.0.1, read it, release it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def free_port() -> Callable[[], int]:
    return pick_free_port
