#!/usr/bin/env bash
# Build the native AMQP 1.0 load client into benchmarks/clients/build/ (gitignored).
#   benchmarks/clients/build.sh            -> prints the binary's path
# Needs gcc and Debian's libqpid-proton11-dev (apt-get install libqpid-proton11-dev gcc).
# Rebuilds only when amqp_load.c is newer than the binary.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=$HERE/build
BIN=$OUT/amqp_load
SRC=$HERE/amqp_load.c
# A fresh Debian machine lacks the headers: install them when we may (root with apt-get), else
# say exactly what is missing.
if [ ! -f /usr/include/proton/proactor.h ] || ! command -v "${CC:-gcc}" >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "build.sh: apt-get install libqpid-proton11-dev gcc libc6-dev" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            libqpid-proton11-dev gcc libc6-dev >/dev/null
    fi
fi
if [ ! -f /usr/include/proton/proactor.h ]; then
    echo "build.sh: /usr/include/proton/proactor.h missing: apt-get install libqpid-proton11-dev" >&2
    exit 1
fi
command -v "${CC:-gcc}" >/dev/null || { echo "build.sh: ${CC:-gcc} not found: apt-get install gcc" >&2; exit 1; }
mkdir -p "$OUT"
if [ ! -x "$BIN" ] || [ "$SRC" -nt "$BIN" ] || [ "$0" -nt "$BIN" ]; then
    # A temporary name of this build's own: two builds at once (two pytest-xdist workers, or
    # `make bench` beside `make test`) must not write one file, and the rename is atomic.
    "${CC:-gcc}" -O2 -g -Wall -Wextra -Werror -std=gnu11 -o "$BIN.tmp.$$" "$SRC" -lqpid-proton -lm
    mv -f "$BIN.tmp.$$" "$BIN"
fi
echo "$BIN"
