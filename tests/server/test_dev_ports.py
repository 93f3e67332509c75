"""`spate dev up` gives every listener of a plan its own port (CI once met two listeners of
one node drawn the same free port: `address already in use` at start-up)."""

from __future__ import annotations

import pytest
from spate.core.errors import Unavailable
from spate.server import devcluster


def test_a_port_already_in_the_plan_is_never_drawn_again() -> None:
    taken: set[int] = set()
    for _ in range(500):
        port = devcluster._free_port(taken)
        assert port not in taken
        taken.add(port)


def test_no_free_port_left_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devcluster, "dev_port_min", 20_000)
    monkeypatch.setattr(devcluster, "dev_port_max", 20_003)
    monkeypatch.setattr(devcluster, "_ephemeral_range", lambda: (32768, 60999))
    with pytest.raises(Unavailable, match="no free port"):
        devcluster._free_port({20_000, 20_001, 20_002})
