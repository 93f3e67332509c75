#!/bin/bash
# RESULTS §60: w1_cpu.py at 100 B and 1 KiB on A (688e80e, PYTHONPATH=/tmp/Apkg) and B (this
# build), alternated, PAIRS pairs, rows appended to cpu/w1_cpu.jsonl.
out=/work/main/benchmarks/results/2026-11-28/q60/cpu; mkdir -p $out
for p in $(seq 1 "$1"); do
  order="A B"; [ $((p % 2)) = 0 ] && order="B A"
  for build in $order; do
    if [ "$build" = A ]; then pp=/tmp/Apkg; else pp=; fi
    cd /work/main && PYTHONPATH=$pp SPATE_DEV_PORTS=16000-19000 .venv/bin/python benchmarks/w1_cpu.py \
      --sizes 100,1024 --label "$build" --out $out/w1_cpu.jsonl >> $out/cpu.log 2>&1
  done
done
echo DONE >> $out/cpu.log
