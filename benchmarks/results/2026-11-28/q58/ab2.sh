#!/bin/bash
# §58: W3 (side_by_side --w3-only), A = 5ba3d85, B = working tree (gateway FrameReceiver + fixed malloc thresholds); 6 pairs, order alternating
cd /work/main
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for mode in $order; do
    case $mode in A) pp="/tmp/q58/pkg-old" ;; B) pp="" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp timeout 600 .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q58/ab2/$mode$i > /tmp/q58/ab2/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
