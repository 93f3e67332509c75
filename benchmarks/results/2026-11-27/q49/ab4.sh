#!/bin/bash
# fourth round: E (followers inline, leaders <= 4 KiB, the recent-bytes rule) vs A, W3 with W1 at 100 B
cd /work/main
for i in 10 11 12; do
  for mode in E A; do
    tag=$mode$i
    case $mode in
      A) envs="" ;;
      E) envs="SPATE_SYNC_INLINE_BYTES_MAX=131072 SPATE_SYNC_INLINE_LEADER_BYTES_MAX=4096" ;;
    esac
    echo "$(date +%T) $tag $(cut -d' ' -f1-3 /proc/loadavg)"
    env $envs timeout 600 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --w1 --sizes 100 --runs 1 --duration 10 --out-dir /tmp/q49/ab/w3-$tag > /tmp/q49/ab/w3-$tag.log 2>&1
  done
done
echo done
