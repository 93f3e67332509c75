"""Real dev clusters whose nodes speak the Event Hubs dialect (ADR 0021), with SAS keys: plain
TCP and TLS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.eventhubs import Hubs, running_hubs


@pytest.fixture(scope="module")
def hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hubs]:
    with running_hubs(tmp_path_factory.mktemp("eventhubs")) as running:
        yield running


@pytest.fixture(scope="module")
def tls_hubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hubs]:
    with running_hubs(tmp_path_factory.mktemp("eventhubs-tls"), tls=True) as running:
        yield running
