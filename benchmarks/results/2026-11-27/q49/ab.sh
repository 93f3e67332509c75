#!/bin/bash
# C ran with a first form of the switch, SPATE_SYNC_INLINE_LEADERS=1: every small batch with a leader inline up to the
# general limit (131072 bytes); the committed form is SPATE_SYNC_INLINE_LEADER_BYTES_MAX=N (round 3, D: 4096).
# A: default (threaded syncs); B: followers inline; C: followers and leaders inline
cd /work/main
for i in 1 2 3; do
  for mode in A B C; do
    tag=$mode$i
    case $mode in
      A) envs="" ;;
      B) envs="SPATE_SYNC_INLINE_BYTES_MAX=131072" ;;
      C) envs="SPATE_SYNC_INLINE_BYTES_MAX=131072 SPATE_SYNC_INLINE_LEADERS=1" ;;
    esac
    echo "$(date +%T) $tag $(cut -d' ' -f1-3 /proc/loadavg)"
    env $envs timeout 600 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q49/ab/w3-$tag > /tmp/q49/ab/w3-$tag.log 2>&1
    env $envs timeout 300 .venv/bin/python benchmarks/replication_latency.py --count 3000 > /tmp/q49/ab/rl-$tag.json 2>/tmp/q49/ab/rl-$tag.err
  done
done
echo done
