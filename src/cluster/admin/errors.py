"""BrokerError code -> gRPC status code: the one table, nowhere else.

The error's message travels as the status details, the code's text (e.g. "not-found") in the
trailing metadata key ERROR_CODE_KEY, so a client can tell "the metadata service is unavailable"
(UNAVAILABLE with a spate code) from "nothing listens there" (UNAVAILABLE without one).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import grpc
from spate.core.errors import BrokerError, ErrorCode

ERROR_CODE_KEY = "spate-error-code"

GRPC_STATUS: Mapping[ErrorCode, grpc.StatusCode] = MappingProxyType(
    {
        ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
        ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
        ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
        ErrorCode.MESSAGE_SIZE_EXCEEDED: grpc.StatusCode.INVALID_ARGUMENT,
        ErrorCode.UNAUTHORIZED: grpc.StatusCode.PERMISSION_DENIED,
        ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
        ErrorCode.NOT_LEADER: grpc.StatusCode.UNAVAILABLE,
        ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
        ErrorCode.RESOURCE_LIMIT: grpc.StatusCode.RESOURCE_EXHAUSTED,
        ErrorCode.NO_PARTITION_FREE: grpc.StatusCode.RESOURCE_EXHAUSTED,
        ErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
        ErrorCode.NOT_IMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
        ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
        ErrorCode.STORAGE: grpc.StatusCode.INTERNAL,
    }
)

assert set(GRPC_STATUS) == set(ErrorCode), "every error code needs a gRPC status"


def grpc_status(error: BrokerError) -> grpc.StatusCode:
    return GRPC_STATUS[error.code]
