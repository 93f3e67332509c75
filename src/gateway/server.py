"""GatewayServer: the AMQP 1.0 listener a host process (node or gateway) constructs and runs."""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from spate.core import limits
from spate.core.backend import Broker
from spate.core.errors import InvalidArgument
from spate.gateway import eventhubs
from spate.gateway.auth import Users
from spate.gateway.driver import AmqpConnection, Context, snapshot
from spate.gateway.links import Rooms
from spate.gateway.stats import ListenerSnapshot, ListenerStats

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ListenerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    node_id: str
    allow_anonymous: bool = True
    users_file: Path | None = None
    """JSON users file for SASL PLAIN (see spate.gateway.auth); None: PLAIN is not offered."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    """PEM files; both set: the listener speaks TLS only (terminated by asyncio)."""
    allow_remote_anonymous: bool = False
    """SASL ANONYMOUS from non-loopback clients too (ADR 0023: off, so no credential-free
    access reaches a listener bound to a real interface unless asked for)."""
    idle_timeout_s: float | None = None
    offset_commit_messages: int = limits.offset_commit_messages
    offset_commit_ms: int = limits.offset_commit_interval_ms
    """Named consumers' batched offset stores (ADR 0012)."""
    dialects: tuple[str, ...] = ()
    """Vendor dialects spoken besides Spate's own: "eventhubs" (ADR 0021, docs/event-hubs.md)."""

    def validate(self) -> None:
        for dialect in self.dialects:
            if dialect not in eventhubs.DIALECTS:
                raise InvalidArgument(
                    f"unknown listener dialect {dialect!r}: known are "
                    + ", ".join(eventhubs.DIALECTS)
                )
        if not self.allow_anonymous and self.users_file is None:
            raise InvalidArgument("the listener needs allow_anonymous or a users_file")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("TLS needs both tls_cert and tls_key")
        if self.idle_timeout_s is not None and self.idle_timeout_s <= 0:
            raise InvalidArgument(f"idle timeout must be positive, got {self.idle_timeout_s}")
        check_offset_commits(self.offset_commit_messages, self.offset_commit_ms)


def check_offset_commits(messages: int, interval_ms: int) -> None:
    """The batching of named consumers' offset stores, as the flags name it."""
    if not 1 <= messages <= 1_000_000:
        raise InvalidArgument(f"--offset-commit-messages must be 1-1000000, got {messages}")
    if not 1 <= interval_ms <= 60_000:
        raise InvalidArgument(f"--offset-commit-ms must be 1-60000, got {interval_ms}")


class GatewayServer:
    def __init__(
        self,
        broker: Broker,
        config: ListenerConfig,
        modes: dict[str, Broker] | None = None,
        rooms: Rooms | None = None,
    ) -> None:
        config.validate()
        self.broker = broker
        self.rooms = rooms
        """A gateway's rooms (ADR 0018): serves `$rooms/<room>` links."""
        self.modes = modes or {}
        """Gateways: the broker of each mode a client may ask for (`spate:gateway-mode`)."""
        self.config = config
        self._server: asyncio.Server | None = None
        self._context: Context | None = None
        self._users: Users | None = None

    async def start(self) -> int:
        """Listen; returns the bound port."""
        assert self._server is None, "started twice"
        users = Users.load(self.config.users_file) if self.config.users_file else None
        self._users = users

        async def check_plain(user: str, password: str) -> bool:
            current = self._users
            assert current is not None
            # scrypt costs tens of milliseconds: keep it off the loop
            return await asyncio.to_thread(current.check, user, password)

        self._context = Context(
            broker=self.broker,
            modes=self.modes,
            rooms=self.rooms,
            node_id=self.config.node_id,
            allow_anonymous=self.config.allow_anonymous,
            authenticate_plain=check_plain if users is not None else None,
            idle_timeout_s=self.config.idle_timeout_s,
            permissions=users.store if users is not None else None,
            anonymous_remote=self.config.allow_remote_anonymous,
            offset_commit_messages=self.config.offset_commit_messages,
            offset_commit_interval_ms=self.config.offset_commit_ms,
            dialects=frozenset(self.config.dialects),
            sas_keys=dict(users.sas_keys) if users is not None else {},
        )
        tls = None
        if self.config.tls_cert is not None and self.config.tls_key is not None:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        loop = asyncio.get_running_loop()
        context = self._context
        self._server = await loop.create_server(
            lambda: AmqpConnection(context),
            self.config.host,
            self.config.port,
            backlog=limits.listen_backlog,
            ssl=tls,
        )
        port = int(self._server.sockets[0].getsockname()[1])
        log.info("AMQP listener on %s:%d (tls=%s)", self.config.host, port, tls is not None)
        return port

    def reload_users(self, users: Users) -> None:
        """Take a re-read users file (SIGHUP): passwords and shared access keys apply to new
        connections, permissions to links attached from now on (connections stay open)."""
        if self._context is None or self._users is None:
            return  # no users file at start: PLAIN is not offered; a restart changes that
        self._users = users
        self._context.permissions = users.store
        self._context.sas_keys = dict(users.sas_keys)

    def counters(self) -> ListenerStats:
        """The listener's counters alone, without a walk over its connections."""
        return ListenerStats() if self._context is None else self._context.stats

    def stats(self) -> tuple[ListenerStats, ListenerSnapshot]:
        """The listener's counters and its live connections, links and credit (/metrics)."""
        if self._context is None:
            return ListenerStats(), ListenerSnapshot(0, 0, 0, 0, 0, 0, 0, 0)
        return self._context.stats, snapshot(self._context)

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is None:
            return
        self._server.close()
        if self._context is not None:
            for connection in list(self._context.connections):
                if connection.sock is not None:
                    connection.sock.abort()
        await self._server.wait_closed()
        self._server = None
