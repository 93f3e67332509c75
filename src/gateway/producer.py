"""The producer part of an AMQP connection (spate.gateway.driver): links the client sends on.

Hot path in: a producer link's current delivery is readable -> `drain` reads every complete
delivery of the link with direct `cproton_ffi.lib` calls into one batch (bytes, and the
delivery or None when it came settled) -> `flush` (once per pump) cuts each link's batch into
chunks and appends them, one `Partition.append` per chunk and partition -> `_appended`
accepts or rejects the chunk's deliveries. Credit is admission control (`links.producer_credit`):
none while too many deliveries of the connection wait for durability.

A link to a super stream (ADR 0014) routes every message by its routing key: a message laid
out like the last one read the slow way has its group key read after one `startswith`
(`key_prefix`); any other is read by `_accept_routed`, which decodes the message annotations
and properties. The message goes to its partition's batch (`routed`), or is rejected when it
has no routing key or no partition matches it.

A named producer link (`spate:producer-name`, ADR 0011) also reads each message's publishing id
(`sections.publishing_id`) into `ids`: a message without one, or with one not above the link's
previous, is rejected with amqp:invalid-field. When one of its appends fails, the link is
detached with the error: what is stored of a producer must stay a prefix of what it sent, so
the producer re-attaches, reads `spate:last-publishing-id` and resends from there.

A sub-entry (ADR 0017: a message annotated `x-opt-spate-sub-entry`, found by one `in` per
message) is checked whole by `spate.gateway.subentry.parse` (`_accept_sub_entry`) and batched
as one `SubEntry` record; `flush` appends each sub-entry alone (`chunk_bounds`), so the node
stores it as one sub-entry chunk. A refused one is rejected alone; the link goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cproton_ffi import ffi, lib
from proton import Link, symbol
from spate.core import filtering, limits
from spate.core.backend import Partition, PublishingIds
from spate.core.errors import BrokerError, InvalidArgument, MessageSizeExceeded, NotFound
from spate.core.ids import PartitionId
from spate.core.subentry import SubEntry
from spate.core.superstreams import GROUP_KEY_ANNOTATION, hash_partition, routing_key
from spate.gateway import codec, eventhubs, fastsend, links, sections
from spate.gateway import subentry as sub_entries
from spate.gateway.errors import (
    DECODE_ERROR,
    INVALID_FIELD,
    NOT_IMPLEMENTED,
    AmqpError,
    amqp_error,
    plain,
)
from spate.gateway.stats import ListenerStats

log = logging.getLogger(__name__)
ACCEPTED = lib.PN_ACCEPTED
GROUP_KEY_BYTES = GROUP_KEY_ANNOTATION.encode()
"""An agnostic link's message holding these bytes may carry a group key (000 §4.6.7): it is
read the slow way (`_accept_keyed`); one `in` per message (C memchr-speed) keeps the others on
the fast path."""


class Host(Protocol):
    """What a connection's producer and consumer parts need from the connection."""

    closed: bool
    guard: Any
    """The connection's inbound.InboundGuard (Event Hubs batches are noted there)."""

    def schedule_pump(self) -> None: ...

    def own(self, future: asyncio.Future[Any]) -> None: ...

    def end_producer(self, producer: ProducerLink, error: AmqpError) -> None: ...

    def end_consumer(self, consumer: Any, error: AmqpError) -> None:
        """Detach a consumer link (spate.gateway.consumer.ConsumerLink) with an error."""
        ...


def detach_all(partitions: Iterable[Partition]) -> None:
    for partition in partitions:
        partition.detach()


@dataclass
class ProducerLink:
    link: Link  # keeps the C link (and its unsettled deliveries) alive while appends are pending
    pointer: Any
    plan: links.ProducerPlan
    presettled: bool
    records: list[bytes] = field(default_factory=list)
    """Drained this turn, for the bound partition (or, on an agnostic link, unannotated ones for
    this batch's round-robin partition)."""
    deliveries: list[Any] = field(default_factory=list)
    """`records[i]`'s delivery, None when it came settled (nothing to confirm): a pointer, or
    its address (an int) when the C loop took it (`fastsend.delivery_pointer` reads both)."""
    routed: dict[PartitionId, tuple[list[bytes], list[Any]]] = field(default_factory=dict)
    """Agnostic links: records routed by their event-streams-target-partition annotation or
    their event-streams-group-key (000 §4.6.7)."""
    oversize: set[Any] = field(default_factory=set)
    """Deliveries (pointers) being read and dropped: larger than `limits.message_bytes_max`."""
    closed: bool = False
    name: bytes | None = None
    """The producer name of a deduplicating link (bound to one partition)."""
    ids: list[int] = field(default_factory=list)
    """Named links: `records[i]`'s publishing id."""
    last_id: int = -1
    """Named links: the last publishing id taken on this link."""
    id_prefix: bytes = b"\x01"
    """Named links: the bytes before the publishing id's 8 bytes in the last message whose id
    was read the slow way (header, annotations map up to the ulong constructor; ADR 0011); a
    message starting with them has its id at `len(id_prefix)`. `01` matches no plain message."""
    key_prefix: bytes = b"\x01"
    """Super-stream links: the bytes before the group key's value in the last message whose
    key was read the slow way (`sections.group_key_at`, ADR 0014); a plain message starting
    with them has its key's str8/sym8 at `len(key_prefix)`. `01` matches no plain message."""
    sub_entries: bool = False
    """A SubEntry is among this turn's records (`chunk_bounds` then appends each alone)."""
    id_section: int = -1
    """Named links: where the message-annotations section starts in a message starting with
    `id_prefix` when the publishing id is all it holds (-1: it holds more): such messages are
    stored without it (the chunk's producer section has the id)."""
    eventhubs: bool = False
    """A link of the Event Hubs dialect (ADR 0021): read by `_drain_eventhubs`."""
    message_bytes: int = 0
    """The mean message size of the link's last appended chunk (0 before its first): sizes its
    credit window (`links.producer_window`)."""


class ProducerPart:
    def __init__(self, host: Host, recv_buffer: Any, stats: ListenerStats | None = None) -> None:
        self.host = host
        self.recv_buffer = recv_buffer
        self.stats = stats or ListenerStats()
        """The listener's counters (shared by its connections; ADR 0023)."""
        self.links: dict[Any, ProducerLink] = {}
        """By the C link pointer (cffi pointers hash and compare by address), so the hot path
        looks a link up by `pn_delivery_link(...)` without converting it to an int."""
        self.dirty: set[Any] = set()
        """Producer links (pointers) that drained records this turn."""
        self.unconfirmed = 0
        """Deliveries of this connection waiting for durability."""
        self.in_flight_bytes = 0
        """Bytes of this connection's messages handed to partitions and not answered yet,
        pre-settled ones included (ADR 0048)."""

    def open(
        self,
        link: Link,
        plan: links.ProducerPlan,
        answer: dict[symbol, Any] | None,
        *,
        eventhubs: bool = False,
    ) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if answer is not None:
            link.properties = answer
        link.max_message_size = limits.message_bytes_max
        presettled = link.remote_snd_settle_mode == Link.SND_SETTLED
        state = ProducerLink(
            link, link._impl, plan, presettled, name=plan.producer, eventhubs=eventhubs
        )
        self.links[link._impl] = state
        link.open()
        self.top_up(state)

    def forget(self, producer: ProducerLink) -> None:
        producer.closed = True
        batches = self.host.guard.batches
        if batches:  # batches it will never read
            batches.difference_update({k for k in batches if k[0] == producer.link.name})
        self._drop(producer.deliveries + [d for _, ds in producer.routed.values() for d in ds])
        producer.records, producer.deliveries, producer.ids, producer.routed = [], [], [], {}
        detach_all(producer.plan.targets.values())

    def _drop(self, deliveries: list[Any]) -> None:
        """Deliveries drained but never appended (their link ended first): nobody waits for
        their outcome, so they no longer count against the connection's producer credit."""
        self.unconfirmed -= len(deliveries) - deliveries.count(None)

    def forget_all(self) -> None:
        for producer in self.links.values():
            self.forget(producer)
        self.links.clear()

    # hot path: deliveries -----------------------------------------------------------------------

    def drain(self, producer: ProducerLink) -> None:
        """Read every complete delivery of a producer link (called for its current delivery)."""
        if producer.eventhubs:
            self._drain_eventhubs(producer)
            return
        if self.host.guard.batches and self._batch_on_spate_link(producer):
            return
        lp = producer.pointer
        buf = self.recv_buffer
        size_max = limits.message_bytes_max
        current, partial, recv, advance = (
            lib.pn_link_current,
            lib.pn_delivery_partial,
            lib.pn_link_recv,
            lib.pn_link_advance,
        )
        remote_settled, settle, unpack, is_plain = (
            lib.pn_delivery_settled,
            lib.pn_delivery_settle,
            ffi.unpack,
            sections.is_plain,
        )
        presettled = producer.presettled
        records, deliveries = producer.records, producer.deliveries
        oversize = producer.oversize
        named = producer.name is not None
        topology = producer.plan.super_stream
        route_key = None if topology is None else topology.route_utf8
        keyed = topology is None and producer.plan.bound is None
        routed = producer.routed
        id_at = sections.ULONG.unpack_from
        sub_marker = sub_entries.MARKER_BYTES
        has_key = filtering.has_annotation_key  # keys only where annotations can be
        # The C loop (ADR 0038) takes the plain messages of a bound or unkeyed link as the
        # steps below would; it hands back any other one, received, for the steps after recv.
        fast = None if route_key is not None or oversize else fastsend.native
        if fast is not None:
            fast_keys = (sub_marker, GROUP_KEY_BYTES) if keyed else (sub_marker,)
            link_address = fastsend.address(lp)
        got = 0
        while True:
            if fast is not None:
                taken, unconfirmed, last_id, raw, address = fast.recv_run(
                    fastsend.RECV_FUNCTIONS, link_address, size_max, presettled, fast_keys,
                    producer.id_prefix if named else None, producer.last_id,
                    producer.id_section, records, deliveries, producer.ids,
                )  # fmt: skip
                got += taken
                self.unconfirmed += unconfirmed
                producer.last_id = last_id
            if fast is not None and raw is not None:
                cur = ffi.cast("pn_delivery_t *", address)
            else:
                cur = current(lp)
                if cur == ffi.NULL:
                    break
                if partial(cur):
                    if lib.pn_delivery_aborted(cur):
                        self._discard_aborted(producer, cur)
                        continue
                    if cur in oversize or lib.pn_delivery_pending(cur) > size_max:
                        oversize.add(cur)  # discard what arrived: the message is too big to store
                        while recv(lp, buf, size_max + 1) > 0:
                            pass
                    break
                size = recv(lp, buf, size_max + 1)
                if size > size_max or (oversize and cur in oversize):
                    self._reject_oversize(producer, cur)
                    continue
                if size < 0:
                    if lib.pn_delivery_aborted(cur):
                        self._discard_aborted(producer, cur)
                        continue
                    size = 0  # an empty transfer: not a message, scan_incoming says why
                raw = unpack(buf, size)
                advance(lp)
            if has_key(raw, sub_marker) and self._accept_sub_entry(producer, cur, raw):
                got += 1
                if producer.closed:
                    break
                continue
            if route_key is not None:
                got += 1
                prefix = producer.key_prefix
                if raw.startswith(prefix) and is_plain(raw):  # the key where it was last time
                    at = len(prefix)
                    key = raw[at + 2 : at + 2 + raw[at + 1]]
                    if presettled or remote_settled(cur):
                        settle(cur)
                        cur = None
                    else:
                        self.unconfirmed += 1
                    try:
                        pid = PartitionId(route_key(key))
                    except (BrokerError, UnicodeDecodeError) as err:
                        self._refuse_routed(producer, cur, err)
                    else:
                        batch = routed.get(pid)
                        if batch is None:
                            batch = routed[pid] = ([], [])
                        batch[0].append(raw)
                        batch[1].append(cur)
                else:
                    self._accept_routed(producer, cur, raw)
                if producer.closed:
                    break
                continue
            if not is_plain(raw):
                self._accept_incoming(producer, cur, raw)
                got += 1
                continue
            if keyed and has_key(raw, GROUP_KEY_BYTES):
                self._accept_keyed(producer, cur, raw)
                got += 1
                if producer.closed:
                    break
                continue
            if named:
                # the id at the learned offset (same section layout as a checked message);
                # anything else, including an id that does not increase, goes the slow way
                prefix = producer.id_prefix
                if (
                    raw.startswith(prefix)
                    and (publishing_id := id_at(raw, len(prefix))[0]) > producer.last_id
                ):
                    producer.last_id = publishing_id
                    producer.ids.append(publishing_id)
                    if producer.id_section >= 0:
                        raw = raw[: producer.id_section] + raw[len(prefix) + 8 :]
                else:
                    kept = self._take_id(producer, cur, raw)
                    if kept is None:
                        if producer.closed:
                            break
                        continue
                    raw = kept
            if presettled or remote_settled(cur):
                settle(cur)
                deliveries.append(None)
            else:
                deliveries.append(cur)
                self.unconfirmed += 1
            records.append(raw)
            got += 1
        if got:
            self.dirty.add(lp)

    def _batch_on_spate_link(self, producer: ProducerLink) -> bool:
        """An Event Hubs batch (format 0x80013700, let through by the guard of a dialect
        listener) on a link that is not the dialect's: the link ends, as for any format but 0."""
        name = producer.link.name
        batches: set[tuple[str | None, bytes]] = self.host.guard.batches
        mine = {key for key in batches if key[0] == name}
        if not mine:
            return False
        batches.difference_update(mine)
        self.host.end_producer(
            producer,
            plain(
                NOT_IMPLEMENTED,
                f"message-format 0x{eventhubs.BATCH_FORMAT:08x} on link {name!r}: batches are "
                "taken on Event Hubs links ('<hub>', '<hub>/Partitions/<n>'); Spate's own "
                "links store AMQP messages (message-format 0)",
            ),
        )
        return True

    def _drain_eventhubs(self, producer: ProducerLink) -> None:
        """An Event Hubs link's deliveries (ADR 0021): a batch (message-format 0x80013700, noted
        by the inbound guard) is split into its messages, stored as consecutive records whose
        last carries the delivery's outcome; on a link to the hub (no partition) a message or
        batch with `x-opt-partition-key` goes where Event Hubs' own hash of the key puts it
        (`eventhubs.key_partition`: the partition Azure would pick), the others round-robin per
        pump like any agnostic link."""
        lp, buf, size_max = producer.pointer, self.recv_buffer, limits.message_bytes_max
        batches: set[tuple[str | None, bytes]] = self.host.guard.batches
        plan = producer.plan
        got = 0
        while True:
            cur = lib.pn_link_current(lp)
            if cur == ffi.NULL:
                break
            if lib.pn_delivery_partial(cur):
                if lib.pn_delivery_aborted(cur):
                    self._discard_aborted(producer, cur)
                    continue
                if cur in producer.oversize or lib.pn_delivery_pending(cur) > size_max:
                    producer.oversize.add(cur)
                    while lib.pn_link_recv(lp, buf, size_max + 1) > 0:
                        pass
                break
            size = lib.pn_link_recv(lp, buf, size_max + 1)
            if size > size_max or cur in producer.oversize:
                self._reject_oversize(producer, cur)
                continue
            if size < 0:
                if lib.pn_delivery_aborted(cur):
                    self._discard_aborted(producer, cur)
                    continue
                size = 0
            raw = ffi.unpack(buf, size)
            tag = lib.pn_delivery_tag(cur)
            key = (producer.link.name, bytes(ffi.buffer(tag.start, tag.size)))
            lib.pn_link_advance(lp)
            got += 1
            try:
                if batches and key in batches:
                    batches.discard(key)
                    records = eventhubs.split_batch(raw)
                else:
                    records = [sections.scan_incoming(raw).stored]
                hub_key = None if plan.bound is not None else eventhubs.partition_key(records[0])
                ids = eventhubs.publishing_ids(records) if producer.name is not None else None
            except (sections.MalformedMessage, codec.DecodeError) as err:
                self._reject(cur, plain(DECODE_ERROR, f"malformed message: {err}"))
                continue
            except InvalidArgument as err:
                self._reject(cur, amqp_error(err))
                continue
            if ids is not None:  # an idempotent producer (ADR 0011 by sequence numbers)
                if ids[0] <= producer.last_id or any(b <= a for a, b in itertools.pairwise(ids)):
                    self._reject(
                        cur,
                        amqp_error(
                            InvalidArgument(
                                f"producer sequence numbers {ids[0] - 1}..{ids[-1] - 1} do not "
                                f"follow {producer.last_id - 1}, the last on this link: they "
                                "must increase"
                            )
                        ),
                    )
                    continue
                producer.last_id = ids[-1]
                producer.ids.extend(ids)
            if producer.presettled or lib.pn_delivery_settled(cur):
                lib.pn_delivery_settle(cur)
                cur = None
            else:
                self.unconfirmed += 1
            outcomes = [None] * (len(records) - 1) + [cur]
            if hub_key is not None:
                pid = PartitionId(eventhubs.key_partition(hub_key, plan.partitions))
                batch = producer.routed.setdefault(pid, ([], []))
                batch[0].extend(records)
                batch[1].extend(outcomes)
            else:
                producer.records.extend(records)
                producer.deliveries.extend(outcomes)
        if got:
            self.dirty.add(lp)

    def _take_id(self, producer: ProducerLink, delivery: Any | None, stored: bytes) -> bytes | None:
        """Named links: note the message's publishing id and return the bytes to store
        (without the annotations section when the id is all it holds); None (the delivery
        rejected, or the link ended for a settled one) when it has none or it does not
        increase."""
        try:
            publishing_id = sections.publishing_id(stored)
            if publishing_id is None:
                problem = (
                    f"a message on producer link {producer.link.name!r} (named "
                    f"{producer.name!r}) has no '{links.PUBLISHING_ID_ANNOTATION}' message "
                    "annotation (a ulong)"
                )
            elif publishing_id <= producer.last_id:
                problem = (
                    f"publishing id {publishing_id} is not above {producer.last_id}, the "
                    "previous one on this link: ids must increase strictly"
                )
            else:
                producer.last_id = publishing_id
                producer.ids.append(publishing_id)
                at = sections.publishing_id_at(stored)
                if at <= 0:
                    return stored
                producer.id_prefix = stored[:at]
                producer.id_section = sections.sole_annotation_start(stored, at)
                if producer.id_section < 0:
                    return stored
                return stored[: producer.id_section] + stored[at + 8 :]
        except (sections.BadPublishingId, sections.MalformedMessage) as err:
            problem = str(err)
        error = plain(INVALID_FIELD, problem)
        if delivery is None or producer.presettled or lib.pn_delivery_settled(delivery):
            if delivery is not None:
                lib.pn_delivery_settle(delivery)
            self.host.end_producer(producer, error)  # nothing to reject: say it on the link
        else:
            self._reject(delivery, error)
        return None

    def _accept_sub_entry(self, producer: ProducerLink, delivery: Any, raw: bytes) -> bool:
        """A message holding the sub-entry marker's bytes: False when it is no sub-entry after
        all (the caller goes on with it); else it is batched as one SubEntry record, or
        rejected (only it: the link goes on)."""
        try:
            envelope = sub_entries.parse(sections.scan_incoming(raw).stored)
        except sections.MalformedMessage:
            return False  # not even a message: the usual path names the error
        except sub_entries.Refused as err:
            self._reject(delivery, plain(err.condition, str(err)))
            return True
        if envelope is None:
            return False
        if producer.plan.super_stream is not None:
            self._reject(
                delivery,
                plain(
                    INVALID_FIELD,
                    "a super stream routes each message by its key: send sub-entries on a "
                    "link to one of its partitions",
                ),
            )
            return True
        if producer.presettled or lib.pn_delivery_settled(delivery):
            lib.pn_delivery_settle(delivery)
            delivery = None
        else:
            self.unconfirmed += 1
        if producer.name is not None:
            publishing_id = envelope.publishing_id
            if publishing_id is None or publishing_id <= producer.last_id:
                problem = (
                    f"a sub-entry on producer link {producer.link.name!r} (named "
                    f"{producer.name!r}) needs an '{links.PUBLISHING_ID_ANNOTATION}' above "
                    f"{producer.last_id}, the previous one on this link"
                )
                if delivery is None:
                    self.host.end_producer(producer, plain(INVALID_FIELD, problem))
                else:
                    self._reject_counted(delivery, plain(INVALID_FIELD, problem))
                return True
            producer.last_id = publishing_id
            producer.ids.append(publishing_id)
        producer.records.append(envelope.blob)
        producer.deliveries.append(delivery)
        producer.sub_entries = True
        return True

    def _discard_aborted(self, producer: ProducerLink, delivery: Any) -> None:
        producer.oversize.discard(delivery)
        lib.pn_link_advance(producer.pointer)
        lib.pn_delivery_settle(delivery)

    def _reject_oversize(self, producer: ProducerLink, delivery: Any) -> None:
        """The rest of a message over `limits.message_bytes_max` is read and dropped; the
        delivery is rejected and the link stays usable."""
        lp, buf, size_max = producer.pointer, self.recv_buffer, limits.message_bytes_max
        while lib.pn_link_recv(lp, buf, size_max + 1) > 0:
            pass
        producer.oversize.discard(delivery)
        lib.pn_link_advance(lp)
        error = amqp_error(
            MessageSizeExceeded(f"message larger than {size_max} bytes (limits.message_bytes_max)")
        )
        self._reject(delivery, error)

    def _accept_incoming(self, producer: ProducerLink, delivery: Any, raw: bytes) -> None:
        """The full path for what `sections.is_plain` did not settle: delivery annotations
        (routing by event-streams-target-partition), rarer layouts, and malformed messages."""
        try:
            incoming = sections.scan_incoming(raw)
        except sections.MalformedMessage as err:
            self._reject(delivery, plain(DECODE_ERROR, f"malformed message: {err}"))
            return
        settled = producer.presettled or lib.pn_delivery_settled(delivery)
        if settled:
            lib.pn_delivery_settle(delivery)
            delivery = None
        else:
            self.unconfirmed += 1
        plan = producer.plan
        if incoming.delivery_annotations is not None:
            try:
                annotations = sections.delivery_annotations_map(incoming.delivery_annotations)
                target = annotations.get(links.TARGET_PARTITION_ANNOTATION)
                pid = plan.route(target) if target is not None else None
                if pid is None and plan.bound is None and plan.super_stream is None:
                    pid = keyed_partition(plan, incoming.stored)
            except sections.MalformedMessage as err:
                self._reject_counted(delivery, plain(DECODE_ERROR, f"malformed message: {err}"))
                return
            except BrokerError as err:
                self._reject_counted(delivery, amqp_error(err))
                return
            if pid is not None and plan.bound is None:
                records, deliveries = producer.routed.setdefault(pid, ([], []))
                records.append(incoming.stored)
                deliveries.append(delivery)
                return
        # bound links keep arrival order in one list (a routed message there matched the bound
        # partition); agnostic links collect the unannotated for this batch's round-robin turn
        stored = incoming.stored
        if producer.name is not None:
            kept = self._take_id(producer, delivery, stored)
            if kept is None:
                if delivery is not None:
                    self.unconfirmed -= 1
                return
            stored = kept
        producer.records.append(stored)
        producer.deliveries.append(delivery)

    def _accept_keyed(self, producer: ProducerLink, delivery: Any, raw: bytes) -> None:
        """An agnostic link's plain message that may carry an `event-streams-group-key`
        (000 §4.6.7): to the batch of the partition its key hashes to, with the unkeyed
        messages when it has none, or rejected (`amqp:invalid-field`) when the key is no
        routing key (`spate.core.superstreams.routing_key`: a float, say)."""
        if producer.presettled or lib.pn_delivery_settled(delivery):
            lib.pn_delivery_settle(delivery)
            delivery = None
        else:
            self.unconfirmed += 1
        try:
            pid = keyed_partition(producer.plan, raw)
        except (sections.MalformedMessage, BrokerError) as err:
            self._refuse_routed(producer, delivery, err)
            return
        if pid is None:
            producer.records.append(raw)
            producer.deliveries.append(delivery)
            return
        records, deliveries = producer.routed.setdefault(pid, ([], []))
        records.append(raw)
        deliveries.append(delivery)

    def _accept_routed(self, producer: ProducerLink, delivery: Any, raw: bytes) -> None:
        """A super-stream link's message: to the batch of the partition its routing key (or
        its event-streams-target-partition delivery annotation) names, or rejected."""
        topology = producer.plan.super_stream
        assert topology is not None
        try:
            incoming = sections.scan_incoming(raw)
        except sections.MalformedMessage as err:
            self._reject(delivery, plain(DECODE_ERROR, f"malformed message: {err}"))
            return
        if producer.presettled or lib.pn_delivery_settled(delivery):
            lib.pn_delivery_settle(delivery)
            delivery = None
        else:
            self.unconfirmed += 1
        try:
            target = None
            if incoming.delivery_annotations is not None:
                annotations = sections.delivery_annotations_map(incoming.delivery_annotations)
                target = annotations.get(links.TARGET_PARTITION_ANNOTATION)
            if target is not None:
                pid = producer.plan.route(target)
            else:
                group_key, message_id = sections.routing_fields(incoming.stored)
                pid = PartitionId(topology.route(routing_key(group_key, message_id)))
                if group_key is not None and incoming.delivery_annotations is None:
                    at = sections.group_key_at(raw)
                    if at > 0:  # the next messages laid out alike go the fast way
                        producer.key_prefix = raw[:at]
        except (sections.MalformedMessage, BrokerError) as err:
            self._refuse_routed(producer, delivery, err)
            return
        records, deliveries = producer.routed.setdefault(pid, ([], []))
        records.append(incoming.stored)
        deliveries.append(delivery)

    def _refuse_routed(self, producer: ProducerLink, delivery: Any, err: Exception) -> None:
        """A message that cannot be routed (super stream, or a bad group key): rejected
        (counted in `unconfirmed`), or, when it came settled, the link ends with the reason."""
        error = (
            amqp_error(err)
            if isinstance(err, BrokerError)
            else plain(DECODE_ERROR, f"malformed message: {err}")
        )
        if delivery is None:  # came settled: nothing to reject, so say it on the link
            self.host.end_producer(producer, error)
        else:
            self._reject_counted(delivery, error)

    def _reject_counted(self, delivery: Any, error: AmqpError) -> None:
        if delivery is not None:
            self.unconfirmed -= 1
            self._reject(delivery, error)

    def _reject(self, delivery: Any, error: AmqpError) -> None:
        delivery = fastsend.delivery_pointer(delivery)
        if not lib.pn_delivery_settled(delivery):
            condition = lib.pn_disposition_condition(lib.pn_delivery_local(delivery))
            lib.pn_condition_set_name(condition, error.condition.encode())
            lib.pn_condition_set_description(condition, error.description.encode())
            lib.pn_delivery_update(delivery, lib.PN_REJECTED)
        lib.pn_delivery_settle(delivery)

    def flush(self) -> None:
        while self.dirty:
            producer = self.links.get(self.dirty.pop())
            if producer is None or producer.closed:
                continue
            plan = producer.plan
            if producer.name is not None:
                self._flush_named(producer)
                continue
            batches, producer.routed = producer.routed, {}
            if plan.super_stream is not None and (stale := plan.stale()) is not None:
                self._end_stale(producer, batches, stale)
                continue
            records, deliveries = producer.records, producer.deliveries
            if records:
                producer.records, producer.deliveries = [], []
                if plan.bound is not None:
                    pid = plan.bound
                else:
                    pid = plan.route(None)
                    plan.next_batch()
                routed = batches.get(pid)
                if routed is None:
                    batches[pid] = (records, deliveries)
                else:
                    routed[0].extend(records)
                    routed[1].extend(deliveries)
            split, producer.sub_entries = producer.sub_entries, False
            for pid, (batch_records, batch_deliveries) in batches.items():
                for start, end in chunk_bounds(batch_records, split):
                    self._append(
                        producer, pid, batch_records[start:end], batch_deliveries[start:end]
                    )

    def _end_stale(
        self,
        producer: ProducerLink,
        batches: dict[PartitionId, tuple[list[bytes], list[Any]]],
        reason: BrokerError,
    ) -> None:
        """A super-stream link whose topology changed: nothing more is routed by it."""
        error = amqp_error(reason)
        for _, deliveries in batches.values():
            for delivery in deliveries:
                if delivery is not None:
                    self._reject_counted(delivery, error)
        self.host.end_producer(producer, error)

    def _flush_named(self, producer: ProducerLink) -> None:
        """A named link's batch, to its bound partition, with its publishing ids."""
        records, deliveries, ids = producer.records, producer.deliveries, producer.ids
        if not records:
            return
        producer.records, producer.deliveries, producer.ids = [], [], []
        split, producer.sub_entries = producer.sub_entries, False
        pid = producer.plan.bound
        assert pid is not None and producer.name is not None
        for start, end in chunk_bounds(records, split):
            if producer.closed:  # an append failed at once: the link has ended
                self._drop(deliveries[start:])
                break
            self._append(
                producer,
                pid,
                records[start:end],
                deliveries[start:end],
                PublishingIds(producer.name, ids[start:end]),
            )

    def _append(
        self,
        producer: ProducerLink,
        pid: PartitionId,
        records: list[bytes],
        deliveries: list[Any],
        named: PublishingIds | None = None,
    ) -> None:
        """One chunk; `deliveries[i]` is record i's delivery, None when it came settled."""
        partition = producer.plan.targets.get(pid)
        try:
            if partition is None:
                raise NotFound(f"partition {int(pid)} is not served on this link")
            pending = partition.append(records, named)
        except BrokerError as err:
            self._appended(producer, deliveries, err)
            return
        stats = self.stats  # once per chunk: the lengths are summed in C
        size = sum(map(len, records))
        stats.messages_in += len(records)
        stats.bytes_in += size
        self.in_flight_bytes += size
        producer.message_bytes = size // len(records) or 1
        if named is not None and isinstance(pending, asyncio.Future) and pending.done():
            refusal = None if pending.cancelled() else pending.exception()
            if refusal is not None:  # refused at once: end the link before the next append
                self._append_done(producer, deliveries, size, pending)
                return
        future = asyncio.ensure_future(pending)
        self.host.own(future)
        future.add_done_callback(lambda f: self._append_done(producer, deliveries, size, f))

    def _append_done(
        self,
        producer: ProducerLink,
        deliveries: list[Any],
        size: int,
        future: asyncio.Future[Any],
    ) -> None:
        self.in_flight_bytes -= size
        if future.cancelled():
            self._appended(producer, deliveries, BrokerError("append was cancelled"))
            return
        error = future.exception()
        if error is not None and not isinstance(error, BrokerError):
            log.error("append failed with an unexpected error", exc_info=error)
            error = BrokerError(f"append failed: {type(error).__name__}")
        self._appended(producer, deliveries, error)

    def _appended(
        self, producer: ProducerLink, deliveries: list[Any], error: BrokerError | None
    ) -> None:
        self.unconfirmed -= len(deliveries) - deliveries.count(None)
        if self.host.closed or producer.closed:
            return  # the link or connection is gone; nobody is waiting for the outcome
        if error is None:
            fastsend.accept_all(deliveries, ACCEPTED)
        else:
            amqp = amqp_error(error)
            for delivery in deliveries:
                if delivery is not None:
                    self._reject(delivery, amqp)
            if producer.name is not None:
                self.host.end_producer(
                    producer,
                    plain(
                        amqp.condition,
                        f"a message of producer {producer.name.decode(errors='replace')!r} "
                        f"was refused ({amqp.description}); attach again, read "
                        f"'{links.LAST_PUBLISHING_ID_PROPERTY}' and resend after it",
                    ),
                )
        self.host.schedule_pump()

    def top_up_all(self) -> None:
        for producer in self.links.values():
            self.top_up(producer)

    def top_up(self, producer: ProducerLink) -> None:
        if producer.closed:
            return
        grant = links.producer_credit(
            lib.pn_link_credit(producer.pointer),
            self.unconfirmed,
            self.in_flight_bytes,
            producer.message_bytes,
        )
        if grant:
            lib.pn_link_flow(producer.pointer, grant)


def keyed_partition(plan: links.ProducerPlan, stored: bytes) -> PartitionId | None:
    """The partition of an agnostic link's message by its `event-streams-group-key` message
    annotation (000 §4.6.7: related events are partitioned together, on the same partition at
    all times while the partition count stays): MurmurHash3 of the key modulo the partition
    count, where a super stream of as many partitions would route it. None without a key.
    Raises MalformedMessage, or InvalidArgument for a key that is no routing key."""
    group_key, _ = sections.routing_fields(stored)
    if group_key is None:
        return None
    return PartitionId(hash_partition(routing_key(group_key, None), plan.partitions))


def chunk_bounds(records: list[bytes], sub_entries: bool = False) -> list[tuple[int, int]]:
    """Cut one batch into chunks within limits.chunk_records_max / chunk_bytes_max:
    [(start, end), ...] index ranges. With `sub_entries`, every SubEntry record is a range of
    its own (one append, one sub-entry chunk; ADR 0017)."""
    records_max, bytes_max = limits.chunk_records_max, limits.chunk_bytes_max
    if not sub_entries and len(records) <= records_max and sum(map(len, records)) <= bytes_max:
        return [(0, len(records))]
    bounds: list[tuple[int, int]] = []
    start = 0
    size = 0
    for i, record in enumerate(records):
        if sub_entries and (isinstance(record, SubEntry) or isinstance(records[i - 1], SubEntry)):
            if i > start:
                bounds.append((start, i))
                start = i
                size = 0
        elif i > start and (i - start >= records_max or size + len(record) > bytes_max):
            bounds.append((start, i))
            start = i
            size = 0
        size += len(record)
    bounds.append((start, len(records)))
    return bounds
