#!/bin/bash
# §50: E (followers' small syncs inline, leaders' <= 4 KiB, the recent-bytes rule) vs A (default), W3 + W1 at 100 B, five pairs, alternating orders
cd /work/main
n=0
for order in "A E" "E A" "A E" "E A" "A E"; do
  n=$((n+1))
  for mode in $order; do
    tag=$mode$n
    case $mode in
      A) envs="" ;;
      E) envs="SPATE_SYNC_INLINE_BYTES_MAX=131072 SPATE_SYNC_INLINE_LEADER_BYTES_MAX=4096" ;;
    esac
    echo "$(date +%T) $tag $(cut -d' ' -f1-3 /proc/loadavg)"
    env $envs timeout 900 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --w1 --sizes 100 --runs 1 --duration 10 --out-dir /tmp/q50/r4-$tag > /tmp/q50/r4-$tag.log 2>&1
  done
done
echo "$(date +%T) done"
