"""The Event Hubs request/response nodes `$cbs` and `$management` of one connection (ADR 0021).

A client attaches a sender to the node (its requests) and a receiver from it whose target is
its reply-to address (the answers). Each request is decoded with proton (control plane, a few
per connection), answered by `spate.gateway.eventhubs` (pure), and the answer sent on the
receiver whose target is the request's reply-to (else the node's only receiver), with
`correlation-id` = the request's `message-id` and `status-code` / `status-description`
application properties (the AMQP management convention both SDKs read).

- `$cbs` `put-token` (a SAS token): 202, the grant noted on the connection; 401 with the
  reason when the listener has SAS keys and no key signed it, or it expired;
- `$management` `READ` of `com.microsoft:eventhub` (partition ids, created at) or
  `com.microsoft:partition` (begin/last sequence number, last offset and time, empty): 200;
- anything else: 400 / 404 / 501 with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from cproton_ffi import ffi, lib
from proton import Link, Message, int32, symbol, timestamp
from spate.core.backend import Broker
from spate.core.errors import BrokerError, NotFound, NotLeader, Unavailable
from spate.core.ids import PartitionId, StreamName
from spate.gateway import codec, eventhubs

log = logging.getLogger(__name__)
REQUEST_CREDIT = 100
REQUEST_BYTES_MAX = 64 * 1024
GRANTS_MAX = 1024
"""Distinct token audiences one connection may hold (one per entity it uses, typically)."""


@dataclass
class NodeLinks:
    requests: dict[Any, Link] = field(default_factory=dict)
    """Links the client sends requests on, by C pointer."""
    replies: dict[Any, Link] = field(default_factory=dict)
    """Links the client receives answers on, by C pointer."""


class RequestNodes:
    def __init__(
        self,
        broker_of: Any,
        keys: dict[str, str],
        require_token: bool,
        schedule_pump: Any,
        own: Any,
    ) -> None:
        self.broker_of = broker_of
        """() -> the connection's broker."""
        self.keys = keys
        self.require_token = require_token
        self.schedule_pump = schedule_pump
        self.own = own
        self.nodes: dict[str, NodeLinks] = {}
        self.node_of: dict[Any, str] = {}
        self.grants: dict[str, eventhubs.Grant] = {}
        """By audience: a token put again for the same resource (the SDKs refresh theirs
        before they expire) replaces the older one, so a long connection holds a few."""
        self.client = False
        """The connection put a token on `$cbs`: an Event Hubs client's, so its bare `<hub>`
        addresses are hubs (ADR 0021)."""
        self._tag = 0

    def open(self, link: Link, node: str) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        links = self.nodes.setdefault(node, NodeLinks())
        if link.is_receiver:
            links.requests[link._impl] = link
        else:
            links.replies[link._impl] = link
        self.node_of[link._impl] = node
        if link.is_receiver:
            link.max_message_size = REQUEST_BYTES_MAX
        link.open()
        if link.is_receiver:
            link.flow(REQUEST_CREDIT)

    def forget(self, pointer: Any) -> bool:
        node = self.node_of.pop(pointer, None)
        if node is None:
            return False
        links = self.nodes[node]
        links.requests.pop(pointer, None)
        links.replies.pop(pointer, None)
        return True

    def owns(self, pointer: Any) -> bool:
        return pointer in self.node_of

    def covers(self, entity: str) -> bool:
        """May this connection use `entity` (a hub's path)? Always, unless it must present
        tokens (in by MSSBCBS or ANONYMOUS where anonymous access is off)."""
        return not self.require_token or eventhubs.covers(
            list(self.grants.values()), entity, time.time()
        )

    # requests ------------------------------------------------------------------------------------

    def readable(self, delivery: Any) -> None:
        """Requests arrived on a node's link (the dispatch loop's cold branch): each complete
        one is decoded, accepted (rejected when it is no AMQP message or too big) and
        answered in a task."""
        lp = lib.pn_delivery_link(delivery)
        node = self.node_of.get(lp)
        if node is None or lp not in self.nodes[node].requests:
            return
        while True:
            current = lib.pn_link_current(lp)
            if current == ffi.NULL or lib.pn_delivery_partial(current):
                break
            size = lib.pn_delivery_pending(current)
            raw = b""
            if size <= REQUEST_BYTES_MAX:
                buf = ffi.new("char[]", max(size, 1))
                raw = ffi.unpack(buf, max(lib.pn_link_recv(lp, buf, size), 0))
            lib.pn_link_advance(lp)
            request = Message()
            try:
                if not raw:
                    raise ValueError(f"empty or over {REQUEST_BYTES_MAX} bytes")
                request.decode(raw)
            except Exception as err:  # proton raises its own MessageException
                log.info("refused a %s request: %s", node, err)
                lib.pn_delivery_update(current, lib.PN_REJECTED)
                lib.pn_delivery_settle(current)
                continue
            lib.pn_delivery_update(current, lib.PN_ACCEPTED)
            lib.pn_delivery_settle(current)
            self.own(asyncio.ensure_future(self._answer(node, request)))
        if lib.pn_link_credit(lp) < REQUEST_CREDIT // 2:
            lib.pn_link_flow(lp, REQUEST_CREDIT - lib.pn_link_credit(lp))

    async def _answer(self, node: str, request: Message) -> None:
        props: dict[Any, Any] = request.properties or {}
        try:
            if node == eventhubs.CBS_NODE:
                status, description, body = self._put_token(props, request.body)
            else:
                status, description, body = await self._management(props)
        except eventhubs.TokenRefused as refused:
            status, description, body = refused.status, refused.description, None
        except NotFound as err:
            status, description, body = 404, err.message, None
        except (NotLeader, Unavailable) as err:
            status, description, body = 503, err.message, None
        except BrokerError as err:
            status, description, body = 500, err.message, None
        self._reply(node, request, status, description, body)

    def _put_token(self, props: dict[Any, Any], body: Any) -> tuple[int, str, Any]:
        self.client = True
        operation = props.get("operation")
        if operation != "put-token":
            return 400, f"$cbs takes operation 'put-token', not {operation!r}", None
        token_type = props.get("type")
        if token_type != eventhubs.SAS_TOKEN_TYPE:
            if self.keys:
                return 401, f"token type {token_type!r}: only SAS tokens are taken here", None
            return 202, "Accepted (this listener has no SAS keys: any token is taken)", None
        if not self.keys:
            return 202, "Accepted (this listener has no SAS keys: any token is taken)", None
        grant = eventhubs.check_sas_token(str(body), self.keys)
        if len(self.grants) >= GRANTS_MAX and grant.audience not in self.grants:
            return 403, f"a connection holds at most {GRANTS_MAX} tokens", None
        self.grants[grant.audience] = grant
        return 202, "Accepted", None

    async def _management(self, props: dict[Any, Any]) -> tuple[int, str, Any]:
        if props.get("operation") != "READ":
            return 501, f"$management: operation {props.get('operation')!r} is not served", None
        hub = props.get("name")
        if not isinstance(hub, str) or not hub:
            return 400, "$management READ needs the hub's 'name'", None
        if self.require_token and not self.covers(hub):
            token = props.get("security_token")
            if token is None:
                return 401, f"no token covers {hub!r}: put one on $cbs first", None
            grant = eventhubs.check_sas_token(str(token), self.keys)
            if not eventhubs.covers([grant], hub, time.time()):
                return 401, f"the token's resource {grant.audience!r} does not cover {hub!r}", None
        broker: Broker = self.broker_of()
        config = await broker.lookup(StreamName(hub))
        kind = props.get("type")
        if kind == "com.microsoft:eventhub":
            created = await _created_ms(broker, StreamName(hub), config.partitions)
            return 200, "OK", eventhubs.hub_properties(hub, created, config.partitions)
        if kind == "com.microsoft:partition":
            partition = props.get("partition")
            pid = _pid(partition, config.partitions, hub)
            figures = await _figures(broker, StreamName(hub), pid)
            return 200, "OK", eventhubs.partition_properties(hub, str(int(pid)), figures)
        return 404, f"$management READ: type {kind!r} is not served", None

    def _reply(self, node: str, request: Message, status: int, description: str, body: Any) -> None:
        links = self.nodes.get(node)
        if links is None or not links.replies:
            log.info("no reply link on %s for a request", node)
            return
        link = next(
            (lk for lk in links.replies.values() if lk.remote_target.address == request.reply_to),
            next(iter(links.replies.values())),
        )
        answer = Message(
            correlation_id=request.id if request.id is not None else request.correlation_id,
            # both spellings: the AMQP management draft's, and the one azure-eventhub's
            # management link reads (it ignores the SDK's own `description_fields`)
            properties={
                "status-code": int32(status),  # an AMQP int: uamqp reads nothing else
                "status-description": description,
                "statusDescription": description,
            },
            body=_proton_body(body),
        )
        self._tag += 1
        delivery = link.delivery(str(self._tag))
        link.send(answer.encode())
        link.advance()
        delivery.settle()
        if status >= 400:
            log.info("%s answered %d: %s", node, status, description)
        self.schedule_pump()


def _proton_body(body: Any) -> Any:
    """Our codec's values (Timestamp, Symbol) as proton's, for Message.encode."""
    if isinstance(body, dict):
        return {_proton_body(k): _proton_body(v) for k, v in body.items()}
    if isinstance(body, list):
        return [_proton_body(v) for v in body]
    if isinstance(body, codec.Timestamp):
        return timestamp(int(body))
    if isinstance(body, codec.Symbol):
        return symbol(str(body))
    return body


def _pid(value: Any, partitions: int, hub: str) -> PartitionId:
    text = str(value) if value is not None else ""
    if not text.isdigit() or not 0 <= int(text) < partitions:
        raise NotFound(
            f"event hub {hub!r} has no partition {value!r} (ids '0'..'{partitions - 1}')"
        )
    return PartitionId(int(text))


async def _figures(
    broker: Broker, stream: StreamName, pid: PartitionId
) -> eventhubs.PartitionFigures:
    partition = broker.partition(stream, pid, write=False)
    try:
        info = await partition.describe()
    finally:
        partition.detach()
    begin = int(info.first_offset) if info.first_offset is not None else int(info.end_offset)
    return eventhubs.PartitionFigures(begin, int(info.end_offset), info.last_timestamp_ms or 0)


async def _created_ms(broker: Broker, stream: StreamName, partitions: int) -> int:
    """Spate keeps no creation time: the oldest retained message's, else now."""
    oldest: int | None = None
    for p in range(partitions):
        try:
            partition = broker.partition(stream, PartitionId(p), write=False)
        except BrokerError:
            continue
        try:
            info = await partition.describe()
        except BrokerError:
            continue
        finally:
            partition.detach()
        if info.first_timestamp_ms is not None:
            oldest = min(oldest or info.first_timestamp_ms, info.first_timestamp_ms)
    return oldest if oldest is not None else int(time.time() * 1000)
