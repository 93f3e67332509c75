#!/bin/bash
# §50: leaders' Appends at propose time (X, temporary switch SPATE_TMP_EARLY) vs A, W3 + W1 at 100 B, alternating orders
cd /work/main
for pair in "X A" "A X" "X A"; do
  for mode in $pair; do
    i=$(( $(ls -d /tmp/q50/r2-$mode* 2>/dev/null | wc -l) + 1 ))
    tag=$mode$i
    case $mode in
      A) envs="" ;;
      X) envs="SPATE_TMP_EARLY=1" ;;
    esac
    echo "$(date +%T) $tag $(cut -d' ' -f1-3 /proc/loadavg)"
    env $envs timeout 900 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --w1 --sizes 100 --runs 1 --duration 10 --out-dir /tmp/q50/r2-$tag > /tmp/q50/r2-$tag.log 2>&1
  done
done
echo "$(date +%T) done"
