#!/usr/bin/env bash
# A measurement script kept as it was run (RESULTS §61): W3 leader/follower pairs (w3place.py)
# with ADR 0050 on (B) and off (A: SPATE_COMMIT_WITH=0, the same build), alternated.
# Usage: ab.sh ROUNDS PAIRS [TAG]  (rows appended to ab[TAG]-A.jsonl / ab[TAG]-B.jsonl)
set -u
cd /work/main
out=benchmarks/results/2026-11-28/q61
for r in $(seq 1 "$1"); do
    for cfg in B A; do
        if [ "$cfg" = A ]; then export SPATE_COMMIT_WITH=0; else unset SPATE_COMMIT_WITH; fi
        echo "round $r $cfg $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        SPATE_DEV_PORTS=16000-19000 timeout 900 .venv/bin/python $out/w3place.py /tmp/q61ab "$2" \
            >> $out/ab${3:-}-$cfg.jsonl 2>> /tmp/q61ab.err
    done
done
