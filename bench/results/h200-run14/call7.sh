#!/bin/bash
# H200 run 14 call 7: serve_bench 1B c64,c1 again, the switch interval at 100 us then 5 ms (call 6 ran 5 ms first).
mkdir -p /tmp/r7
for v in 100 5000; do
  CODESERVE_SWITCH_INTERVAL_US=$v timeout 70 python3 -m bench.serve_bench --gpu --out /tmp/sb7_$v --phases c64,c1 > /tmp/r7/serve_$v.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  cp /tmp/sb7_$v/serve_bench.json /tmp/r7/serve_$v.json; echo $v; grep -E "^c64|^c1 " /tmp/r7/serve_$v.txt
  tar czf $OUT/json.tgz -C /tmp/r7 .
done
