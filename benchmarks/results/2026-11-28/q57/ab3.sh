#!/bin/bash
# §57: W3 (+ W1 100 B) with the three builds alternated: O = be395ee (before), M = 2153eaf (readers move only), N = working tree (ADR 0045 whole)
cd /work/main
for i in 1 2 3 4; do
  for mode in O N; do
    case $mode in
      O) pp="/tmp/q57/pkg-old" ;;
      M) pp="/tmp/q57/pkg-movonly" ;;
      N) pp="" ;;
    esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp timeout 600 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q57/ab3/$mode$i > /tmp/q57/ab3/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
