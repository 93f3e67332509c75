#!/bin/bash
# §50: W1 at 1 KiB and 16 KiB (and 100 B), inline syncs on (E, the new default) vs off (A), three pairs, alternating; CPU per message per node
cd /work/main
n=0
for order in "E A" "A E" "E A"; do
  n=$((n+1))
  for mode in $order; do
    case $mode in
      A) envs="SPATE_SYNC_INLINE_BYTES_MAX=0 SPATE_SYNC_INLINE_LEADER_BYTES_MAX=0" ;;
      E) envs="" ;;
    esac
    echo "$(date +%T) $mode$n $(cut -d' ' -f1-3 /proc/loadavg)"
    env $envs timeout 600 .venv/bin/python benchmarks/w1_cpu.py --sizes 100,1024,16384 --label $mode$n --out /tmp/q50/w1cpu.jsonl > /tmp/q50/w1cpu-$mode$n.log 2>&1
  done
done
echo "$(date +%T) done"
