"""One line per node of what node liveness did (issue 16, ADR 0026 addendum), read from each
node's /metrics: quiet replicas, peers suspected, liveness wake-ups (by reason where the build
counts them), followers settled again, suspicions, wake-ups by a peer's message, and how often
the node's own ticks came late. Used by idle_partitions.sh; works against builds that have only
some of these metrics (they print as "-").

    python benchmarks/node_liveness.py http://127.0.0.1:PORT/metrics ...
"""

from __future__ import annotations

import re
import sys
import urllib.request

SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+|NaN|\+Inf)$")


def read(url: str) -> dict[str, float]:
    """Sums of each sample name (labels summed over), plus the tick-gap buckets by `le`."""
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if found is None:
            continue
        name, labels, value = found.group(1), found.group(2) or "", float(found.group(3))
        if name == "spate_replication_tick_gap_seconds_bucket":
            le = re.search(r'le="([^"]+)"', labels)
            assert le is not None
            name = f"gap_le_{le.group(1)}"
        elif name == "spate_replication_liveness_wakes_total" and "reason=" in labels:
            reason = re.search(r'reason="([^"]+)"', labels)
            assert reason is not None
            out[f"wakes_{reason.group(1)}"] = value
        out[name] = out.get(name, 0.0) + value
    return out


def line(url: str) -> str:
    m = read(url)

    def get(name: str) -> str:
        value = m.get(name)
        return "-" if value is None else f"{value:.0f}"

    count = m.get("spate_replication_tick_gap_seconds_count")
    late = "-"
    if count is not None:
        late = "/".join(
            f"{count - m.get(f'gap_le_{le}', 0.0):.0f}" for le in ("0.25", "0.5", "1.0", "2.5")
        )
    return (
        f"quiet {get('spate_replication_quiet_replicas')}"
        f" suspected {get('spate_replication_peers_suspected')}"
        f" wakes {get('spate_replication_liveness_wakes_total')}"
        f" (leader {get('wakes_leader_suspected')} quorum {get('wakes_quorum_suspected')}"
        f" back {get('wakes_peer_back')})"
        f" settled {get('spate_replication_liveness_settled_total')}"
        f" quorum_back {get('spate_replication_quorum_back_total')}"
        f" suspicions {get('spate_replication_suspicions_total')}"
        f" message_wakes {get('spate_replication_message_wakes_total')}"
        f" ticks_late>0.25/0.5/1/2.5s {late}"
    )


def main() -> None:
    for url in sys.argv[1:]:
        try:
            print(f"{url}: {line(url)}")
        except OSError as error:
            print(f"{url}: no answer ({error})")


if __name__ == "__main__":
    main()
