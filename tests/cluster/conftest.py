"""Fixtures for the metadata service and admin server tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.ports import port_picker


@pytest.fixture
def free_port() -> Callable[[], int]:
    """Ports for listeners a test names before they bind (support.ports): free a moment ago,
    this xdist worker's own, never the same twice in one test."""
    return port_picker()
