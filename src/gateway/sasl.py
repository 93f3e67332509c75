"""SASL server layer (AMQP 1.0 §5.3) in front of proton's engine: ANONYMOUS and PLAIN. Sans-IO.

proton's PyPI build has no Cyrus SASL, and its built-in server SASL offers only ANONYMOUS
(research/proton.md §7), so the gateway speaks SASL itself and hands the engine a transport
without a SASL layer once the outcome is ok.

    state      input                               output / next state
    ---------  ----------------------------------  ------------------------------------------
    HEADER     `AMQP 3 1 0 0`                      SASL header + sasl-mechanisms; INIT
    HEADER     `AMQP 0 1 0 0`, anonymous allowed   Done(all bytes) - plain AMQP, no SASL
    HEADER     `AMQP 0 1 0 0`, MSSBCBS allowed     Done(all bytes, "$cbs") - tokens only
    HEADER     anything else                       our SASL header, then Close
    INIT       sasl-init(mechanism, response)      Authenticate(mech, user, password); AUTH
    INIT       another frame / oversize / garbage  Close
    AUTH       (shell calls `outcome(ok)`)         sasl-outcome ok + Done(rest)  | outcome 1 + Close
    DONE       -                                   everything goes to the engine

Frame: `size:u32 doff:u8=2 type:u8=1 channel:u16=0` then a described list.
sasl-mechanisms 0x40 [symbol[]]; sasl-init 0x41 [symbol, binary?, string?];
sasl-outcome 0x44 [ubyte].
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

from spate.gateway import codec

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_FRAME_BYTES_MAX = 64 * 1024
"""A sasl-init carrying PLAIN credentials is tiny; anything bigger is hostile."""
_FRAME_HEAD = struct.Struct(">IBBH")
MECHANISMS, INIT, OUTCOME = 0x40, 0x41, 0x44
CBS_USER = "$cbs"
"""Who a connection is when it came in by MSSBCBS, or without SASL on an Event Hubs dialect
listener: the tokens it puts on `$cbs` say what it may use (ADR 0021)."""
OUTCOME_OK, OUTCOME_AUTH = 0, 1


class Stage(Enum):
    HEADER = "header"
    INIT = "init"
    AUTH = "auth"
    DONE = "done"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes


@dataclass(frozen=True, slots=True)
class Close:
    reason: str


@dataclass(frozen=True, slots=True)
class Authenticate:
    mechanism: str
    user: str | None
    password: str | None


@dataclass(frozen=True, slots=True)
class Done:
    """SASL is over: `rest` (possibly a pipelined AMQP header and open) goes to the engine."""

    rest: bytes
    user: str
    sasl: bool = True
    """False: the client skipped SASL (a plain AMQP header)."""


Action = Send | Close | Authenticate | Done


def frame(code: int, fields: list[object]) -> bytes:
    body = codec.encode(codec.Described(codec.ULong(code), fields))
    return _FRAME_HEAD.pack(8 + len(body), 2, 1, 0) + body


class SaslServer:
    def __init__(
        self, *, allow_anonymous: bool, allow_plain: bool, allow_cbs: bool = False
    ) -> None:
        assert allow_anonymous or allow_plain or allow_cbs, "a listener needs a way in"
        self.allow_anonymous = allow_anonymous
        self.allow_plain = allow_plain
        self.allow_cbs = allow_cbs
        """MSSBCBS (the Event Hubs dialect, ADR 0021): no credentials at this stage, the
        connection presents tokens on `$cbs`; such listeners also take ANONYMOUS that way."""
        self.stage = Stage.HEADER
        self._buf = b""
        self._user = "anonymous"

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return (
            (("PLAIN",) if self.allow_plain else ())
            + (("MSSBCBS",) if self.allow_cbs else ())
            + (("ANONYMOUS",) if self.allow_anonymous or self.allow_cbs else ())
        )

    def receive(self, data: bytes) -> list[Action]:
        assert self.stage not in (Stage.DONE, Stage.CLOSED), self.stage
        self._buf += data
        out: list[Action] = []
        if self.stage == Stage.HEADER:
            if len(self._buf) < 8:
                return out
            head, self._buf = self._buf[:8], self._buf[8:]
            if head == AMQP_HEADER and (self.allow_anonymous or self.allow_cbs):
                # no SASL: anonymous, or (Event Hubs dialect: @azure/event-hubs with a
                # `SharedAccessSignature=` connection string) a connection whose only way
                # further is a token put on `$cbs` (ADR 0021)
                self.stage = Stage.DONE
                user = "anonymous" if self.allow_anonymous else CBS_USER
                return [Done(head + self._buf, user, sasl=False)]
            if head != SASL_HEADER:
                self.stage = Stage.CLOSED
                return [Send(SASL_HEADER), Close(f"protocol header {head!r} is not SASL 1.0")]
            out.append(Send(SASL_HEADER + frame(MECHANISMS, [codec.SymbolArray(self.mechanisms)])))
            self.stage = Stage.INIT
        if self.stage == Stage.INIT and len(self._buf) >= 8:
            size, doff, ftype, _ = _FRAME_HEAD.unpack_from(self._buf)
            if size > SASL_FRAME_BYTES_MAX or size < 8 or doff < 2 or ftype != 1:
                self.stage = Stage.CLOSED
                return [*out, Close(f"bad SASL frame (size {size}, doff {doff}, type {ftype})")]
            if len(self._buf) < size:
                return out
            body, self._buf = self._buf[doff * 4 : size], self._buf[size:]
            out.append(self._init(body))
        return out

    def _init(self, body: bytes) -> Action:
        try:
            performative = codec.decode(body)
        except codec.DecodeError as err:
            self.stage = Stage.CLOSED
            return Close(f"undecodable SASL frame: {err}")
        if (
            not isinstance(performative, codec.Described)
            or performative.descriptor != INIT
            or not isinstance(performative.value, list)
            or not performative.value
        ):
            self.stage = Stage.CLOSED
            return Close("expected sasl-init")
        fields = [*performative.value, None, None]
        mechanism, response = str(fields[0]), fields[1]
        self.stage = Stage.AUTH
        if mechanism == "PLAIN" and self.allow_plain and isinstance(response, bytes):
            parts = response.split(b"\0")
            if len(parts) == 3:
                try:
                    user, password = parts[1].decode(), parts[2].decode()
                except UnicodeDecodeError:
                    return Authenticate("PLAIN", None, None)
                return Authenticate("PLAIN", user, password)
            return Authenticate("PLAIN", None, None)
        if mechanism == "ANONYMOUS" and (self.allow_anonymous or self.allow_cbs):
            return Authenticate("ANONYMOUS", None, None)
        if mechanism == "MSSBCBS" and self.allow_cbs:
            return Authenticate("MSSBCBS", None, None)
        return Authenticate(mechanism, None, None)

    def outcome(self, user: str | None) -> list[Action]:
        """Finish authentication: `user` is who logged in, None when refused."""
        assert self.stage == Stage.AUTH, self.stage
        if user is None:
            self.stage = Stage.CLOSED
            return [
                Send(frame(OUTCOME, [codec.UByte(OUTCOME_AUTH)])),
                Close("authentication failed"),
            ]
        self.stage = Stage.DONE
        rest, self._buf = self._buf, b""
        return [Send(frame(OUTCOME, [codec.UByte(OUTCOME_OK)])), Done(rest, user)]
