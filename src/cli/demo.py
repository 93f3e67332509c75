"""`make demo`: start a local cluster, create a stream, publish and consume through AMQP 1.0.

Prints every command it runs and what happened, then stops the cluster it started. Run with
`python -m spate.cli.demo [--nodes N] [--messages N] [--keep]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proton.utils import BlockingConnection
from spate.client import Consumer, Producer


def _spate(*args: str, capture_json: bool = False) -> Any:
    argv = [sys.executable, "-m", "spate.cli.main", *args]
    print("$ spate " + " ".join(args), flush=True)
    proc = subprocess.run(argv, check=False, capture_output=capture_json, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"demo: `spate {' '.join(args)}` failed:\n{proc.stderr or ''}")
    return json.loads(proc.stdout) if capture_json else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spate.cli.demo", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="cluster size (default: 3)")
    parser.add_argument("--messages", type=int, default=2000, help="messages to publish")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)

    data_dir = Path(tempfile.mkdtemp(prefix="spate-demo-"))
    print(f"== Spate demo: {args.nodes}-node cluster in {data_dir}\n", flush=True)
    try:
        cluster = _spate(
            "dev",
            "up",
            "--nodes",
            str(args.nodes),
            "--data-dir",
            str(data_dir),
            "--output",
            "json",
            capture_json=True,
        )
        node = cluster["nodes"][0]
        gateway = cluster["gateways"][0]
        print(
            f"   {len(cluster['nodes'])} node(s) ready; clients connect to the gateway at "
            f"{gateway['amqp']} (it redirects each link to its partition's leader); "
            f"admin at {cluster['admin']}\n"
        )
        admin = ["--admin", cluster["admin"]]
        _spate("stream", "create", "demo", "--partitions", "1", "--max-age", "1h", *admin)
        url = f"amqp://{gateway['amqp']}"

        print(f"\n== publish {args.messages} messages to 'demo' with confirms (accepted = fsynced)")
        bodies = [f"event {i}".encode() for i in range(args.messages)]
        started = time.perf_counter()
        with Producer(url, "demo") as producer:
            confirmed = producer.send_batch(bodies)
        elapsed = time.perf_counter() - started
        print(
            f"   {confirmed} accepted in {elapsed:.2f}s ({confirmed / elapsed:,.0f} msg/s, "
            "python-qpid-proton BlockingConnection, redirected by the gateway)"
        )

        print("\n== consume from 'first' (event-streams offset filter)")
        with Consumer(url, "demo", start="first") as consumer:
            events = [consumer.receive(timeout=10) for _ in range(args.messages)]
        assert [e.body for e in events] == bodies, "consumed bodies differ from published ones"
        first, last = events[0], events[-1]
        print(
            f"   got {len(events)} events in order; first offset {first.offset} "
            f"({first.body!r}), last offset {last.offset} ({last.body!r})"
        )

        print("\n== consume the last 3 (relative start -3)")
        with Consumer(url, "demo", start=-3) as consumer:
            tail = [consumer.receive(timeout=10) for _ in range(3)]
        print("   " + ", ".join(f"{e.offset}:{e.body!r}" for e in tail))

        print("\n== runtime information from 'demo/$info' (Event Streams §6)")
        connection = BlockingConnection(f"amqp://{node['amqp']}", timeout=10)
        try:
            receiver = connection.create_receiver("demo/$info", credit=1)
            info: Any = receiver.receive(timeout=10).body
            receiver.accept()
        finally:
            connection.close()
        for part in info["partitions"]:
            print("   " + ", ".join(f"{k}={v}" for k, v in part.items()))

        print()
        _spate("stream", "describe", "demo", *admin)
        print("\ndemo finished: publish, confirm, consume and $info all worked.")
        return 0
    finally:
        if args.keep:
            print(f"\ncluster left running; stop it with: spate dev down --data-dir {data_dir}")
        else:
            print()
            _spate("dev", "down", "--data-dir", str(data_dir))
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
