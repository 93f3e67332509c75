"""SetReplicas (ADR 0022): the metadata side of a partition move. Pure state machine and codec:
learners are assigned, leader reports from them accepted, every refusal has its code, and the
record survives the full dump."""

from __future__ import annotations

from cluster.test_metadata_placement import T0, register, rid
from spate.cluster.metadata.codec import (
    LogEntry,
    RaftCheckpoint,
    decode_command,
    decode_dump,
    encode_command,
    encode_dump,
)
from spate.cluster.metadata.state import (
    Applied,
    CreateStream,
    MetadataState,
    Rejected,
    ReportLeader,
    SetReplicas,
    assignments,
)
from spate.core.errors import ErrorCode
from spate.core.ids import LeaderEpoch, NodeId, PartitionId, StreamName
from spate.core.streams import StreamConfig

N1, N2, N3, N4 = (NodeId(f"n{i}") for i in range(1, 5))
ORDERS = StreamName("orders")


def _state() -> MetadataState:
    state = MetadataState()
    for node in ("n1", "n2", "n3", "n4"):
        assert isinstance(state.apply(register(node)), Applied)
    config = StreamConfig(name=ORDERS, partitions=1, replicas=3)
    assert isinstance(state.apply(CreateStream(rid(), config, T0)), Applied)
    return state


def test_a_move_is_recorded_step_by_step_and_nodes_follow() -> None:
    state = _state()
    before = state.view.streams[ORDERS].partitions[0].replicas
    assert N4 not in before
    joining = SetReplicas(rid(), ORDERS, PartitionId(0), before, (N4,), expected=before)
    assert isinstance(state.apply(joining), Applied)
    assert [a.partition for a in assignments(state.view, N4)] == [0]  # n4 opens it
    # A promoted learner may lead before metadata lists it as a voter.
    report = ReportLeader(rid(), ORDERS, PartitionId(0), N4, LeaderEpoch(5))
    assert isinstance(state.apply(report), Applied)
    after = (N4, *before[1:])
    assert isinstance(state.apply(SetReplicas(rid(), ORDERS, PartitionId(0), after)), Applied)
    record = state.view.streams[ORDERS].partitions[0]
    assert record.replicas == after and record.learners == ()
    assert record.leader is not None and record.leader.node == N4  # kept
    assert assignments(state.view, before[0]) == []  # the source closes its replica


def test_refusals_name_what_is_wrong() -> None:
    state = _state()
    replicas = state.view.streams[ORDERS].partitions[0].replicas

    def code(command: SetReplicas) -> ErrorCode:
        result = state.apply(command)
        assert isinstance(result, Rejected), result
        return result.code

    assert code(SetReplicas(rid(), StreamName("nope"), PartitionId(0), replicas)) is (
        ErrorCode.NOT_FOUND
    )
    assert code(SetReplicas(rid(), ORDERS, PartitionId(3), replicas)) is ErrorCode.INVALID_ARGUMENT
    assert code(SetReplicas(rid(), ORDERS, PartitionId(0), ())) is ErrorCode.INVALID_ARGUMENT
    twice = SetReplicas(rid(), ORDERS, PartitionId(0), replicas, (replicas[0],))
    assert code(twice) is ErrorCode.INVALID_ARGUMENT
    ghost = SetReplicas(rid(), ORDERS, PartitionId(0), (*replicas[:2], NodeId("n9")))
    assert code(ghost) is ErrorCode.NOT_FOUND
    stale = SetReplicas(rid(), ORDERS, PartitionId(0), replicas, (N4,), expected=(N1,))
    assert code(stale) is ErrorCode.FAILED_PRECONDITION
    assert state.view.streams[ORDERS].partitions[0].learners == ()  # nothing changed


def test_set_replicas_and_learners_round_trip_through_the_codec_and_the_dump() -> None:
    command = SetReplicas(rid(), ORDERS, PartitionId(0), (N1, N2, N3), (N4,), expected=(N1,))
    assert decode_command(encode_command(command)) == command
    state = _state()
    replicas = state.view.streams[ORDERS].partitions[0].replicas
    assert isinstance(
        state.apply(SetReplicas(rid(), ORDERS, PartitionId(0), replicas, (N4,))), Applied
    )
    entry = LogEntry(b"x", 1, 1)
    checkpoint = RaftCheckpoint((entry, entry), ("127.0.0.1:1",))
    _, restored = decode_dump(encode_dump(checkpoint, state.snapshot()))
    again = MetadataState(restored)
    assert again.view.streams[ORDERS].partitions[0].learners == (N4,)
