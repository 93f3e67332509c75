#!/bin/bash
# §58 (ab7): W1 direct 1 KiB then 16 KiB, CPU per message, A = 3f6ddfd (uvloop's 256 KiB reads), R = 1 MiB reads (BufferedProtocol, SPATE_READ_BYTES); 4 pairs alternated
cd /work/main
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="A R"; else order="R A"; fi
  for mode in $order; do
    case $mode in A) pp="" ;; R) pp="/tmp/q58/pkg-dev" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp SPATE_DEV_PORTS=16000-19000 timeout 900 .venv/bin/python benchmarks/w1_cpu.py --sizes 1024,16384 --label $mode$i --out /tmp/q58/ab7/w1.jsonl > /tmp/q58/ab7/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
