"""`spate user add|hash`: manage the SASL PLAIN users file read by `spate node run --users-file`."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any

from spate.core.errors import InvalidArgument
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
        description="Add NAME to the users file (created if missing) or "
        "change its password. Nodes read the file at start.",
    )
    add.add_argument("name", help="user name")
    add.add_argument("--users-file", type=Path, required=True, help="the JSON users file")
    add.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from standard input instead of prompting",
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


def _password(from_stdin: bool) -> str:
    password = sys.stdin.readline().rstrip("\n") if from_stdin else getpass.getpass("password: ")
    if not password:
        raise InvalidArgument("the password is empty")
    return password


def _hash(args: argparse.Namespace) -> int:
    print(hash_password(_password(args.password_stdin)))
    return 0


def _add(args: argparse.Namespace) -> int:
    path: Path = args.users_file
    document: dict[str, Any] = {"users": {}}
    if path.exists():
        try:
            document = json.loads(path.read_text())
        except ValueError as error:
            raise InvalidArgument(f"{path} is not a JSON users file: {error}") from error
        if not isinstance(document.get("users"), dict):
            raise InvalidArgument(f'{path} has no "users" object')
    document["users"][args.name] = hash_password(_password(args.password_stdin))
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(document, f, indent=2)
    tmp.replace(path)
    print(f"user {args.name!r} saved in {path}")
    return 0
