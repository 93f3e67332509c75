#!/bin/bash
# §50: a leader's small syncs inline up to a loop 85% busy (B) vs 50% (D, the default), W3 + W1 at 100 B, five pairs, alternating
cd /work/main
n=0
for order in "B D" "D B" "B D" "D B" "B D"; do
  n=$((n+1))
  for mode in $order; do
    tag=$mode$n
    case $mode in
      D) envs="" ;;
      B) envs="SPATE_TMP_LEADER_BUSY=0.85" ;;
    esac
    echo "$(date +%T) $tag $(cut -d' ' -f1-3 /proc/loadavg)"
    env $envs timeout 900 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --w1 --sizes 100 --runs 1 --duration 10 --out-dir /tmp/q50/r6-$tag > /tmp/q50/r6-$tag.log 2>&1
  done
done
echo "$(date +%T) done"
