"""The streams a run uses: created (or found) before it, deleted after it on request, over
the admin gRPC API — as stream-perf-test does: it always tries to create them; streams that
exist already are used as they are (with a warning when their retention differs).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import grpc
from spate.api.tls import channel, explain, from_environment
from spate.api.v1 import admin_pb2 as pb
from spate.api.v1 import admin_pb2_grpc
from spate.core.errors import (
    AlreadyExists,
    BrokerError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)

ERROR_CODE_KEY = "spate-error-code"  # the server's trailing metadata key (cluster.admin.errors)
_BY_CODE: dict[str, type[BrokerError]] = {
    kind.code.value: kind
    for kind in (AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unavailable)
}


@dataclass(frozen=True)
class Retention:
    max_bytes: int | None = None
    max_age_ms: int | None = None


@dataclass(frozen=True)
class SuperStreamTopology:
    name: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]
    routing: str


class Admin:
    """A gRPC channel to one node's admin API, with Spate's errors for its failures."""

    def __init__(self, address: str, timeout_s: float) -> None:
        """TLS and the token as the `spate` CLI's: $SPATE_ADMIN_TLS_CA, _CERT, _KEY and
        $SPATE_ADMIN_TOKEN (spate.api.tls)."""
        self.address, self.timeout_s = address, timeout_s
        self._tls = from_environment()
        self._channel = channel(address, self._tls)
        self._stub = admin_pb2_grpc.AdminStub(self._channel)
        token = os.environ.get("SPATE_ADMIN_TOKEN")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise self._failure(error) from None

    def _failure(self, error: Any) -> BrokerError:
        details = error.details() or error.code().name
        spate_code = dict(error.trailing_metadata() or ()).get(ERROR_CODE_KEY)
        known = _BY_CODE.get(spate_code) if spate_code is not None else None
        if known is not None:
            return known(details)
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            why = explain(details, self.address, self._tls)
            if why is not None:
                return Unavailable(f"{why} (spate perf: set $SPATE_ADMIN_TLS_CA, _CERT, _KEY)")
        if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return Unavailable(
                f"cannot reach the admin API at {self.address} ({details}); spate perf creates "
                "its streams there: pass --admin HOST:PORT (or set SPATE_ADMIN)"
            )
        return FailedPrecondition(f"the admin API at {self.address} failed: {details}")

    def ensure_stream(
        self, name: str, replicas: int | None, retention: Retention
    ) -> tuple[bool, str | None]:
        """Create the stream (one partition); (created, warning about an existing one)."""
        config = pb.StreamConfig(
            name=name,
            partitions=1,
            retention=pb.Retention(max_age_ms=retention.max_age_ms, max_bytes=retention.max_bytes),
        )
        if replicas is not None:
            config.replicas = replicas
        try:
            self._call("CreateStream", pb.CreateStreamRequest(stream=config))
        except AlreadyExists:
            return False, self._differs(name, replicas, retention)
        return True, None

    def _differs(self, name: str, replicas: int | None, retention: Retention) -> str | None:
        stream = self._call("DescribeStream", pb.DescribeStreamRequest(name=name)).stream
        have = (
            stream.retention.max_bytes if stream.retention.HasField("max_bytes") else None,
            stream.retention.max_age_ms if stream.retention.HasField("max_age_ms") else None,
        )
        differences = []
        if have != (retention.max_bytes, retention.max_age_ms):
            differences.append(f"retention max-bytes/max-age {have[0]}/{have[1]}")
        if replicas is not None and stream.replicas != replicas:
            differences.append(f"{stream.replicas} replicas")
        if stream.partitions != 1:
            differences.append(f"{stream.partitions} partitions")
        if not differences:
            return None
        return f"stream {name!r} exists with {', '.join(differences)}: used as it is"

    def ensure_super_stream(
        self, name: str, partitions: int, replicas: int | None, retention: Retention
    ) -> tuple[bool, SuperStreamTopology]:
        template = pb.StreamConfig(
            name=name,
            retention=pb.Retention(max_age_ms=retention.max_age_ms, max_bytes=retention.max_bytes),
        )
        if replicas is not None:
            template.replicas = replicas
        request = pb.CreateSuperStreamRequest(name=name, partitions=partitions, stream=template)
        try:
            topology = self._call("CreateSuperStream", request).super_stream
            created = True
        except AlreadyExists:
            described = self._call("DescribeSuperStream", pb.DescribeSuperStreamRequest(name=name))
            topology, created = described.super_stream, False
        return created, SuperStreamTopology(
            topology.name,
            tuple(topology.partitions),
            tuple(topology.binding_keys),
            topology.routing or "hash",
        )

    def delete_stream(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self._call("DeleteStream", pb.DeleteStreamRequest(name=name))

    def delete_super_stream(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self._call("DeleteSuperStream", pb.DeleteSuperStreamRequest(name=name))
