"""Consumer group definitions (000 §4.5, 003 "Creating Consumer Groups", ADR 0015), pure.

A consumer group exists when links attach with `event-streams-consumer-group` (000 §4.5: "created
on first attach") and may also be *defined ahead* with `spate group create STREAM GROUP`: the
definition is configuration stored in the metadata service, one per (stream, group name),
carrying what the coordinator needs (strategy, session timeout, rebalance delay). It is not
safety state: ownership, epochs and committed offsets live in the partitions' logs under the
reserved consumer names below (ADR 0015), so deleting a definition forgets no offset.

Names: a group name is non-empty UTF-8 of at most `limits.group_name_bytes_max` (256) bytes
and must not start with `$` (names beginning with `$` are reserved, as consumer names are).

Reserved consumer names in a partition's offset table (ADR 0012's table, ADR 0015):

| name | value |
|---|---|
| `$group/<g>` | the group's committed offset on the partition |
| `$epoch/<g>` | the current owner epoch of the partition for the group |
| `$generation/<g>` | the coordinator's generation (partition 0, next) |

`version` is the metadata version that created the definition; a definition never changes
after creation (delete and create again), so (stream, name, version) identifies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from spate.core import limits
from spate.core.errors import InvalidArgument
from spate.core.ids import StreamName
from spate.core.streams import validate_stream_name

RESERVED_PREFIX = "$"
"""Consumer names starting with it belong to groups; links may not use them."""
COMMITTED_PREFIX = "$group/"
EPOCH_PREFIX = "$epoch/"
GENERATION_PREFIX = "$generation/"
EVENTHUBS_PREFIX = "eventhubs:"
"""Groups named `eventhubs:<cg>` are Event Hubs consumer groups' owner levels (ADR 0021): a
claim with an epoch *equal* to the owner's takes over too, as Event Hubs lets a receiver with an
owner level >= the current one take over; every other rule of ADR 0015 holds."""


def takes_over_at_equal_epoch(group: str) -> bool:
    """Whether a claim for `group` whose epoch equals the owner's displaces it (Event Hubs'
    owner-level rule) rather than being refused (ADR 0015's rule: only a greater epoch)."""
    return group.startswith(EVENTHUBS_PREFIX)


class Strategy(Enum):
    """How the coordinator assigns partitions to members (003 "Consumer Group Strategies")."""

    ROUND_ROBIN = "round-robin"
    RANGE = "range"
    STICKY = "sticky"


STRATEGY_DEFAULT = Strategy.ROUND_ROBIN

GroupKey = tuple[StreamName, str]
"""(stream, group name): how definitions are keyed."""


@dataclass(frozen=True, slots=True)
class GroupDefinition:
    """A consumer group defined ahead, as the metadata service stores it."""

    stream: StreamName
    name: str
    strategy: Strategy = STRATEGY_DEFAULT
    session_timeout_ms: int = limits.group_session_timeout_ms_default
    rebalance_delay_ms: int = limits.group_rebalance_delay_ms_default
    version: int = 0
    pending_max: int = limits.group_pending_max_default
    """Members beyond the partition count kept waiting (000 §4.5.1); then detach-forced."""
    """The metadata version that created it (0 before it is stored)."""

    @property
    def key(self) -> GroupKey:
        return (self.stream, self.name)


def validate_group_name(name: str) -> None:
    """InvalidArgument naming the rule a group name breaks."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a consumer group name must be a non-empty string")
    if name.startswith(RESERVED_PREFIX):
        raise InvalidArgument(
            f"consumer group name {name!r} starts with '{RESERVED_PREFIX}', which is reserved"
        )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"consumer group name {name!r} is not valid UTF-8") from None
    if size > limits.group_name_bytes_max:
        raise InvalidArgument(
            f"consumer group name is {size} bytes of UTF-8; the limit is "
            f"{limits.group_name_bytes_max}"
        )


def define(
    stream: str,
    name: str,
    *,
    strategy: Strategy | str | None = None,
    session_timeout_ms: int | None = None,
    rebalance_delay_ms: int | None = None,
    pending_max: int | None = None,
) -> GroupDefinition:
    """The definition for `spate group create` (version 0), defaults filled in, or
    InvalidArgument naming the field."""
    validate_stream_name(stream)
    validate_group_name(name)
    if strategy is None:
        chosen = STRATEGY_DEFAULT
    elif isinstance(strategy, Strategy):
        chosen = strategy
    else:
        try:
            chosen = Strategy(strategy)
        except ValueError:
            known = ", ".join(s.value for s in Strategy)
            raise InvalidArgument(f"strategy must be one of {known}, got {strategy!r}") from None
    session = limits.group_session_timeout_ms_default
    if session_timeout_ms is not None:
        session = session_timeout_ms
    low, high = limits.group_session_timeout_ms_min, limits.group_session_timeout_ms_max
    if not low <= session <= high:
        raise InvalidArgument(
            f"session-timeout-ms must be between {low} and {high} ms, got {session}"
        )
    delay = limits.group_rebalance_delay_ms_default
    if rebalance_delay_ms is not None:
        delay = rebalance_delay_ms
    if not 0 <= delay <= limits.group_rebalance_delay_ms_max:
        raise InvalidArgument(
            f"rebalance-delay-ms must be between 0 and {limits.group_rebalance_delay_ms_max} "
            f"ms, got {delay}"
        )
    pending = limits.group_pending_max_default if pending_max is None else pending_max
    if not 0 <= pending <= limits.group_pending_max_max:
        raise InvalidArgument(
            f"pending-max must be between 0 and {limits.group_pending_max_max}, got {pending}"
        )
    return GroupDefinition(StreamName(stream), name, chosen, session, delay, pending_max=pending)


def validate(definition: GroupDefinition) -> GroupDefinition:
    """`define`'s rules applied to a definition from elsewhere (a command, a request)."""
    return define(
        definition.stream,
        definition.name,
        strategy=definition.strategy,
        session_timeout_ms=definition.session_timeout_ms,
        rebalance_delay_ms=definition.rebalance_delay_ms,
        pending_max=definition.pending_max,
    )


def find(
    definitions: Mapping[GroupKey, GroupDefinition], stream: StreamName, name: str
) -> GroupDefinition | None:
    """The definition of `name` on `stream` (None: not defined)."""
    return definitions.get((stream, name))


def of_stream(
    definitions: Mapping[GroupKey, GroupDefinition], stream: StreamName
) -> list[GroupDefinition]:
    """The definitions on `stream`, by name."""
    return sorted((d for (s, _), d in definitions.items() if s == stream), key=lambda d: d.name)


def committed_name(group: str) -> str:
    """The consumer name whose stored offset is the group's committed offset."""
    return COMMITTED_PREFIX + group


def epoch_name(group: str) -> str:
    """The consumer name whose stored value is the group's current owner epoch."""
    return EPOCH_PREFIX + group


def generation_name(group: str) -> str:
    """The consumer name (partition 0) whose stored value is the coordinator's last
    generation."""
    return GENERATION_PREFIX + group


def group_of(consumer_name: str) -> str | None:
    """The group whose committed offset `consumer_name` stores (`$group/<g>` -> g), or None."""
    if consumer_name.startswith(COMMITTED_PREFIX) and len(consumer_name) > len(COMMITTED_PREFIX):
        return consumer_name[len(COMMITTED_PREFIX) :]
    return None


def is_reserved(consumer_name: str) -> bool:
    """Whether a consumer name belongs to the groups' machinery (starts with `$`)."""
    return consumer_name.startswith(RESERVED_PREFIX)
