"""The client's failures, as values (no proton types: conditions and info are plain data).

Every error a caller sees is one of these or a builtin: `PublishRefused` (one message not
accepted), `AttachRefused` (the link was refused and following or retrying did not help),
`ConnectionLost` (a `ConnectionError`, so an `OSError`: the connection is gone and reconnecting
is off or gave up; `LinkStolen` when a greater epoch took the consumer's partition) and
`TimeoutError` (a blocking call's bound ran out).
"""

from __future__ import annotations

from typing import Any

REDIRECT = "amqp:link:redirect"
STOLEN = "amqp:link:stolen"
UNAUTHORIZED = "amqp:unauthorized-access"
RETRYABLE = "spate:retryable"
"""Key of a refusal's info map the broker sets when trying again later can succeed (an
election, a leader change); docs/amqp.md."""


class PublishRefused(Exception):
    """The broker did not accept a message (rejected or released); `condition` says why."""

    def __init__(
        self,
        state: str,
        condition: str | None,
        description: str | None,
        info: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"message {state}: {condition or '-'}: {description or ''}".rstrip(": "))
        self.state, self.condition, self.description = state, condition, description
        self.info: dict[str, Any] = info or {}


class AttachRefused(Exception):
    """The broker refused the link; `condition` and `info` say why."""

    def __init__(
        self, condition: str | None, description: str | None, info: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"attach refused: {condition}: {description}")
        self.condition, self.description = condition, description
        self.info: dict[str, Any] = info or {}


class AuthenticationFailed(AttachRefused):
    """SASL refused the credentials (`amqp:unauthorized-access`): the connection was closed
    before any link; retrying with the same credentials cannot succeed, so no client retries."""


class ConnectionLost(ConnectionError):
    """The connection is gone and the client will not (or could no longer) reconnect."""


class LinkStolen(ConnectionLost):
    """The broker detached the consumer's link with `amqp:link:stolen`: a consumer of the same
    group attached to its partition with a greater epoch and owns it now (ADR 0015). Attaching
    again with the old epoch would be refused, so no client reconnects after it."""


class ConsumerClosed(ConnectionLost):
    """The consumer was closed by its application (iteration ends on it)."""


def is_retryable(condition: str | None, info: dict[str, Any]) -> bool:
    """A refusal that a re-attach (elsewhere or later) can cure: a redirect or a refusal the
    broker marked `spate:retryable` (a leader change)."""
    return condition == REDIRECT or bool(info.get(RETRYABLE))


RESOURCE_LOCKED = "amqp:resource-locked"


def is_retryable_outcome(condition: str | None, info: dict[str, Any]) -> bool:
    """A rejected transfer that a resend after re-attaching can cure. Besides the attach
    rules: `amqp:resource-locked`, which on a transfer only means Unavailable / leader
    unknown (src/gateway/errors.py's table) — the node's rejections carry no info map today,
    so `spate:retryable` cannot be read there."""
    return is_retryable(condition, info) or condition == RESOURCE_LOCKED
