#!/bin/bash
# Session 29 call 4: py-spy with idle stacks (wall clock per thread) of the worker, scheduler and cache during c256.
mkdir -p /tmp/r4; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
SPY=/tmp/site/bin/py-spy
(timeout 200 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r4/serve > /tmp/r4/serve.txt 2>&1) &
for i in $(seq 1 1200); do grep -q "c64:" /tmp/r4/serve.txt 2>/dev/null && break; sleep 0.1; done
sleep 1.0
for p in worker_svc scheduler_svc cache_svc; do P=$(pgrep -f "m $p" | head -1)
  $SPY record -p $P -r 200 -d 3 --idle --threads --nonblocking --format raw -o /tmp/r4/$p.txt > /tmp/r4/spy_$p.log 2>&1 & done
wait
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
grep -E "c64:|c256:" /tmp/r4/serve.txt | cut -c1-200
rm -rf /tmp/r4/serve/logs; tar czf $OUT/r4.tgz -C /tmp/r4 .
