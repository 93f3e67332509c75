#!/bin/bash
# §58 (ab6): W1 direct 1 KiB then 16 KiB, CPU per message, A = main (16 KiB AMQP input slices), S = 64 KiB slices; 3 pairs alternated
cd /work/main
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="A S"; else order="S A"; fi
  for mode in $order; do
    case $mode in A) pp="" ;; S) pp="/tmp/q58/pkg-dev" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp SPATE_DEV_PORTS=16000-19000 timeout 900 .venv/bin/python benchmarks/w1_cpu.py --sizes 1024,16384 --label $mode$i --out /tmp/q58/ab6/w1.jsonl > /tmp/q58/ab6/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
