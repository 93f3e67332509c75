#!/bin/bash
# §57: W3 only, P = ce4dff3 (node side only) vs G = main (the gateway reads with FrameReceiver too), 4 pairs, order alternating (ON NO ON NO ...)
cd /work/main
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="P G"; else order="G P"; fi
  for mode in $order; do
    case $mode in P) pp="/tmp/q57/pkg-pregw" ;; G) pp="" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp timeout 600 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q57/ab7/$mode$i > /tmp/q57/ab7/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
