#!/bin/bash
# Session 29 call 8: A/B twice, alternated: (a) --no-gc-freeze (as before this session), (c) the start-up heap frozen +
# this worker's switch interval 200 us; c64/c256 each. gc pauses >= 10 ms and the worker's "serving" time listed.
mkdir -p /tmp/r8; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
arm() { name=$1; shift
  timeout 150 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r8/$name --worker-flags="$*" > /tmp/r8/$name.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  echo "== $name ($*)"; grep -h -E '"serving"|gc_pause' /tmp/r8/$name/logs/*worker* 2>/dev/null | cut -c1-100 | head -4
  grep -E "c64:|c256:" /tmp/r8/$name.txt | cut -c24-220
  python3 -m bench.forward_timeline /tmp/r8/$name/forwards.tsv 2>&1 | grep -E "segment|gap decode->decode" | tail -4
  rm -rf /tmp/r8/$name/logs; }
arm a --no-gc-freeze
arm c --switch-interval-us 200
arm a2 --no-gc-freeze
arm c2 --switch-interval-us 200
tar czf $OUT/r8.tgz -C /tmp/r8 .
