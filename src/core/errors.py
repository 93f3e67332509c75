"""Typed failures. Bugs are assertions; failures that a peer or operator causes are BrokerErrors.

Each error names its code, who is to blame and whether retrying can help. The AMQP condition table
lives in spate.gateway.errors and the gRPC status table in spate.cluster.admin.errors: one table
each, nowhere else.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar


class Blame(Enum):
    CLIENT = "client"  # the request was wrong; retrying the same request fails again
    SERVER = "server"  # the broker could not do it now


class ErrorCode(Enum):
    NOT_FOUND = "not-found"
    ALREADY_EXISTS = "already-exists"
    INVALID_ARGUMENT = "invalid-argument"
    MESSAGE_SIZE_EXCEEDED = "message-size-exceeded"
    UNAUTHORIZED = "unauthorized"
    UNAUTHENTICATED = "unauthenticated"
    NOT_LEADER = "not-leader"
    UNAVAILABLE = "unavailable"
    RESOURCE_LIMIT = "resource-limit-exceeded"
    NO_PARTITION_FREE = "no-partition-free"
    FAILED_PRECONDITION = "failed-precondition"
    NOT_IMPLEMENTED = "not-implemented"
    INTERNAL = "internal"
    STORAGE = "storage"


class BrokerError(Exception):
    """A failure with a code, a blame side and a retry flag; the message is for a person."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    blame: ClassVar[Blame] = Blame.SERVER
    retryable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(BrokerError):
    code, blame = ErrorCode.NOT_FOUND, Blame.CLIENT


class AlreadyExists(BrokerError):
    code, blame = ErrorCode.ALREADY_EXISTS, Blame.CLIENT


class InvalidArgument(BrokerError):
    code, blame = ErrorCode.INVALID_ARGUMENT, Blame.CLIENT


class MessageSizeExceeded(BrokerError):
    code, blame = ErrorCode.MESSAGE_SIZE_EXCEEDED, Blame.CLIENT


class Unauthorized(BrokerError):
    code, blame = ErrorCode.UNAUTHORIZED, Blame.CLIENT


class Unauthenticated(BrokerError):
    """No identity, or one that does not check out (a missing or unknown admin token)."""

    code, blame = ErrorCode.UNAUTHENTICATED, Blame.CLIENT


class NotImplementedFeature(BrokerError):
    code, blame = ErrorCode.NOT_IMPLEMENTED, Blame.CLIENT


class FailedPrecondition(BrokerError):
    """The request is valid but the state does not allow it now (e.g. resetting the offset of
    a consumer name whose link is attached)."""

    code, blame = ErrorCode.FAILED_PRECONDITION, Blame.CLIENT


class ResourceLimitExceeded(BrokerError):
    code, blame, retryable = ErrorCode.RESOURCE_LIMIT, Blame.SERVER, True


class NoPartitionFree(ResourceLimitExceeded):
    """000 §4.5.1: a consumer group link the node was to bind finds every partition owned
    (answered `amqp:link:detach-forced`)."""

    code = ErrorCode.NO_PARTITION_FREE


class Unavailable(BrokerError):
    code, blame, retryable = ErrorCode.UNAVAILABLE, Blame.SERVER, True


class NotLeader(BrokerError):
    """This node does not lead the partition; `leader` says where to go when it is known."""

    code, blame, retryable = ErrorCode.NOT_LEADER, Blame.SERVER, True

    def __init__(
        self,
        message: str,
        *,
        leader_host: str | None = None,
        leader_port: int | None = None,
        leader_node: str | None = None,
    ) -> None:
        super().__init__(message)
        self.leader_host = leader_host
        self.leader_port = leader_port
        self.leader_node = leader_node


class StorageFailure(BrokerError):
    """The disk refused a write or a sync; the partition stops accepting appends."""

    code, blame = ErrorCode.STORAGE, Blame.SERVER
