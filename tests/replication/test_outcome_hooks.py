"""`ReplicatedPartition.append_then` and `store_offset_then`: the outcome of an append or an
offset store handed to a callback on the loop turn that applies the commit, before the
partition's listeners run, not through a future's callbacks a turn later (the node's AMQP
listener settles producers' confirms and consumers' commits from there: RESULTS §51). Three
hosts in one process on real files and sockets (test_sync_inline's harness)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spate.core.errors import FailedPrecondition, NotLeader
from spate.core.ids import NodeId
from spate.core.ownership import GROUP_PREFIX

from tests.replication.test_shell_cluster import until
from tests.replication.test_sync_inline import Watched, leader_of, run


def test_an_append_s_offset_is_handed_over_before_the_commit_s_listeners(tmp_path: Path) -> None:
    async def body(nodes: dict[NodeId, Watched]) -> None:
        leader, followers = leader_of(nodes)
        part = leader.part
        before = await part.append([b"first"])
        got: list[Any] = []
        seen: list[list[Any]] = []
        part.add_listener(lambda: seen.append(list(got)))
        part.append_then([b"a", b"b"], None, got.append)
        assert got == []  # not at once: at the commit
        await until(lambda: got, "the outcome")
        assert got == [before + 1]
        assert seen[0] == got, "the listeners ran before the outcome was handed over"
        refused: list[Any] = []
        followers[0].part.append_then([b"x"], None, refused.append)
        assert len(refused) == 1 and isinstance(refused[0], NotLeader)  # before it returned

    run(body, tmp_path, "inline")


def test_a_stored_offset_is_confirmed_at_its_commit_and_a_fenced_one_at_once(
    tmp_path: Path,
) -> None:
    async def body(nodes: dict[NodeId, Watched]) -> None:
        leader, _ = leader_of(nodes)
        part = leader.part
        await part.append([b"m%d" % i for i in range(5)])
        got: list[Any] = []
        part.store_offset_then(b"billing", 3, 0, got.append)
        assert got == []
        await until(lambda: got, "the store's outcome")
        assert got == [None]
        stored = await part.stored_offset(b"billing")
        assert stored is not None and stored.offset == 3
        fenced: list[Any] = []
        part.store_offset_then(GROUP_PREFIX + b"g", 2, 7, fenced.append)  # 7 holds nothing
        assert len(fenced) == 1 and isinstance(fenced[0], FailedPrecondition)
        assert await part.stored_offset(GROUP_PREFIX + b"g") is None

    run(body, tmp_path, "inline")
