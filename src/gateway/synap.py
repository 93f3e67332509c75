"""The Synap command API's requests and errors (003; ADR 0018). Pure.

A request is 003's object `{"command": NAME, "payload": {...}}` (plus an optional
`request_id`, echoed in the answer so WebSocket clients can tell answers from pushed events);
`parse` checks it and returns the command's name and payload, and the payload readers below
check each field. Every refusal is a `SynapError` with 003's error name where 003 has one
(`StreamError`: RoomNotFound, EventNotFound, OffsetOutOfRange, SubscriptionFailed,
BroadcastFailed) and the HTTP status it is answered with; `error_of` is THE table from
Spate's BrokerErrors to those.
"""

from __future__ import annotations

import json
from typing import Any

from spate.core import limits
from spate.core.errors import BrokerError, ErrorCode
from spate.gateway.rooms import OffsetOutOfRange, RoomLimitExceeded

ROOM_COMMANDS = ("stream.publish", "stream.subscribe", "stream.unsubscribe", "stream.history")
TOPIC_COMMANDS = ("topic.create", "topic.publish", "topic.consume", "topic.stats")
GROUP_COMMANDS = (
    "group.create",
    "group.join",
    "group.assignment",
    "group.heartbeat",
    "group.commit",
    "group.offset",
    "group.leave",
    "group.stats",
)
COMMANDS = ROOM_COMMANDS + TOPIC_COMMANDS + GROUP_COMMANDS
WEBSOCKET_ONLY = ("stream.subscribe", "stream.unsubscribe")


class SynapError(Exception):
    """A refused command: `code` (003's name where it has one), a message for a person, the
    HTTP status, whether retrying can help, and extra fields for the answer."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int = 400,
        *,
        retryable: bool = False,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.retryable = retryable
        self.details = details

    def answer(self) -> dict[str, Any]:
        return {
            "error": self.code,
            "message": self.message,
            "retryable": self.retryable,
            **self.details,
        }


_BROKER_ERRORS: dict[ErrorCode, tuple[str, int]] = {
    ErrorCode.NOT_FOUND: ("NotFound", 404),
    ErrorCode.ALREADY_EXISTS: ("AlreadyExists", 409),
    ErrorCode.INVALID_ARGUMENT: ("InvalidRequest", 400),
    ErrorCode.MESSAGE_SIZE_EXCEEDED: ("MessageTooLarge", 413),
    ErrorCode.UNAUTHORIZED: ("Unauthorized", 401),
    ErrorCode.UNAUTHENTICATED: ("Unauthorized", 401),
    ErrorCode.NOT_IMPLEMENTED: ("NotImplemented", 501),
    ErrorCode.FAILED_PRECONDITION: ("FailedPrecondition", 409),
    ErrorCode.RESOURCE_LIMIT: ("ResourceLimitExceeded", 429),
    ErrorCode.NO_PARTITION_FREE: ("ResourceLimitExceeded", 429),
    ErrorCode.UNAVAILABLE: ("Unavailable", 503),
    ErrorCode.NOT_LEADER: ("Unavailable", 503),
    ErrorCode.STORAGE: ("StorageFailure", 500),
    ErrorCode.INTERNAL: ("InternalError", 500),
}
"""BrokerError -> (Synap error name, HTTP status). Codes missing here are a bug (asserted)."""


def error_of(error: BrokerError) -> SynapError:
    if isinstance(error, RoomLimitExceeded):
        return SynapError("RoomLimitExceeded", error.message, 429, retryable=True)
    if isinstance(error, OffsetOutOfRange):
        return SynapError(
            "OffsetOutOfRange",
            error.message,
            416,
            requested=error.requested,
            oldest=error.window.oldest,
            newest=error.window.newest,
        )
    code, status = _BROKER_ERRORS.get(error.code, ("InternalError", 500))
    return SynapError(code, error.message, status, retryable=error.retryable)


def invalid(message: str) -> SynapError:
    return SynapError("InvalidRequest", message, 400)


def parse(text: str | bytes) -> tuple[str, dict[str, Any], Any]:
    """(command, payload, request_id) of one request."""
    if len(text) > limits.synap_command_bytes_max:
        raise SynapError(
            "InvalidRequest",
            f"a command is at most {limits.synap_command_bytes_max} bytes",
            413,
        )
    try:
        request = json.loads(text)
    except ValueError as error:
        raise invalid(f"not JSON: {error}") from None
    if not isinstance(request, dict):
        raise invalid('a command is a JSON object {"command": ..., "payload": {...}}')
    command = request.get("command")
    if command not in COMMANDS:
        raise SynapError(
            "UnknownCommand",
            f"unknown command {command!r}: one of {', '.join(COMMANDS)}",
            400,
        )
    payload = request.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise invalid("'payload' must be a JSON object")
    return command, payload, request.get("request_id")


# -- payload fields


def string(payload: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = payload.get(key)
    if value is None:
        if required:
            raise invalid(f"'{key}' is required")
        return None
    if not isinstance(value, str) or not value:
        raise invalid(f"'{key}' must be a non-empty string")
    return value


def name(payload: dict[str, Any], key: str) -> str:
    value = string(payload, key)
    assert value is not None
    return value


def integer(
    payload: dict[str, Any],
    key: str,
    *,
    default: int | None = None,
    low: int | None = None,
    high: int | None = None,
) -> int | None:
    value = payload.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{key}' must be an integer")
    if low is not None and value < low:
        raise invalid(f"'{key}' must be at least {low}, got {value}")
    if high is not None and value > high:
        raise invalid(f"'{key}' must be at most {high}, got {value}")
    return value


def boolean(payload: dict[str, Any], key: str) -> bool | None:
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise invalid(f"'{key}' must be true or false")
    return value


def metadata(payload: dict[str, Any]) -> dict[str, Any] | None:
    value = payload.get("metadata")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("'metadata' must be a JSON object")
    return value


def data(payload: dict[str, Any]) -> Any:
    if "data" not in payload:
        raise invalid("'data' is required")
    return payload["data"]


def retention(payload: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """003's `retention_policy` -> (max_age_ms, max_bytes, max_messages)."""
    policy = payload.get("retention_policy")
    if policy is None:
        return None, None, None
    if not isinstance(policy, dict):
        raise invalid("'retention_policy' must be a JSON object")
    kind = policy.get("type", "Combined")
    kinds = ("Time", "Size", "Messages", "Combined", "Infinite")
    if kind not in kinds:
        raise invalid(f"retention_policy 'type' must be one of {', '.join(kinds)}")
    if kind == "Infinite":
        return None, None, None
    secs = integer(policy, "retention_secs", low=1)
    max_bytes = integer(policy, "max_bytes", low=1)
    max_messages = integer(policy, "max_messages", low=1)
    wanted = {
        "Time": ("retention_secs", secs),
        "Size": ("max_bytes", max_bytes),
        "Messages": ("max_messages", max_messages),
    }
    if kind in wanted and wanted[kind][1] is None:
        raise invalid(f"retention_policy of type {kind} needs '{wanted[kind][0]}'")
    age_ms = None if secs is None else secs * 1000
    if kind == "Time":
        return age_ms, None, None
    if kind == "Size":
        return None, max_bytes, None
    if kind == "Messages":
        return None, None, max_messages
    return age_ms, max_bytes, max_messages
