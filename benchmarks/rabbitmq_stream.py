#!/usr/bin/env python3
"""Delete and re-create a RabbitMQ stream over the stream protocol (an AMQP 1.0 client cannot
declare a stream in RabbitMQ 3.10). Runs with the peers venv (rstream), inside the peers netns:

  ip netns exec peers /tmp/peers/venv/bin/python benchmarks/rabbitmq_stream.py NAME [--replicas R]

Used as workload.py's --create-cmd when validating the load client against RabbitMQ.
"""

from __future__ import annotations

import argparse
import asyncio

SETTLE_S = 1.0
"""Pause after create so the stream's members have started (as the peers harness does)."""


async def recreate(host: str, port: int, name: str, replicas: int) -> None:
    from rstream import Producer  # type: ignore[import-not-found]  # peers venv only

    p = Producer(host, port, username="guest", password="guest")
    await p.start()
    try:
        await p.delete_stream(name, missing_ok=True)
        await p.create_stream(name, arguments={"initial-cluster-size": replicas})
        await asyncio.sleep(SETTLE_S)
    finally:
        await p.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("name")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5552, help="stream-protocol port")
    a = ap.parse_args()
    asyncio.run(asyncio.wait_for(recreate(a.host, a.port, a.name, a.replicas), 60))


if __name__ == "__main__":
    main()
