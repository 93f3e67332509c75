#!/usr/bin/env bash
# Time for one stream of PARTS partitions (3 replicas, 3 nodes) to have a live leader on every
# partition (issue 16): `spate stream create big --partitions PARTS --replicas 3`, then the
# count of led partitions every 2 s until all are led or LIMIT seconds pass.
#   benchmarks/big_stream.sh 1000 300
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; LIMIT=${2:-300}
export SPATE_DEV_PORTS=${SPATE_DEV_PORTS:-20000-23000}
D=$(mktemp -d /tmp/spate-big-XXXX)
trap '.venv/bin/spate dev down --data-dir "$D" > /dev/null; rm -rf "$D"' EXIT
.venv/bin/spate dev up --nodes 3 --gateways 0 --data-dir "$D" --output json > /dev/null
ADMIN=$(python3 -c "import json;print(json.load(open('$D/endpoints.json'))['admin'])")
echo "pids: $(python3 -c "import json;print(' '.join(str(n['pid']) for n in json.load(open('$D/endpoints.json'))['nodes']))")"
t0=$(date +%s.%N)
.venv/bin/spate stream create big --partitions "$N" --replicas 3 --admin "$ADMIN" > /dev/null
echo "created in $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
while :; do
  ok=$(.venv/bin/spate partition list big --admin "$ADMIN" --output json | python3 -c "import json,sys;r=json.load(sys.stdin)['partitions'];print(sum(1 for x in r if x.get('leader') and x.get('leader_alive')))")
  el=$(python3 -c "import time;print(round(time.time()-$t0,1))")
  echo "$el s: $ok/$N led"
  [ "$ok" -ge "$N" ] && break
  python3 -c "import sys;sys.exit(0 if $el < $LIMIT else 1)" || break
  sleep 2
done
uptime
