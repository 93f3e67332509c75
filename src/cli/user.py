"""`spate user add|hash`: manage the SASL PLAIN users file read by `spate node run --users-file`."""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from spate.core.errors import InvalidArgument
from spate.core.permissions import FULL, Grants, Permission, UserStore, token_hash
from spate.gateway.auth import hash_password


def register(subparsers: Any) -> None:
    user = subparsers.add_parser(
        "user",
        help="manage SASL PLAIN users",
        description='Users for SASL PLAIN live in a JSON file ({"users": {name: hash}}) given to '
        "`spate node run --users-file`. Passwords are stored as scrypt hashes.",
    )
    commands = user.add_subparsers(dest="user_command", required=True, metavar="COMMAND")
    add = commands.add_parser(
        "add",
        help="add or change a user in a users file",
        description="Add NAME to the users file (created if missing), or change its password, "
        "permissions or token. Nodes and gateways read the file at start (restart them to "
        "apply a change). Example: spate user add billing --users-file users.json "
        "--write '^orders$' --read '^(orders|audit)$' --configure '' --password-stdin",
    )
    add.add_argument("name", help="user name")
    add.add_argument("--users-file", type=Path, required=True, help="the JSON users file")
    add.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from standard input instead of prompting",
    )
    add.add_argument(
        "--no-password",
        action="store_true",
        help="no password (a user that only calls the admin API with a token)",
    )
    for permission, what in (
        ("configure", "create/delete streams, super streams and groups, reset offsets"),
        ("write", "publish"),
        ("read", "consume, read $info, describe"),
    ):
        add.add_argument(
            f"--{permission}",
            metavar="REGEX",
            help=f"streams the user may {what}: a regular expression matched against the whole "
            "name (default '.*' for a new user; '' grants nothing)",
        )
    add.add_argument(
        "--token",
        action="store_true",
        help="make a new admin API token for the user: its SHA-256 goes into the file, the "
        "token itself is printed once (use it as $SPATE_ADMIN_TOKEN)",
    )
    add.set_defaults(run=_add)
    hash_cmd = commands.add_parser(
        "hash",
        help="print the hash of a password",
        description="Print the scrypt hash of a password, for writing a users file by hand.",
    )
    hash_cmd.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from standard input instead of prompting",
    )
    hash_cmd.set_defaults(run=_hash)
    sas = commands.add_parser(
        "add-sas-key",
        help="add or replace a shared access key (Event Hubs dialect)",
        description="Generate a shared access key named NAME in the users file (created if "
        "missing) and print an Event Hubs connection string using it. Listeners with "
        "`--dialect eventhubs` check the SAS tokens Event Hubs clients put on $cbs against "
        "these keys (docs/event-hubs.md). The key is stored as is: keep the file private.",
    )
    sas.add_argument("name", help="key name (SharedAccessKeyName in connection strings)")
    sas.add_argument("--users-file", type=Path, required=True, help="the JSON users file")
    sas.add_argument(
        "--endpoint",
        default="127.0.0.1:5672",
        help="host:port for the printed connection string (default 127.0.0.1:5672)",
    )
    sas.set_defaults(run=_add_sas_key)


def _password(from_stdin: bool) -> str:
    password = sys.stdin.readline().rstrip("\n") if from_stdin else getpass.getpass("password: ")
    if not password:
        raise InvalidArgument("the password is empty")
    return password


def _hash(args: argparse.Namespace) -> int:
    print(hash_password(_password(args.password_stdin)))
    return 0


def _load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = {"users": {}}
    if path.exists():
        try:
            document = json.loads(path.read_text())
        except ValueError as error:
            raise InvalidArgument(f"{path} is not a JSON users file: {error}") from error
        if not isinstance(document.get("users"), dict):
            raise InvalidArgument(f'{path} has no "users" object')
    return document


def _save(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(document, f, indent=2)
    tmp.replace(path)


def _add_sas_key(args: argparse.Namespace) -> int:
    path: Path = args.users_file
    if not args.name or any(c in args.name for c in "&=;/ "):
        raise InvalidArgument(f"key name {args.name!r} must not be empty or hold & = ; / or spaces")
    document = _load(path)
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    keys = document.setdefault("sas_keys", {})
    if not isinstance(keys, dict):
        raise InvalidArgument(f'{path}: "sas_keys" is not an object')
    keys[args.name] = key
    _save(path, document)
    print(f"key {args.name!r} saved in {path}; restart the listeners that read it")
    print(
        f"Endpoint=sb://{args.endpoint}/;SharedAccessKeyName={args.name};SharedAccessKey={key};"
        "UseDevelopmentEmulator=true"
    )
    return 0


def _add(args: argparse.Namespace) -> int:
    path: Path = args.users_file
    document = _load(path)
    old = document["users"].get(args.name)
    entry: dict[str, Any] = (
        dict(old)
        if isinstance(old, dict)
        else {"password": old, **FULL.to_json()}
        if isinstance(old, str)
        else dict(FULL.to_json())
    )
    if args.no_password:
        entry.pop("password", None)
    else:
        entry["password"] = hash_password(_password(args.password_stdin))
    for permission in Permission:
        value = getattr(args, permission.value)
        if value is not None:
            entry[permission.value] = value
    token = None
    if args.token:
        token = secrets.token_urlsafe(32)
        entry["token_sha256"] = token_hash(token)
    Grants.parse(args.name, entry)  # a pattern that does not compile is refused here
    document["users"][args.name] = entry
    UserStore.parse(document, str(path))
    _save(path, document)
    print(f"user {args.name!r} saved in {path}", file=sys.stderr)
    if token is not None:
        print(token)  # stdout: `SPATE_ADMIN_TOKEN=$(spate user add ... --token)`
    return 0
