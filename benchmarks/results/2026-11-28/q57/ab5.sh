#!/bin/bash
# §57: W3 only, O = be395ee vs N = main (ADR 0045), 6 pairs, order alternating (ON NO ON NO ...)
cd /work/main
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="O N"; else order="N O"; fi
  for mode in $order; do
    case $mode in O) pp="/tmp/q57/pkg-old" ;; N) pp="" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp timeout 600 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q57/ab5/$mode$i > /tmp/q57/ab5/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
