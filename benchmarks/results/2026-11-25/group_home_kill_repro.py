#!/usr/bin/env python3
"""Reproduction (RESULTS.md §14, not a benchmark): three GroupConsumers of a group (round-robin,
rebalance delay 0) read a 6-partition stream of 20,000 messages per partition through the proxy
gateway; 3 s in, the leader of the group's home partition (STREAM/0) is killed with SIGKILL and
restarted. Prints what was received, each member's error, whether a fresh member attaches, and
the nodes' refusals. On 2026-11-25 (commit 61e45fe) every message arrived in 6 of 6 runs, but
in 2 of them one member's reconnect was refused `amqp:precondition-failed ... epoch None is
stale` and the member stopped.

  .venv/bin/python benchmarks/results/2026-11-25/group_home_kill_repro.py   # ~1 min
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
os.chdir(ROOT)

from spate.client import GroupConsumer, Producer  # noqa: E402

from cluster import SPATE, Cluster, run  # noqa: E402 (after the path is set)

PER_PARTITION = 20_000


def main() -> None:
    with Cluster(3) as c:
        gateway = f"amqp://{c.endpoints['gateways'][0]['amqp']}"
        c.create_stream("rk", replicas=3, partitions=6)
        c.leaders("rk")
        run(
            [
                str(SPATE), "group", "create", "rk", "g", "--strategy", "round-robin",
                "--rebalance-delay-ms", "0", "--admin", c.admin,
            ],
            60,
        )  # fmt: skip
        for p in range(6):
            with Producer(gateway, "rk", partition=p, window=2000) as producer:
                producer.send_batch([b"x" * 100] * PER_PARTITION)
        seen: list[set[int]] = [set() for _ in range(6)]
        errors: list[str] = []
        lock = threading.Lock()

        def member(i: int) -> None:
            try:
                m = GroupConsumer(gateway, "rk", "g", start="first", credit=500)
                while True:
                    event = m.receive(timeout=60)
                    with lock:
                        seen[int(event.partition or 0)].add(event.offset)
                    time.sleep(0.0002)  # slow readers: the kill lands mid-stream
            except Exception as error:  # what stopped the member is the finding: printed
                errors.append(f"member {i}: {type(error).__name__}: {error}")

        for i in range(3):
            threading.Thread(target=member, args=(i,), daemon=True).start()
        time.sleep(3)
        home = c.leaders("rk")[0]
        pid = int(c.node(home)["pid"])
        print(f"SIGKILL {home} (pid {pid}), leader of rk/0; received so far", sum(map(len, seen)))
        os.kill(pid, signal.SIGKILL)
        time.sleep(2)
        c.up()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and sum(map(len, seen)) < 6 * PER_PARTITION:
            time.sleep(1)
        print("received per partition", [len(s) for s in seen], "of", PER_PARTITION)
        print("member errors:", errors)
        try:
            GroupConsumer(gateway, "rk", "g", timeout_s=15).close()
            print("a fresh member attached")
        except Exception as error:  # the finding, printed
            print("a fresh member was refused:", error)
        for log in sorted(c.data_dir.glob("*/node.log")):
            for line in log.read_text().splitlines():
                if "precondition" in line or "Error" in line:
                    print(f"{log.parent.name}: {line}")


if __name__ == "__main__":
    main()
