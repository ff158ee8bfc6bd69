#!/bin/bash
# Session 29 call 6: c64/c256 with the Forward timeline's new marks column: each stage's time on the worker.
mkdir -p /tmp/r6; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
timeout 200 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r6/serve > /tmp/r6/serve.txt 2>&1
pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"
grep -E "c64:|c256:" /tmp/r6/serve.txt | cut -c1-200
python3 -m bench.forward_timeline /tmp/r6/serve/forwards.tsv 2>&1 | tail -30
rm -rf /tmp/r6/serve/logs; tar czf $OUT/r6.tgz -C /tmp/r6 .
