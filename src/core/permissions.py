"""Per-user permissions on streams (ADR 0023), pure: RabbitMQ's configure / write / read, each
a regular expression a stream name must match in full.

- `configure`: create and delete the stream, its super stream and its consumer groups, reset a
  consumer's offset (admin gRPC);
- `write`: publish to it (an AMQP target address);
- `read`: consume from it and read `STREAM/$info` (an AMQP source address); describe it and
  list its partitions, producers, consumers and groups (admin gRPC).

Cluster-wide reads (cluster status, list streams) need an authenticated user and nothing more.
A refusal is `Unauthorized` (amqp:unauthorized-access, gRPC PERMISSION_DENIED) naming the
user, the permission, the stream and the pattern that did not match. No identity at all is
`Unauthenticated` (gRPC UNAUTHENTICATED; over AMQP, SASL already refused it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from spate.core.errors import InvalidArgument, Unauthorized

PATTERN_BYTES_MAX = 1024


class Permission(Enum):
    CONFIGURE = "configure"
    WRITE = "write"
    READ = "read"


@dataclass(frozen=True, slots=True)
class Grants:
    """One user's three patterns (compiled; `fullmatch` against the stream name)."""

    configure: re.Pattern[str]
    write: re.Pattern[str]
    read: re.Pattern[str]

    @staticmethod
    def of(configure: str = ".*", write: str = ".*", read: str = ".*") -> Grants:
        return Grants(
            _compile("configure", configure), _compile("write", write), _compile("read", read)
        )

    @staticmethod
    def parse(user: str, entry: dict[str, Any]) -> Grants:
        """From a users-file entry; a missing pattern grants nothing ("" matches no stream)."""
        patterns = {}
        for permission in Permission:
            value = entry.get(permission.value, "")
            if not isinstance(value, str):
                raise InvalidArgument(
                    f"user {user!r}: {permission.value} must be a regular expression string, "
                    f"got {value!r}"
                )
            try:
                patterns[permission.value] = _compile(permission.value, value)
            except InvalidArgument as error:
                raise InvalidArgument(f"user {user!r}: {error.message}") from None
        return Grants(**patterns)

    def pattern(self, permission: Permission) -> re.Pattern[str]:
        pattern: re.Pattern[str] = getattr(self, permission.value)
        return pattern

    def allows(self, permission: Permission, stream: str) -> bool:
        return self.pattern(permission).fullmatch(stream) is not None

    def check(self, user: str, permission: Permission, stream: str) -> None:
        """Unauthorized naming what is missing, unless `user` holds `permission` on `stream`."""
        if not self.allows(permission, stream):
            raise Unauthorized(
                f"user {user!r} has no {permission.value} permission on stream {stream!r} "
                f"(its {permission.value} pattern is {self.pattern(permission).pattern!r})"
            )

    def to_json(self) -> dict[str, str]:
        return {p.value: self.pattern(p).pattern for p in Permission}


def _compile(field: str, pattern: str) -> re.Pattern[str]:
    if len(pattern.encode()) > PATTERN_BYTES_MAX:
        raise InvalidArgument(f"{field} pattern is over {PATTERN_BYTES_MAX} bytes")
    if pattern == "":
        return re.compile(r"(?!)")  # grants nothing: matches no name, not even the empty one
    try:
        return re.compile(pattern)
    except re.error as error:
        raise InvalidArgument(
            f"{field} pattern {pattern!r} is not a regular expression: {error}"
        ) from None


FULL = Grants.of()
"""Everything (anonymous users where anonymous access is on, users of a file written before
permissions existed)."""


ANONYMOUS = "anonymous"
"""The user of a SASL ANONYMOUS connection and of an admin call without a token where those
are allowed; the users file may give it narrower grants (an entry of that name)."""
USERS_MAX = 100_000
TOKEN_HASH_HEX = 64


def token_hash(token: str) -> str:
    """SHA-256 of an admin token, as the users file stores it. Tokens are random (32 bytes,
    `spate user add --token`), so a fast hash is enough (scrypt is for passwords people pick)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class UserStore:
    """The users file, parsed: who may connect (passwords, tokens) and what they may do.

    File layout (JSON; every node and gateway reads its own copy at start):

        {"users": {
           "admin": {"password": "scrypt$...", "token_sha256": "<64 hex>",
                     "configure": ".*", "write": ".*", "read": ".*"},
           "billing": {"password": "scrypt$...", "write": "^orders$", "read": "^(orders|audit)$"},
           "legacy": "scrypt$..."}}

    A bare hash string (the layout before permissions) grants everything. A pattern left out
    grants nothing. An entry named `anonymous` (no password) narrows what anonymous
    connections may do where anonymous access is on."""

    passwords: dict[str, str]
    grants: dict[str, Grants]
    tokens: dict[str, str]
    """SHA-256 hex of a token -> its user."""

    @staticmethod
    def parse(document: Any, source: str) -> UserStore:
        users = document.get("users") if isinstance(document, dict) else None
        if not isinstance(users, dict) or len(users) > USERS_MAX:
            raise InvalidArgument(f'users file {source}: expected {{"users": {{name: entry}}}}')
        passwords: dict[str, str] = {}
        grants: dict[str, Grants] = {}
        tokens: dict[str, str] = {}
        for name, raw in users.items():
            entry = (
                {"password": raw, "configure": ".*", "write": ".*", "read": ".*"}
                if isinstance(raw, str)
                else raw
            )
            if not isinstance(entry, dict):
                raise InvalidArgument(
                    f"users file {source}: user {name!r} must be a password hash or an object"
                )
            unknown = sorted(
                set(entry) - {"password", "token_sha256", *(p.value for p in Permission)}
            )
            if unknown:
                raise InvalidArgument(
                    f"users file {source}: user {name!r} has unknown field(s) {', '.join(unknown)}"
                    "; known: password, token_sha256, configure, write, read"
                )
            password = entry.get("password")
            if password is not None:
                if not isinstance(password, str) or not password.startswith("scrypt$"):
                    raise InvalidArgument(
                        f"users file {source}: user {name!r}: password must be a scrypt hash "
                        "(`spate user hash`)"
                    )
                passwords[name] = password
            token = entry.get("token_sha256")
            if token is not None:
                if not isinstance(token, str) or not re.fullmatch(r"[0-9a-f]{64}", token):
                    raise InvalidArgument(
                        f"users file {source}: user {name!r}: token_sha256 must be 64 lowercase "
                        "hex digits (`spate user add --token`)"
                    )
                tokens[token] = name
            try:
                grants[name] = Grants.parse(name, entry)
            except InvalidArgument as error:
                raise InvalidArgument(f"users file {source}: {error.message}") from None
        return UserStore(passwords, grants, tokens)

    def user_of_token(self, token: str) -> str | None:
        return self.tokens.get(token_hash(token))

    def has_user(self, name: str) -> bool:
        """A named user of the file (the `anonymous` entry is not one: it narrows anonymous
        access, nobody can be it)."""
        return name != ANONYMOUS and name in self.grants

    def grants_of(self, user: str) -> Grants:
        """A known user's grants; anonymous without an entry: everything; else nothing."""
        found = self.grants.get(user)
        if found is not None:
            return found
        return FULL if user == ANONYMOUS else NONE


NONE = Grants.of("", "", "")
