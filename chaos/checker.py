"""The history checker (issue 13): pure, over the operations a chaos run recorded.

A history is a list of operations (JSON lines in `history.jsonl`), each

    {"process": "p3", "type": "invoke" | "ok" | "fail" | "info", "f": "send" | "read",
     "value": ..., "time": seconds since the run started}

- `send`: value {"partition": p, "value": "p3-17"} — one producer process publishes to one
  partition, its values numbered 0, 1, 2... in the order it sends them. `ok`: the broker said
  `accepted` (a majority has it on disk); `fail`: it said definitely not (rejected, or refused
  before sending); `info`: unknown (timeout, lost connection) — it may or may not be stored.
- `read`: an `ok` read carries {"partition": p, "offset": o, "value": v} for one delivered
  message; `process` names the consumer (a live consumer "c1", the final reader "final").

The final reader reads every partition from its first offset to its end after the faults are
healed; that read is the truth of what the cluster holds. Anomalies, per partition (Jepsen's
queue checkers, Redpanda's [B2] and NATS's [B12] in ../shared/research/anchors.md):

| kind          | meaning                                                                   |
|---------------|---------------------------------------------------------------------------|
| lost          | a send acknowledged `ok` is not in the final read                          |
| duplicate     | a value stored more than once (deduplication is on: never allowed)         |
| reordered     | two values of one producer stored in the other order than they were sent   |
| unexpected    | a value read that no process ever sent                                     |
| failed-stored | a send answered `fail` (definitely not stored) is stored after all         |
| offset-gap    | the final read's offsets are not consecutive from the first               |
| read-backwards | a consumer was delivered an offset at or below one it had before          |
| read-skip     | a consumer was delivered an offset more than one past its previous one     |
| read-mismatch | a consumer read a value at an offset where the final read has another      |
| diverged      | two replicas' final reads of a partition differ (when given per replica)  |
| timestamp-backwards | a message's timestamp is below the one before it in the final read  |
|               | (append times never go back, whatever a leader's clock says)              |

Consumer groups (group `chaos`; its members `g<p>a`, `g<p>b` take partition p over from each
other with ever greater epochs): `grant` (invoke {partition, epoch}; ok {partition, epoch,
stored}: the group's committed offset the attach reply carried), `group-read` (ok {partition,
offset, value, epoch}) and `commit` (invoke/ok/info {partition, epoch, offset}).

| kind          | meaning                                                                   |
|---------------|---------------------------------------------------------------------------|
| fenced-commit | a commit acknowledged although it began after a greater epoch had been    |
|               | granted the partition (a displaced member must be fenced); not one that   |
|               | acknowledged only an offset the same member had had acknowledged before   |
|               | it began (it stored nothing: voters seed 1)                               |
| stale-grant   | a grant acknowledged for an epoch below one whose grant was acknowledged  |
|               | before it began (epochs are linearizable as they arrive: the workload's  |
|               | members now and then ask for such an epoch on purpose, `probe`, and must  |
|               | be refused)                                                               |
| commit-lost   | a grant reports a committed offset below one acknowledged before it began |
| group-skip    | a member's first read after its grant is past the committed offset + 1    |
|               | (messages no member of the group is given)                                |
| read-mismatch | (as above) a member read a value at an offset where the final read has   |
|               | another                                                                   |

Named consumers (server-side offset tracking, `spate:consumer-name`, ADR 0012; process `n<p>`
is the name on partition p): sessions one after another, each `attach` (invoke {partition,
session}; ok {partition, session, stored}: the stored offset the attach reply carried, None
when there is none), `named-read` (ok {partition, offset, value, session}) and `named-commit`
(invoke {partition, session, offset}; ok {.., offset}: what `commit()` returned; info). A
manual-commit consumer accepts only at `commit()`, so what the broker may store is bounded
by the commits invoked.

| kind              | meaning                                                              |
|-------------------|----------------------------------------------------------------------|
| named-commit-lost | an attach reports a stored offset below one a commit acknowledged     |
|                   | before the attach began (or none)                                     |
| named-ahead       | an attach reports a stored offset above every commit invoked before   |
|                   | it ended (stored beyond what the consumer accepted)                   |
| named-resume      | a session's first read is not the stored offset + 1 (a repeat or a    |
|                   | skip: it must resume right after it)                                  |
| named-skip        | a session's reads are not consecutive                                 |
| read-mismatch     | (as above) a read value differs from the final read's at its offset   |

Single active consumers (ADR 0013; processes `s<p>a` and `s<p>b` share the name `s<p>` on
partition p, one active at a time, each in sessions like a named consumer's): `sac-attach`,
`sac-read` (ok {partition, name, session, offset, value}) and `sac-commit` (invoke/ok/info
{partition, name, session, offset}). A member's first read is where it took over (or began):

| kind       | meaning                                                                     |
|------------|-----------------------------------------------------------------------------|
| sac-repeat | a member's first read is at or below an offset a commit of the name had     |
|            | acknowledged before it (delivered again beyond the unsettled window)        |
| sac-gap    | a member's first read is past every commit of the name asked for before it  |
|            | + 1 (messages no member is given), once one has been acknowledged           |
| sac-skip   | a member's reads within one session are not consecutive                     |

Super streams: producers `r<i>` publish to a super stream's address, each message routed by
the broker on its `event-streams-group-key`; the workload records each `send` with the
partition stream the key must land on (RabbitMQ's rule, MurmurHash3 computed by the workload)
as partition `SUPER_BASE + i`, and the final reads of the partition streams likewise. All the
checks above apply to them (no deduplication: each value is sent once, never resent), and:

| kind      | meaning                                                                     |
|-----------|-----------------------------------------------------------------------------|
| misrouted | a value stored in another partition stream than its key's                   |

The metadata service (partition -1 in the verdict, "metadata" in reports): process "admin"
creates streams with new names, lists them and deletes them, each through any node's admin API
(`f` "create" / "delete" with the name as value, "list" with the names seen as value). Each name
is created and deleted once, so linearizability reduces to real-time order per name:

| kind              | meaning                                                              |
|-------------------|----------------------------------------------------------------------|
| admin-missing     | a list that began after a create was acknowledged, and ended before  |
|                   | its delete began, does not show the stream                            |
| admin-resurrected | a list that began after a delete was acknowledged shows the stream    |
| admin-premature   | a list that ended before the create began shows the stream            |
| admin-phantom     | a stream whose create was refused (definitely not made) shows up      |

`info` sends found stored are counted as "recovered", not anomalies; `info` sends not found
are "indeterminate-lost" (allowed: the client never heard `accepted`).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ANOMALY_KINDS = (
    "lost",
    "duplicate",
    "reordered",
    "unexpected",
    "failed-stored",
    "offset-gap",
    "read-backwards",
    "read-skip",
    "read-mismatch",
    "diverged",
    "timestamp-backwards",
    "fenced-commit",
    "stale-grant",
    "commit-lost",
    "group-skip",
    "named-commit-lost",
    "named-ahead",
    "named-resume",
    "named-skip",
    "sac-repeat",
    "sac-gap",
    "sac-skip",
    "misrouted",
    "admin-missing",
    "admin-resurrected",
    "admin-premature",
    "admin-phantom",
)
METADATA = -1
"""The verdict's key for the metadata service's result."""
SUPER_BASE = 100
"""Partition `SUPER_BASE + i` in a history and the verdict is the super stream's i-th
partition stream."""
EXAMPLES_MAX = 10
"""Examples kept per anomaly kind and partition (the counts are exact)."""


@dataclass
class PartitionResult:
    partition: int
    acknowledged: int = 0
    stored: int = 0
    recovered: int = 0
    indeterminate_lost: int = 0
    failed: int = 0
    reads: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, example: str) -> None:
        assert kind in ANOMALY_KINDS, kind
        self.anomalies[kind] = self.anomalies.get(kind, 0) + 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES_MAX:
            shown.append(example)

    @property
    def valid(self) -> bool:
        return not self.anomalies


@dataclass
class Verdict:
    partitions: dict[int, PartitionResult]

    @property
    def valid(self) -> bool:
        return all(p.valid for p in self.partitions.values())

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for result in self.partitions.values():
            total.update(result.anomalies)
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "anomalies": dict(self.totals()),
            "partitions": {
                str(p): {
                    "acknowledged": r.acknowledged,
                    "stored": r.stored,
                    "recovered": r.recovered,
                    "indeterminate_lost": r.indeterminate_lost,
                    "failed": r.failed,
                    "reads": r.reads,
                    "anomalies": r.anomalies,
                    "examples": r.examples,
                }
                for p, r in sorted(self.partitions.items())
            },
        }


def sequence_of(value: str) -> tuple[str, int]:
    """("p3", 17) for "p3-17": the producer and its sequence number."""
    producer, _, number = value.rpartition("-")
    return producer, int(number)


def check(
    history: Iterable[Mapping[str, Any]],
    replicas: Mapping[str, Mapping[int, Sequence[tuple[int, str]]]] | None = None,
) -> Verdict:
    """The verdict over a history (see the module). `replicas` optionally gives each replica's
    own final read, node -> partition -> [(offset, value)], for the divergence check."""
    ops = list(history)
    outcome: dict[str, str] = {}  # value -> ok | fail | info
    partition_of: dict[str, int] = {}
    final: dict[int, list[tuple[int, str]]] = defaultdict(list)
    stamps: dict[int, list[tuple[int, int]]] = defaultdict(list)
    live: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for op in ops:
        f, kind, value = op.get("f"), op.get("type"), op.get("value")
        if f == "send" and isinstance(value, Mapping):
            v = str(value["value"])
            partition_of[v] = int(value["partition"])
            if kind in ("ok", "fail", "info"):
                outcome[v] = str(kind)
            elif kind == "invoke":
                outcome.setdefault(v, "info")  # no completion recorded: unknown
        elif f == "read" and kind == "ok" and isinstance(value, Mapping):
            entry = (int(value["offset"]), str(value["value"]))
            partition = int(value["partition"])
            if op.get("process") == "final":
                final[partition].append(entry)
                if "timestamp" in value:
                    stamps[partition].append((entry[0], int(value["timestamp"])))
            else:
                live[(str(op.get("process")), partition)].append(entry)
    partitions = set(final) | set(partition_of.values()) | {p for _, p in live}
    results = {p: PartitionResult(p) for p in sorted(partitions)}
    for v, kind in outcome.items():
        result = results[partition_of[v]]
        if kind == "ok":
            result.acknowledged += 1
        elif kind == "fail":
            result.failed += 1
    for partition, result in results.items():  # one never read back lost everything sent
        _check_final(result, final.get(partition, []), outcome, partition_of)
    for (process, partition), entries in live.items():
        _check_live(results[partition], process, entries, dict(final.get(partition, [])))
    for partition, times in stamps.items():
        times.sort()
        for (o1, t1), (o2, t2) in itertools.pairwise(times):
            if t2 < t1:
                results[partition].add(
                    "timestamp-backwards", f"offset {o2} at {t2} ms after offset {o1} at {t1} ms"
                )
    if replicas:
        _check_replicas(results, replicas, final)
    group_ops = [op for op in ops if op.get("f") in ("grant", "group-read", "commit")]
    if group_ops:
        check_groups(group_ops, final, results)
    named_ops = [op for op in ops if op.get("f") in ("attach", "named-read", "named-commit")]
    if named_ops:
        check_named(named_ops, final, results)
    sac_ops = [op for op in ops if op.get("f") in ("sac-attach", "sac-read", "sac-commit")]
    if sac_ops:
        check_sac(sac_ops, final, results)
    admin = [op for op in ops if op.get("process") == "admin"]
    if admin:
        results[METADATA] = check_admin(admin)
    return Verdict(results)


@dataclass
class _AdminOp:
    invoked: float
    completed: float | None = None
    outcome: str = "info"
    value: Any = None


def check_admin(ops: Sequence[Mapping[str, Any]]) -> PartitionResult:
    """The metadata service's checks (module docstring) over the admin process's operations,
    which run one at a time: an invoke, then its completion."""
    result = PartitionResult(METADATA)
    creates: dict[str, _AdminOp] = {}
    deletes: dict[str, _AdminOp] = {}
    lists: list[_AdminOp] = []
    current: tuple[str, _AdminOp] | None = None
    for op in ops:
        f, kind, time = str(op.get("f")), op.get("type"), float(op.get("time", 0.0))
        if kind == "invoke":
            current = (f, _AdminOp(time, value=op.get("value")))
            if f == "create":
                creates[str(op.get("value"))] = current[1]
            elif f == "delete":
                deletes[str(op.get("value"))] = current[1]
            continue
        if current is None or current[0] != f:
            continue
        one = current[1]
        one.completed, one.outcome = time, str(kind)
        if f == "list" and kind == "ok":
            one.value = set(op.get("value") or [])
            lists.append(one)
        current = None
    result.acknowledged = sum(1 for c in creates.values() if c.outcome == "ok")
    result.failed = sum(1 for c in creates.values() if c.outcome == "fail")
    result.reads = len(lists)
    for name, create in creates.items():
        delete = deletes.get(name)
        for seen in lists:
            assert seen.completed is not None
            has = name in seen.value
            if create.outcome == "fail" and has:
                result.add(
                    "admin-phantom", f"{name} listed at {seen.invoked:.2f}s; its create failed"
                )
            if has and seen.completed < create.invoked:
                result.add("admin-premature", f"{name} listed before its create began")
            if (
                create.outcome == "ok"
                and create.completed is not None
                and seen.invoked > create.completed
                and (delete is None or seen.completed < delete.invoked)
                and not has
            ):
                result.add("admin-missing", f"{name} missing from a list at {seen.invoked:.2f}s")
            if (
                delete is not None
                and delete.outcome == "ok"
                and delete.completed is not None
                and seen.invoked > delete.completed
                and has
            ):
                result.add(
                    "admin-resurrected", f"{name} listed at {seen.invoked:.2f}s after its delete"
                )
    return result


@dataclass
class _Timed:
    """One group operation: invoked and (if it completed) its completion."""

    process: str
    invoked: float
    value: Mapping[str, Any]
    completed: float | None = None
    outcome: str = "info"
    result: Mapping[str, Any] = field(default_factory=dict)


def _pair(ops: Sequence[Mapping[str, Any]], f: str) -> list[_Timed]:
    """Each process's invokes of `f` matched with their completions (one at a time each)."""
    done: list[_Timed] = []
    open_: dict[str, _Timed] = {}
    for op in ops:
        if op.get("f") != f:
            continue
        process, kind, time = str(op.get("process")), op.get("type"), float(op["time"])
        value = op.get("value") or {}
        if kind == "invoke":
            open_[process] = _Timed(process, time, value)
            done.append(open_[process])
        elif process in open_:
            one = open_.pop(process)
            one.completed, one.outcome, one.result = time, str(kind), value
    return done


def _repeats_an_earlier_commit(commit: _Timed, commits: Sequence[_Timed]) -> bool:
    """Whether `commit` acknowledged an offset that an earlier commit of the same member (same
    process and epoch) had already acknowledged before it began. `commit()` answers with the
    last confirmed offset, without asking the broker, when nothing new can be committed (the
    member took nothing since, or what it took was on a link it lost and reattached): such a
    commit stores nothing, so it cannot be a store after a newer epoch was granted. The
    earlier commit is judged by the rule itself."""
    offset = commit.result.get("offset")
    if offset is None:
        return False
    return any(
        other.process == commit.process
        and other.value.get("partition") == commit.value.get("partition")
        and other.value.get("epoch") == commit.value.get("epoch")
        and other.completed is not None
        and other.completed < commit.invoked
        and other.result.get("offset") is not None
        and int(other.result["offset"]) >= int(offset)
        for other in commits
    )


def check_groups(
    ops: Sequence[Mapping[str, Any]],
    final: Mapping[int, list[tuple[int, str]]],
    results: dict[int, PartitionResult],
) -> None:
    """The consumer-group checks (module docstring), per partition."""
    grants = [g for g in _pair(ops, "grant") if g.outcome == "ok"]
    commits = [c for c in _pair(ops, "commit") if c.outcome == "ok"]

    def result(partition: int) -> PartitionResult:
        return results.setdefault(partition, PartitionResult(partition))

    for commit in commits:
        partition, epoch = int(commit.value["partition"]), int(commit.value["epoch"])
        if _repeats_an_earlier_commit(commit, commits):
            continue  # it stored nothing: the client answered with what it had confirmed
        for grant in grants:
            if (
                int(grant.value["partition"]) == partition
                and int(grant.value["epoch"]) > epoch
                and grant.completed is not None
                and grant.completed < commit.invoked
            ):
                result(partition).add(
                    "fenced-commit",
                    f"{commit.process} (epoch {epoch}) committed offset "
                    f"{commit.result.get('offset')} at {commit.invoked:.2f}s, after epoch "
                    f"{grant.value['epoch']} was granted at {grant.completed:.2f}s",
                )
                break
    _check_stale_grants(grants, result)
    for grant in grants:
        partition, stored = int(grant.value["partition"]), grant.result.get("stored")
        before = [
            int(c.result["offset"])
            for c in commits
            if int(c.value["partition"]) == partition
            and c.completed is not None
            and c.completed < grant.invoked
            and c.result.get("offset") is not None
        ]
        if before and (stored is None or int(stored) < max(before)):
            result(partition).add(
                "commit-lost",
                f"epoch {grant.value['epoch']} granted at {grant.invoked:.2f}s with committed "
                f"offset {stored}; {max(before)} had been committed",
            )
    first_read: dict[tuple[str, int], tuple[int, float]] = {}
    reads: dict[tuple[str, int, int], list[tuple[int, str]]] = defaultdict(list)
    for op in ops:
        value = op.get("value") or {}
        if op.get("f") == "group-read" and op.get("type") == "ok":
            key = (str(op.get("process")), int(value["epoch"]))
            first_read.setdefault(key, (int(value["offset"]), float(op["time"])))
            reads[(*key, int(value["partition"]))].append(
                (int(value["offset"]), str(value["value"]))
            )
    for grant in grants:
        key = (grant.process, int(grant.value["epoch"]))
        stored = grant.result.get("stored")
        if key in first_read and stored is not None and first_read[key][0] > int(stored) + 1:
            result(int(grant.value["partition"])).add(
                "group-skip",
                f"{grant.process} (epoch {key[1]}) granted with committed offset {stored} first "
                f"read offset {first_read[key][0]}",
            )
    for (process, epoch, partition), entries in reads.items():
        _judge_reads(result(partition), f"{process} (epoch {epoch})", entries, final, None)


def check_named(
    ops: Sequence[Mapping[str, Any]],
    final: Mapping[int, list[tuple[int, str]]],
    results: dict[int, PartitionResult],
) -> None:
    """The named-consumer checks (module docstring), per partition."""
    attaches = [a for a in _pair(ops, "attach") if a.outcome == "ok"]
    commits = _pair(ops, "named-commit")

    def result(partition: int) -> PartitionResult:
        return results.setdefault(partition, PartitionResult(partition))

    reads: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for op in ops:
        value = op.get("value") or {}
        if op.get("f") == "named-read" and op.get("type") == "ok":
            key = (str(op.get("process")), int(value["session"]))
            reads[key].append((int(value["offset"]), str(value["value"])))
    for attach in attaches:
        partition, session = int(attach.value["partition"]), int(attach.value["session"])
        stored = attach.result.get("stored")
        mine = [c for c in commits if c.process == attach.process]
        acknowledged = [
            int(c.result["offset"])
            for c in mine
            if c.outcome == "ok" and c.completed is not None and c.completed < attach.invoked
        ]
        if acknowledged and (stored is None or int(stored) < max(acknowledged)):
            result(partition).add(
                "named-commit-lost",
                f"{attach.process} session {session} attached at {attach.invoked:.2f}s with "
                f"stored offset {stored}; {max(acknowledged)} had been committed",
            )
        assert attach.completed is not None
        invoked = [int(c.value["offset"]) for c in mine if c.invoked < attach.completed]
        if stored is not None and (not invoked or int(stored) > max(invoked)):
            result(partition).add(
                "named-ahead",
                f"{attach.process} session {session} attached with stored offset {stored}; "
                f"the greatest commit asked for before was {max(invoked, default=None)}",
            )
        entries = reads.get((attach.process, session), [])
        if stored is not None and entries and entries[0][0] != int(stored) + 1:
            result(partition).add(
                "named-resume",
                f"{attach.process} session {session} attached with stored offset {stored} "
                f"first read offset {entries[0][0]}",
            )
    session_partition = {
        (a.process, int(a.value["session"])): int(a.value["partition"]) for a in attaches
    }
    for (process, session), entries in reads.items():
        if (process, session) not in session_partition:
            continue  # reads of a session whose attach was never acknowledged: none happen
        partition = session_partition[(process, session)]
        who = f"{process} session {session}"
        _judge_reads(result(partition), who, entries, final, "named-skip")


def check_sac(
    ops: Sequence[Mapping[str, Any]],
    final: Mapping[int, list[tuple[int, str]]],
    results: dict[int, PartitionResult],
) -> None:
    """The single-active-consumer checks (module docstring), per partition."""
    commits = _pair(ops, "sac-commit")
    reads: dict[tuple[str, int], list[tuple[int, str, float]]] = defaultdict(list)
    where: dict[tuple[str, int], tuple[int, str]] = {}
    for op in ops:
        value = op.get("value") or {}
        if op.get("f") == "sac-read" and op.get("type") == "ok":
            key = (str(op.get("process")), int(value["session"]))
            reads[key].append((int(value["offset"]), str(value["value"]), float(op["time"])))
            where[key] = (int(value["partition"]), str(value["name"]))

    def result(partition: int) -> PartitionResult:
        return results.setdefault(partition, PartitionResult(partition))

    for key, entries in reads.items():
        (process, session), (partition, name) = key, where[key]
        first, _, at = entries[0]
        of_name = [c for c in commits if c.value.get("name") == name]
        acknowledged = [
            int(c.result["offset"])
            for c in of_name
            if c.outcome == "ok" and c.completed is not None and c.completed < at
        ]
        invoked = [int(c.value["offset"]) for c in of_name if c.invoked < at]
        if acknowledged and first <= max(acknowledged):
            result(partition).add(
                "sac-repeat",
                f"{process} session {session} of {name} first read offset {first} at {at:.2f}s; "
                f"{max(acknowledged)} had been committed",
            )
        if acknowledged and first > max(invoked) + 1:
            result(partition).add(
                "sac-gap",
                f"{process} session {session} of {name} first read offset {first} at {at:.2f}s; "
                f"the greatest commit asked for before was {max(invoked)}",
            )
        pairs = [(offset, value) for offset, value, _ in entries]
        who = f"{process} session {session}"
        _judge_reads(result(partition), who, pairs, final, "sac-skip")


def _judge_reads(
    result: PartitionResult,
    who: str,
    entries: Sequence[tuple[int, str]],
    final: Mapping[int, list[tuple[int, str]]],
    skip: str | None,
) -> None:
    """One reader's reads of `result`'s partition: counted, each value held to the final
    read's at its offset (read-mismatch) and, with `skip` (the kind to report), each offset
    to the one before + 1."""
    truth = dict(final.get(result.partition, []))
    result.reads += len(entries)
    if skip is not None:
        for (o1, _), (o2, _) in itertools.pairwise(entries):
            if o2 != o1 + 1:
                result.add(skip, f"{who} read offset {o2} after {o1}")
    for offset, value in entries:
        stored_value = truth.get(offset)
        if stored_value is not None and stored_value != value:
            result.add(
                "read-mismatch",
                f"{who} read {value!r} at offset {offset}; stored: {stored_value!r}",
            )


def _check_stale_grants(grants: Sequence[_Timed], result: Callable[[int], PartitionResult]) -> None:
    """stale-grant: per partition, the greatest epoch acknowledged before each grant began."""
    done: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for grant in grants:
        if grant.completed is not None:
            done[int(grant.value["partition"])].append((grant.completed, int(grant.value["epoch"])))
    for partition, completions in done.items():
        completions.sort()
        times = [t for t, _ in completions]
        greatest = list(itertools.accumulate((e for _, e in completions), max))
        for grant in grants:
            if int(grant.value["partition"]) != partition:
                continue
            earlier = bisect.bisect_left(times, grant.invoked)
            epoch = int(grant.value["epoch"])
            if earlier and greatest[earlier - 1] > epoch:
                result(partition).add(
                    "stale-grant",
                    f"{grant.process} was granted epoch {epoch} at {grant.invoked:.2f}s; epoch "
                    f"{greatest[earlier - 1]} had been granted before",
                )


def _values(entries: Sequence[tuple[int, str]]) -> list[str]:
    return [v for _, v in entries]


def _check_final(
    result: PartitionResult,
    entries: list[tuple[int, str]],
    outcome: Mapping[str, str],
    partition_of: Mapping[str, int],
) -> None:
    entries = sorted(entries)
    result.stored = len(entries)
    offsets = [o for o, _ in entries]
    for before, after in itertools.pairwise(offsets):
        if after != before + 1:
            result.add("offset-gap", f"offset {before} then {after}")
    counts = Counter(_values(entries))
    first_offset: dict[str, int] = {}
    for offset, value in entries:
        first_offset.setdefault(value, offset)
        kind = outcome.get(value)
        if kind is None:
            result.add("unexpected", f"{value!r} at offset {offset} was never sent")
        elif partition_of.get(value) != result.partition and result.partition >= SUPER_BASE:
            result.add(
                "misrouted",
                f"{value!r} at offset {offset} of partition stream "
                f"{result.partition - SUPER_BASE}; its key routes to "
                f"{partition_of[value] - SUPER_BASE}",
            )
        elif partition_of.get(value) != result.partition:
            result.add("unexpected", f"{value!r} at offset {offset} was sent to another partition")
    for value, count in counts.items():
        if count > 1:
            result.add("duplicate", f"{value!r} stored {count} times")
    for value, kind in outcome.items():
        if partition_of[value] != result.partition:
            continue
        if value in first_offset:
            if kind == "info":
                result.recovered += 1
            elif kind == "fail":
                result.add("failed-stored", f"{value!r} was refused but is stored")
        elif kind == "ok":
            result.add("lost", f"{value!r} was acknowledged and is not stored")
        elif kind == "info":
            result.indeterminate_lost += 1
    by_producer: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for value, offset in first_offset.items():
        if value in outcome:
            producer, number = sequence_of(value)
            by_producer[producer].append((number, offset, value))
    for items in by_producer.values():
        items.sort()
        for (_, o1, v1), (_, o2, v2) in itertools.pairwise(items):
            if o2 < o1:
                result.add("reordered", f"{v2!r} (sent after {v1!r}) at offset {o2} < {o1}")


def _check_live(
    result: PartitionResult, process: str, entries: list[tuple[int, str]], truth: dict[int, str]
) -> None:
    result.reads += len(entries)
    previous: int | None = None
    for offset, value in entries:
        if previous is not None:
            if offset <= previous:
                result.add("read-backwards", f"{process} got offset {offset} after {previous}")
            elif offset > previous + 1:
                result.add("read-skip", f"{process} got offset {offset} after {previous}")
        previous = offset if previous is None else max(previous, offset)
        stored = truth.get(offset)
        if stored is not None and stored != value:
            result.add(
                "read-mismatch", f"{process} read {value!r} at offset {offset}; stored: {stored!r}"
            )


def _check_replicas(
    results: dict[int, PartitionResult],
    replicas: Mapping[str, Mapping[int, Sequence[tuple[int, str]]]],
    final: Mapping[int, list[tuple[int, str]]],
) -> None:
    for node, partitions in replicas.items():
        for partition, entries in partitions.items():
            truth = dict(final.get(partition, []))
            mine = dict(entries)
            differ = [o for o in sorted(set(truth) & set(mine)) if truth[o] != mine[o]]
            if differ:
                results.setdefault(partition, PartitionResult(partition)).add(
                    "diverged",
                    f"{node} holds {mine[differ[0]]!r} at offset {differ[0]}; "
                    f"the final read {truth[differ[0]]!r}",
                )
