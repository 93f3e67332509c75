#!/bin/bash
# ADR 0044 A/B: A = SPATE_COMMIT_UPDATES=all (before), B = default (readers only). Alternated.
cd /work/main
out=/tmp/q56/ab2; mkdir -p $out
for i in 1 2 3; do
  for m in all readers; do
    SPATE_COMMIT_UPDATES=$m .venv/bin/python benchmarks/replication_latency.py --count 4000 > $out/rl-$m-$i.json 2>/dev/null
    python3 -c "import json; d=json.load(open('$out/rl-$m-$i.json')); print('RL $m $i', d['leader_commit']['p50_ms'], d['leader_commit']['p99_ms'], d['follower_visible']['p50_ms'], d['follower_visible']['p99_ms'], d['leader_cpu_ms_per_append'], d['appends_per_s'], d['loadavg_before'][0])"
  done
done
for i in 1 2 3 4 5; do
  for m in all readers; do
    SPATE_COMMIT_UPDATES=$m .venv/bin/python benchmarks/side_by_side.py --no-peers --w3-only --runs 1 --duration 10 --out-dir $out/w3-$m-$i > $out/w3-$m-$i.log 2>&1
    echo "W3 $m $i $(cut -d' ' -f1 /proc/loadavg) p50 $(grep 'W3 e2e p50' $out/w3-$m-$i/summary.md | cut -d'|' -f4,6,7) p99 $(grep 'W3 e2e p99' $out/w3-$m-$i/summary.md | cut -d'|' -f4,6,7)"
  done
done
for i in 1 2; do
  for m in all readers; do
    SPATE_COMMIT_UPDATES=$m .venv/bin/python benchmarks/w1_cpu.py --sizes 100,1024 --label $m --out $out/w1.jsonl > $out/w1-$m-$i.log 2>&1
    grep '^{' $out/w1-$m-$i.log | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print('W1', '$m', $i, d['size'], d['msgs_per_s'], d['cpu_us_per_msg'])"
  done
done
