#!/bin/bash
# A = HEAD (old), B = working tree (ADR 0048); gateway W1 16 KiB, 5 runs per cluster
cd /work/main
SYS=${1:-spate-gateway}; SIZE=${2:-16384}; PAIRS=${3:-3}; OUT=${4:-/tmp/q59/ab1}; COUNT=${5:-20000}
mkdir -p $OUT
for p in $(seq 1 $PAIRS); do
  order="A B"; [ $((p % 2)) = 0 ] && order="B A"
  for b in $order; do
    if [ $b = A ]; then export PYTHONPATH=/tmp/q59/oldpkg; else unset PYTHONPATH; fi
    echo "== pair $p build $b $(uptime | sed 's/.*average://')" >> $OUT/log
    timeout 600 .venv/bin/python /work/main/benchmarks/results/2026-11-28/q59/w1mem.py /tmp/q59/abc 5 $SYS $SIZE $COUNT 2>&1 | grep RUN | sed "s/^/$b $p /" >> $OUT/log
  done
done
unset PYTHONPATH
echo done >> $OUT/log
