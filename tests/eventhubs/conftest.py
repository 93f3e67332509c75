"""Real dev clusters whose nodes speak the Event Hubs dialect (ADR 0021), with SAS keys: plain
TCP and TLS. Session-scoped: the SDK modules run in one xdist group, so one worker starts each
cluster once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.eventhubs import Hubs, running_hubs


@pytest.fixture(scope="session")
def hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hubs]:
    with running_hubs(tmp_path_factory.mktemp("eventhubs")) as running:
        yield running


@pytest.fixture(scope="session")
def tls_hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hubs]:
    with running_hubs(tmp_path_factory.mktemp("eventhubs-tls"), tls=True) as running:
        yield running
