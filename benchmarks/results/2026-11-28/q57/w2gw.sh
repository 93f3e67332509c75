#!/bin/bash
# W2 1 KiB through the gateway with perf on the gateway; $1 = PYTHONPATH ('' for main)
cd /work/main
export PYTHONPATH=$1 SPATE_DEV_PORTS=16000-19000
D=/tmp/q57/w2dev; rm -rf $D
.venv/bin/spate dev up --nodes 3 --data-dir $D --output json > /dev/null 2>&1
read ADMIN GWPORT GWPID < <(python3 -c "
import json;d=json.load(open('$D/endpoints.json'))
g=d['gateways'][0]
print(d['admin'], g['amqp'].split(':')[1], g['pid'])")
.venv/bin/spate stream create w2 --replicas 3 --partitions 1 --admin $ADMIN > /dev/null
sleep 2
LP=$(python3 -c "
import json,subprocess
rows=json.loads(subprocess.check_output(['.venv/bin/spate','partition','list','w2','--admin','$ADMIN','--output','json']))
print(rows)" | head -1)
benchmarks/clients/build/amqp_load publish --host 127.0.0.1 --port $GWPORT --address w2 --count 100000 --size 1024 --window 10000 > /dev/null 2>&1
for i in 1 2 3; do
  f0=$(awk '{print $10, $14+$15}' /proc/$GWPID/stat)
  benchmarks/clients/build/amqp_load consume --host 127.0.0.1 --port $GWPORT --address w2 --count 100000 --size 1024 --credit 10000 --offset first --settled 2>/dev/null | python3 -c "import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print('msgs/s', r.get('msgs_per_s'))"
  f1=$(awk '{print $10, $14+$15}' /proc/$GWPID/stat)
  echo "gateway minflt,cpu-ticks before $f0 after $f1"
done
perf record -F 999 -g -p $GWPID -o /tmp/q57/w2gw-$2.data -- sleep 3 > /dev/null 2>&1 &
benchmarks/clients/build/amqp_load consume --host 127.0.0.1 --port $GWPORT --address w2 --count 100000 --size 1024 --credit 10000 --offset first --settled > /dev/null 2>&1
wait
.venv/bin/spate dev down --data-dir $D > /dev/null 2>&1
