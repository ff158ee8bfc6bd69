#!/bin/bash
# Session 29 call 7: A/B/C of the worker's interpreter settings at c64/c256: (a) --no-gc-freeze (as before), (b) the
# start-up heap frozen (the new default), (c) frozen + this worker's switch interval 200 us. gc pauses >= 10 ms counted.
mkdir -p /tmp/r7; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
arm() { name=$1; shift
  timeout 150 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r7/$name --worker-flags "$*" > /tmp/r7/$name.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  echo "== $name ($*): gc pauses $(cat /tmp/r7/$name/logs/*worker* 2>/dev/null | grep -c gc_pause) $(grep -h gc_pause /tmp/r7/$name/logs/*worker* 2>/dev/null | head -3 | cut -c1-160)"
  grep -E "c64:|c256:" /tmp/r7/$name.txt | cut -c24-200
  python3 -m bench.forward_timeline /tmp/r7/$name/forwards.tsv 2>&1 | grep -E "segment|gap decode->decode|stages decode" | tail -6
  rm -rf /tmp/r7/$name/logs; }
arm a --no-gc-freeze
arm b
arm c --switch-interval-us 200
arm a2 --no-gc-freeze
tar czf $OUT/r7.tgz -C /tmp/r7 .
