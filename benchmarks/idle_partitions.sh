#!/usr/bin/env bash
# Cost of partitions (issue 16, ADR 0026, ADR 0027): `spate dev up --nodes 3 --gateways 0`,
# STREAMS streams of PARTS partitions with 3 replicas each (created one stream at a time, each
# waited for until every partition has a live leader), and optionally HOT more partitions
# under a light load (a super stream of HOT one-partition streams, 3 replicas, `spate perf`
# publishing 10 msg/s per hot partition of 100 B with one consumer, for $SETTLE + 70 s). After 20 s ($SETTLE) to
# settle, per node: CPU over 30 s (utime + stime from /proc), RSS, open file descriptors; then
# node n1's quiet-replica gauge.
#   benchmarks/idle_partitions.sh 1 1000          # 1,000 idle partitions (one stream)
#   benchmarks/idle_partitions.sh 5 990 50        # 5,000 partitions, 1% of them active
#   benchmarks/idle_partitions.sh 0 0             # the empty cluster's own idle cost
#   NOWAIT=900 benchmarks/idle_partitions.sh 5 1000  # all streams created at once; measured
#                                                    # after every leader, or 900 s
#   SETTLE=120 ...                                   # settle 120 s instead of 20 before measuring
#   VENV=/work/main/.venv ...                        # another build's venv (a before/after pair)
#   STALLS="0.8 1.2" ...                             # then stop node n1 (SIGSTOP) for 0.8 s, and
#                                                    # 10 s later for 1.2 s: leaders lost to stalls
# Node liveness per node (benchmarks/node_liveness.py) is printed before settling and after the
# CPU window.
set -euo pipefail
cd "$(dirname "$0")/.."
S=$1; N=$2; HOT=${3:-0}
export SPATE_DEV_PORTS=${SPATE_DEV_PORTS:-20000-23000}
V=${VENV:-.venv}
D=$(mktemp -d /tmp/spate-idle-XXXX)
PERF=""
cleanup() {
  [ -n "$PERF" ] && kill "$PERF" 2> /dev/null && wait "$PERF" 2> /dev/null
  $V/bin/spate dev down --data-dir "$D" > /dev/null
  rm -rf "$D"
}
trap cleanup EXIT
$V/bin/spate dev up --nodes 3 --gateways 0 --data-dir "$D" --output json > /dev/null
ADMIN=$(python3 -c "import json;print(json.load(open('$D/endpoints.json'))['admin'])")
AMQP=$(python3 -c "import json;print(json.load(open('$D/endpoints.json'))['nodes'][0]['amqp'])")
PIDS=$(python3 -c "import json;print(' '.join(str(n['pid']) for n in json.load(open('$D/endpoints.json'))['nodes']))")
led() {  # partitions of stream $1 with a live leader (0 while the admin API does not answer)
  { $V/bin/spate partition list "$1" --admin $ADMIN --output json 2> /dev/null || true; } |
    python3 -c "import json,sys
try: r=json.load(sys.stdin)['partitions']; print(sum(1 for x in r if x.get('leader') and x.get('leader_alive')))
except ValueError: print(0)"
}
t0=$(date +%s)
if [ -n "${NOWAIT:-}" ]; then  # create every stream at once, then wait up to $NOWAIT s for all leaders
  for s in $(seq 1 $S); do
    $V/bin/spate stream create idle$s --partitions $N --replicas 3 --admin $ADMIN > /dev/null
  done
  while :; do
    ok=0; for s in $(seq 1 $S); do ok=$((ok + $(led idle$s))); done
    echo "leaders $ok/$((S * N)) at $(( $(date +%s)-t0 )) s"
    [ "$ok" -ge $((S * N)) ] || [ $(( $(date +%s)-t0 )) -ge "$NOWAIT" ] && break; sleep 10
  done
  S=0
fi
for s in $(seq 1 $S); do
  $V/bin/spate stream create idle$s --partitions $N --replicas 3 --admin $ADMIN > /dev/null
  for i in $(seq 1 300); do
    ok=$(led idle$s)
    [ "$ok" -ge "$N" ] && break; sleep 1
  done
  echo "stream $s: leaders $ok/$N at $(( $(date +%s)-t0 )) s"
done
if [ "$HOT" -gt 0 ]; then
  $V/bin/spate perf --url "amqp://$AMQP" --admin "$ADMIN" --super-stream hot \
    --super-stream-partitions "$HOT" --replicas 3 --producers 1 --consumers 1 --size 100 \
    --rate $((HOT * 10)) --time $((${SETTLE:-20} + 70)) --output json > "$D/perf.out" 2>&1 &
  PERF=$!
  echo "perf: $((HOT * 10)) msg/s over $HOT partitions (pid $PERF)"
  sleep 10  # its super stream created and led: the liveness reads below see its traffic only
fi
URLS=$(python3 -c "import json;print(' '.join(n['metrics'] for n in json.load(open('$D/endpoints.json'))['nodes']))")
# A scrape builds every partition's metrics on the node's loop (seconds at 5,000 partitions
# under load: a stall its peers see), so liveness is read before settling and after measuring.
echo "liveness before settling:"; python3 benchmarks/node_liveness.py --state "$D/liveness.json" $URLS
sleep "$(( ${SETTLE:-20} - (HOT > 0 ? 10 : 0) ))"
uptime
declare -A a
for p in $PIDS; do a[$p]=$(awk '{print $14+$15}' /proc/$p/stat); done
sleep 30
for p in $PIDS; do
  b=$(awk '{print $14+$15}' /proc/$p/stat); rss=$(awk '/VmRSS/{print $2}' /proc/$p/status)
  fds=$(ls /proc/$p/fd | wc -l); lim=$(awk '/Max open files/{print $4}' /proc/$p/limits)
  echo "pid $p: cpu $(( (b-${a[$p]}) * 10 / 30 )) ms/s rss $((rss/1024)) MiB fds $fds (limit $lim)"
done
echo "liveness after the CPU window:"; python3 benchmarks/node_liveness.py --state "$D/liveness.json" $URLS
if [ -n "${STALLS:-}" ]; then  # e.g. STALLS="0.8 1.2": node n1 stopped (SIGSTOP) for each, 10 s apart
  P1=${PIDS%% *}
  for s in $STALLS; do
    kill -STOP "$P1"; sleep "$s"; kill -CONT "$P1"; echo "n1 (pid $P1) stopped for $s s"; sleep 10
  done
  echo "liveness after the stalls:"; python3 benchmarks/node_liveness.py --state "$D/liveness.json" $URLS
fi
if [ -n "$PERF" ]; then
  kill -INT "$PERF" 2> /dev/null || true; wait "$PERF" 2> /dev/null || true; PERF=""
  tail -1 "$D/perf.out" | python3 -c "import json,sys
try:
  r=json.loads(sys.stdin.read()); print('perf: published %.0f/s consumed %.0f/s p50 %.1f ms' % (r['published_per_s'], r['consumed_per_s'], r['latency_ms']['p50']))
except Exception as e: print('perf: no summary', e)"
fi
uptime
