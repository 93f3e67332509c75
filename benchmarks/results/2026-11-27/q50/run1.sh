#!/bin/bash
# §50: W3 with RabbitMQ (default build), then the same without fdatasync (temporary switch), alternating
cd /work/main
for i in 1 2 3; do
  for mode in A N; do
    tag=$mode$i
    case $mode in
      A) envs=""; peers="--peer rabbitmq" ;;
      N) envs="SPATE_TMP_NOSYNC=1"; peers="--no-peers" ;;
    esac
    echo "$(date +%T) $tag $(cut -d' ' -f1-3 /proc/loadavg)"
    env $envs timeout 900 .venv/bin/python benchmarks/side_by_side.py $peers --w3-only --runs 1 --duration 10 --out-dir /tmp/q50/w3-$tag > /tmp/q50/w3-$tag.log 2>&1
  done
done
echo "$(date +%T) done"
