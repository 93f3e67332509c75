#!/bin/bash
cd /work/main
for round in 4 5 6; do
  for tag in B A; do
    q=$([ $tag = A ] && echo 0 || echo 1)
    echo "== $tag$round w3 $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    SPATE_QUIET_COMMITS=$q .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q48/w3-$tag$round > /tmp/q48/w3-$tag$round.txt 2>&1
  done
done
echo "== done $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
