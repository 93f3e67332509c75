#!/bin/bash
# §58: W2 through the gateway (consume_cpu.py gateway-settled), A = 5ba3d85 (StreamReader sessions at the gateway),
# B = working tree (FrameReceiver at the gateway + fixed malloc thresholds), C = B with SPATE_MALLOC=default
cd /work/main
for i in 1 2 3; do
  case $i in 1) order="A B C" ;; 2) order="C B A" ;; 3) order="B A C" ;; esac
  for mode in $order; do
    case $mode in A) pp="/tmp/q58/pkg-old"; m="" ;; B) pp=""; m="" ;; C) pp=""; m="default" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp SPATE_MALLOC=$m SPATE_DEV_PORTS=16000-19000 timeout 900 .venv/bin/python benchmarks/consume_cpu.py --sizes 100,1024 --runs 2 --cases gateway-settled --label $mode$i --out /tmp/q58/ab1/consume.jsonl > /tmp/q58/ab1/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
