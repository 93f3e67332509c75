"""The `spate` console script: one argparse tree, subcommands registered by modules.

Each module in COMMAND_MODULES exposes `register(subparsers) -> None`; it adds its subcommands
and sets `run=<function(args) -> int>` on each leaf parser. Adding a command group is a one-line
change to the tuple. Failures end as `spate: <message>` on stderr with an exit code from
EXIT_CODES, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NoReturn

from spate.core.errors import BrokerError, ErrorCode

COMMAND_MODULES: tuple[str, ...] = (
    "spate.cli.admin",
    "spate.cli.dev",
    "spate.cli.gateway",
    "spate.cli.node",
    "spate.cli.perf",
    "spate.cli.user",
    "spate.cli.ops",  # after admin and node: adds verbs to `partition` and `node`
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # also argparse's own code for a malformed command line

EXIT_CODES: Mapping[ErrorCode, int] = MappingProxyType(
    {
        ErrorCode.INVALID_ARGUMENT: EXIT_USAGE,
        ErrorCode.NOT_FOUND: 3,
        ErrorCode.ALREADY_EXISTS: 4,
        ErrorCode.UNAVAILABLE: 5,
        ErrorCode.NOT_LEADER: 5,
    }
)
"""Exit code per error code; any other failure exits with EXIT_FAILURE."""

_EPILOG = """\
exit codes: 0 success, 1 other failure, 2 invalid command or argument, 3 not found,
4 already exists, 5 cluster unavailable (nothing listening, or no metadata leader)"""


class CommandFailed(Exception):
    """A command's failure that is not a BrokerError of this process, with its exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class SpateArgumentParser(argparse.ArgumentParser):
    """Usage errors read like every other failure: `spate: <message>`, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"spate: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = SpateArgumentParser(
        prog="spate",
        description="Spate: a partitioned, Raft-replicated event-stream broker speaking AMQP 1.0.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(
        title="commands", metavar="COMMAND", dest="command", required=True
    )
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # here, so that a closed pipe is caught below
    except BrokerError as error:
        print(f"spate: {error.message}", file=sys.stderr)
        return EXIT_CODES.get(error.code, EXIT_FAILURE)
    except CommandFailed as failure:
        print(f"spate: {failure.message}", file=sys.stderr)
        return failure.exit_code
    except KeyboardInterrupt:
        print("spate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `spate ... | head`: the reader left. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again, and exit as a shell command killed by SIGPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


if __name__ == "__main__":  # `python -m spate.cli.main`: run the package's module, not a copy
    from spate.cli.main import main as package_main

    sys.exit(package_main())
