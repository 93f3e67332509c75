"""A single-active-consumer member as its own process, for the failover tests (ADR 0013).

    python sac_member.py URLS STREAM NAME [DELAY_S]

spate.client `Consumer(name=NAME, single_active=True, start="first")` with reconnecting on
(URLS comma-separated, redirects followed). Prints one JSON line when attached
({"attached": true, "active": bool}) and one per event ({"offset", "body", "active"}), flushed
at once; each event is finished (automatic commits) when the next is asked for, after
DELAY_S. Runs until killed."""

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
        print(json.dumps({"attached": True, "active": consumer.active}), flush=True)
        while True:
            event = consumer.receive(timeout=None)
            body = event.body
            text = body.decode() if isinstance(body, bytes) else str(body)
            line = {"offset": event.offset, "body": text, "active": consumer.active}
            print(json.dumps(line), flush=True)
            time.sleep(delay_s)


if __name__ == "__main__":
    main()
