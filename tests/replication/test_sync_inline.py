"""A follower's small batches may sync on the loop thread (ADR 0036, off by default); nothing
is acknowledged before its sync either way.

Three ReplicationHosts in one process (real sockets on 127.0.0.1, real files with fdatasync),
run three ways: syncs inline on the loop thread (`inline_sync_bytes=INLINE_SYNC_BYTES_MAX`),
and all on the fsync thread (0, the default) handed over either by the sync thread's queue and
eventfd (ADR 0040, the default) or by `run_in_executor` (the path before it). The followers'
`RaftStore.run_sync` is wrapped to record what each sync made durable, and their transports'
`send` to look at every frame leaving: an ack (an accepted AppendResponse) must never name an
index its node has not synced yet (ADR 0005's send rule; BRIEF §2.3: `accepted` only after a
majority fsync).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from spate.core import frames
from spate.core.errors import BrokerError, InvalidArgument, NotLeader
from spate.core.ids import NodeId, PartitionId, StreamName
from spate.node.log import LogConfig
from spate.node.replication import codec, synctrace
from spate.node.replication import host as host_module
from spate.node.replication.host import (
    INLINE_LOOP_BUSY_MAX,
    INLINE_RECENT_BYTES_MAX,
    INLINE_SYNC_BYTES_MAX,
    INLINE_SYNC_SLOW_S,
    INLINE_SYNC_TYPICAL_MAX_S,
    ReplicationHost,
)
from spate.node.replication.messages import AppendResponse
from spate.node.replication.partition import ReplicatedPartition
from spate.node.replication.raft import Role
from spate.node.replication.storage import SyncWork

from tests.replication.test_shell_cluster import SECRET, TICK_MS, until

WARM_ATTEMPTS = 20

STREAM = StreamName("s")
P0 = PartitionId(0)
IDS = [NodeId("n1"), NodeId("n2"), NodeId("n3")]
MODES: dict[str, tuple[int, str]] = {
    "inline": (INLINE_SYNC_BYTES_MAX, "thread"),
    "thread": (0, "thread"),
    "executor": (0, "executor"),
}
"""(inline_sync_bytes, handoff): inline syncs on with the limit tried (ADR 0036); off, the
others on the sync thread (ADR 0040, the default); off, through `run_in_executor`."""
LEADERS_INLINE = 4096
"""`inline_leader_bytes` of the one test whose leaders' small syncs run inline too (RESULTS
§49; off by default)."""


class Watched:
    """A node's host, with its syncs and its acks recorded."""

    def __init__(self, host: ReplicationHost, part: ReplicatedPartition) -> None:
        self.host = host
        self.part = part
        self.synced_index = part.raft.log.stable
        """The highest Raft index a sync of this node has returned for."""
        self.acks: list[tuple[int, int]] = []
        """(index acknowledged, synced_index when the ack was queued)."""
        self.sync_delay_s = 0.0
        self.sync_error: OSError | None = None
        store = part.store
        run_sync = store.run_sync

        def watched_sync(work: SyncWork) -> None:
            written = store.log.last_raft_index  # no write runs while a batch syncs
            if self.sync_delay_s:
                time.sleep(self.sync_delay_s)
            if self.sync_error is not None:
                raise self.sync_error
            run_sync(work)
            self.synced_index = max(self.synced_index, written)

        store.run_sync = watched_sync  # type: ignore[method-assign]
        send = host.transport.send

        def watched_send(peer: NodeId, frame: frames.Frame) -> bool:
            whole = frames.frame_bytes(frame)  # an Append may leave in pieces (ADR 0037)
            _length, kind = frames.FRAME_HEAD.unpack_from(whole)
            if kind == codec.KIND_RAFT:
                _key, message = codec.decode_raft(memoryview(whole)[frames.FRAME_HEAD_BYTES :])
                if type(message) is AppendResponse and not message.rejected:
                    self.acks.append((message.index, self.synced_index))
            return send(peer, frame)

        host.transport.send = watched_send  # type: ignore[method-assign]

    def early_acks(self) -> list[tuple[int, int]]:
        return [(index, synced) for index, synced in self.acks if index > synced]


@contextlib.asynccontextmanager
async def three_hosts(
    root: Path, mode: str, leader_bytes: int = 0
) -> AsyncIterator[dict[NodeId, Watched]]:
    """Three hosts with a leader and one entry committed on every replica; only then are
    their syncs and acks watched (what was synced before is known from `raft.log.stable`)."""
    addresses: dict[NodeId, tuple[str, int]] = {}
    hosts: dict[NodeId, ReplicationHost] = {}
    parts: dict[NodeId, ReplicatedPartition] = {}
    try:
        for node in IDS:
            host = ReplicationHost(
                node,
                root / node,
                host="127.0.0.1",
                port=0,
                secret=SECRET,
                peers=addresses.get,
                tick_ms=TICK_MS,
                rng_seed=IDS.index(node),
                inline_sync_bytes=MODES[mode][0],
                handoff=MODES[mode][1],
                inline_leader_bytes=leader_bytes,
            )
            hosts[node] = host
            addresses[node] = ("127.0.0.1", await host.start())
            parts[node] = await host.open_partition(STREAM, P0, IDS, LogConfig())
        leader = await _warm(parts)
        await until(
            lambda: all(p.raft.log.applied >= leader.raft.log.committed for p in parts.values()),
            "every replica applied the first entry",
        )
        nodes = {node: Watched(hosts[node], parts[node]) for node in IDS}
        yield nodes
    finally:
        for host in hosts.values():
            await host.stop()


async def _warm(parts: dict[NodeId, ReplicatedPartition]) -> ReplicatedPartition:
    """One entry committed through whichever host leads; an append lost in a leader change
    (the first election can be followed by a second on a loaded machine: CI saw it) is made
    again at the next leader."""
    for _ in range(WARM_ATTEMPTS):
        await until(lambda: any(p.is_leader for p in parts.values()), "a leader")
        leader = next(p for p in parts.values() if p.is_leader)
        try:
            await leader.append([b"warm"])
        except NotLeader:
            await asyncio.sleep(TICK_MS / 1000)
            continue
        return leader
    raise AssertionError(f"no append committed in {WARM_ATTEMPTS} leaderships")


def leader_of(nodes: dict[NodeId, Watched]) -> tuple[Watched, list[Watched]]:
    leader = next(w for w in nodes.values() if w.part.is_leader)
    return leader, [w for w in nodes.values() if w is not leader]


def run(
    body: Callable[[dict[NodeId, Watched]], Coroutine[None, None, None]],
    root: Path,
    mode: str,
    leader_bytes: int = 0,
) -> None:
    async def main() -> None:
        async with three_hosts(root, mode, leader_bytes) as nodes:
            await body(nodes)

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES)
def test_acks_leave_only_after_the_sync_that_covers_them(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow follower syncs (5 ms inline; 20 ms on the fsync thread, while the loop reads the
    next Appends): every ack a follower sends names an index its own sync already returned
    for, and the appends succeed. (The back-off after a slow inline sync is another test's.)"""
    monkeypatch.setattr(host_module, "INLINE_SYNC_SLOW_S", 10.0)

    async def body(nodes: dict[NodeId, Watched]) -> None:
        leader, followers = leader_of(nodes)
        inline_before = [f.host.syncs_inline for f in followers]
        for follower in followers:
            follower.sync_delay_s = 0.005 if mode == "inline" else 0.02
        for i in range(20):
            await leader.part.append([b"r%d" % i])
        for follower, before in zip(followers, inline_before, strict=True):
            assert follower.acks, "the followers acknowledged"
            assert follower.early_acks() == [], follower.early_acks()
            if mode == "inline":
                assert follower.host.syncs_inline > before
            else:
                assert follower.host.syncs_inline == 0 and follower.host.syncs_threaded > 0

    run(body, tmp_path, mode)


@pytest.mark.parametrize("mode", MODES)
def test_a_failing_sync_acknowledges_nothing(tmp_path: Path, mode: str) -> None:
    """Both followers' syncs fail: neither acknowledges the entry, so the leader cannot
    commit it and the append is never `accepted`; the followers stop (StorageFailure)."""

    async def body(nodes: dict[NodeId, Watched]) -> None:
        leader, followers = leader_of(nodes)
        await leader.part.append([b"before"])
        last = leader.part.raft.log.last_index
        await until(
            lambda: all(any(i >= last for i, _ in f.acks) for f in followers),
            "both followers acknowledged the entry",
        )
        acked = [max((i for i, _ in f.acks), default=0) for f in followers]
        for follower in followers:
            follower.sync_error = OSError(5, "injected EIO")
        append = leader.part.append([b"never"])
        with pytest.raises((TimeoutError, BrokerError)):
            await asyncio.wait_for(asyncio.shield(append), 1.0)
        assert not append.done() or append.exception() is not None
        for follower, before in zip(followers, acked, strict=True):
            assert max((i for i, _ in follower.acks), default=0) == before
            assert follower.early_acks() == []
            assert follower.part.failure is not None
        append.cancel()

    run(body, tmp_path, mode)


def test_a_slow_inline_sync_sends_the_next_ones_to_the_fsync_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inline sync slower than INLINE_SYNC_SLOW_S (a busy disk) backs off: the next
    batches sync on the fsync thread, and the loop is not stalled by every one of them. (The
    busy rule is another test's: the three hosts share this process's loop, which a loaded
    machine kept above it, so no sync ran inline to be slow.)"""
    monkeypatch.setattr(host_module, "INLINE_LOOP_BUSY_MAX", 1.01)

    async def body(nodes: dict[NodeId, Watched]) -> None:
        leader, followers = leader_of(nodes)
        await leader.part.append([b"warm"])
        follower = followers[0]
        threaded = follower.host.syncs_threaded
        follower.sync_delay_s = 2 * INLINE_SYNC_SLOW_S
        for i in range(5):
            await leader.part.append([b"r%d" % i])
        await until(lambda: follower.host.inline_backoffs >= 1, "the slow sync is noticed")
        await until(lambda: follower.host.syncs_threaded > threaded, "later syncs are threaded")
        assert follower.early_acks() == []

    run(body, tmp_path, "inline")


def test_a_disk_whose_syncs_take_milliseconds_keeps_them_on_the_fsync_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower whose every sync takes 5 ms (network block storage: under
    INLINE_SYNC_SLOW_S, so no single one backs off) stops syncing inline once its syncs'
    average passes INLINE_SYNC_TYPICAL_MAX_S, goes on measuring them on the fsync thread, and
    syncs inline again once the disk is fast. (The busy rule set aside, as above; and the
    slow-sync back-off too: on a loaded machine one 5 ms sync took over INLINE_SYNC_SLOW_S
    in CI, and a back-off would keep the syncs threaded without the rule under test.)"""
    monkeypatch.setattr(host_module, "INLINE_LOOP_BUSY_MAX", 1.01)
    slow_s = 0.005
    assert 2 * INLINE_SYNC_TYPICAL_MAX_S < slow_s < INLINE_SYNC_SLOW_S
    monkeypatch.setattr(host_module, "INLINE_SYNC_SLOW_S", 3600.0)

    async def body(nodes: dict[NodeId, Watched]) -> None:
        leader, followers = leader_of(nodes)
        follower = followers[0]
        host = follower.host
        follower.sync_delay_s = slow_s
        for i in range(40):
            await leader.part.append([b"slow%d" % i])
        await until(lambda: host.sync_seconds_avg > INLINE_SYNC_TYPICAL_MAX_S, "the average")
        inline = host.syncs_inline
        threaded = host.syncs_threaded
        for i in range(10):
            await leader.part.append([b"still%d" % i])
        await until(lambda: host.syncs_threaded > threaded, "the slow syncs are threaded")
        assert host.syncs_inline == inline, "no inline sync while they are slow"
        assert host.inline_backoffs == 0, "no back-off: the average alone keeps them threaded"
        follower.sync_delay_s = 0.0
        for i in range(60):
            await leader.part.append([b"fast%d" % i])
        await until(lambda: host.syncs_inline > inline, "inline again on a fast disk")
        assert follower.early_acks() == []

    run(body, tmp_path, "inline")


def test_a_busy_loop_keeps_its_syncs_on_the_fsync_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the loop thread is busy (its CPU time as much as the wall time, as W1's leader
    parsing and proposing at full rate), small batches sync on the fsync thread, so that the
    loop works meanwhile; once it is idle again they sync inline. The loop's CPU clock is
    replaced by the wall clock: a busy loop without a flaky CPU burner."""
    monkeypatch.setattr(host_module, "INLINE_SYNC_SLOW_S", 10.0)  # a slow disk: not this test

    async def body(nodes: dict[NodeId, Watched]) -> None:
        leader, followers = leader_of(nodes)
        hosts = [w.host for w in nodes.values()]
        with monkeypatch.context() as busy:
            busy.setattr(host_module.time, "thread_time", time.monotonic)
            await until(lambda: all(h.loop_busy >= INLINE_LOOP_BUSY_MAX for h in hosts), "busy")
            before = [(h.syncs_inline, h.syncs_threaded) for h in hosts]
            for i in range(10):
                await leader.part.append([b"busy%d" % i])
            after = [(h.syncs_inline, h.syncs_threaded) for h in hosts]
        assert [a[0] for a in after] == [b[0] for b in before], (before, after)
        assert all(a[1] > b[1] for a, b in zip(after, before, strict=True)), (before, after)
        await until(lambda: all(h.loop_busy < INLINE_LOOP_BUSY_MAX for h in hosts), "idle")
        following = [w.host for w in followers]
        inline = [h.syncs_inline for h in following]
        for i in range(100):  # the test's own loop may be busy for a tick now and then
            await leader.part.append([b"idle%d" % i])
            if all(h.syncs_inline > n for h, n in zip(following, inline, strict=True)):
                break
            await asyncio.sleep(0.05)
        assert all(h.syncs_inline > n for h, n in zip(following, inline, strict=True))
        assert all(w.early_acks() == [] for w in nodes.values())

    run(body, tmp_path, "inline")


def test_the_trace_stamps_each_batch_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$SPATE_SYNC_TRACE: one row per batch, its stamps in the order the driver loop takes
    its steps, on both paths (the trace is what RESULTS §40's breakdown is read from)."""
    trace_dir = tmp_path / "trace"
    monkeypatch.setenv(synctrace.TRACE_ENV, str(trace_dir))
    for mode in MODES:

        async def body(nodes: dict[NodeId, Watched]) -> None:
            leader, _followers = leader_of(nodes)
            for i in range(10):
                await leader.part.append([b"r%d" % i])

        run(body, tmp_path / mode, mode)
        rows = []
        for path in sorted(trace_dir.glob("sync-trace-*.tsv")):
            lines = path.read_text().splitlines()
            assert lines[0].split("\t") == list(synctrace.FIELDS)
            rows += [
                dict(zip(synctrace.FIELDS, map(int, line.split("\t")), strict=True))
                for line in lines[1:]
            ]
            path.unlink()
        synced = [r for r in rows if r["syncs"]]
        assert (
            synced and any(r["leaders"] for r in synced) and any(not r["leaders"] for r in synced)
        )
        for r in synced:
            # the stamps from the batch's begin to its acks flushed, in the order they happen
            steps = [r[f] for f in synctrace.FIELDS[1 : synctrace.FIELDS.index("flushed") + 1]]
            assert steps == sorted(steps) and steps[0] > 0, r
            assert r["woken"] <= r["begin"], r
            if r["inline"]:
                assert r["resumed"] == r["job_end"], r
                assert not r["leaders"], r  # a leader's own sync stays on the fsync thread
        flags = [r["inline"] for r in synced]
        assert any(flags) if mode == "inline" else not any(flags), flags


def test_inline_syncs_are_on_unless_the_environment_turns_them_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On by default since RESULTS §50 (followers' batches up to INLINE_SYNC_BYTES_MAX,
    leaders' up to INLINE_LEADER_BYTES_DEFAULT); 0 turns either off, another value sets its
    limit, and a bad value names what to change."""
    for name in (host_module.INLINE_BYTES_ENV, host_module.INLINE_LEADER_BYTES_ENV):
        monkeypatch.delenv(name, raising=False)
    assert host_module.inline_sync_bytes_max() == INLINE_SYNC_BYTES_MAX
    host = ReplicationHost(
        IDS[0], tmp_path, host="127.0.0.1", port=0, secret=SECRET, peers=lambda _node: None
    )
    assert host.inline_sync_bytes == INLINE_SYNC_BYTES_MAX
    assert host.inline_leader_bytes == host_module.INLINE_LEADER_BYTES_DEFAULT == 4096
    monkeypatch.setenv(host_module.INLINE_BYTES_ENV, "0")
    monkeypatch.setenv(host_module.INLINE_LEADER_BYTES_ENV, "0")
    host = ReplicationHost(
        IDS[0], tmp_path, host="127.0.0.1", port=0, secret=SECRET, peers=lambda _node: None
    )
    assert host.inline_sync_bytes == 0 and host.inline_leader_bytes == 0
    monkeypatch.setenv(host_module.INLINE_BYTES_ENV, "65536")
    assert host_module.inline_sync_bytes_max() == 65536
    for bad in ("-1", "lots"):
        monkeypatch.setenv(host_module.INLINE_BYTES_ENV, bad)
        with pytest.raises(InvalidArgument, match="SPATE_SYNC_INLINE_BYTES_MAX must be a byte"):
            host_module.inline_sync_bytes_max()


def test_the_sync_handoff_is_the_sync_thread_unless_the_environment_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ADR 0040: the sync thread by default; $SPATE_SYNC_HANDOFF=executor puts back
    `run_in_executor` (for A/B runs); a bad value names what to change."""
    monkeypatch.delenv(host_module.HANDOFF_ENV, raising=False)
    assert host_module.sync_handoff() == "thread"
    monkeypatch.setenv(host_module.HANDOFF_ENV, "executor")
    assert host_module.sync_handoff() == "executor"
    monkeypatch.setenv(host_module.HANDOFF_ENV, "inline")
    with pytest.raises(InvalidArgument, match="SPATE_SYNC_HANDOFF must be one of thread, exec"):
        host_module.sync_handoff()


@pytest.mark.parametrize("mode", ["thread", "executor"])
def test_a_follower_stopping_with_its_sync_in_flight(tmp_path: Path, mode: str) -> None:
    """A follower's host stops while its batch's fsync runs (200 ms): `stop` waits for the
    sync before it closes the replica's files (the sync returns cleanly), the abandoned batch
    sends no ack (the stopping host finishes nothing), and the leader commits the entry with
    the other follower. On the sync thread (ADR 0040) the batch is finished by the thread's
    completion callback, not the driver task, so the callback must see the stop."""

    async def main() -> None:
        async with three_hosts(tmp_path, mode) as nodes:
            leader, followers = leader_of(nodes)
            follower = followers[0]
            started = threading.Event()
            outcomes: list[str] = []
            store = follower.part.store
            run_sync = store.run_sync

            def slow_sync(work: SyncWork) -> None:
                started.set()
                time.sleep(0.2)
                try:
                    run_sync(work)
                except OSError as error:
                    outcomes.append(f"failed: {error}")
                    raise
                outcomes.append("ok")

            store.run_sync = slow_sync  # type: ignore[method-assign]
            acks = len(follower.acks)
            append = asyncio.ensure_future(leader.part.append([b"late"]))
            await until(started.is_set, "the follower's sync started")
            await follower.host.stop()
            assert outcomes == ["ok"]
            assert follower.part.closed
            assert len(follower.acks) == acks, follower.acks[acks:]
            await asyncio.wait_for(append, 10)

    asyncio.run(main())


def test_a_leaders_small_syncs_inline_still_commit_only_on_a_majority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`inline_leader_bytes` (off by default, RESULTS §49): a leader's small batches sync on
    its loop thread too, and its appends commit; with both followers' syncs failing, the
    leader's own inline sync is one of three: nothing is accepted. (The busy rule is another
    test's: a loaded CI machine kept the leader's loop above it.)"""
    monkeypatch.setattr(host_module, "INLINE_SYNC_SLOW_S", 10.0)
    monkeypatch.setattr(host_module, "INLINE_LOOP_BUSY_MAX", 1.01)

    async def body(nodes: dict[NodeId, Watched]) -> None:
        leader, followers = leader_of(nodes)
        before = leader.host.syncs_inline
        for i in range(20):
            await leader.part.append([b"r%d" % i])
        assert leader.host.syncs_inline > before, "the leader's small syncs ran inline"
        for follower in followers:
            assert follower.early_acks() == []
            follower.sync_error = OSError(5, "injected EIO")
        append = leader.part.append([b"never"])
        with pytest.raises((TimeoutError, BrokerError)):
            await asyncio.wait_for(asyncio.shield(append), 1.0)
        assert not append.done() or append.exception() is not None
        append.cancel()

    run(body, tmp_path, "inline", LEADERS_INLINE)


def test_a_stream_of_writes_keeps_the_syncs_on_the_fsync_thread(tmp_path: Path) -> None:
    """Small batches sync inline only while the node wrote at most INLINE_RECENT_BYTES_MAX in
    this tick and the last (RESULTS §49: W1's burst lost 3-10% to inline syncs the loop-busy
    rule, a tick late, did not stop); a quiet tick later they are inline again."""
    host = ReplicationHost(
        IDS[0],
        tmp_path,
        host="127.0.0.1",
        port=0,
        secret=SECRET,
        peers=lambda _node: None,
        inline_sync_bytes=INLINE_SYNC_BYTES_MAX,
    )
    follower = SimpleNamespace(raft=SimpleNamespace(role=Role.FOLLOWER))

    def batch(size: int) -> Any:
        return SimpleNamespace(syncs=[(follower, None)], bytes_written=size)

    assert host._inline(batch(2048))
    written = 2048
    while written + 16384 <= INLINE_RECENT_BYTES_MAX:
        assert host._inline(batch(16384))
        written += 16384
    assert not host._inline(batch(16384)), "past the recent bytes: the fsync thread"
    assert not host._inline(batch(100)), "still this tick"
    host._bytes_last_tick, host._bytes_this_tick = host._bytes_this_tick, 0  # a tick
    assert not host._inline(batch(100)), "the last tick counts too"
    host._bytes_last_tick, host._bytes_this_tick = host._bytes_this_tick, 0  # a quiet one
    assert host._inline(batch(100))
