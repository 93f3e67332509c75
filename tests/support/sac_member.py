"""A single-active-consumer member as its own process, for the failover tests (ADR 0013).

    python sac_member.py URLS STREAM NAME [DELAY_S]

spate.client `Consumer(name=NAME, single_active=True, start="first")` with reconnecting on
(URLS comma-separated, redirects followed). Prints one JSON line when attached
({"attached": true, "active": bool}, with "streams" on a super stream) and one per event
({"offset", "body", "active"}; on a super stream's address, ADR 0034, also "stream" and the
"streams" it was told it is active on), flushed at once; each event is finished (automatic
commits) when the next is asked for, after DELAY_S. Runs until killed."""

from __future__ import annotations

import json
import sys
import time

from spate.client import Consumer


def main() -> None:
    urls, stream, name = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    delay_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    with Consumer(
        urls,
        stream,
        name=name,
        single_active=True,
        start="first",
        credit=10,
        timeout_s=20,
        reconnect_timeout_s=60,
    ) as consumer:
        line: dict[str, object] = {"attached": True, "active": consumer.active}
        if consumer.active_streams:
            line["streams"] = sorted(consumer.active_streams)
        print(json.dumps(line), flush=True)
        while True:
            event = consumer.receive(timeout=None)
            body = event.body
            text = body.decode() if isinstance(body, bytes) else str(body)
            line = {"offset": event.offset, "body": text, "active": consumer.active}
            if event.stream is not None:  # a super stream's (ADR 0034)
                line["stream"] = event.stream
                line["streams"] = sorted(consumer.active_streams)
            print(json.dumps(line), flush=True)
            time.sleep(delay_s)


if __name__ == "__main__":
    main()
