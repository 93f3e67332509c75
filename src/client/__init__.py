"""spate.client: a thin layer over python-qpid-proton for Spate's stream features.

    from spate.client import Producer, Consumer

    with Producer("amqp://127.0.0.1:5672", "orders") as producer:
        producer.send(b"hello")                       # returns once the broker accepted it
        producer.send_batch([b"a", b"b"])             # pipelined, waits for every confirm
    with Consumer("amqp://127.0.0.1:5672", "orders", start="first") as consumer:
        event = consumer.receive(timeout=5)
        print(event.offset, event.timestamp_ms, event.body)

    # survive the node's death: try these nodes in turn, resend what was not confirmed
    producer = Producer([url1, url2, url3], "orders", reconnect_timeout_s=30)

Any AMQP 1.0 client works with Spate; this module only saves writing filters and reading
delivery annotations by hand. See docs/amqp.md for the wire-level contract.
"""

from spate.client.blocking import Consumer, Event, Producer, PublishRefused
from spate.client.offsets import offset_filter

__all__ = ["Consumer", "Event", "Producer", "PublishRefused", "offset_filter"]
