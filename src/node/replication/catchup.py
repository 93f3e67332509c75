"""Catch-up by segment transfer: how a replica that needs entries its leader no longer keeps in
memory (or a wiped replica) gets the leader's segment files.

Follower side (`fetch`): ask the leader for a manifest of the segment files that hold every
chunk up to the snapshot index (the last file cut right after that chunk), then fetch each
file in pieces of `limits.catchup_piece_bytes` into `<replica>/catchup/`, one request in flight.
The transfer is resumable: a staged file is continued from its current size (the leader's
committed bytes never change, and the chunk bytes are identical on every replica), so a
transfer broken by a timeout, a leader change or a restart goes on where it stopped instead
of starting from zero (pysyncobj's behaviour, research/pysyncobj.md). Staged files are fsynced
before `install`.

`install` (on the owner's loop, between Ready batches): close the log, replace its segment
files by the staged ones, fsync the directory, reopen (recovery rebuilds the indexes, which are
caches), and record the commit point in the hard state. Then the host calls
`Raft.restore(index, term)`.

Leader side (`manifest_reply`, `piece_reply`): read-only, from durable, committed data.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from spate.core.errors import StorageFailure, Unavailable
from spate.node.log.partition_log import PartitionLog
from spate.node.log.segment import SEGMENT_SUFFIX, parse_name
from spate.node.replication import codec, limits
from spate.node.replication.storage import RaftStore

Request = Callable[[Callable[[int], bytes]], Awaitable[tuple[int, memoryview]]]
"""Sends a request frame built for a request id to the leader; resolves to (kind, body)."""


def staging_dir(store: RaftStore) -> Path:
    return store.directory / "catchup"


async def fetch(
    store: RaftStore, key: codec.GroupKey, raft_index: int, request: Request
) -> list[tuple[str, int]]:
    """Stage the leader's files up to `raft_index`; returns the manifest. Raises Unavailable
    when the leader refuses or does not answer (the caller retries later)."""
    staging = staging_dir(store)
    staging.mkdir(exist_ok=True)
    kind, body = await request(lambda rid: codec.encode_fetch_manifest(key, rid, raft_index))
    if kind != codec.KIND_MANIFEST:
        reason = bytes(codec.decode_reply(body)[1]).decode(errors="replace")
        raise Unavailable(f"leader refused the manifest: {reason}")
    _, manifest = codec.decode_manifest(body)
    names = {name for name, _ in manifest}
    for name, _ in manifest:
        meaning = parse_name(name)
        if meaning is None or meaning[1] != SEGMENT_SUFFIX or "/" in name:
            raise Unavailable(f"leader sent a manifest with a strange file name {name!r}")
    for stale in os.listdir(staging):
        if stale not in names:
            os.unlink(staging / stale)
    for name, size in manifest:
        path = staging / name
        have = path.stat().st_size if path.exists() else 0
        if have > size:
            os.truncate(path, size)  # the committed prefix is identical: keep what fits
            have = size
        with open(path, "ab") as out:
            while have < size:
                want = min(limits.catchup_piece_bytes, size - have)
                kind, body = await request(functools.partial(_piece_request, key, name, have, want))
                _, data = codec.decode_reply(body)
                if kind != codec.KIND_PIECE or len(data) == 0:
                    reason = bytes(data).decode(errors="replace")
                    raise Unavailable(f"leader refused segment {name} at {have}: {reason}")
                out.write(data[:want])
                out.flush()
                have += min(len(data), want)
        await asyncio.to_thread(_fsync_file, path)
    await asyncio.to_thread(_fsync_file, staging)
    return manifest


def _piece_request(
    key: codec.GroupKey, name: str, position: int, length: int, request_id: int
) -> bytes:
    return codec.encode_fetch_piece(key, request_id, name, position, length)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install(store: RaftStore, manifest: list[tuple[str, int]], raft_index: int) -> None:
    """Replace the replica's log by the staged files (see module docstring)."""
    staging = staging_dir(store)
    for name, size in manifest:
        if (staging / name).stat().st_size != size:
            raise StorageFailure(f"staged segment {name} is not {size} bytes")
    store.log.close()
    log_dir = store.directory / "log"
    for name in os.listdir(log_dir):
        os.unlink(log_dir / name)
    for name, _ in manifest:
        os.rename(staging / name, log_dir / name)
    _fsync_file(log_dir)
    shutil.rmtree(staging)
    _fsync_file(store.directory)
    store.log = PartitionLog.open(store.log_storage(), store.config)
    if store.log.last_raft_index != raft_index:
        raise StorageFailure(
            f"installed segments end at Raft index {store.log.last_raft_index}, not {raft_index}"
        )
    store.write_commit(raft_index)


def manifest_reply(store: RaftStore, request_id: int, raft_index: int) -> bytes:
    try:
        return codec.encode_manifest(request_id, store.log.transfer_manifest(raft_index))
    except StorageFailure as error:
        return codec.encode_fetch_error(request_id, error.message)


def piece_reply(store: RaftStore, request_id: int, name: str, position: int, length: int) -> bytes:
    length = min(length, limits.catchup_piece_bytes)
    try:
        return codec.encode_piece(request_id, store.log.read_file(name, position, length))
    except (StorageFailure, OSError) as error:
        return codec.encode_fetch_error(request_id, str(error))
