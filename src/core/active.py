"""Single active consumer groups of one partition, kept by its leader (pure; ADR 0013).

Receivers that attach with `spate:consumer-name` and `spate:single-active-consumer` = true
form a group per (stream, partition, name). Members are numbered as they join (1, 2, 3, ...
per partition, never reused); the member that joined first among those still here is the
active one. When it leaves, the next one in joining order becomes active; a watcher
registered for a member is told exactly once: True when it is (or becomes) active, False when
it leaves first. A name is used either by one group or by plain named links, never both
(`Conflict`), so that "the one active consumer" means what it says.

Node-local, like the attached-link counts of offset tracking: a new leader starts with no
groups, and the members' links, redirected or re-routed there, join again in the order they
arrive.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

Watcher = Callable[[bool], None]


class Conflict(Exception):
    """A name is already used the other way (single active or plain)."""


@dataclass
class ActiveGroups:
    groups: dict[bytes, list[int]] = field(default_factory=dict)
    """name -> members in joining order (the first is active)."""
    watchers: dict[int, Watcher] = field(default_factory=dict)
    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def join(self, name: bytes, plain_links: int) -> tuple[int, bool]:
        """A member joins `name`'s group: (its number, whether it is active). `plain_links`:
        the links of that name attached without single-active-consumer."""
        if plain_links:
            raise Conflict(
                f"{plain_links} link(s) of consumer {_text(name)} are attached without "
                "single-active-consumer"
            )
        member = next(self.numbers)
        members = self.groups.setdefault(name, [])
        members.append(member)
        return member, len(members) == 1

    def check_plain(self, name: bytes) -> None:
        """A plain named link may attach only while `name` has no group."""
        members = self.groups.get(name)
        if members:
            raise Conflict(
                f"consumer {_text(name)} is a single-active-consumer group of {len(members)} "
                "link(s); attach with spate:single-active-consumer = true to join it"
            )

    def active(self, name: bytes) -> int | None:
        members = self.groups.get(name)
        return members[0] if members else None

    def size(self, name: bytes) -> int:
        return len(self.groups.get(name, ()))

    def watch(self, name: bytes, member: int, watcher: Watcher) -> None:
        """Tell `watcher` once: True when `member` is or becomes active, False when it has left
        (or never was here)."""
        members = self.groups.get(name, [])
        if member not in members:
            watcher(False)
        elif members[0] == member:
            watcher(True)
        else:
            self.watchers[member] = watcher

    def disband(self) -> None:
        """Forget every group (the partition's leadership moved elsewhere); member numbers go
        on from where they were, so a late `leave` of an old member touches nothing new."""
        self.groups.clear()
        self.watchers.clear()

    def leave(self, name: bytes, member: int) -> int | None:
        """`member` leaves; returns the member that became active because of it (None: the
        active one did not change, or nobody is left)."""
        members = self.groups.get(name)
        if not members or member not in members:
            return None
        was_active = members[0] == member
        members.remove(member)
        if not members:
            del self.groups[name]
        watcher = self.watchers.pop(member, None)
        if watcher is not None:
            watcher(False)
        if not was_active or not members:
            return None
        promoted = members[0]
        watcher = self.watchers.pop(promoted, None)
        if watcher is not None:
            watcher(True)
        return promoted


def _text(name: bytes) -> str:
    return repr(name.decode(errors="replace"))
