"""One line per node of what node liveness did (issue 16, ADR 0026 addendum), read from each
node's /metrics: partitions led and leader changes seen (summed over its replicas), quiet
replicas, peers suspected, liveness wake-ups (by reason where the build counts them), followers
settled again, suspicions, wake-ups by a peer's message, how often the node's own ticks came
late, peers found late but not suspected (RESULTS §42) and the generation 2 collections' pauses.
Used by idle_partitions.sh; works against builds that have only some of these metrics (they
print as "-").

    python benchmarks/node_liveness.py http://127.0.0.1:PORT/metrics ...
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

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
        elif name.startswith("spate_gc_pause_seconds") and 'generation="2"' in labels:
            le = re.search(r'le="([^"]+)"', labels)
            name = "gc2_count" if name.endswith("_count") else name
            if le is not None:
                name = f"gc2_le_{le.group(1)}"
        elif name == "spate_replication_suspect_after_ticks":
            out[name] = max(out.get(name, 0.0), value)
            continue
        elif name == "spate_replication_liveness_wakes_total" and "reason=" in labels:
            reason = re.search(r'reason="([^"]+)"', labels)
            assert reason is not None
            out[f"wakes_{reason.group(1)}"] = value
        out[name] = out.get(name, 0.0) + value
    return out


GAP_BOUNDS = ("0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "+Inf")


def p99_gap(m: dict[str, float]) -> str:
    """The tick-gap histogram's bucket holding the 99th percentile ("<=0.1" s)."""
    count = m.get("spate_replication_tick_gap_seconds_count")
    if not count:
        return "-"
    for bound in GAP_BOUNDS:
        if m.get(f"gap_le_{bound}", 0.0) >= 0.99 * count:
            return f"<={bound}"
    return "-"


def line(m: dict[str, float]) -> str:

    def get(name: str) -> str:
        value = m.get(name)
        return "-" if value is None else f"{value:.0f}"

    count = m.get("spate_replication_tick_gap_seconds_count")
    late = "-"
    if count is not None:
        late = "/".join(
            f"{count - m.get(f'gap_le_{le}', 0.0):.0f}" for le in ("0.25", "0.5", "1.0", "2.5")
        )
    gc2 = m.get("gc2_count")
    gc_late = "-"
    if gc2 is not None:
        gc_late = "/".join(
            f"{gc2 - m.get(f'gc2_le_{le}', 0.0):.0f}" for le in ("0.25", "0.5", "1.0", "2.5")
        )
    return (
        f"led {get('spate_partition_leader')}"
        f" leader_changes {get('spate_partition_leader_changes_total')}"
        f" quiet {get('spate_replication_quiet_replicas')}"
        f" suspected {get('spate_replication_peers_suspected')}"
        f" wakes {get('spate_replication_liveness_wakes_total')}"
        f" (leader {get('wakes_leader_suspected')} quorum {get('wakes_quorum_suspected')}"
        f" back {get('wakes_peer_back')})"
        f" settled {get('spate_replication_liveness_settled_total')}"
        f" quorum_back {get('spate_replication_quorum_back_total')}"
        f" suspicions {get('spate_replication_suspicions_total')}"
        f" message_wakes {get('spate_replication_message_wakes_total')}"
        f" ticks_late>0.25/0.5/1/2.5s {late} gap_p99 {p99_gap(m)}"
        f" late {get('spate_replication_late_total')}"
        f" held {get('spate_replication_campaigns_held_total')}"
        f" suspect_after_max {get('spate_replication_suspect_after_ticks')}"
        f" gc2 {get('gc2_count')} (>0.25/0.5/1/2.5s {gc_late})"
    )


def main() -> None:
    """`--state FILE` first: also print what changed since the reading saved in FILE, then save
    this one there (idle_partitions.sh: the figures of its measured window alone)."""
    args = sys.argv[1:]
    state: Path | None = None
    if args[:1] == ["--state"]:
        state, args = Path(args[1]), args[2:]
    before: dict[str, dict[str, float]] = {}
    if state is not None and state.exists():
        before = json.loads(state.read_text())
    now: dict[str, dict[str, float]] = {}
    for url in args:
        try:
            now[url] = read(url)
        except OSError as error:
            print(f"{url}: no answer ({error})")
            continue
        print(f"{url}: {line(now[url])}")
        if url in before:
            delta = {
                k: v - before[url].get(k, 0.0)
                for k, v in now[url].items()
                if not k.startswith(("spate_replication_quiet", "spate_replication_peers"))
                and k not in ("spate_partition_leader", "spate_replication_suspect_after_ticks")
            }
            print(f"  since the last reading: {line(delta)}")
    if state is not None:
        state.write_text(json.dumps(now))


if __name__ == "__main__":
    main()
