"""Rendering for the CLI: aligned tables, `key  value` blocks and JSON documents.

Commands build plain data (dicts, lists, strings) and pick a renderer by `--output`; only this
module decides how it looks. Nothing here talks to the network.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from typing import Any

from spate.core.units import format_bytes, format_duration_ms

OUTPUT_FORMATS = ("table", "json")

_NUMERIC = re.compile(r"^-?\d[\d.,]*(?:[A-Za-z]{0,3})?$")
EMPTY = "-"
"""Shown in a table cell that has no value (unset limit, empty partition)."""


def render_json(document: object) -> str:
    """One JSON document, keys in the order the command built them."""
    return json.dumps(document, indent=2, ensure_ascii=False)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns separated by two spaces; numeric-looking cells right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        assert len(row) == len(headers), (headers, row)
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    right = [
        bool(rows) and all(_NUMERIC.match(row[i]) or row[i] == EMPTY for row in rows)
        for i in range(len(headers))
    ]
    lines = []
    for row in [list(headers), *rows]:
        cells = [
            cell.rjust(widths[i]) if right[i] else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def render_fields(pairs: Sequence[tuple[str, str]]) -> str:
    """A `label  value` block with the values aligned."""
    width = max((len(label) for label, _ in pairs), default=0)
    return "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in pairs)


def size(count: int | None) -> str:
    return EMPTY if count is None else format_bytes(count)


def duration(duration_ms: int | None) -> str:
    return EMPTY if duration_ms is None else format_duration_ms(duration_ms)


def number(value: int | None) -> str:
    return EMPTY if value is None else str(value)


def liveness(alive: bool, heartbeat_age_ms: int) -> str:
    """`yes (2s ago)` / `NO (5m ago)`: whether a node is alive and its last heartbeat's age."""
    seconds = heartbeat_age_ms // 1000
    age = f"{seconds}s" if seconds < 120 else format_duration_ms(seconds // 60 * 60_000)
    return f"{'yes' if alive else 'NO'} ({age} ago)"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def retention_text(retention: dict[str, Any]) -> str:
    """`max-age 6h, max-bytes 10.0GB` or `forever`."""
    parts = []
    if retention.get("max_age_ms") is not None:
        parts.append(f"max-age {format_duration_ms(retention['max_age_ms'])}")
    if retention.get("max_bytes") is not None:
        parts.append(f"max-bytes {format_bytes(retention['max_bytes'])}")
    if retention.get("max_messages") is not None:
        parts.append(f"max-messages {retention['max_messages']}")
    return ", ".join(parts) if parts else "forever"


def timestamp(milliseconds: int) -> str:
    """An epoch-milliseconds time as UTC ISO 8601 (to the millisecond)."""
    moment = datetime.datetime.fromtimestamp(milliseconds / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
