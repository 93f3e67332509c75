"""A leader's answers to reads of the log's state (a consumer's stored offset, ADR 0012; a
producer's last publishing id, ADR 0011) are never older than a write acknowledged before the
read was asked, wherever that write was led.

The reads are answered from the leader's log, once a quorum has confirmed in this term that it
still leads (`Raft.confirm_leadership`, Raft thesis §6.4: ReadIndex's heartbeat round). Before
(issue 16, ADR 0035 addendum) a replica that still believed it led answered at once: cut off
from its quorum (check-quorum gives it up to two election timeouts) or left behind by a
leadership transfer whose new term it had not heard, it answered "never stored" for a store a
newer leader had committed and acknowledged — the shell simulator's seed 208 (`offset-durable`),
once folded acks had changed which messages its network lost.

Production drivers and replicas, frames carried by hand (replication/drivers.py).
"""

from __future__ import annotations

from replication.drivers import Nodes, outcomes
from spate.core.backend import ConsumerOffset, ProducerInfo, PublishingIds
from spate.core.errors import BrokerError, NotLeader
from spate.core.ids import NodeId, Offset
from spate.node.replication.raft import Role
from spate.node.replication.replica import Replica

NAME = b"consumer-a"
PRODUCER = b"producer-a"


def _run_without(nodes: Nodes, live: list[NodeId], cut: NodeId) -> None:
    """Batches and deliveries among `live` only; everything to or from `cut` is lost."""
    for _ in range(50):
        for node in live:
            nodes.run(node)
        nodes.discard(cut)
        if not nodes.deliver(to=live):
            return
    raise AssertionError("the live nodes did not settle")


def _cut_off(nodes: Nodes, n1: NodeId, live: list[NodeId]) -> Replica:
    """n1 is cut off, and its ticks are late (a loaded node): it still believes it leads, as it
    may for up to two election timeouts under check-quorum. The `live` two elect a leader,
    returned."""
    for _ in range(60):
        for node in live:
            nodes.drivers[node].tick()
        _run_without(nodes, live, n1)
        if any(nodes.replicas[n].raft.role is Role.LEADER for n in live):
            break
    (new_id,) = [n for n in live if nodes.replicas[n].raft.role is Role.LEADER]
    new = nodes.replicas[new_id]
    assert nodes.replicas[n1].raft.role is Role.LEADER
    assert nodes.replicas[n1].raft.term < new.raft.term
    return new


def _heal(nodes: Nodes, n1: NodeId, live: list[NodeId]) -> None:
    """The peers answer the old term's heartbeats with their own term: n1 steps down."""
    nodes.deliver(to=live)
    for node in live:
        nodes.run(node)
    nodes.deliver(to=[n1])
    assert nodes.replicas[n1].raft.role is Role.FOLLOWER


def test_a_leader_cut_off_from_its_quorum_never_answers_from_its_stale_log() -> None:
    nodes = Nodes()
    n1, a, b = nodes.elect()
    old = nodes.replicas[n1]
    live = [a, b]
    new = _cut_off(nodes, n1, live)
    # The new leader stores an offset and a publishing id; both are acknowledged.
    stored, done = outcomes()
    new.propose_offsets([(NAME, 5)], done)  # type: ignore[arg-type]
    new.propose([b"r"], done, PublishingIds(PRODUCER, [1]))  # type: ignore[arg-type]
    _run_without(nodes, live, n1)
    assert stored == [Offset(0), Offset(0)]

    # A consumer sent to n1 by stale metadata asks for its stored offset; a producer, for its
    # last publishing id. n1's log has neither: it must not answer "never stored".
    offsets: list[ConsumerOffset | BrokerError | None] = []
    ids: list[ProducerInfo | BrokerError | None] = []
    old.query_offset(NAME, offsets.append)
    old.query_publishing_id(PRODUCER, ids.append)
    assert offsets == [] and ids == [], (offsets, ids)  # before: [None], [None]
    nodes.run(n1)  # its leadership check: heartbeats to both peers
    assert offsets == [] and ids == []
    # Healed: n1 steps down, and the reads fail as retryable NotLeader (the client asks the
    # new leader).
    _heal(nodes, n1, live)
    assert [type(o) for o in offsets] == [NotLeader], offsets
    assert [type(i) for i in ids] == [NotLeader], ids

    # The new leader answers after one round trip of its own check, with what it stored.
    offsets.clear()
    ids.clear()
    new.query_offset(NAME, offsets.append)
    new.query_publishing_id(PRODUCER, ids.append)
    assert offsets == [] and ids == []  # not before a quorum confirmed it
    nodes.settle()
    assert [o.offset for o in offsets if isinstance(o, ConsumerOffset)] == [5], offsets
    assert [i.last_publishing_id for i in ids if isinstance(i, ProducerInfo)] == [1], ids


def test_a_leader_answers_reads_once_a_quorum_confirmed_it_leads() -> None:
    """Several reads at once share one check; a leader whose answers are lost waits (its next
    heartbeats carry the round again) and never answers without them."""
    nodes = Nodes()
    n1, _, _ = nodes.elect()
    leader = nodes.replicas[n1]
    stored, done = outcomes()
    leader.propose_offsets([(NAME, 3)], done)  # type: ignore[arg-type]
    nodes.settle()
    assert stored == [Offset(0)]
    answers: list[ConsumerOffset | BrokerError | None] = []
    for _ in range(3):
        leader.query_offset(NAME, answers.append)
    leader.query_offset(b"never-stored", answers.append)
    assert answers == []  # before: answered at once
    nodes.run(n1)
    assert nodes.discard(n1) == 2  # one check for the four reads, lost on its way
    nodes.run(n1)
    assert answers == []
    nodes.drivers[n1].tick()  # the next heartbeats carry the round again
    nodes.settle()
    assert [a.offset if isinstance(a, ConsumerOffset) else a for a in answers] == [3, 3, 3, None]


def test_a_cut_off_leader_never_answers_a_batch_of_duplicates() -> None:
    """ADR 0041: a batch whose every message is a duplicate (ADR 0011) is answered with the end
    offset of the leader's log, once the entry that stored the originals is committed. The
    originals being committed, `accepted` is true wherever it is answered; the end offset is
    a read of the log's state like the ones above, so it too waits for a quorum to confirm that
    the leader still leads. Before, a leader cut off from its quorum answered at once, with the
    end of a log missing what a newer leader had acknowledged since."""
    nodes = Nodes()
    n1, a, b = nodes.elect()
    old = nodes.replicas[n1]
    stored, done = outcomes()
    old.propose([b"first"], done, PublishingIds(PRODUCER, [1]))  # type: ignore[arg-type]
    nodes.settle()
    assert stored == [Offset(0)]
    live = [a, b]
    new = _cut_off(nodes, n1, live)
    new.propose([b"x", b"y"], done)  # type: ignore[arg-type]  # another producer's
    _run_without(nodes, live, n1)
    assert stored == [Offset(0), Offset(1)]  # the stream ends at 3 now

    # The named producer, sent to n1 by stale metadata, resends its message 1.
    answers: list[Offset | BrokerError] = []
    assert old.propose([b"first"], answers.append, PublishingIds(PRODUCER, [1])) is None
    assert answers == []  # before: [Offset(1)], the end of n1's log
    nodes.run(n1)  # its leadership check: heartbeats to both peers
    assert answers == []
    _heal(nodes, n1, live)
    assert [type(x) for x in answers] == [NotLeader], answers  # retryable: ask the new leader

    # The new leader answers the same resend after one round trip, with the stream's end.
    answers.clear()
    assert new.propose([b"first"], answers.append, PublishingIds(PRODUCER, [1])) is None
    assert answers == []  # not before a quorum confirmed it
    nodes.settle()
    assert answers == [Offset(3)]
    assert new.end_offset() == 3, "nothing stored twice"
