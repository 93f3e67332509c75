#!/usr/bin/env bash
# RESULTS §53: A = 126f795 (a git worktree in /tmp/oldtree, its src linked as /tmp/oldpp/spate), B = the change;
# replication_latency.py with entry points, alternated four times
set -u
out="$(cd "$(dirname "$0")" && pwd)"
for i in 1 2 3 4; do
  for v in A B; do
    if [ $v = A ]; then tree=/tmp/oldtree; pp=/tmp/oldpp; else tree=/work/main; pp=; fi
    rm -rf $out/ep-$v$i
    (cd $tree && PYTHONPATH=$pp /work/main/.venv/bin/python benchmarks/replication_latency.py --count 4000 --entry-points $out/ep-$v$i > $out/rl-$v$i.txt 2>&1)
    echo "$v$i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
