"""Typed identifiers shared by every package. One meaning per word; see docs/glossary.md."""

from __future__ import annotations

from typing import NewType

StreamName = NewType("StreamName", str)
"""A stream's name, also its AMQP address (`orders`)."""

PartitionId = NewType("PartitionId", int)
"""Zero-based partition number within a stream."""

Offset = NewType("Offset", int)
"""Position of a message in one partition's log, counting from 0. Never reused."""

NodeId = NewType("NodeId", str)
"""A storage node's stable name (`n1`)."""

Term = NewType("Term", int)
"""Raft term of a partition's replication group."""

LeaderEpoch = NewType("LeaderEpoch", int)
"""Increases every time a partition gets a new leader; visible to clients."""

OFFSET_SYMBOL_DIGITS = 20
"""Offsets travel as fixed-width decimal symbols so that lexicographic order is log order
(000_e36e0ffc94de3955.txt §5.1.1). 20 digits hold any unsigned 64-bit value."""


def offset_to_symbol(offset: Offset) -> str:
    """Encode an offset as the opaque `event-streams-offset` symbol text."""
    assert 0 <= offset < 10**OFFSET_SYMBOL_DIGITS, offset
    return f"{offset:0{OFFSET_SYMBOL_DIGITS}d}"


def offset_from_symbol(text: str) -> Offset | None:
    """Decode an `event-streams-offset` symbol; None when it is not one of ours."""
    if len(text) != OFFSET_SYMBOL_DIGITS or not text.isdigit():
        return None
    return Offset(int(text))


MemberId = NewType("MemberId", int)
"""A consumer-group member, numbered by its coordinator as it joins (1, 2, ...; never reused
within one coordinator's life). Member order is this order."""

Generation = NewType("Generation", int)
"""A consumer group's assignment round: one more on every rebalance, stored before any member
learns the assignment, so it never goes back (ADR 0015)."""
