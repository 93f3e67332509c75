#!/bin/bash
# §58 (ab10): W3 only, A = 3f6ddfd, B = 1 MiB reads (ADR 0047); 4 pairs alternated
cd /work/main
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for mode in $order; do
    case $mode in A) pp="/tmp/q58/pkg-c2" ;; B) pp="" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp timeout 900 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q58/ab10/$mode$i > /tmp/q58/ab10/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
