"""Users for SASL PLAIN: a JSON file of salted, hashed passwords.

File layout: `{"users": {"alice": "scrypt$16384$8$1$<salt b64>$<hash b64>"}, "sas_keys":
{"RootManageSharedAccessKey": "<key>"}}`, or per user an object with the hash as `password` and
the user's permissions (spate.core.permissions); `sas_keys` (optional) are the Event Hubs
dialect's shared access keys (ADR 0021). Each hash is
`hashlib.scrypt(password, salt, n, r, p, dklen=32)` with a per-user random 16-byte salt; the
parameters travel in the string so they can be raised later without breaking old entries.
Create entries with `hash_password("secret")` (or `python -m spate.gateway.auth <password>`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from spate.core.errors import InvalidArgument
from spate.core.permissions import UserStore

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
SCRYPT_MAXMEM_BYTES = 64 * 1024 * 1024
PASSWORD_BYTES_MAX = 1024


def hash_password(
    password: str,
    *,
    n: int = SCRYPT_N,
    r: int = SCRYPT_R,
    p: int = SCRYPT_P,
    salt: bytes | None = None,
) -> str:
    """`scrypt$n$r$p$salt_b64$hash_b64` for a users file."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=HASH_BYTES, maxmem=SCRYPT_MAXMEM_BYTES
    )
    b64 = base64.b64encode
    return f"scrypt${n}${r}${p}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, encoded: str) -> bool:
    """Constant-time check of a password against `hash_password` output."""
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise InvalidArgument("password hash is not in the form scrypt$n$r$p$salt$hash")
    n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
    salt, expected = base64.b64decode(parts[4]), base64.b64decode(parts[5])
    if len(password.encode()) > PASSWORD_BYTES_MAX:
        return False
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=len(expected), maxmem=SCRYPT_MAXMEM_BYTES
    )
    return hmac.compare_digest(digest, expected)


@dataclass(frozen=True, slots=True)
class Users:
    """A users file (spate.core.permissions.UserStore has the layout): passwords for SASL
    PLAIN, each user's grants, and the Event Hubs dialect's shared access keys."""

    store: UserStore
    sas_keys: dict[str, str] = field(default_factory=dict)
    """Shared access keys (name -> key) of the Event Hubs dialect (ADR 0021): tokens put on
    `$cbs` must be signed by one. Kept as they are: the listener needs them to check an HMAC."""

    @property
    def hashes(self) -> dict[str, str]:
        return self.store.passwords

    @staticmethod
    def load(path: Path) -> Users:
        """Read a users file; InvalidArgument with the reason when it is not usable."""
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise InvalidArgument(f"cannot read users file {path}: {err}") from err
        keys = doc.get("sas_keys", {}) if isinstance(doc, dict) else {}
        if not isinstance(keys, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and len(v) >= 16
            for k, v in keys.items()
        ):
            raise InvalidArgument(
                f'users file {path}: "sas_keys" must map key names to keys of 16+ characters'
            )
        return Users(UserStore.parse(doc, str(path)), dict(keys))

    def check(self, user: str, password: str) -> bool:
        encoded = self.store.passwords.get(user)
        if encoded is None:
            return False
        return verify_password(password, encoded)


if __name__ == "__main__":  # pragma: no cover - operator helper
    sys.stdout.write(hash_password(sys.argv[1]) + "\n")
