#!/usr/bin/env bash
# Cost of idle partitions (issue 16, ADR 0026): `spate dev up --nodes 3 --gateways 0`, STREAMS
# streams of PARTS partitions with 3 replicas each (created one stream at a time, each waited for
# until every partition has a live leader), 20 s to settle, then per node: CPU over 30 s (utime +
# stime from /proc), RSS, open file descriptors, and node n1's quiet-replica gauge.
#   benchmarks/idle_partitions.sh 10 100      # 1,000 partitions
#   benchmarks/idle_partitions.sh 0 0         # the empty cluster's own idle cost
set -euo pipefail
cd "$(dirname "$0")/.."
S=$1; N=$2
export SPATE_DEV_PORTS=${SPATE_DEV_PORTS:-20000-23000}
D=$(mktemp -d /tmp/spate-idle-XXXX)
trap '.venv/bin/spate dev down --data-dir "$D" > /dev/null; rm -rf "$D"' EXIT
.venv/bin/spate dev up --nodes 3 --gateways 0 --data-dir "$D" --output json > /dev/null
ADMIN=$(python3 -c "import json;print(json.load(open('$D/endpoints.json'))['admin'])")
PIDS=$(python3 -c "import json;print(' '.join(str(n['pid']) for n in json.load(open('$D/endpoints.json'))['nodes']))")
t0=$(date +%s)
for s in $(seq 1 $S); do
  .venv/bin/spate stream create idle$s --partitions $N --replicas 3 --admin $ADMIN > /dev/null
  for i in $(seq 1 300); do
    ok=$(.venv/bin/spate partition list idle$s --admin $ADMIN --output json | python3 -c "import json,sys;r=json.load(sys.stdin)['partitions'];print(sum(1 for x in r if x.get('leader') and x.get('leader_alive')))")
    [ "$ok" -ge "$N" ] && break; sleep 1
  done
  echo "stream $s: leaders $ok/$N at $(( $(date +%s)-t0 )) s"
done
sleep 20
declare -A a
for p in $PIDS; do a[$p]=$(awk '{print $14+$15}' /proc/$p/stat); done
sleep 30
for p in $PIDS; do b=$(awk '{print $14+$15}' /proc/$p/stat); rss=$(awk '/VmRSS/{print $2}' /proc/$p/status); fds=$(ls /proc/$p/fd | wc -l); echo "pid $p: cpu $(( (b-${a[$p]}) * 10 / 30 )) ms/s rss $((rss/1024)) MiB fds $fds"; done
M=$(python3 -c "import json;print(json.load(open('$D/endpoints.json'))['nodes'][0]['metrics'])"); curl -s $M | grep -E "^spate_replication_(quiet|peers)"
uptime
