#!/bin/bash
# §57: W1 100 B through the gateway, CPU per message per process; O = be395ee, N = working tree
cd /work/main
for i in 1 2 3; do
  for mode in O N; do
    case $mode in
      O) pp="/tmp/q57/pkg-old" ;;
      N) pp="" ;;
    esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp SPATE_DEV_PORTS=16000-19000 timeout 600 .venv/bin/python benchmarks/w1_cpu.py --sizes 100 --via gateway --label $mode$i --out /tmp/q57/ab2/w1gw.jsonl > /tmp/q57/ab2/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
