"""What one AMQP listener counts for /metrics (ADR 0023), pure.

The listener's connections update these once per append and once per run of deliveries, never
per message; the Prometheus adapter (spate.server.metrics) reads them at scrape time together
with the live state (connections, links, credit) it finds in the listener's `Context`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ListenerStats:
    messages_in: int = 0
    """Messages producers sent that were handed to a partition for append."""
    bytes_in: int = 0
    messages_out: int = 0
    """Messages sent to consumer links (deliveries, or sub-entries each counted once)."""
    bytes_out: int = 0
    connections_accepted: int = 0
    connections_refused: int = 0
    """Over `limits.connections_max`."""
    authentication_failures: int = 0
    """SASL outcomes other than ok (a wrong password, a mechanism that is not allowed)."""
    links_refused: dict[str, int] = field(default_factory=dict)
    """Attaches refused, by AMQP error condition."""


@dataclass(frozen=True, slots=True)
class ListenerSnapshot:
    """The live state of one listener at a scrape (spate.gateway.driver.snapshot)."""

    connections: int
    producer_links: int
    consumer_links: int
    info_links: int
    attaching_links: int
    producer_credit: int
    """Credit this listener has granted its producer links (messages they may still send)."""
    consumer_credit: int
    """Credit the clients have granted their consumer links (messages they may still receive)."""
    unconfirmed: int
    """Deliveries received and waiting for durability (not yet accepted)."""
