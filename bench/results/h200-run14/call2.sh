#!/bin/bash
# H200 run 14 call 2 (and call 3's editor runs): the editor bench (tiny, 20 typists, PSM) with the hop trace, and
# py-spy on every service process for 6 s in the middle (SPY="--gil": the samples of the thread holding the GIL,
# i.e. the Python work; SPY="--nonblocking": every thread). Results under /tmp/r/$TAG (default: ed).
TAG=${TAG:-ed}; SPY=${SPY:---gil}
mkdir -p /tmp/r/$TAG/spy; [ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl
python3 -m bench.editor_bench --gpu --out /tmp/r/$TAG/ed --typists 20 --duration 15 --modes psm --context-files 4 --hop-trace /tmp/r/$TAG/hops > /tmp/r/$TAG/ed.txt 2>&1 &
B=$!
for i in $(seq 90); do pgrep -f gateway >/dev/null && break; sleep 1; done; echo "gateway after $i s"; sleep 6
for s in gateway scheduler_svc cache_svc worker_svc; do
  p=$(pgrep -f -- "-m $s" | head -1)
  [ -n "$p" ] && timeout 20 /tmp/spy/bin/py-spy record -p $p -d 6 -r 250 $SPY -f raw -o /tmp/r/$TAG/spy/$s.txt > /tmp/r/$TAG/spy/$s.log 2>&1 &
done
wait $B; wait
rm -rf /tmp/r/$TAG/ed/logs; tar czf /tmp/r/$TAG/hops.tgz -C /tmp/r/$TAG hops && rm -rf /tmp/r/$TAG/hops; gzip -f /tmp/r/$TAG/spy/*.txt
python3 -c "
import json,glob; d=json.load(open(glob.glob('/tmp/r/$TAG/ed/*.json')[0])); print('$TAG', 'TTFT', {k: round(v, 2) for k, v in d['ttft_ms'].items()}, 'answered', d['answered'], 'cpu ms/req', d['cpu_ms_per_request'])
for k, v in d['hops'].items(): print('   %-30s %.2f' % (k, v['p50_ms']))"
