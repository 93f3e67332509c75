"""chaos.checker: each anomaly kind is found in a history made to have it, and a clean history
(with indeterminate sends both stored and not) is valid. Histories as a run writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos import run
from chaos.checker import SUPER_BASE, check


def send(process: str, partition: int, value: str, outcome: str) -> list[dict[str, Any]]:
    v = {"partition": partition, "value": value}
    return [
        {"process": process, "type": "invoke", "f": "send", "value": v, "time": 0.0},
        {"process": process, "type": outcome, "f": "send", "value": v, "time": 0.1},
    ]


def read(process: str, partition: int, offset: int, value: str) -> dict[str, Any]:
    return {
        "process": process,
        "type": "ok",
        "f": "read",
        "value": {"partition": partition, "offset": offset, "value": value},
        "time": 1.0,
    }


def clean() -> list[dict[str, Any]]:
    ops = []
    for n in range(5):
        ops += send("p0", 0, f"p0-{n}", "ok")
    ops += send("p0", 0, "p0-5", "info")  # stored: recovered
    ops += send("p0", 0, "p0-6", "info")  # not stored: allowed
    ops += send("p0", 0, "p0-7", "fail")
    ops += [read("final", 0, o, f"p0-{o}") for o in range(6)]
    ops += [read("c1", 0, o, f"p0-{o}") for o in range(4)]
    return ops


def test_a_clean_history_is_valid_and_counted() -> None:
    verdict = check(clean())
    assert verdict.valid, verdict.to_json()
    result = verdict.partitions[0]
    assert (result.acknowledged, result.stored, result.recovered) == (5, 6, 1)
    assert (result.indeterminate_lost, result.failed, result.reads) == (1, 1, 4)


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        (
            lambda ops: [
                o for o in ops if o["value"].get("offset") != 2 or o["process"] != "final"
            ],
            "lost",
        ),
        (lambda ops: [*ops, read("final", 0, 6, "p0-1")], "duplicate"),
        (lambda ops: [*ops, read("final", 0, 6, "p9-1")], "unexpected"),
        (lambda ops: [*ops, read("final", 0, 6, "p0-7")], "failed-stored"),
        (lambda ops: [*ops, read("final", 0, 7, "p0-6")], "offset-gap"),
        (lambda ops: [*ops, read("c1", 0, 1, "p0-1")], "read-backwards"),
        (lambda ops: [*ops, read("c1", 0, 5, "p0-5")], "read-skip"),
        (lambda ops: [*ops, read("c2", 0, 0, "p0-3")], "read-mismatch"),
    ],
)
def test_each_anomaly_is_found(change: Any, kind: str) -> None:
    verdict = check(change(clean()))
    assert not verdict.valid
    assert kind in verdict.totals(), verdict.to_json()
    assert verdict.partitions[0].examples[kind]


def test_reordering_within_one_producer_is_found() -> None:
    ops = send("p1", 2, "p1-0", "ok") + send("p1", 2, "p1-1", "ok")
    ops += [read("final", 2, 0, "p1-1"), read("final", 2, 1, "p1-0")]
    verdict = check(ops)
    assert verdict.totals() == {"reordered": 1}


def test_a_partition_never_read_back_lost_its_acknowledged_sends() -> None:
    verdict = check(send("p2", 3, "p2-0", "ok"))
    assert verdict.totals() == {"lost": 1}


def test_timestamps_going_back_in_the_final_read_are_found() -> None:
    ops = send("p1", 0, "p1-0", "ok") + send("p1", 0, "p1-1", "ok")
    for offset, stamp in ((0, 2000), (1, 1000)):
        op = read("final", 0, offset, f"p1-{offset}")
        op["value"]["timestamp"] = stamp
        ops.append(op)
    assert check(ops).totals() == {"timestamp-backwards": 1}
    ops[-1]["value"]["timestamp"] = 2000  # equal is fine: one chunk, one time
    assert check(ops).valid


def test_replicas_that_disagree_are_reported() -> None:
    verdict = check(clean(), {"n2": {0: [(0, "p0-0"), (1, "p0-9")]}})
    assert verdict.totals() == {"diverged": 1}


def admin(f: str, kind: str, value: Any, time: float) -> dict[str, Any]:
    return {"process": "admin", "type": kind, "f": f, "value": value, "time": time}


def admin_history(listed_after_delete: list[str]) -> list[dict[str, Any]]:
    return [
        admin("create", "invoke", "m0", 0.0),
        admin("create", "ok", "m0", 1.0),
        admin("list", "invoke", None, 1.5),
        admin("list", "ok", ["chaos", "m0"], 2.0),
        admin("delete", "invoke", "m0", 3.0),
        admin("delete", "ok", "m0", 4.0),
        admin("list", "invoke", None, 4.5),
        admin("list", "ok", listed_after_delete, 5.0),
        admin("create", "invoke", "m1", 6.0),
        admin("create", "fail", "m1", 7.0),
    ]


def test_a_linearizable_admin_history_is_valid() -> None:
    verdict = check(admin_history(["chaos"]))
    assert verdict.valid, verdict.to_json()
    meta = verdict.partitions[-1]
    assert (meta.acknowledged, meta.failed, meta.reads) == (1, 1, 2)


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        (lambda ops: admin_history(["chaos", "m0"]), "admin-resurrected"),
        (lambda ops: [*ops[:3], admin("list", "ok", ["chaos"], 2.0), *ops[4:]], "admin-missing"),
        (
            lambda ops: [
                admin("list", "invoke", None, -1.0),
                admin("list", "ok", ["m0"], -0.5),
                *ops,
            ],
            "admin-premature",
        ),
        (lambda ops: admin_history(["chaos", "m1"]), "admin-phantom"),
    ],
)
def test_each_admin_anomaly_is_found(change: Any, kind: str) -> None:
    verdict = check(change(admin_history(["chaos"])))
    assert kind in verdict.totals(), verdict.to_json()


# Consumer groups: two members of partition 0 taking it from each other with greater epochs.


def group_op(process: str, kind: str, f: str, value: dict[str, Any], time: float) -> dict[str, Any]:
    return {"process": process, "type": kind, "f": f, "value": value, "time": time}


def grant(process: str, epoch: int, stored: int | None, at: float) -> list[dict[str, Any]]:
    return [
        group_op(process, "invoke", "grant", {"partition": 0, "epoch": epoch}, at),
        group_op(process, "ok", "grant", {"partition": 0, "epoch": epoch, "stored": stored},
                 at + 0.1),
    ]  # fmt: skip


def probe(process: str, epoch: int, at: float, outcome: str) -> list[dict[str, Any]]:
    """A stale epoch asked for on purpose (the workload's probe)."""
    value = {"partition": 0, "epoch": epoch, "probe": True}
    done = {**value, "stored": 2} if outcome == "ok" else value
    return [
        group_op(process, "invoke", "grant", value, at),
        group_op(process, outcome, "grant", done, at + 0.1),
    ]


def group_read(process: str, epoch: int, offset: int, at: float) -> dict[str, Any]:
    value = {"partition": 0, "offset": offset, "value": f"p0-{offset}", "epoch": epoch}
    return group_op(process, "ok", "group-read", value, at)


def commit(process: str, epoch: int, offset: int, at: float, outcome: str = "ok") -> list[Any]:
    value = {"partition": 0, "epoch": epoch, "offset": offset}
    return [
        group_op(process, "invoke", "commit", value, at),
        group_op(process, outcome, "commit", value, at + 0.1),
    ]


def group_history() -> list[dict[str, Any]]:
    """g0a holds epoch 1 from the start, reads 0-2 and commits 2; g0b takes over (epoch 2)
    from 2, reads 3-4; g0a's commit after that is refused (info); g0b commits 4."""
    return [
        *clean(),
        *grant("g0a", 1, None, 1.0),
        *[group_read("g0a", 1, o, 1.5 + o / 10) for o in range(3)],
        *commit("g0a", 1, 2, 2.0),
        *grant("g0b", 2, 2, 3.0),
        *[group_read("g0b", 2, o, 3.5 + o / 10) for o in (3, 4)],
        *commit("g0a", 1, 2, 4.0, outcome="info"),
        *commit("g0b", 2, 4, 4.5),
    ]


def test_a_clean_group_history_is_valid() -> None:
    verdict = check(group_history())
    assert verdict.valid, verdict.to_json()
    assert verdict.partitions[0].reads == 4 + 5


WRONG_READ = group_op(
    "g0b", "ok", "group-read", {"partition": 0, "offset": 4, "value": "p0-1", "epoch": 2}, 3.9
)


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        # the displaced member's commit, begun after epoch 2 was granted, acknowledged
        (lambda ops: [*ops, *commit("g0a", 1, 3, 3.3)], "fenced-commit"),
        # epoch 1 granted again, asked for after epoch 2's grant was acknowledged
        (lambda ops: [*ops, *probe("g0a", 1, 3.5, "ok")], "stale-grant"),
        # a later grant reports a committed offset below one acknowledged before it began
        (lambda ops: [*ops, *grant("g0a", 3, 2, 5.0)], "commit-lost"),
        (lambda ops: [*ops, *grant("g0a", 3, None, 5.0)], "commit-lost"),
        # a member's first read after its grant skips past the committed offset + 1
        (lambda ops: [*ops, *grant("g0a", 3, 4, 5.0), group_read("g0a", 3, 6, 5.5)], "group-skip"),
        (lambda ops: [*ops, WRONG_READ], "read-mismatch"),
    ],
)
def test_each_group_anomaly_is_found(change: Any, kind: str) -> None:
    verdict = check(change(group_history()))
    assert kind in verdict.totals(), verdict.to_json()
    assert verdict.partitions[0].examples[kind]


def test_a_commit_begun_before_the_takeover_may_be_acknowledged() -> None:
    """Real time: a commit in flight when a greater epoch is granted may be the takeover's own
    commit of what the holder finished — not an anomaly. Only one begun after the grant is."""
    ops = [*group_history(), *commit("g0a", 1, 2, 2.95)]
    ops[-1]["time"] = 3.5  # acknowledged after epoch 2's grant (3.1), begun before it (3.0)
    assert check(ops).valid, check(ops).to_json()


def test_a_commit_that_only_repeats_a_confirmed_offset_is_not_a_fenced_store() -> None:
    """Voters seed 1: the displaced member took 3-4 on a link it then lost and reattached, and
    its last `commit()` after the takeover answered the offset it had confirmed before it (2)
    without asking the broker — nothing was stored. A commit acknowledging a new offset
    after the takeover still is an anomaly."""
    repeat = commit("g0a", 1, 4, 3.3)
    repeat[1]["value"] = {**repeat[1]["value"], "offset": 2}  # what commit() returned
    assert check([*group_history(), *repeat]).valid
    stored = commit("g0a", 1, 4, 3.3)
    assert "fenced-commit" in check([*group_history(), *stored]).totals()
    other = commit("g0c", 1, 4, 3.3)  # another process's repeat proves nothing for this one
    other[1]["value"] = {**other[1]["value"], "offset": 2}
    assert "fenced-commit" in check([*group_history(), *other]).totals()


def test_a_refused_stale_epoch_and_grants_that_overlap_are_valid() -> None:
    """Epoch grants are linearizable as they arrive: one asked for below an epoch already
    granted must be refused (it is); a grant of a lower epoch that began before the greater one
    was acknowledged may be acknowledged after it (its linearization point comes first)."""
    ops = [*group_history(), *probe("g0a", 1, 3.5, "fail"), *probe("g0a", 1, 3.6, "info")]
    assert check(ops).valid, check(ops).to_json()
    overlapping = [*group_history(), *grant("g0c", 1, None, 3.05)]
    overlapping[-1]["time"] = 3.2  # acknowledged after epoch 2's grant (3.1), begun before it
    assert "stale-grant" not in check(overlapping).totals()


def named_op(kind: str, f: str, value: dict[str, Any], at: float) -> dict[str, Any]:
    return {"process": "n0", "type": kind, "f": f, "value": value, "time": at}


def attach(session: int, stored: int | None, at: float) -> list[dict[str, Any]]:
    value = {"partition": 0, "session": session}
    return [
        named_op("invoke", "attach", value, at),
        named_op("ok", "attach", {**value, "stored": stored}, at + 0.1),
    ]


def named_read(session: int, offset: int, at: float) -> dict[str, Any]:
    value = {"partition": 0, "session": session, "offset": offset, "value": f"p0-{offset}"}
    return named_op("ok", "named-read", value, at)


def named_commit(session: int, offset: int, at: float, outcome: str = "ok") -> list[Any]:
    value = {"partition": 0, "session": session, "offset": offset}
    return [
        named_op("invoke", "named-commit", value, at),
        named_op(outcome, "named-commit", value, at + 0.1),
    ]


def mismatched(op: dict[str, Any]) -> dict[str, Any]:
    """Session 2's read of offset 4 with another value than the final read's."""
    value = op["value"]
    if op["f"] == "named-read" and value["session"] == 2 and value["offset"] == 4:
        return {**op, "value": {**value, "value": "p0-0"}}
    return op


def named_history() -> list[dict[str, Any]]:
    """n0's first session (nothing stored: it starts at the end, offset 1) reads 1-3 and
    commits 3; the second resumes at 4, reads 4-5, and its commit of 5 is lost with its link
    (info); the third finds 5 stored (the accept reached the broker) and reads nothing."""
    return [
        *clean(),
        *attach(1, None, 1.0),
        *[named_read(1, o, 1.2 + o / 10) for o in (1, 2, 3)],
        *named_commit(1, 3, 1.6),
        *attach(2, 3, 2.0),
        *[named_read(2, o, 2.2 + o / 10) for o in (4, 5)],
        *named_commit(2, 5, 2.8, outcome="info"),
        *attach(3, 5, 3.0),
    ]


def test_a_clean_named_consumer_history_is_valid() -> None:
    verdict = check(named_history())
    assert verdict.valid, verdict.to_json()
    assert verdict.partitions[0].reads == 4 + 5
    # the unknown commit may as well not have been stored
    not_stored = [*named_history()[:-2], *attach(3, 3, 3.0), named_read(3, 4, 3.2)]
    assert check(not_stored).valid, check(not_stored).to_json()


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        # the stored offset went back below an acknowledged commit (ADR 0012: never lost)
        (lambda ops: [*ops, *attach(4, 2, 4.0)], "named-commit-lost"),
        (lambda ops: [*ops, *attach(4, None, 4.0)], "named-commit-lost"),
        # stored beyond any commit asked for: ahead of what the consumer accepted
        (lambda ops: [*ops, *attach(4, 6, 4.0)], "named-ahead"),
        (lambda ops: [*attach(1, 0, 0.5), *ops], "named-ahead"),
        # not resumed right after the stored offset: a repeat, or a skip
        (lambda ops: [*ops, named_read(3, 5, 3.5)], "named-resume"),
        (lambda ops: [*ops, named_read(3, 7, 3.5)], "named-resume"),
        # a gap within one session
        (lambda ops: [*ops, named_read(3, 6, 3.5), named_read(3, 8, 3.6)], "named-skip"),
        (lambda ops: [mismatched(op) for op in ops], "read-mismatch"),
    ],
)
def test_each_named_consumer_anomaly_is_found(change: Any, kind: str) -> None:
    verdict = check(change(named_history()))
    assert kind in verdict.totals(), verdict.to_json()
    assert verdict.partitions[0].examples[kind]


def sac_op(process: str, kind: str, f: str, value: dict[str, Any], at: float) -> dict[str, Any]:
    return {"process": process, "type": kind, "f": f, "value": value, "time": at}


def sac_read(process: str, session: int, offset: int, at: float) -> dict[str, Any]:
    value = {"partition": 0, "name": "s0", "session": session, "offset": offset,
             "value": f"p0-{offset}"}  # fmt: skip
    return sac_op(process, "ok", "sac-read", value, at)


def sac_commit(
    process: str, session: int, offset: int, at: float, outcome: str = "ok"
) -> list[Any]:
    value = {"partition": 0, "name": "s0", "session": session, "offset": offset}
    return [
        sac_op(process, "invoke", "sac-commit", value, at),
        sac_op(process, outcome, "sac-commit", value, at + 0.1),
    ]


def sac_mismatched(op: dict[str, Any]) -> dict[str, Any]:
    """s0b's read of offset 4 with another value than the final read's."""
    value = op["value"]
    if op["f"] == "sac-read" and op["process"] == "s0b" and value["offset"] == 4:
        return {**op, "value": {**value, "value": "p0-0"}}
    return op


def sac_history() -> list[dict[str, Any]]:
    """s0a is active first (reads 1-3, commits 2, its commit of 3 is unknown) and leaves; s0b
    takes over at 3 (the unknown commit was not stored: 3 comes again, inside the unsettled
    window), reads 3-5 and commits 5; s0a's next session takes over from s0b at 6... on an
    idle stream it reads nothing."""
    return [
        *clean(),
        *[sac_read("s0a", 1, o, 1.0 + o / 10) for o in (1, 2)],
        *sac_commit("s0a", 1, 2, 1.3),
        sac_read("s0a", 1, 3, 1.5),
        *sac_commit("s0a", 1, 3, 1.6, outcome="info"),
        *[sac_read("s0b", 1, o, 2.0 + o / 10) for o in (3, 4, 5)],
        *sac_commit("s0b", 1, 5, 2.6),
    ]


def test_a_clean_single_active_consumer_history_is_valid() -> None:
    verdict = check(sac_history())
    assert verdict.valid, verdict.to_json()
    assert verdict.partitions[0].reads == 4 + 3 + 3
    # had s0a's unknown commit been stored, s0b would have begun at 4: valid too
    stored = [op for op in sac_history() if not (op["f"] == "sac-read" and
              op["process"] == "s0b" and op["value"]["offset"] == 3)]  # fmt: skip
    assert check(stored).valid, check(stored).to_json()


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        # the next member began at or below an acknowledged commit (ADR 0013: no duplicate
        # beyond the unsettled window)
        (lambda ops: [*ops, sac_read("s0a", 2, 5, 3.0)], "sac-repeat"),
        (lambda ops: [*ops, sac_read("s0a", 2, 2, 3.0)], "sac-repeat"),
        # ... or past every commit asked for + 1 (no gap)
        (lambda ops: [*ops, sac_read("s0a", 2, 7, 3.0)], "sac-gap"),
        (lambda ops: [*ops, sac_read("s0a", 2, 6, 3.0), sac_read("s0a", 2, 8, 3.1)], "sac-skip"),
        (lambda ops: [sac_mismatched(op) for op in ops], "read-mismatch"),
    ],
)
def test_each_single_active_consumer_anomaly_is_found(change: Any, kind: str) -> None:
    verdict = check(change(sac_history()))
    assert kind in verdict.totals(), verdict.to_json()
    assert verdict.partitions[0].examples[kind]


def test_the_report_summarises_every_workload(tmp_path: Path) -> None:
    """chaos.run's summary.md over a history with every kind of operation (the admin's values
    are names, not mappings): each workload's line is there, and the verdict is valid."""
    ops = [
        *group_history(),
        *named_history()[len(clean()) :],
        *sac_history()[len(clean()) :],
        *admin_history(["chaos"]),
    ]
    verdict = check(ops)
    assert verdict.valid, verdict.to_json()
    run._report(run.Outcome(tmp_path, verdict, [], []), ops, "ci", 7, "replay")
    summary = (tmp_path / "summary.md").read_text()
    assert "**Verdict: valid**" in summary
    assert "Consumer group `chaos`: 2 grants" in summary
    assert "Named consumers (server-side offsets): 3 sessions attached (1 resumed" in summary
    assert "Single active consumers: 0 member sessions attached" in summary
    assert "6 reads by 2 members" in summary
    assert json.loads((tmp_path / "verdict.json").read_text())["valid"] is True


def routed_history() -> list[dict[str, Any]]:
    """r0's messages to the super stream: keys routed to partition streams 0 and 2 (SUPER_BASE
    + i); one unknown send not stored, one refused."""
    ops = []
    for n, routed in enumerate((0, 2, 2, 0)):
        ops += send("r0", SUPER_BASE + routed, f"r0-{n}", "ok")
    ops += send("r0", SUPER_BASE + 2, "r0-4", "info")
    ops += send("r0", SUPER_BASE + 0, "r0-5", "fail")
    ops += [read("final", SUPER_BASE, 0, "r0-0"), read("final", SUPER_BASE, 1, "r0-3")]
    ops += [read("final", SUPER_BASE + 2, 0, "r0-1"), read("final", SUPER_BASE + 2, 1, "r0-2")]
    return ops


def test_a_clean_routed_history_is_valid() -> None:
    verdict = check([*clean(), *routed_history()])
    assert verdict.valid, verdict.to_json()
    assert verdict.partitions[SUPER_BASE + 2].acknowledged == 2


def test_a_value_stored_in_another_partition_stream_is_misrouted_and_lost() -> None:
    ops = [*clean(), *routed_history()]
    ops = [
        {**op, "value": {**op["value"], "partition": SUPER_BASE + 1}}
        if op["process"] == "final" and op["value"]["value"] == "r0-3"
        else op
        for op in ops
    ]
    totals = check(ops).totals()
    assert totals["misrouted"] == 1 and totals["lost"] == 1, totals
    # in a plain stream's partitions the same is "unexpected", as before
    assert "misrouted" not in check([*clean(), read("final", 1, 0, "p0-1")]).totals()
