"""TLS and mutual TLS on the gRPC admin API (ADR 0023 addendum), with grpcio's own credentials.

One place for every process that serves or calls `spate.api.v1.Admin`: the node's admin server,
the node's calls to the other nodes during cluster operations, gateways reading routes, the
`spate` CLI and `spate perf`.

- `AdminTls.load(ca=, cert=, key=, client_auth=)` reads and checks the PEM files once, at start:
  an unreadable file, a file that is not PEM, a key that does not match its certificate, fail
  with InvalidArgument naming the setting, the path and the reason.
- `server_credentials()`: the admin server's certificate; with `client_auth`, a client
  certificate chaining to `ca` is required (mTLS). The files are re-read when they change, at
  the next handshake (certificate rotation without a restart; a broken replacement is logged and
  the previous certificate kept).
- `channel_credentials()`: verify the server against `ca` (the system roots when None) and, with
  `cert`/`key`, present them as the client certificate. gRPC checks the server's certificate
  names the host dialed (its subjectAltName): admin certificates name the advertised host.
- `explain()`: a TLS failure of a call in words a person can act on (which flag to pass, which
  CA did not verify what), instead of gRPC's handshake dump.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from spate.core.errors import InvalidArgument

log = logging.getLogger(__name__)

NODE_FIELDS = ("admin_tls_ca", "admin_tls_cert", "admin_tls_key")
"""Setting names of the three files in the node and gateway config (messages name them)."""
CLI_FIELDS = ("--tls-ca", "--tls-cert", "--tls-key")

ENV_CA, ENV_CERT, ENV_KEY = "SPATE_ADMIN_TLS_CA", "SPATE_ADMIN_TLS_CERT", "SPATE_ADMIN_TLS_KEY"

probe_timeout_s = 2.0
"""How long `speaks_tls` waits for a TLS handshake when explaining a plaintext call's failure."""


def _read(path: Path, name: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InvalidArgument(f"{name}: cannot read {path}: {error.strerror or error}") from None
    return data


def _read_ca(path: Path, name: str) -> bytes:
    data = _read(path, name)
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise InvalidArgument(f"{name}: {path} holds no PEM certificate (-----BEGIN CERTIFICATE)")
    try:
        ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as error:
        raise InvalidArgument(f"{name}: {path} is not a valid CA bundle: {error}") from None
    return data


def _read_pair(cert: Path, key: Path, names: tuple[str, str]) -> tuple[bytes, bytes]:
    cert_data, key_data = _read(cert, names[0]), _read(key, names[1])
    if b"-----BEGIN CERTIFICATE-----" not in cert_data:
        raise InvalidArgument(f"{names[0]}: {cert} holds no PEM certificate")
    if b"PRIVATE KEY-----" not in key_data:
        raise InvalidArgument(f"{names[1]}: {key} holds no PEM private key")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
    except ssl.SSLError as error:
        reason = "the key does not match the certificate" if "MISMATCH" in str(error) else error
        raise InvalidArgument(
            f"{names[0]} {cert} and {names[1]} {key} cannot be used: {reason}"
        ) from None
    return cert_data, key_data


def _mtimes(paths: tuple[Path | None, ...]) -> tuple[int, ...]:
    stamps = []
    for path in paths:
        try:
            stamps.append(os.stat(path).st_mtime_ns if path is not None else 0)
        except OSError:
            stamps.append(-1)
    return tuple(stamps)


@dataclass
class AdminTls:
    """Checked PEM material for one process's admin TLS; build with `load`."""

    ca: Path | None
    cert: Path | None
    key: Path | None
    client_auth: bool
    names: tuple[str, str, str]
    ca_pem: bytes | None
    cert_pem: bytes | None
    key_pem: bytes | None
    _stamps: tuple[int, ...] = field(default=(), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(
        cls,
        ca: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
        *,
        client_auth: bool = False,
        names: tuple[str, str, str] = NODE_FIELDS,
    ) -> AdminTls:
        ca_name, cert_name, key_name = names
        if (cert is None) != (key is None):
            given, missing = (cert_name, key_name) if cert is not None else (key_name, cert_name)
            raise InvalidArgument(f"{given} is set but {missing} is not: give both or neither")
        if client_auth and ca is None:
            raise InvalidArgument(
                f"admin_tls_client_auth needs {ca_name}: the CA the clients' certificates must "
                "chain to"
            )
        ca_pem = _read_ca(ca, ca_name) if ca is not None else None
        cert_pem = key_pem = None
        if cert is not None and key is not None:
            cert_pem, key_pem = _read_pair(cert, key, (cert_name, key_name))
        return cls(
            ca,
            cert,
            key,
            client_auth,
            names,
            ca_pem,
            cert_pem,
            key_pem,
            _mtimes((ca, cert, key)),
        )

    # -- server --------------------------------------------------------------------------------

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert_pem is None or self.key_pem is None:
            raise InvalidArgument(
                f"the admin server's TLS needs {self.names[1]} and {self.names[2]}"
            )
        initial = grpc.ssl_server_certificate_configuration(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem
        )
        # None from the callback means "unchanged" (grpcio's documentation; its stubs omit it)
        return grpc.dynamic_ssl_server_credentials(
            initial,
            self._fetch,  # type: ignore[arg-type]
            require_client_authentication=self.client_auth,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each handshake: a new configuration when a file changed."""
        stamps = _mtimes((self.ca, self.cert, self.key))
        with self._lock:
            if stamps == self._stamps:
                return None
            self._stamps = stamps
            try:
                ca_pem = _read_ca(self.ca, self.names[0]) if self.ca is not None else None
                assert self.cert is not None and self.key is not None
                cert_pem, key_pem = _read_pair(self.cert, self.key, (self.names[1], self.names[2]))
            except InvalidArgument as error:
                log.warning("admin TLS: keeping the previous certificate: %s", error.message)
                return None
            self.ca_pem, self.cert_pem, self.key_pem = ca_pem, cert_pem, key_pem
        log.info("admin TLS: certificate files changed, new handshakes use them")
        return grpc.ssl_server_certificate_configuration(
            [(key_pem, cert_pem)], root_certificates=ca_pem
        )

    # -- client --------------------------------------------------------------------------------

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem,
            private_key=self.key_pem,
            certificate_chain=self.cert_pem,
        )

    def aio_channel(self, address: str, **kwargs: object) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(address, self.channel_credentials(), **kwargs)  # type: ignore[arg-type]


def aio_channel(address: str, tls: AdminTls | None, **kwargs: object) -> grpc.aio.Channel:
    """An asyncio channel to an admin API: TLS with `tls`, plaintext without."""
    if tls is None:
        return grpc.aio.insecure_channel(address, **kwargs)  # type: ignore[arg-type]
    return tls.aio_channel(address, **kwargs)


def channel(address: str, tls: AdminTls | None) -> grpc.Channel:
    """A blocking channel to an admin API: TLS with `tls`, plaintext without."""
    if tls is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, tls.channel_credentials())


def from_environment(
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    env: dict[str, str] | None = None,
) -> AdminTls | None:
    """Client TLS from flags, each falling back to SPATE_ADMIN_TLS_CA/_CERT/_KEY; None when none
    is given (plaintext)."""
    environ = os.environ if env is None else env

    def pick(given: Path | None, name: str) -> Path | None:
        if given is not None:
            return given
        value = environ.get(name)
        return Path(value) if value else None

    ca, cert, key = pick(ca, ENV_CA), pick(cert, ENV_CERT), pick(key, ENV_KEY)
    if ca is None and cert is None and key is None:
        return None
    return AdminTls.load(ca, cert, key, names=CLI_FIELDS)


# -- explaining failures -----------------------------------------------------------------------


def speaks_tls(address: str, timeout_s: float = probe_timeout_s) -> bool:
    """True when a TLS handshake (nothing verified) succeeds at `address`: a plaintext call's
    failure was the server wanting TLS."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw) as tls,
        ):
            return tls.version() is not None
    except (OSError, ValueError):
        return False


def explain(details: str, address: str, tls: AdminTls | None, *, probe: bool = True) -> str | None:
    """A message for a failed call's details when TLS is why; None when it is not. Without
    `tls`, `probe` tries a TLS handshake at `address` (blocking, up to `probe_timeout_s`) to
    tell a server that wants TLS."""
    names = tls.names if tls is not None else CLI_FIELDS
    ca_name, cert_name, key_name = names
    text = details.lower()
    if tls is None:
        if not probe:
            return None
        if "socket closed" in text or "connection reset" in text or "handshake" in text:
            with contextlib.suppress(Exception):
                if speaks_tls(address):
                    return (
                        f"the admin API at {address} speaks TLS: pass {ca_name} (the CA of its "
                        f"certificate; and {cert_name}/{key_name} if it requires client "
                        "certificates)"
                    )
        return None
    if "certificate_verify_failed" in text or "certificate verify failed" in text:
        against = f"{ca_name} {tls.ca}" if tls.ca is not None else "the system's CA roots"
        return (
            f"the admin API at {address} presented a certificate that {against} does not "
            f"verify (certificate verify failed): pass the CA that signed it"
        )
    if "peer name" in text or "hostname" in text or "subject alt" in text:
        return (
            f"the admin API at {address} presented a certificate that does not name "
            f"{address.rpartition(':')[0]} (its subjectAltName): dial it by a name the "
            "certificate holds"
        )
    if "wrong_version_number" in text or "wrong version number" in text:
        return f"the admin API at {address} does not speak TLS: drop {ca_name}"
    closed = "socket closed" in text or "connection reset" in text
    if (
        "certificate_required" in text
        or "certificate required" in text
        or (("handshake" in text or closed) and tls.cert is None)
    ):
        return (
            f"the admin API at {address} requires a client certificate: pass {cert_name} and "
            f"{key_name} (signed by the CA it trusts)"
        )
    if closed:
        return (
            f"the admin API at {address} closed the connection during the TLS handshake: it "
            f"did not accept the client certificate {cert_name} {tls.cert} (is it signed by "
            "the CA the nodes trust, admin_tls_ca?)"
        )
    if any(word in text for word in ("ssl", "tls", "handshake", "alert")):
        client = f" and {cert_name} {tls.cert}" if tls.cert is not None else ""
        return (
            f"the TLS handshake with the admin API at {address} failed ({details}); check "
            f"{ca_name} {tls.ca}{client}"
        )
    return None
