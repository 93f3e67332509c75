#!/bin/bash
# §50: preallocated segments (temporary switch SPATE_TMP_PREALLOC: F fallocate, Z zero-filled) vs A, W3 + W1 at 100 B
cd /work/main
n=0
for order in "F Z A" "A F Z" "Z A F"; do
  n=$((n+1))
  for mode in $order; do
    tag=$mode$n
    case $mode in
      A) envs="" ;;
      F) envs="SPATE_TMP_PREALLOC=F" ;;
      Z) envs="SPATE_TMP_PREALLOC=Z" ;;
    esac
    echo "$(date +%T) $tag $(cut -d' ' -f1-3 /proc/loadavg)"
    env $envs timeout 900 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --w1 --sizes 100 --runs 1 --duration 10 --out-dir /tmp/q50/r3-$tag > /tmp/q50/r3-$tag.log 2>&1
  done
done
echo "$(date +%T) done"
