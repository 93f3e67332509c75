"""Builds Spate's one C extension, spate.gateway._fastsend (ADR 0030), in place:
src/gateway/_fastsend<EXT_SUFFIX>, with the C compiler and headers of the Python running this
script (tools/bootstrap.sh runs it with the venv's; Debian needs gcc and python3-dev).

Usage: python tools/build_native.py [--check]   (--check: exit 1 unless the module imports and
is newer than its source; nothing is built)

Spate runs without it (the same sends in pure Python, `spate.gateway.fastsend`), so a machine
without a compiler still serves; the consumers' hot path is then ~2x slower per delivery."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "gateway" / "_fastsend.c"


def target() -> Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return SOURCE.with_name("_fastsend" + suffix)


def build() -> Path:
    out = target()
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    command = [
        *cc, "-O2", "-fPIC", "-shared", "-Wall", "-Werror", "-std=c11",
        f"-I{include}", str(SOURCE), "-o", str(out),
    ]  # fmt: skip
    subprocess.run(command, check=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only test that it is built")
    args = parser.parse_args()
    out = target()
    if args.check:
        fresh = out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime
        print(f"{out}: {'built' if fresh else 'missing or stale'}")
        return 0 if fresh else 1
    print(f"build_native: {build()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
