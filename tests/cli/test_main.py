"""`spate`'s entry point: what every command shares."""

from __future__ import annotations

import subprocess
import sys

_LONG_OUTPUT = """
import argparse, sys
from spate.cli import main as cli

def build():
    parser = argparse.ArgumentParser()
    parser.set_defaults(run=lambda args: [print("x" * 79) for _ in range(100_000)] and 0)
    return parser

cli.build_parser = build
sys.exit(cli.main([]))
"""


def test_a_reader_that_leaves_early_ends_the_command_quietly() -> None:
    # `spate partition list big | head`: head exits after one line. The command stops as a
    # shell command killed by SIGPIPE does (141), with no traceback on stderr.
    done = subprocess.run(
        [
            "bash",
            "-c",
            f'"{sys.executable}" -c "$0" | head -1; exit ${{PIPESTATUS[0]}}',
            _LONG_OUTPUT,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout == "x" * 79 + "\n"
    assert done.stderr == ""
    assert done.returncode == 141
