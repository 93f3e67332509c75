#!/bin/bash
# §58 (ab9): W3 and W1 (direct and through the gateway, 1 KiB and 16 KiB), A = 3f6ddfd, B = 1 MiB reads (ADR 0047); 3 pairs alternated
cd /work/main
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for mode in $order; do
    case $mode in A) pp="/tmp/q58/pkg-c2" ;; B) pp="" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp timeout 900 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --w1 --sizes 1024,16384 --partitions '' --runs 1 --duration 10 --out-dir /tmp/q58/ab9/$mode$i > /tmp/q58/ab9/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
