"""A run of consumer deliveries handed to proton (ADR 0030), and a producer link's plain
deliveries taken from it (ADR 0038): the C extension `_fastsend` when it is built
(`tools/build_native.py`, run by tools/bootstrap.sh), else the same work in Python.

Both send, for record i of a run, the delivery `sections.splice_run` builds (the run's delivery
annotations spliced after the record's header, offset `first_offset + i`) with the 8-byte
little-endian tag `first_tag + i`; pre-settled deliveries are settled (which advances the link
past them), others leave the link advanced. Same frames on the wire either way
(tests/gateway/test_fastsend.py runs every case through both).

`SPATE_FASTSEND=0` in the environment makes a process use the Python sends and receives (for
A/B measurements, RESULTS §31, §38)."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from cproton_ffi import ffi, lib
from spate.gateway import sections

_TAG = struct.Struct("<Q")
_OFFSETS_MAX = 2**63
"""Offsets the C digits (an unsigned 64-bit value) are used for; beyond, the Python sends."""


def _load() -> ModuleType | None:
    if os.environ.get("SPATE_FASTSEND", "1") == "0":
        return None
    try:
        from spate.gateway import _fastsend  # type: ignore[attr-defined]
    except ImportError:  # not built on this machine: the Python sends
        return None
    module: ModuleType = _fastsend
    if not all(hasattr(module, name) for name in ("send_run", "recv_run", "accept_run")):
        return None  # built from an older source: `tools/build_native.py` builds it again
    return module


native: ModuleType | None = _load()
"""The C extension, or None (the Python sends)."""

_FUNCTIONS = tuple(
    int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
    for name in ("pn_delivery", "pn_link_send", "pn_link_advance", "pn_delivery_settle")
)


RECV_FUNCTIONS = tuple(
    int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
    for name in (
        "pn_link_current", "pn_delivery_partial", "pn_delivery_aborted", "pn_delivery_pending",
        "pn_link_recv", "pn_link_advance", "pn_delivery_settled", "pn_delivery_settle",
    )
)  # fmt: skip
"""`_fastsend.recv_run`'s proton functions (ADR 0038)."""

SKIP_FUNCTIONS = tuple(
    int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
    for name in (
        "pn_collector_peek", "pn_collector_pop", "pn_event_type", "pn_event_delivery",
        "pn_delivery_link", "pn_link_is_receiver", "pn_delivery_readable",
    )
)  # fmt: skip
"""`_fastsend.skip_events`'s proton functions (ADR 0038)."""

ACCEPT_FUNCTIONS = tuple(
    int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
    for name in ("pn_delivery_update", "pn_delivery_settle")
)
"""`_fastsend.accept_run`'s proton functions (ADR 0038)."""


def delivery_pointer(delivery: Any) -> Any:
    """A delivery as proton's functions take it: `recv_run` notes deliveries as addresses."""
    return ffi.cast("pn_delivery_t *", delivery) if type(delivery) is int else delivery


def accept_all(deliveries: list[Any], state: int) -> None:
    """Give every delivery (pointer or address; None: came settled) `state` and settle it."""
    fast = native
    rest = deliveries if fast is None else fast.accept_run(ACCEPT_FUNCTIONS, deliveries, state)
    update, settle = lib.pn_delivery_update, lib.pn_delivery_settle
    for entry in rest:
        if entry is not None:
            delivery = delivery_pointer(entry)
            update(delivery, state)
            settle(delivery)


def address(link: Any) -> int:
    """A link's pointer (a cproton_ffi `pn_link_t *`) as the integer `_fastsend` takes."""
    return int(ffi.cast("uintptr_t", link))


class Sender:
    """Sends runs of deliveries; one per connection part (its tag buffer is reused)."""

    def __init__(self, use_native: bool = True) -> None:
        self.native = native if use_native else None
        self._tag_buffer = ffi.new("char[]", _TAG.size)
        self._tag_view = ffi.buffer(self._tag_buffer)
        tag_struct = ffi.new("pn_delivery_tag_t *", (_TAG.size, self._tag_buffer))
        self._tag_value = tag_struct[0]
        self._tag_struct = tag_struct  # keeps the struct alive

    def send_run(
        self,
        link: Any,
        link_address: int,
        records: Sequence[bytes | memoryview],
        first_offset: int,
        first_tag: int,
        *,
        parts: tuple[bytes, bytes],
        presettled: bool,
    ) -> int:
        """Send `records` as deliveries on `link` (`link_address` is `address(link)`): record i
        with offset `first_offset + i` and tag `first_tag + i`, its delivery annotations
        `prefix + <offset digits> + suffix` (`parts`, `sections.delivery_annotation_parts`);
        returns the bytes sent."""
        prefix, suffix = parts
        count = len(records)
        fast = self.native
        if fast is None or first_offset + count >= _OFFSETS_MAX or first_tag + count >= 2**64:
            return self._send_python(link, records, first_offset, first_tag, parts, presettled)
        sent = 0
        at = 0
        while at < count:
            stopped, nbytes = fast.send_run(
                _FUNCTIONS, link_address, records, at, first_offset, prefix, suffix,
                first_tag, presettled,
            )  # fmt: skip
            sent += nbytes
            if stopped >= count:
                break
            # a header layout the C does not read: this one record the careful way
            one = records[stopped : stopped + 1]
            sent += self._send_python(
                link, one, first_offset + stopped, first_tag + stopped, parts, presettled
            )
            at = stopped + 1
        return sent

    def _send_python(  # noqa: PLR0917 (the hot path's positional call)
        self,
        link: Any,
        records: Sequence[bytes | memoryview],
        first_offset: int,
        first_tag: int,
        parts: tuple[bytes, bytes],
        presettled: bool,
    ) -> int:
        outs = sections.splice_run(records, first_offset, *parts)
        new_delivery, send = lib.pn_delivery, lib.pn_link_send
        tag_view, tag_value, pack_tag = self._tag_view, self._tag_value, _TAG.pack_into
        tag = first_tag
        if presettled:
            # pn_delivery_settle advances the link past its current delivery itself: three
            # calls per message, not four (RESULTS §26)
            settle = lib.pn_delivery_settle
            for out in outs:
                pack_tag(tag_view, 0, tag)
                tag += 1
                delivery = new_delivery(link, tag_value)
                send(link, out, len(out))
                settle(delivery)
        else:
            advance = lib.pn_link_advance
            for out in outs:
                pack_tag(tag_view, 0, tag)
                tag += 1
                new_delivery(link, tag_value)
                send(link, out, len(out))
                advance(link)
        return sum(map(len, outs))
