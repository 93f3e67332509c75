"""Mutual TLS for the cluster's own links (ADR 0023): node-to-node replication and the
gateways' wire sessions, both on the nodes' replication port.

Every node and gateway holds a certificate signed by the cluster's CA (`cluster_tls_cert`,
`cluster_tls_key`, `cluster_tls_ca`). The listening side requires a client certificate chaining
to that CA (`CERT_REQUIRED`); the dialing side presents its own and verifies the listener's the
same way. Host names are not checked: peers are dialed at the addresses the metadata service
registered, often bare IPs, and the identity that matters is "holds a certificate of this
cluster's CA" — on top of which the transport's HMAC handshake still proves the cluster secret
(spate.node.replication.transport). A peer without a certificate of the CA fails the TLS
handshake before it can send a byte of Raft.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from spate.core.errors import InvalidArgument


def cluster_contexts(cert: Path, key: Path, ca: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for the replication port; InvalidArgument naming the file
    when one cannot be loaded."""
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        server.verify_mode = ssl.CERT_REQUIRED
        server.load_cert_chain(cert, key)
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
        client.check_hostname = False
        client.verify_mode = ssl.CERT_REQUIRED
        client.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise InvalidArgument(
            f"cluster TLS: cannot load cert {cert}, key {key} or CA {ca}: {error}"
        ) from error
    for context in (server, client):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    return server, client


def check_all_or_none(cert: Path | None, key: Path | None, ca: Path | None) -> bool:
    """True when cluster TLS is on; InvalidArgument when only some of the three are set."""
    given = [p is not None for p in (cert, key, ca)]
    if any(given) and not all(given):
        raise InvalidArgument(
            "cluster TLS needs all three of cluster_tls_cert, cluster_tls_key and cluster_tls_ca"
        )
    return all(given)
