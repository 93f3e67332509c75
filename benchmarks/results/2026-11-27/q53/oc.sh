#!/usr/bin/env bash
# commit-1/publish-1 (q51/oc_us.py) A = /tmp/oldtree via PYTHONPATH, B = working tree; alternated x3
set -u
out=/work/main/benchmarks/results/2026-11-27/q53
for i in 1 2 3; do
  for v in A B; do
    if [ $v = A ]; then pp=/tmp/oldpp; else pp=; fi
    (cd /work/main && PYTHONPATH=$pp .venv/bin/python benchmarks/results/2026-11-27/q51/oc_us.py $out/oc-$v$i --no-prof 2>&1 | grep -v '^\[' | tail -2 | sed "s/^/$v$i /")
  done
done
