"""Single active consumer groups of one partition, kept by its leader (pure; ADR 0013).

Receivers that attach with `spate:consumer-name` and `spate:single-active-consumer` = true
form a group per (stream, partition, name). Members are numbered as they join (1, 2, 3, ...
per partition, never reused). One member at a time is *current*: the one the partition's
messages go to. Which member should be current — the *designated* one — is the first still
here, or, for a partition of a super stream (`spread` = the partition's index in it), member
number `spread % size` in joining order, so that consumers of a super stream spread their
active links over its partitions (004 "Single Active Consumer Support", RabbitMQ's rule).

When the designated member changes while another is current (a member joined or left a
spread group), the current one is asked to step down (`watch_deposed`); it stops receiving,
stores what it finished and reports `stepped_down`; only then does the designated member
become current (`watch`), so that it starts after what the one before it stored. When the
current member leaves, the designated one takes over at once. Each watcher is told once.

A name is used either by one group or by plain named links, never both (`Conflict`), so that
"the one active consumer" means what it says.

*Exclusive* groups (`claim`; consumer groups, ADR 0015, 000 §4.5.2) are the same machinery
with epochs: the designated member is the newest claimer, a claim is granted only when nobody
owns the partition or it carries an epoch above the group's, and the member it displaces steps
down (stores what it finished) before the claimer becomes current — then leaves.

Event Hubs groups (`claim(at_equal=True)`, ADR 0021 addendum) follow Event Hubs' owner-level
rules: an equal epoch takes over too, and a claim *without* an epoch is a *shared* member
(a receiver without owner level): any number of them receive side by side while no member
with an epoch is there, they never commit (never current), a claim without an epoch is refused
(`Owned`) while one with an epoch is there, and a claim with an epoch deposes every shared
member (each steps down and leaves) before it becomes current.

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
    """A name is already used the other way (single active or plain), or with another spread."""


class Owned(Exception):
    """An exclusive group's partition is owned and the claim's epoch is not above its epoch."""

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


class Stale(Exception):
    """A claim's epoch is below the group's stored epoch: epochs never go back."""

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


@dataclass
class Group:
    members: list[int]
    """In joining order."""
    spread: int | None
    """The partition's index in its super stream (None: the first member is designated)."""
    current: int | None
    """The member receiving now (None: between a step-down and the next member's turn)."""
    stepping_down: bool = False
    """`current` was asked to step down and has not reported it yet."""
    epoch: int | None = None
    """Exclusive groups (`ActiveGroups.claim`): the newest claim's epoch; None for single
    active consumer groups."""
    generation: int | None = None
    """Exclusive groups whose holders a coordinator assigns: the newest claim's generation."""
    shared: list[int] = field(default_factory=list)
    """Event Hubs groups: the members receiving without an epoch (all at once, none current;
    also in `members`)."""

    def holders(self) -> list[int]:
        """The members with an epoch: the holder and the claims waiting for it."""
        return [m for m in self.members if m not in self.shared]

    def designated(self) -> int:
        if self.epoch is not None:
            return self.members[-1]  # the newest claim takes over
        if self.spread is None:
            return self.members[0]
        return self.members[self.spread % len(self.members)]


@dataclass
class ActiveGroups:
    groups: dict[bytes, Group] = field(default_factory=dict)
    activation: dict[int, Watcher] = field(default_factory=dict)
    """member -> told True when it becomes current, False when it leaves first."""
    deposal: dict[int, Watcher] = field(default_factory=dict)
    """current member -> told True when it must step down, False when it leaves first."""
    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def join(self, name: bytes, plain_links: int, spread: int | None = None) -> tuple[int, bool]:
        """A member joins `name`'s group: (its number, whether it is current). `plain_links`:
        the links of that name attached without single-active-consumer."""
        if plain_links:
            raise Conflict(
                f"{plain_links} link(s) of consumer {_text(name)} are attached without "
                "single-active-consumer"
            )
        group = self.groups.get(name)
        if group is not None and group.epoch is not None:
            raise Conflict(f"{_text(name)} is a consumer group's partition; claim it instead")
        if group is not None and group.spread != spread:
            raise Conflict(
                f"consumer {_text(name)} is a single-active-consumer group "
                + ("of a super stream's partition" if group.spread is not None else "of a stream")
                + "; its members attach the same way"
            )
        member = next(self.numbers)
        if group is None:
            self.groups[name] = Group([member], spread, member)
            return member, True
        group.members.append(member)
        self._rebalance(group)
        return member, False

    def attach(
        self, name: bytes, attached: int, *, single_active: bool, spread: int | None = None
    ) -> tuple[int, bool]:
        """A named link attaches (`attached`: the name's links attached already, members
        included): (member number, current) — (0, True) for a plain link."""
        if not single_active:
            self.check_plain(name)
            return 0, True
        return self.join(name, attached - self.size(name), spread)

    def claim(  # noqa: PLR0917 (the claim and what the partition stored)
        self,
        name: bytes,
        epoch: int | None,
        stored_epoch: int,
        plain_links: int = 0,
        generation: int | None = None,
        stored_generation: int = 0,
        *,
        at_equal: bool = False,
    ) -> tuple[int, int, bool]:
        """A link claims `name`'s partition for its exclusive group: (member number, the
        granted epoch, whether it is current now). Granted when nobody holds it — with
        `epoch` if given (`Stale` below `stored_epoch`, the durable one), else the current
        epoch — or when `epoch` is above the group's (`at_equal`: or equal to it, Event Hubs'
        owner-level rule): then the member holding it (or a claim still waiting for it, told
        False) is displaced, and the claimer becomes current once the holder `stepped_down`.
        Otherwise `Owned`. `at_equal` without `epoch`: a shared member (module docstring)."""
        if plain_links:
            raise Conflict(
                f"{plain_links} link(s) of {_text(name)} are attached without a consumer group"
            )
        group = self.groups.get(name)
        if group is not None and group.epoch is None:
            raise Conflict(f"{_text(name)} is a single-active-consumer group")
        if group is not None and (group.generation is None) != (generation is None):
            raise Conflict(
                f"{_text(name)} is held by a link the group's coordinator assigned; links with "
                "their own partition and epoch cannot share it"
                if generation is None
                else f"{_text(name)} is held by a link with its own partition and epoch"
            )
        current = stored_epoch if group is None else max(stored_epoch, group.epoch or 0)
        if generation is not None:
            return self._claim_assigned(name, group, current, generation, stored_generation)
        if at_equal and epoch is None:
            return self._share(name, group, current)
        if epoch is not None and epoch < stored_epoch:
            raise Stale(
                f"epoch {epoch} is below {_text(name)}'s epoch {stored_epoch}; epochs never go "
                "back: attach with a greater one to take over",
                stored_epoch,
            )
        member = next(self.numbers)
        if group is None:
            granted = current if epoch is None else epoch
            self.groups[name] = Group([member], None, member, epoch=granted)
            return member, granted, True
        if epoch is None or epoch < current or (epoch == current and not at_equal):
            raise Owned(
                f"{_text(name)} is owned at epoch {current}; attach with an epoch "
                + ("at or above" if at_equal else "above")
                + " it to take over",
                current,
            )
        self._displace_waiting(group)  # an earlier claim not granted yet
        group.members.append(member)
        group.epoch = epoch
        if group.shared:  # receivers without an epoch give way first (each leaves)
            for holder in group.shared:
                told = self.deposal.pop(holder, None)
                if told is not None:
                    told(True)
        elif group.current is None:
            self._promote(group)
        else:
            self._rebalance(group)
        return member, epoch, group.current == member

    def _share(self, name: bytes, group: Group | None, current: int) -> tuple[int, int, bool]:
        """An Event Hubs receiver without an epoch: it receives beside the others like it,
        unless a member with an epoch holds the partition or claims it."""
        if group is not None and group.holders():
            raise Owned(
                f"{_text(name)} is held by a receiver with an epoch ({current}); a receiver "
                "without one may not read it meanwhile",
                current,
            )
        member = next(self.numbers)
        if group is None:
            self.groups[name] = Group([member], None, None, epoch=current, shared=[member])
        else:
            group.members.append(member)
            group.shared.append(member)
        return member, current, True

    def _claim_assigned(
        self,
        name: bytes,
        group: Group | None,
        current: int,
        generation: int,
        stored_generation: int,
    ) -> tuple[int, int, bool]:
        """A claim by a coordinator's member (ADR 0015): fenced by generation (a claim from a
        generation below the highest the partition has seen is `Stale`), every grant a new
        epoch; a claim from a newer generation takes over from the holder (the coordinator
        gave it the partition: the holder released it or was removed, or is a zombie)."""
        top = max(stored_generation, 0 if group is None else group.generation or 0)
        if generation < top:
            raise Stale(
                f"generation {generation} of {_text(name)} is below generation {top}: this "
                "member was fenced by a newer rebalance",
                top,
            )
        member = next(self.numbers)
        if group is None:
            self.groups[name] = Group([member], None, member, epoch=current + 1)
            self.groups[name].generation = generation
            return member, current + 1, True
        if generation <= (group.generation or 0) and group.current is not None:
            raise Owned(f"{_text(name)} is held in generation {group.generation} already", current)
        self._displace_waiting(group)
        group.members.append(member)
        group.epoch, group.generation = current + 1, generation
        if group.current is None:
            self._promote(group)
        else:
            self._rebalance(group)
        return member, current + 1, group.current == member

    def epoch(self, name: bytes) -> int | None:
        """An exclusive group's epoch (None: no such group here)."""
        group = self.groups.get(name)
        return None if group is None else group.epoch

    def check_plain(self, name: bytes) -> None:
        """A plain named link may attach only while `name` has no group."""
        group = self.groups.get(name)
        if group is not None:
            if group.epoch is not None:
                raise Conflict(f"{_text(name)} is a consumer group's partition")
            raise Conflict(
                f"consumer {_text(name)} is a single-active-consumer group of "
                f"{len(group.members)} link(s); attach with spate:single-active-consumer = true "
                "to join it"
            )

    def active(self, name: bytes) -> int | None:
        """The current member (None: no group, or between a step-down and the next turn)."""
        group = self.groups.get(name)
        return None if group is None else group.current

    def size(self, name: bytes) -> int:
        group = self.groups.get(name)
        return 0 if group is None else len(group.members)

    def watch(self, name: bytes, member: int, watcher: Watcher) -> None:
        """Tell `watcher` once: True when `member` is or becomes current, False when it has
        left (or never was here)."""
        group = self.groups.get(name)
        if group is None or member not in group.members:
            watcher(False)
        elif group.current == member:
            watcher(True)
        else:
            self.activation[member] = watcher

    def watch_deposed(self, name: bytes, member: int, watcher: Watcher) -> None:
        """Tell `watcher` once: True when the current `member` must step down, False when it
        has left (or is not current)."""
        group = self.groups.get(name)
        if group is not None and member in group.shared:
            if group.holders():  # a claim with an epoch waits for it
                watcher(True)
            else:
                self.deposal[member] = watcher
        elif group is None or group.current != member:
            watcher(False)
        elif group.stepping_down:
            watcher(True)
        else:
            self.deposal[member] = watcher

    def stepped_down(self, name: bytes, member: int) -> int | None:
        """The current member stopped receiving and stored what it finished: the designated
        member becomes current (returned; None when nothing changed)."""
        group = self.groups.get(name)
        if group is not None and member in group.shared:
            return self._unshare(name, group, member)  # it is gone: it never stored
        if group is None or group.current != member:
            return None
        group.current, group.stepping_down = None, False
        self.deposal.pop(member, None)
        return self._promote(group)

    def disband(self) -> None:
        """Forget every group (the partition's leadership moved elsewhere); member numbers go
        on from where they were, so a late `leave` of an old member touches nothing new."""
        self.groups.clear()
        self.activation.clear()
        self.deposal.clear()

    def leave(self, name: bytes, member: int) -> int | None:
        """`member` leaves; returns the member that became current because of it (None: the
        current one did not change, or nobody is left)."""
        group = self.groups.get(name)
        if group is None or member not in group.members:
            return None
        if member in group.shared:
            return self._unshare(name, group, member)
        group.members.remove(member)
        for watchers in (self.activation, self.deposal):
            told = watchers.pop(member, None)
            if told is not None:
                told(False)
        if not group.members:
            del self.groups[name]
            return None
        if group.current == member:
            group.current, group.stepping_down = None, False
            return self._promote(group)
        self._rebalance(group)
        return None

    def _unshare(self, name: bytes, group: Group, member: int) -> int | None:
        """A shared member stepped down or left: it is out of the group; once no shared
        member is left, the member with an epoch that waited for them becomes current
        (returned)."""
        group.shared.remove(member)
        group.members.remove(member)
        told = self.deposal.pop(member, None)
        if told is not None:
            told(False)
        if not group.members:
            del self.groups[name]
            return None
        if not group.shared and group.current is None:
            return self._promote(group)
        return None

    def _displace_waiting(self, group: Group) -> None:
        """A newer claim displaces the claims still waiting for the holder (told False)."""
        for waiting in group.members[1:] if not group.shared else list(group.members):
            if waiting != group.current and waiting not in group.shared:
                group.members.remove(waiting)
                told = self.activation.pop(waiting, None)
                if told is not None:
                    told(False)

    def _rebalance(self, group: Group) -> None:
        """Ask the current member to step down when another one is designated."""
        if group.current is None or group.stepping_down or group.current == group.designated():
            return
        group.stepping_down = True
        told = self.deposal.pop(group.current, None)
        if told is not None:
            told(True)

    def _promote(self, group: Group) -> int:
        group.current = promoted = group.designated()
        told = self.activation.pop(promoted, None)
        if told is not None:
            told(True)
        return promoted


def _text(name: bytes) -> str:
    return repr(name.decode(errors="replace"))
