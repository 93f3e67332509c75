"""A consumer group's receiver in its own process (tests/integration/test_consumer_groups.py).

    python group_member.py URL STREAM GROUP PARTITION EPOCH|- CREDIT

Attaches with `event-streams-consumer-group` (and `event-streams-epoch` unless `-`), prints one
JSON line per event — {"attached": epoch, "stored": offset|null}, {"body": ...} for each
message (accepted at once), {"detached": condition, "description": ...} — and exits when its
link is detached (or after 120 s).
"""

from __future__ import annotations

import json
import sys

from proton import Timeout, symbol, ulong
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, LinkDetached


class _Group(LinkOption):  # type: ignore[misc]
    def __init__(self, group: str, partition: str, epoch: int | None) -> None:
        self.props = {
            symbol("event-streams-consumer-group"): group,
            symbol("event-streams-partition"): symbol(partition),
        }
        if epoch is not None:
            self.props[symbol("event-streams-epoch")] = ulong(epoch)

    def apply(self, link: object) -> None:
        link.properties = self.props  # type: ignore[attr-defined]


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main() -> None:
    url, stream, group, partition, epoch_arg, credit = sys.argv[1:7]
    epoch = None if epoch_arg == "-" else int(epoch_arg)
    conn = BlockingConnection(url, timeout=30)
    receiver = conn.create_receiver(
        stream, credit=int(credit), options=_Group(group, partition, epoch)
    )
    props = receiver.link.remote_properties
    say(
        attached=int(props[symbol("event-streams-epoch")]),
        stored=props.get(symbol("spate:stored-offset")),
    )
    try:
        for _ in range(1200):
            try:
                message = receiver.receive(timeout=0.1)
            except Timeout:
                continue
            receiver.accept()
            say(body=message.body)
    except LinkDetached as detached:
        condition = receiver.link.remote_condition
        say(
            detached=condition.name if condition else None,
            description=condition.description if condition else str(detached),
        )
    conn.close()


if __name__ == "__main__":
    main()
