#!/bin/bash
# §57: W2 through the gateway, CPU per delivered message (consume_cpu.py), P = ce4dff3 (before the gateway's FrameReceiver) vs G = cf617e3+ (main)
cd /work/main
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="P G"; else order="G P"; fi
  for mode in $order; do
    case $mode in P) pp="/tmp/q57/pkg-pregw" ;; G) pp="" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp SPATE_DEV_PORTS=16000-19000 timeout 900 .venv/bin/python benchmarks/consume_cpu.py --sizes 100,1024 --runs 1 --cases gateway-settled,direct-settled --label $mode$i --out /tmp/q57/ab6/consume.jsonl > /tmp/q57/ab6/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
