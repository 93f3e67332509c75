#!/bin/bash
# alternate A (updates on) and B (SPATE_TMP_NO_UPDATES=1), W3 only
# SPATE_TMP_NO_UPDATES was a temporary switch (not committed): raft.py _flush_appends passed
# send_if_empty=self._commit_pending and not _TMP_NO_UPDATES, i.e. no commit update to any follower.
cd /work/main
for i in 1 2 3 4; do
  for m in 0 1; do
    SPATE_TMP_NO_UPDATES=$m .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q56/w3-$m-$i > /tmp/q56/w3-$m-$i.log 2>&1
    echo "$m $i $(cat /proc/loadavg | cut -d' ' -f1) $(grep 'W3 e2e p50' /tmp/q56/w3-$m-$i/summary.md | cut -d'|' -f4,6,7) p99 $(grep 'W3 e2e p99' /tmp/q56/w3-$m-$i/summary.md | cut -d'|' -f4,6,7)"
  done
done
