#!/usr/bin/env bash
# RESULTS §52: the floor (commit_floor.py) and Spate's commit-1 / publish-1 (q51/oc_us.py),
# alternated three times in one session.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
out=benchmarks/results/2026-11-27/q52
for i in 1 2 3; do
  echo "== $i floor $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  .venv/bin/python benchmarks/commit_floor.py --runs 1 > "$out/floor-$i.txt" 2>&1
  tail -1 "$out/floor-$i.txt"
  echo "== $i spate $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  .venv/bin/python benchmarks/results/2026-11-27/q51/oc_us.py "$out/spate-$i" --no-prof 2>&1 | grep -v '^\[' | tail -2
done
