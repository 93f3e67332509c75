"""THE table from BrokerError codes to AMQP 1.0 error conditions. Nowhere else maps them.

AMQP conditions (002 / AMQP 1.0 §2.8.15-2.8.18) used by the gateway:

| ErrorCode             | AMQP condition                  | typical use                     |
|-----------------------|---------------------------------|---------------------------------|
| NOT_FOUND             | amqp:not-found                  | attach refused; transfer reject |
| ALREADY_EXISTS        | amqp:resource-locked            | attach refused                  |
| INVALID_ARGUMENT      | amqp:invalid-field              | attach refused; transfer reject |
| MESSAGE_SIZE_EXCEEDED | amqp:link:message-size-exceeded | transfer rejected, link usable  |
| UNAUTHORIZED          | amqp:unauthorized-access        | attach refused                  |
| UNAUTHENTICATED       | amqp:unauthorized-access        | attach refused                  |
| NOT_LEADER            | amqp:link:redirect              | attach + detach with info map   |
|   (leader unknown)    | amqp:resource-locked            | retry later                     |
| UNAVAILABLE           | amqp:resource-locked            | transfer rejected / attach      |
| RESOURCE_LIMIT        | amqp:resource-limit-exceeded    | attach refused                  |
| NO_PARTITION_FREE     | amqp:link:detach-forced         | group member refused (§4.5.1)   |
| FAILED_PRECONDITION   | amqp:precondition-failed        | state forbids it now            |
| NOT_IMPLEMENTED       | amqp:not-implemented            | e.g. dynamic nodes              |
| INTERNAL, STORAGE     | amqp:internal-error             | anything / transfer rejected    |

Every condition carries the error's message as its description, and an info map with
`spate:code` (the ErrorCode value) and `spate:retryable` (bool) so clients can decide to retry
without parsing text. Malformed message bytes are rejected with `amqp:decode-error`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spate.core.errors import BrokerError, ErrorCode, NotLeader

NOT_FOUND = "amqp:not-found"
INVALID_FIELD = "amqp:invalid-field"
DECODE_ERROR = "amqp:decode-error"
NOT_IMPLEMENTED = "amqp:not-implemented"
NOT_ALLOWED = "amqp:not-allowed"
INTERNAL_ERROR = "amqp:internal-error"
RESOURCE_LOCKED = "amqp:resource-locked"
RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
PRECONDITION_FAILED = "amqp:precondition-failed"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
REDIRECT = "amqp:link:redirect"
DETACH_FORCED = "amqp:link:detach-forced"
STOLEN = "amqp:link:stolen"
FRAMING_ERROR = "amqp:connection:framing-error"

CONDITIONS: dict[ErrorCode, str] = {
    ErrorCode.NOT_FOUND: NOT_FOUND,
    ErrorCode.ALREADY_EXISTS: RESOURCE_LOCKED,
    ErrorCode.INVALID_ARGUMENT: INVALID_FIELD,
    ErrorCode.MESSAGE_SIZE_EXCEEDED: MESSAGE_SIZE_EXCEEDED,
    ErrorCode.UNAUTHORIZED: UNAUTHORIZED_ACCESS,
    ErrorCode.UNAUTHENTICATED: UNAUTHORIZED_ACCESS,
    ErrorCode.NOT_LEADER: REDIRECT,
    ErrorCode.UNAVAILABLE: RESOURCE_LOCKED,
    ErrorCode.RESOURCE_LIMIT: RESOURCE_LIMIT_EXCEEDED,
    ErrorCode.NO_PARTITION_FREE: DETACH_FORCED,
    ErrorCode.FAILED_PRECONDITION: PRECONDITION_FAILED,
    ErrorCode.NOT_IMPLEMENTED: NOT_IMPLEMENTED,
    ErrorCode.INTERNAL: INTERNAL_ERROR,
    ErrorCode.STORAGE: INTERNAL_ERROR,
}
assert set(CONDITIONS) == set(ErrorCode), "every ErrorCode needs an AMQP condition"


@dataclass(frozen=True, slots=True)
class AmqpError:
    """What goes into an AMQP `error`: condition symbol, description, info map.

    Info keys are plain strings here; the driver sends them as symbols. Values are str, bool,
    or int (`port` is sent as a ushort).
    """

    condition: str
    description: str
    info: dict[str, Any]


def amqp_error(err: BrokerError) -> AmqpError:
    """Map a BrokerError to the AMQP error a peer sees."""
    info: dict[str, Any] = {"spate:code": err.code.value, "spate:retryable": err.retryable}
    if isinstance(err, NotLeader):
        if err.leader_host is None or err.leader_port is None:
            return AmqpError(RESOURCE_LOCKED, f"{err.message} (leader unknown; retry later)", info)
        return AmqpError(
            REDIRECT,
            err.message,
            {
                # The name a client puts in open.hostname and TLS SNI: the leader's advertised
                # host, never its node id (core §2.8.18; issue 7).
                "hostname": err.leader_host,
                "network-host": err.leader_host,
                "port": err.leader_port,
            },
        )
    return AmqpError(CONDITIONS[err.code], err.message, info)


def plain(condition: str, description: str) -> AmqpError:
    """An error that does not come from a BrokerError (protocol-level refusals)."""
    return AmqpError(condition, description, {})
