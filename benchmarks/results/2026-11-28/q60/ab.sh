#!/bin/bash
# RESULTS §60: cachemem.py on the old build (A, PYTHONPATH=/tmp/Apkg: a worktree of 688e80e)
# and this one (B), alternated, PAIRS pairs. Usage: ab.sh PAIRS OUTDIR
pairs=$1; out=$2; mkdir -p "$out"
for p in $(seq 1 "$pairs"); do
  for build in A B; do
    [ $((p % 2)) = 0 ] && build=$([ "$build" = A ] && echo B || echo A)
    if [ "$build" = A ]; then pp=/tmp/Apkg; else pp=; fi
    echo "== pair $p build $build $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/ab.log"
    PYTHONPATH=$pp /work/main/.venv/bin/python /work/main/benchmarks/results/2026-11-28/q60/cachemem.py /tmp/q60c 6 16384 20000 15 >> "$out/ab.log" 2>&1
  done
done
echo DONE >> "$out/ab.log"
