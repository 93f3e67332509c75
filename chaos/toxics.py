"""Toxics of the Toxiproxy API (https://github.com/Shopify/toxiproxy, README "Toxics"): what
each is, its attributes and their defaults, and what it does to a chunk of bytes. Pure: no
I/O, no clock, no randomness of its own (callers pass `now_s` and a `random.Random`); the
asyncio shell (chaos.toxiproxy) acts on the plans made here.

| type        | attributes (unit)                          | effect on a connection's stream      |
|-------------|--------------------------------------------|---------------------------------------|
| latency     | latency (ms), jitter (ms)                  | each chunk leaves latency ± jitter    |
|             |                                            | after it arrived (order kept)         |
| bandwidth   | rate (KB/s)                                | at most rate KB per second            |
| slow_close  | delay (ms)                                 | the close waits delay                 |
| timeout     | timeout (ms)                               | data is dropped; the connection is    |
|             |                                            | closed after timeout (0: never)       |
| reset_peer  | timeout (ms)                               | the connection is reset (RST) after   |
|             |                                            | timeout (0: at once)                  |
| slicer      | average_size, size_variation (bytes),      | chunks cut into pieces of about       |
|             | delay (us)                                 | average_size, delay between them      |
| limit_data  | bytes                                      | the connection is closed once this    |
|             |                                            | many bytes went through               |

`stream` is "upstream" (client to server) or "downstream" (server to client, the default);
`toxicity` (0..1, default 1) is the chance that the toxic applies to a given connection,
drawn once per connection and toxic, as Toxiproxy does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

STREAMS = ("upstream", "downstream")
DEFAULTS: dict[str, dict[str, int]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}
NAME_BYTES_MAX = 256
ATTRIBUTE_MAX = 1 << 40
"""Any attribute above this is a typo, not a fault to inject (2^40 ms is 35 years)."""
SLICES_MAX = 65_536
"""Pieces one chunk may be cut into (a slicer with average_size 1 on a 64 KiB read)."""


class InvalidToxic(ValueError):
    """A toxic the API refuses (HTTP 400); the message says which field and why."""


@dataclass(slots=True)
class Toxic:
    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


def parse(body: Any, existing: Toxic | None = None) -> Toxic:
    """A toxic from an API request body (POST .../toxics, or an update of `existing` with only
    some fields), checked: a known type, a known stream, toxicity in 0..1, integer attributes
    of the type in 0..ATTRIBUTE_MAX (others refused, missing ones at their default)."""
    if not isinstance(body, dict):
        raise InvalidToxic("a toxic is a JSON object")
    kind = body.get("type", existing.type if existing else None)
    if kind not in DEFAULTS:
        raise InvalidToxic(f"unknown toxic type {kind!r}; known: {', '.join(DEFAULTS)}")
    stream = body.get("stream", existing.stream if existing else "downstream")
    if stream not in STREAMS:
        raise InvalidToxic(f"stream must be 'upstream' or 'downstream', got {stream!r}")
    name = body.get("name", existing.name if existing else f"{kind}_{stream}")
    if not isinstance(name, str) or not 0 < len(name.encode()) <= NAME_BYTES_MAX:
        raise InvalidToxic(f"name must be a string of 1 to {NAME_BYTES_MAX} bytes")
    toxicity = body.get("toxicity", existing.toxicity if existing else 1.0)
    if isinstance(toxicity, bool) or not isinstance(toxicity, int | float):
        raise InvalidToxic("toxicity must be a number between 0 and 1")
    if not 0.0 <= toxicity <= 1.0:
        raise InvalidToxic(f"toxicity must be between 0 and 1, got {toxicity}")
    attributes = dict(DEFAULTS[kind])
    if existing is not None and existing.type == kind:
        attributes |= existing.attributes
    given = body.get("attributes", {})
    if not isinstance(given, dict):
        raise InvalidToxic("attributes must be a JSON object")
    for key, value in given.items():
        if key not in attributes:
            raise InvalidToxic(
                f"{kind} has no attribute {key!r}; it has {', '.join(DEFAULTS[kind])}"
            )
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= ATTRIBUTE_MAX:
            raise InvalidToxic(f"attribute {key!r} must be an integer from 0, got {value!r}")
        attributes[key] = value
    return Toxic(name, kind, stream, float(toxicity), attributes)


def applies(toxic: Toxic, rng: random.Random) -> bool:
    """Whether `toxic` acts on a new connection (drawn once per connection and toxic)."""
    return toxic.toxicity >= 1.0 or rng.random() < toxic.toxicity


def delay_s(toxics: list[Toxic], rng: random.Random) -> float:
    """How long after its arrival a chunk may leave: the sum of the latency toxics' latency
    with a uniform jitter of ± jitter each (never below zero)."""
    total = 0.0
    for toxic in toxics:
        if toxic.type == "latency":
            a = toxic.attributes
            jitter = a["jitter"]
            total += max(0.0, a["latency"] + (rng.uniform(-jitter, jitter) if jitter else 0.0))
    return total / 1000.0


def slices(data: bytes, toxics: list[Toxic], rng: random.Random) -> list[bytes]:
    """The pieces a chunk leaves in: cut by the first slicer with an average_size (whole
    otherwise). A piece is average_size ± size_variation bytes, at least one."""
    slicer = next((t for t in toxics if t.type == "slicer" and t.attributes["average_size"]), None)
    if slicer is None or not data:
        return [data]
    average, variation = slicer.attributes["average_size"], slicer.attributes["size_variation"]
    pieces: list[bytes] = []
    at = 0
    while at < len(data):
        size = max(1, average + (rng.randint(-variation, variation) if variation else 0))
        if len(pieces) == SLICES_MAX - 1:
            size = len(data) - at
        pieces.append(data[at : at + size])
        at += size
    return pieces


def piece_delay_s(toxics: list[Toxic]) -> float:
    """The pause after each piece: the slicers' delay (us) plus nothing else."""
    return sum(t.attributes["delay"] for t in toxics if t.type == "slicer") / 1_000_000


def rate_bytes_per_s(toxics: list[Toxic]) -> float | None:
    """The tightest bandwidth limit (KB/s as Toxiproxy: 1 KB = 1000 bytes), or None."""
    rates = [t.attributes["rate"] for t in toxics if t.type == "bandwidth"]
    return min(rates) * 1000.0 if rates else None


PACE_S = 0.1
"""A bandwidth-limited chunk leaves in parts of this much time at the rate (Toxiproxy: 100 ms)."""


def paced(data: bytes, rate: float | None) -> list[bytes]:
    """`data` in parts of PACE_S at `rate` bytes/s (whole without a rate)."""
    if not rate:
        return [data]
    size = max(1, int(rate * PACE_S))
    return [data[i : i + size] for i in range(0, len(data), size)] or [data]


def byte_limit(toxics: list[Toxic]) -> int | None:
    """The smallest limit_data, or None: the connection closes once that many bytes passed."""
    limits = [t.attributes["bytes"] for t in toxics if t.type == "limit_data"]
    return min(limits) if limits else None


def close_delay_s(toxics: list[Toxic]) -> float:
    return max((t.attributes["delay"] for t in toxics if t.type == "slow_close"), default=0) / 1000


@dataclass(frozen=True, slots=True)
class Cut:
    """What a connection's cutting toxics ask for: drop all data (`drop`), then after
    `after_s` either a reset (`reset`) or a close; `after_s` None: hold, never close."""

    drop: bool
    after_s: float | None
    reset: bool


def cut(toxics: list[Toxic]) -> Cut | None:
    """The earliest of the timeout and reset_peer toxics acting on a connection, or None."""
    best: Cut | None = None
    for toxic in toxics:
        if toxic.type == "reset_peer":
            candidate = Cut(False, toxic.attributes["timeout"] / 1000, True)
        elif toxic.type == "timeout":
            timeout = toxic.attributes["timeout"]
            candidate = Cut(True, timeout / 1000 if timeout else None, False)
        else:
            continue
        if best is None or _sooner(candidate, best):
            best = Cut(
                best.drop or candidate.drop if best else candidate.drop,
                candidate.after_s,
                candidate.reset,
            )
        elif candidate.drop:
            best = Cut(True, best.after_s, best.reset)
    return best


def _sooner(a: Cut, b: Cut) -> bool:
    if a.after_s is None:
        return False
    return b.after_s is None or a.after_s < b.after_s
