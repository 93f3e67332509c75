#!/bin/bash
# §58 (ab8): W1 direct 100 B, 1 KiB, 16 KiB CPU per message, A = 3f6ddfd (uvloop's 256 KiB reads), B = working tree (1 MiB reads into a per-thread buffer, ADR 0047); 3 pairs alternated
cd /work/main
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for mode in $order; do
    case $mode in A) pp="/tmp/q58/pkg-c2" ;; B) pp="" ;; esac
    echo "$(date +%T) $mode$i $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp SPATE_DEV_PORTS=16000-19000 timeout 900 .venv/bin/python benchmarks/w1_cpu.py --sizes 100,1024,16384 --label $mode$i --out /tmp/q58/ab8/w1.jsonl > /tmp/q58/ab8/$mode$i.log 2>&1
  done
done
echo "$(date +%T) done"
