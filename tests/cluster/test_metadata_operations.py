"""Cluster operation records in the metadata service (ADR 0025): kept by id with the highest
revision, bounded, in the codec and the dump; older dumps (no "operations") still read."""

from __future__ import annotations

import pytest
from spate.cluster.metadata import limits
from spate.cluster.metadata.codec import (
    CodecError,
    LogEntry,
    RaftCheckpoint,
    decode_command,
    decode_dump,
    encode_command,
    encode_dump,
)
from spate.cluster.metadata.state import (
    Applied,
    MetadataState,
    OperationRecord,
    RecordOperation,
    Rejected,
    RequestId,
)
from spate.core.errors import ErrorCode
from spate.core.ids import NodeId


def record(op_id: str, revision: int, state: str = "running", step: str = "x") -> OperationRecord:
    return OperationRecord(
        id=op_id,
        node=NodeId("n1"),
        kind="move",
        target="orders/0 n1->n4",
        state=state,
        step=step,
        progress_permille=500,
        error="",
        error_code="",
        started_ms=1,
        finished_ms=0,
        log=("a", step),
        revision=revision,
    )


def publish(state: MetadataState, operation: OperationRecord) -> object:
    return state.apply(
        RecordOperation(RequestId(f"r-{operation.id}-{operation.revision}"), operation)
    )


def test_the_highest_revision_wins_and_the_version_does_not_move() -> None:
    state = MetadataState()
    assert publish(state, record("op-1", 2, step="second")) == Applied(0)
    assert publish(state, record("op-1", 1, step="first")) == Applied(0)  # late: ignored
    assert state.view.operations["op-1"].step == "second"
    publish(state, record("op-1", 3, state="succeeded"))
    assert state.view.operations["op-1"].state == "succeeded" and state.view.version == 0


def test_only_the_last_operations_are_kept() -> None:
    state = MetadataState()
    for n in range(limits.operations_kept_max + 5):
        publish(state, record(f"op-{n}", 1))
    publish(state, record("op-5", 2))  # republished: the newest now
    kept = list(state.view.operations)
    assert len(kept) == limits.operations_kept_max
    assert kept[-1] == "op-5" and "op-4" not in kept and kept[0] == "op-6"


def test_an_oversized_record_is_refused() -> None:
    state = MetadataState()
    long_log = record("op-1", 1)
    long_log = OperationRecord(**{**_fields(long_log), "log": ("x",) * 51})
    result = publish(state, long_log)
    assert isinstance(result, Rejected) and result.code is ErrorCode.INVALID_ARGUMENT


def _fields(operation: OperationRecord) -> dict[str, object]:
    return {name: getattr(operation, name) for name in OperationRecord.__slots__}


def test_codec_and_dump_round_trip_and_older_dumps_read() -> None:
    command = RecordOperation(RequestId("r1"), record("op-1", 7, step="ünïcode"))
    assert decode_command(encode_command(command)) == command
    state = MetadataState()
    publish(state, record("op-1", 1))
    publish(state, record("op-2", 1, state="failed"))
    checkpoint = RaftCheckpoint((LogEntry(b"a", 1, 1), LogEntry(b"b", 2, 1)), ("h:1",))
    _, snapshot = decode_dump(encode_dump(checkpoint, state.snapshot()))
    assert snapshot == state.snapshot()
    assert MetadataState(snapshot).view.operations == state.view.operations
    # A dump without operations has no "operations" key (older builds read it).
    empty = encode_dump(checkpoint, MetadataState().snapshot())
    assert b'"operations"' not in empty
    with pytest.raises(CodecError):
        decode_command(encode_command(command).replace(b'"revision":7', b'"revision":7,"extra":1'))
