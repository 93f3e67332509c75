"""Parsing of human sizes and durations (`10GB`, `64MB`, `6h`, `7d`) for the CLI and config."""

from __future__ import annotations

import re

from spate.core.errors import InvalidArgument

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DURATION_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 7 * 86_400_000,
}
_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """`10GB` -> 10_000_000_000; `64MiB` -> 67_108_864; a bare number is bytes."""
    match = _NUMBER_UNIT.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise InvalidArgument(
            f"cannot read size {text!r}: use a number with one of "
            "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration_ms(text: str) -> int:
    """`6h` -> 21_600_000; `500ms` -> 500; a bare number is seconds."""
    match = _NUMBER_UNIT.match(text)
    unit = match.group(2).lower() if match else None
    if unit == "":
        unit = "s"
    if match is None or unit not in _DURATION_UNITS_MS:
        raise InvalidArgument(
            f"cannot read duration {text!r}: use a number with one of ms, s, m, h, d, w"
        )
    return int(float(match.group(1)) * _DURATION_UNITS_MS[unit])


def format_bytes(count: int) -> str:
    """`64MiB` for exact binary sizes (as a user would have typed them), else `53.2KB`."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2)):
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    for unit, size in (("GB", 1000**3), ("MB", 1000**2), ("KB", 1000)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return f"{count}B"


def format_duration_ms(duration_ms: int) -> str:
    for unit in ("w", "d", "h", "m", "s"):
        size = _DURATION_UNITS_MS[unit]
        if duration_ms >= size and duration_ms % size == 0:
            return f"{duration_ms // size}{unit}"
    return f"{duration_ms}ms"
