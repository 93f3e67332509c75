"""Consumer group statistics (003 "Consumer Group Statistics", ADR 0015), pure.

Everything comes from what partitions already store (ADR 0012's offset table) and report:

| statistic | source, on partition p |
|---|---|
| committed offset | the stored offset of the reserved consumer name `$group/<g>` (None: nothing) |
| epoch | the stored value of `$epoch/<g>` (None: never granted) |
| owner attached | links of `$group/<g>` attached at p's leader (0 or 1: ownership is exclusive) |
| end offset | p's end offset (the offset the next message gets) |
| lag | end - committed - 1, at most the retained messages (all of them: none committed) |

A group *exists* on a stream when it is defined (metadata) or seen: a partition stores a
committed offset for it. Partitions the answering process does not host are shown as not
available and count for nothing.

The coordinator's figures (members, generation, assignment) are not known here yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spate.core.backend import ConsumerOffset, PartitionInfo
from spate.core.groups import GroupDefinition, committed_name, epoch_name, group_of
from spate.core.ids import PartitionId, StreamName


@dataclass(frozen=True, slots=True)
class GroupPartition:
    partition: PartitionId
    available: bool
    """Hosted by the answering process; the figures below are None/False otherwise."""
    owner_attached: bool = False
    epoch: int | None = None
    committed: int | None = None
    end_offset: int | None = None
    lag: int | None = None


@dataclass(frozen=True, slots=True)
class GroupStats:
    stream: StreamName
    name: str
    definition: GroupDefinition | None
    """None: not defined, seen by its committed offsets only."""
    partitions: tuple[GroupPartition, ...]
    """Every partition of the stream, in order."""

    @property
    def links_attached(self) -> int:
        return sum(p.owner_attached for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)


def lag(committed: int | None, info: PartitionInfo) -> int:
    """Messages after the committed offset that the partition still holds."""
    if committed is None:
        return info.messages
    return max(0, min(info.end_offset - committed - 1, info.messages))


def seen(offsets: Mapping[PartitionId, Sequence[ConsumerOffset]]) -> set[str]:
    """Groups with a committed offset on some partition."""
    return {g for entries in offsets.values() for c in entries if (g := group_of(c.name))}


def describe(  # noqa: PLR0917 - the three sources and what to describe, each named at the call
    stream: StreamName,
    name: str,
    definition: GroupDefinition | None,
    partitions: int,
    offsets: Mapping[PartitionId, Sequence[ConsumerOffset]],
    infos: Mapping[PartitionId, PartitionInfo],
) -> GroupStats:
    """`name`'s statistics on the `partitions` partitions of `stream`, from the stored offsets
    and figures of the partitions hosted here."""
    committed_key, epoch_key = committed_name(name), epoch_name(name)
    rows = []
    for index in range(partitions):
        pid = PartitionId(index)
        info = infos.get(pid)
        if pid not in offsets or info is None:
            rows.append(GroupPartition(pid, available=False))
            continue
        by_name = {c.name: c for c in offsets[pid]}
        owner = by_name.get(committed_key)
        epoch = by_name.get(epoch_key)
        committed = None if owner is None else owner.offset
        rows.append(
            GroupPartition(
                pid,
                available=True,
                owner_attached=owner is not None and owner.attached > 0,
                epoch=None if epoch is None else epoch.offset,
                committed=committed,
                end_offset=info.end_offset,
                lag=lag(committed, info),
            )
        )
    return GroupStats(stream, name, definition, tuple(rows))


def summaries(
    stream: StreamName,
    definitions: Sequence[GroupDefinition],
    partitions: int,
    offsets: Mapping[PartitionId, Sequence[ConsumerOffset]],
    infos: Mapping[PartitionId, PartitionInfo],
) -> list[GroupStats]:
    """Every group of `stream`, defined or seen, by name."""
    defined = {d.name: d for d in definitions if d.stream == stream}
    names = sorted(set(defined) | seen(offsets))
    return [describe(stream, name, defined.get(name), partitions, offsets, infos) for name in names]
