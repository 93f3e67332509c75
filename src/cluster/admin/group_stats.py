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
committed offset for it, or partition 0 a generation (`$generation/<g>`: it had coordinator
members); `spate group describe` also finds a group its coordinator knows. Partitions the
answering process does not host are shown as not available and count for nothing.

The coordinator's figures come from its `GroupView` (`GroupCoordinator.describe`, at the
leader of partition 0, asked by the admin server through the node's broker):

| statistic | source |
|---|---|
| state | the view's (Stable, Rebalancing); Empty: no such group there now (no members); |
|       | None: the coordinator could not be asked (`coordinator_unavailable` says why) |
| generation | the view's; else the stored `$generation/<g>` of partition 0, if hosted here |
| members | the view's, in joining order: partitions held, being released, heartbeat age |
|         | (`now_ms - last_heartbeat_ms`, on the coordinator's clock), session timeout |
| member of partition p | the member holding p (staying or releasing) |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spate.core.backend import ConsumerOffset, PartitionInfo
from spate.core.coordinator import GroupView
from spate.core.groups import (
    GENERATION_PREFIX,
    GroupDefinition,
    committed_name,
    epoch_name,
    generation_name,
    group_of,
)
from spate.core.ids import MemberId, PartitionId, StreamName

EMPTY = "Empty"
"""The state of a group its coordinator does not know now (next to GroupState's values)."""


@dataclass(frozen=True, slots=True)
class Coordination:
    """What the admin server learnt from the coordinator of one group."""

    view: GroupView | None
    """None: the coordinator has no such group now (or was not reached)."""
    unavailable: str | None = None
    """Why the coordinator could not be asked (None: it answered)."""


@dataclass(frozen=True, slots=True)
class GroupMember:
    member: MemberId
    partitions: tuple[PartitionId, ...]
    releasing: tuple[PartitionId, ...]
    heartbeat_age_ms: int
    session_timeout_ms: int


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
    member: MemberId | None = None
    """The coordinator's member holding it (None: nobody, or not asked)."""


@dataclass(frozen=True, slots=True)
class GroupStats:
    stream: StreamName
    name: str
    definition: GroupDefinition | None
    """None: not defined, seen by its committed offsets only."""
    partitions: tuple[GroupPartition, ...]
    """Every partition of the stream, in order."""
    state: str | None = None
    """Stable, Rebalancing or Empty; None when the coordinator could not be asked."""
    generation: int | None = None
    members: tuple[GroupMember, ...] = ()
    coordinator_unavailable: str | None = None

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
    """Groups with a committed offset on some partition or a generation on partition 0."""
    found = {g for entries in offsets.values() for c in entries if (g := group_of(c.name))}
    for c in offsets.get(PartitionId(0), ()):
        if c.name.startswith(GENERATION_PREFIX) and len(c.name) > len(GENERATION_PREFIX):
            found.add(c.name[len(GENERATION_PREFIX) :])
    return found


def members(view: GroupView) -> tuple[GroupMember, ...]:
    return tuple(
        GroupMember(
            m.member,
            tuple(sorted(m.partitions)),
            tuple(sorted(m.release)),
            max(0, view.now_ms - m.last_heartbeat_ms),
            m.session_timeout_ms,
        )
        for m in view.members
    )


def holders(view: GroupView | None) -> dict[PartitionId, MemberId]:
    """partition -> the member holding it (staying or releasing)."""
    if view is None:
        return {}
    return {p: m.member for m in view.members for p in m.partitions | m.release}


def describe(  # noqa: PLR0917 - the three sources and what to describe, each named at the call
    stream: StreamName,
    name: str,
    definition: GroupDefinition | None,
    partitions: int,
    offsets: Mapping[PartitionId, Sequence[ConsumerOffset]],
    infos: Mapping[PartitionId, PartitionInfo],
    coordination: Coordination,
) -> GroupStats:
    """`name`'s statistics on the `partitions` partitions of `stream`, from the stored offsets
    and figures of the partitions hosted here and what its coordinator said."""
    committed_key, epoch_key = committed_name(name), epoch_name(name)
    view = coordination.view
    held_by = holders(view)
    rows = []
    for index in range(partitions):
        pid = PartitionId(index)
        info = infos.get(pid)
        if pid not in offsets or info is None:
            rows.append(GroupPartition(pid, available=False, member=held_by.get(pid)))
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
                member=held_by.get(pid),
            )
        )
    if view is not None:
        state: str | None = view.state.value
        generation: int | None = view.generation
    else:
        state = None if coordination.unavailable is not None else EMPTY
        generation = stored_generation(name, offsets)
    return GroupStats(
        stream,
        name,
        definition,
        tuple(rows),
        state,
        generation,
        () if view is None else members(view),
        coordination.unavailable,
    )


def stored_generation(
    name: str, offsets: Mapping[PartitionId, Sequence[ConsumerOffset]]
) -> int | None:
    """`$generation/<name>` on partition 0, when hosted here."""
    key = generation_name(name)
    found = [c.offset for c in offsets.get(PartitionId(0), ()) if c.name == key]
    return found[0] if found else None


def summaries(  # noqa: PLR0917 - the sources, each named at the call
    stream: StreamName,
    definitions: Sequence[GroupDefinition],
    partitions: int,
    offsets: Mapping[PartitionId, Sequence[ConsumerOffset]],
    infos: Mapping[PartitionId, PartitionInfo],
    coordination: Mapping[str, Coordination],
) -> list[GroupStats]:
    """Every group of `stream` in `names(...)`, by name, with what its coordinator said."""
    defined = {d.name: d for d in definitions if d.stream == stream}
    return [
        describe(stream, name, defined.get(name), partitions, offsets, infos, coordination[name])
        for name in names(stream, definitions, offsets)
    ]


def names(
    stream: StreamName,
    definitions: Sequence[GroupDefinition],
    offsets: Mapping[PartitionId, Sequence[ConsumerOffset]],
) -> list[str]:
    """Every group of `stream`, defined or seen, by name."""
    return sorted({d.name for d in definitions if d.stream == stream} | seen(offsets))
