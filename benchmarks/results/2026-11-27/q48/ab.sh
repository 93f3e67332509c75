#!/bin/bash
# ADR 0042 A/B: A = SPATE_QUIET_COMMITS=0 (answered), B = 1 (quiet, the default). Alternated.
cd /work/main
for round in 1 2 3; do
  for tag in A B; do
    q=$([ $tag = A ] && echo 0 || echo 1)
    echo "== $tag$round rl $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    SPATE_QUIET_COMMITS=$q .venv/bin/python benchmarks/replication_latency.py --count 6000 --entry-points /tmp/q48/ep-$tag$round > /tmp/q48/rl-$tag$round.txt 2>&1
    echo "== $tag$round oc $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    SPATE_QUIET_COMMITS=$q .venv/bin/python benchmarks/offset_commits.py --runs 1 --out /tmp/q48/oc-$tag$round.jsonl > /tmp/q48/oc-$tag$round.txt 2>&1
  done
done
for round in 1 2 3; do
  for tag in A B; do
    q=$([ $tag = A ] && echo 0 || echo 1)
    echo "== $tag$round w3 $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    SPATE_QUIET_COMMITS=$q .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q48/w3-$tag$round > /tmp/q48/w3-$tag$round.txt 2>&1
  done
done
echo "== done $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
