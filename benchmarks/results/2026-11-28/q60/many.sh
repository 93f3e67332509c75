#!/bin/bash
# RESULTS §60: 30 streams (one partition, three replicas each) each take one 20 MiB burst
# (1,300 x 16 KiB), then 15 s idle, then malloc_trim through gdb; builds A (688e80e) then B.
out=/work/main/benchmarks/results/2026-11-28/q60/many; mkdir -p $out
for build in A B; do
  if [ "$build" = A ]; then pp=/tmp/Apkg; else pp=; fi
  echo "== build $build $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/many.log
  PYTHONPATH=$pp /work/main/.venv/bin/python /work/main/benchmarks/results/2026-11-28/q60/cachemem.py /tmp/q60m 30 16384 1300 15 trim >> $out/many.log 2>&1
done
echo DONE >> $out/many.log
