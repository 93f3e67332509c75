"""docs/client.md's examples run as they are, against a real one-node cluster with a gateway,
so the documentation cannot rot (issue 7: runnable examples for spate.client and rhea)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from spate.client import Consumer
from support.amqp_clients import run_example
from support.cluster import Cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
BLOCK = re.compile(r"```(python|js) example\n(.*?)```", re.DOTALL)


def examples() -> list[tuple[str, str]]:
    found = [(m.group(1), m.group(2)) for m in BLOCK.finditer(DOC.read_text())]
    assert [language for language, _ in found] == ["python"] * 4 + ["js"], found
    return found


def test_every_example_in_docs_client_runs(cluster: Cluster) -> None:
    cluster.cli("stream", "create", "orders")
    cluster.cli("stream", "create", "jobs", "--partitions", "4")
    cluster.cli("superstream", "create", "invoices", "--partitions", "3")
    gateway = cluster.state["gateways"][0]
    env = {**os.environ, "SPATE_URL": f"amqp://{gateway['amqp']}"}
    outputs = [run_example(language, code, env) for language, code in examples()]
    assert outputs[0].startswith("0 "), outputs[0]  # the first event's offset
    assert outputs[2].strip() == "holding [0, 1, 2, 3]", outputs[2]
    assert outputs[3].splitlines()[0] == "active on ['invoices-0', 'invoices-1', 'invoices-2']"
    assert sorted(outputs[3].splitlines()[1:]) == [  # hello2 -> 0, hello1 -> 1, hello4 -> 2
        "invoices-0 0 hello2",
        "invoices-1 0 hello1",
        "invoices-2 0 hello4",
    ]
    assert "accepted after 1 redirect(s)" in outputs[4]
    with Consumer(cluster.amqp_url(), "orders", start="last") as consumer:
        assert consumer.receive(timeout=10).body == "from rhea"  # rhea sent an amqp-value
