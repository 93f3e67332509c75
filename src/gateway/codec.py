"""A minimal AMQP 1.0 type codec (002 §1.6 / core types) for the few values the gateway touches.

The hot path never decodes messages. This codec is for the small, bounded things around it: the
source-filter map of an attach, an incoming delivery-annotations map when one is present, the
SASL frames, and the `$info` message. It has no third-party imports so that the pure modules
(`filters`, `sections`, `sasl`, `info`) stay testable without proton.

Decoded types: null -> None, boolean -> bool, every integer type -> int (`Timestamp` for
timestamps), float/double -> float, string -> str, symbol -> `Symbol` (a str), binary -> bytes,
list/array -> list, map -> dict, described -> `Described`. Bad input raises `DecodeError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

DEPTH_MAX = 32
"""Nesting limit for decoded values: outside input must not recurse without bound."""


class DecodeError(ValueError):
    """The bytes are not a well-formed AMQP value."""


class Symbol(str):
    """An AMQP symbol (ASCII), distinct from a string on the wire."""

    __slots__ = ()


class Timestamp(int):
    """An AMQP timestamp: milliseconds since the Unix epoch."""

    __slots__ = ()


class ULong(int):
    """An AMQP ulong when the encoder must not pick `long` (descriptors, section codes)."""

    __slots__ = ()


class UShort(int):
    __slots__ = ()


class UByte(int):
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Described:
    descriptor: Any
    value: Any


@dataclass(frozen=True, slots=True)
class SymbolArray:
    """An AMQP array of symbols (encode only; decoding yields a plain list)."""

    items: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Decoding


def skip(b: bytes | memoryview, i: int) -> int:
    """Index just after the AMQP value that starts at b[i]; DecodeError if it does not fit."""
    n = len(b)
    if i >= n:
        raise DecodeError(f"value expected at byte {i}, input ends at {n}")
    c = b[i]
    i += 1
    if c == 0x00:  # described: descriptor then value
        return skip(b, skip(b, i))
    hi = c & 0xF0
    if hi == 0x40:
        end = i
    elif hi == 0x50:
        end = i + 1
    elif hi == 0x60:
        end = i + 2
    elif hi == 0x70:
        end = i + 4
    elif hi == 0x80:
        end = i + 8
    elif hi == 0x90:
        end = i + 16
    elif hi in (0xA0, 0xC0, 0xE0):
        if i >= n:
            raise DecodeError(f"size byte missing at {i}")
        end = i + 1 + b[i]
    elif hi in (0xB0, 0xD0, 0xF0):
        if i + 4 > n:
            raise DecodeError(f"size field missing at {i}")
        end = i + 4 + _U32.unpack_from(b, i)[0]
    else:
        raise DecodeError(f"bad constructor 0x{c:02x} at byte {i - 1}")
    if end > n:
        raise DecodeError(f"value at byte {i - 1} runs past the end ({end} > {n})")
    return end


def decode(b: bytes | memoryview) -> Any:
    """Decode exactly one value that fills `b`."""
    value, end = decode_at(b, 0)
    if end != len(b):
        raise DecodeError(f"{len(b) - end} trailing bytes after the value")
    return value


def decode_at(b: bytes | memoryview, i: int, depth: int = 0) -> tuple[Any, int]:
    """Decode the value at b[i]; returns (value, index after it)."""
    if depth > DEPTH_MAX:
        raise DecodeError(f"values nested deeper than {DEPTH_MAX}")
    end = skip(b, i)  # bounds-checks the whole value once
    try:
        return _decode_checked(b, i, depth), end
    except (struct.error, IndexError, UnicodeDecodeError) as err:
        raise DecodeError(f"malformed value at byte {i}: {err}") from err


def _decode_checked(b: bytes | memoryview, i: int, depth: int) -> Any:
    c = b[i]
    i += 1
    if c == 0x00:
        descriptor, j = decode_at(b, i, depth + 1)
        value, _ = decode_at(b, j, depth + 1)
        return Described(descriptor, value)
    simple = _SIMPLE.get(c)
    if simple is not None:
        return simple(b, i)
    if c in (0xA0, 0xB0):
        size, start = _var_size(b, i, c == 0xA0)
        return bytes(b[start : start + size])
    if c in (0xA1, 0xB1):
        size, start = _var_size(b, i, c == 0xA1)
        return bytes(b[start : start + size]).decode("utf-8")
    if c in (0xA3, 0xB3):
        size, start = _var_size(b, i, c == 0xA3)
        return Symbol(bytes(b[start : start + size]).decode("ascii"))
    if c in (0xC0, 0xD0, 0xC1, 0xD1):
        small = c in (0xC0, 0xC1)
        size, start = _var_size(b, i, small)
        count = b[start] if small else _U32.unpack_from(b, start)[0]
        j = start + (1 if small else 4)
        end = start + size
        items: list[Any] = []
        for _ in range(count):
            if j >= end:
                raise DecodeError(f"compound at byte {i - 1} holds fewer than {count} items")
            item, j = decode_at(b[:end], j, depth + 1)
            items.append(item)
        if c in (0xC1, 0xD1):
            if count % 2:
                raise DecodeError(f"map at byte {i - 1} has an odd item count {count}")
            return _to_dict(items)
        return items
    if c in (0xE0, 0xF0):
        return _decode_array(b, i, c == 0xE0, depth)
    raise DecodeError(f"unsupported constructor 0x{c:02x}")


def _to_dict(items: list[Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k in range(0, len(items), 2):
        key = items[k]
        if isinstance(key, list | dict):
            raise DecodeError("map key of a compound type")
        if isinstance(key, Described):
            key = key.value if isinstance(key.value, str | int) else repr(key)
        out[key] = items[k + 1]
    return out


def _var_size(b: bytes | memoryview, i: int, small: bool) -> tuple[int, int]:
    if small:
        return b[i], i + 1
    return _U32.unpack_from(b, i)[0], i + 4


def _decode_array(b: bytes | memoryview, i: int, small: bool, depth: int) -> list[Any]:
    size, start = _var_size(b, i, small)
    count = b[start] if small else _U32.unpack_from(b, start)[0]
    j = start + (1 if small else 4)
    end = start + size
    # element constructor (possibly described); each element is encoded without it
    descriptor = None
    if b[j] == 0x00:
        descriptor, j = decode_at(b, j + 1, depth + 1)
    ctor = b[j]
    j += 1
    items: list[Any] = []
    for _ in range(count):
        if j >= end and ctor not in (0x40, 0x41, 0x42, 0x43, 0x44, 0x45):
            raise DecodeError("array holds fewer items than its count")
        synthetic = bytes((ctor,)) + bytes(b[j:end])
        value, used = decode_at(synthetic, 0, depth + 1)
        j += used - 1
        items.append(Described(descriptor, value) if descriptor is not None else value)
    return items


def _fixed(s: struct.Struct, cls: type = int) -> Any:
    return lambda b, i: cls(s.unpack_from(b, i)[0])


def _char(code: int, i: int) -> str:
    """AMQP `char` (0x73): one UTF-32BE Unicode scalar value; anything else is damage."""
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        raise DecodeError(f"char at byte {i - 1} is not a Unicode scalar value (0x{code:x})")
    return chr(code)


_SIMPLE: dict[int, Any] = {
    0x40: lambda b, i: None,
    0x41: lambda b, i: True,
    0x42: lambda b, i: False,
    0x56: lambda b, i: b[i] != 0,
    0x43: lambda b, i: 0,
    0x44: lambda b, i: ULong(0),
    0x45: lambda b, i: [],
    0x50: _fixed(_U8),
    0x51: _fixed(_I8),
    0x52: _fixed(_U8),
    0x53: _fixed(_U8, ULong),
    0x54: _fixed(_I8),
    0x55: _fixed(_I8),
    0x60: _fixed(_U16),
    0x61: _fixed(_I16),
    0x70: _fixed(_U32),
    0x71: _fixed(_I32),
    0x72: _fixed(_F32, float),
    0x73: lambda b, i: _char(_U32.unpack_from(b, i)[0], i),
    0x80: _fixed(_U64, ULong),
    0x81: _fixed(_I64),
    0x82: _fixed(_F64, float),
    0x83: _fixed(_I64, Timestamp),
    0x98: lambda b, i: bytes(b[i : i + 16]),
    0x74: lambda b, i: bytes(b[i : i + 4]),
    0x84: lambda b, i: bytes(b[i : i + 8]),
    0x94: lambda b, i: bytes(b[i : i + 16]),
}


# ---------------------------------------------------------------------------------------------
# Encoding (the subset the gateway writes)


def encode(value: Any) -> bytes:
    out = bytearray()
    _encode_into(out, value)
    return bytes(out)


def _encode_into(out: bytearray, v: Any) -> None:
    if v is None:
        out.append(0x40)
    elif isinstance(v, bool):
        out.append(0x41 if v else 0x42)
    elif isinstance(v, Described):
        out.append(0x00)
        _encode_into(out, v.descriptor)
        _encode_into(out, v.value)
    elif isinstance(v, Timestamp):
        out.append(0x83)
        out += _I64.pack(v)
    elif isinstance(v, ULong):
        if v < 256:
            out += bytes((0x53, v))
        else:
            out.append(0x80)
            out += _U64.pack(v)
    elif isinstance(v, UShort):
        out.append(0x60)
        out += _U16.pack(v)
    elif isinstance(v, UByte):
        out += bytes((0x50, v))
    elif isinstance(v, int):
        if -128 <= v <= 127:
            out += bytes((0x55,)) + _I8.pack(v)
        else:
            out.append(0x81)
            out += _I64.pack(v)
    elif isinstance(v, float):
        out.append(0x82)
        out += _F64.pack(v)
    elif isinstance(v, Symbol):
        _encode_var(out, v.encode("ascii"), 0xA3, 0xB3)
    elif isinstance(v, str):
        _encode_var(out, v.encode("utf-8"), 0xA1, 0xB1)
    elif isinstance(v, bytes | bytearray | memoryview):
        _encode_var(out, bytes(v), 0xA0, 0xB0)
    elif isinstance(v, SymbolArray):
        body = bytearray()
        for item in v.items:
            raw = item.encode("ascii")
            body += _U32.pack(len(raw)) + raw
        out.append(0xF0)
        out += _U32.pack(4 + 1 + len(body)) + _U32.pack(len(v.items))
        out.append(0xB3)
        out += body
    elif isinstance(v, list | tuple):
        _encode_compound(out, list(v), 0xC0, 0xD0, len(v))
    elif isinstance(v, dict):
        flat: list[Any] = []
        for key, item in v.items():
            flat += (key, item)
        _encode_compound(out, flat, 0xC1, 0xD1, len(flat))
    else:
        raise TypeError(f"cannot encode {type(v).__name__} as AMQP")


def _encode_var(out: bytearray, raw: bytes, small: int, large: int) -> None:
    if len(raw) < 256:
        out += bytes((small, len(raw)))
    else:
        out.append(large)
        out += _U32.pack(len(raw))
    out += raw


def _encode_compound(out: bytearray, items: list[Any], small: int, large: int, count: int) -> None:
    body = bytearray()
    for item in items:
        _encode_into(body, item)
    if len(body) + 1 < 256 and count < 256:
        out += bytes((small, len(body) + 1, count))
    else:
        out.append(large)
        out += _U32.pack(len(body) + 4) + _U32.pack(count)
    out += body
