"""spate.client: a thin layer over python-qpid-proton for Spate's stream features.

    from spate.client import Consumer, Producer

    with Producer("amqp://127.0.0.1:5672", "orders") as producer:
        producer.send(b"hello")                       # returns once the broker accepted it
        future = producer.send_async(b"a")            # a confirm future, window-bounded
        producer.send_batch([b"b", b"c"])             # pipelined, waits for every confirm
    with Consumer("amqp://127.0.0.1:5672", "orders", start="first") as consumer:
        event = consumer.receive(timeout=5)
        print(event.offset, event.timestamp_ms, event.body)

    # survive a node's death: try these in turn, resend what was not confirmed, resume reads
    producer = Producer([url1, url2, url3], "orders", reconnect_timeout_s=30)

asyncio: `spate.client.aio` (`AsyncProducer`, `AsyncConsumer`). Layout: `core` (pure state
machines), `engine` (the only module importing proton), `aio` (the asyncio shells),
`blocking` (the same clients on a background loop). docs/client.md is the guide.
"""

from spate.client.blocking import Consumer, GroupConsumer, Producer
from spate.client.core import SubEntryBatch
from spate.client.errors import (
    AttachRefused,
    AuthenticationFailed,
    ConnectionLost,
    ConsumerClosed,
    LinkStolen,
    PublishRefused,
)
from spate.client.event import Event
from spate.client.offsets import offset_filter

__all__ = [
    "AttachRefused",
    "AuthenticationFailed",
    "ConnectionLost",
    "Consumer",
    "ConsumerClosed",
    "Event",
    "GroupConsumer",
    "LinkStolen",
    "Producer",
    "PublishRefused",
    "SubEntryBatch",
    "offset_filter",
]
