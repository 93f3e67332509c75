#!/bin/bash
# RESULTS §61: w1_cpu.py at 100 B and 1 KiB with ADR 0050 on (B) and off (A:
# SPATE_COMMIT_WITH=0, the same build), alternated, PAIRS pairs, rows appended to cpu/w1_cpu.jsonl.
out=/work/main/benchmarks/results/2026-11-28/q61/cpu; mkdir -p $out
for p in $(seq 1 "$1"); do
  order="A B"; [ $((p % 2)) = 0 ] && order="B A"
  for build in $order; do
    if [ "$build" = A ]; then cw=0; else cw=1; fi
    cd /work/main && SPATE_COMMIT_WITH=$cw SPATE_DEV_PORTS=16000-19000 .venv/bin/python \
      benchmarks/w1_cpu.py --sizes 100,1024 --label "$build" --out $out/w1_cpu.jsonl >> $out/cpu.log 2>&1
  done
done
echo DONE >> $out/cpu.log
