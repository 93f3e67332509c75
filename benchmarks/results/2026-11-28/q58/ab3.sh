#!/bin/bash
# §58: W3 through the gateway only, 6 runs per cluster; A = 56f29f4 (no route asks), B = working tree (ADR 0046 route asks); 3 pairs alternated
cd /work/main
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for mode in $order; do
    case $mode in A) pp="/tmp/q58/pkg-c1" ;; B) pp="" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp timeout 900 .venv/bin/python /tmp/q58/w3gw.py $mode$i 6 /tmp/q58/ab3/w3gw.jsonl > /tmp/q58/ab3/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
