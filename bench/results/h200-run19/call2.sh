#!/bin/bash
# H200 run 19 call 2 (carry [".whl", ".jit"]; call 1's JIT cache): (1) the GPU tests of the eager extend path on the
# code with the extend prepared at arrival: tests/worker/test_gpu_ragged.py, then tests/worker/test_gpu.py (each
# with its own time limit; a timeout prints no summary line); (2) serve_bench 1B c64 with --rounds 3 (384 requests:
# a phase three times as long as call 1's, whose single c64 runs spread 14.8-19.1k tok/s), the extend prepared at
# arrival (default) / at its turn (--worker-flags=--no-extend-ahead), alternated while time is left.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
S() { n=$1; shift; timeout 150 python3 -m bench.serve_bench --gpu --phases c64 --rounds 3 --out /tmp/r/$n "$@" > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-250
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
S ahead1
S turn1 --worker-flags=--no-extend-ahead
timeout 100 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_ragged.py 2>&1 | tail -4 | tee /tmp/r/test_gpu_ragged.txt
pkill -9 -f pytest; pack; echo "ragged tests after $(( $(date +%s) - T0 )) s"
left 300 && S ahead2
left 360 && S turn2 --worker-flags=--no-extend-ahead
left 420 && { timeout $(( 560 - $(date +%s) + T0 )) python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py 2>&1 | tail -4 | tee /tmp/r/test_gpu.txt; pkill -9 -f pytest; pack; }
echo "done after $(( $(date +%s) - T0 )) s"
