#!/bin/bash
# Session 29 call 9: the GPU tests of launching behind, then the A/B of --launch-lead-steps 1 (the last step, as before)
# against 2 (the new default), alternated twice, c64/c256; the validation now runs before the wait in both arms.
mkdir -p /tmp/r9; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
timeout 150 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py -k "chained or behind or multistep or graph" > /tmp/r9/tests.txt 2>&1; tail -3 /tmp/r9/tests.txt
arm() { name=$1; shift
  timeout 150 python3 -m bench.serve_bench --gpu --phases c64,c256 --out /tmp/r9/$name --worker-flags="$*" > /tmp/r9/$name.txt 2>&1
  pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
  echo "== $name ($*) gc pauses: $(grep -h -c gc_pause /tmp/r9/$name/logs/*worker* 2>/dev/null | head -1)"
  grep -E "c64:|c256:" /tmp/r9/$name.txt | cut -c24-220
  python3 -m bench.forward_timeline /tmp/r9/$name/forwards.tsv 2>&1 | grep -E "segment|gap decode->decode|stages decode" | tail -6
  rm -rf /tmp/r9/$name/logs; }
arm lead1 --launch-lead-steps 1
arm lead2 --launch-lead-steps 2
arm lead1b --launch-lead-steps 1
arm lead2b --launch-lead-steps 2
tar czf $OUT/r9.tgz -C /tmp/r9 .
