"""Source filters that select where a consumer starts (000_e36e0ffc94de3955.txt §5.2).

Where the OASIS map form can say it, the filter uses it: `{event-streams-offset: X}` matches
offsets strictly after X and `{event-streams-timestamp: T}` events strictly after T, so `first` is
`@earliest`, `next` is `@latest`, absolute offset N is "after N-1" and timestamp T is "after T-1".
`last` and relative (-N) have no OASIS spelling; they use Spate's simple forms under the same
descriptor (documented in src/gateway/README.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from proton import Described, symbol, timestamp, ulong
from spate.core.ids import Offset, offset_to_symbol

ES_FILTER = ulong(0x00000000_00000200)
FILTER_KEY = symbol("event-streams-offset-filter")
K_OFFSET = symbol("event-streams-offset")
K_TIMESTAMP = symbol("event-streams-timestamp")

Start = str | int | datetime


def offset_filter(start: Start) -> dict[symbol, Any]:
    """`first`, `last`, `next`, an offset N >= 0, a relative -N, or a datetime (UTC instant)."""
    value: Any
    if isinstance(start, datetime):
        ms = int(start.timestamp() * 1000)
        value = {K_TIMESTAMP: timestamp(ms - 1)}
    elif isinstance(start, bool):
        raise TypeError("start must be first/last/next, an int or a datetime")
    elif isinstance(start, int):
        if start < 0:
            value = start  # relative: |start| messages before the end
        elif start == 0:
            value = {K_OFFSET: symbol("@earliest")}
        else:
            value = {K_OFFSET: symbol(offset_to_symbol(Offset(start - 1)))}
    elif start == "first":
        value = {K_OFFSET: symbol("@earliest")}
    elif start == "next":
        value = {K_OFFSET: symbol("@latest")}
    elif start == "last":
        value = symbol("last")
    else:
        raise ValueError(
            f"unknown start {start!r}: use first, last, next, an offset, -N or a datetime"
        )
    return {FILTER_KEY: Described(ES_FILTER, value)}
