#!/bin/bash
# H200 run 18 call 3 (carry [".whl", ".jit"]; .jit = call 2's jit.part00): (1) tests/worker/test_gpu.py;
# (2) serve_bench 1B c256,c64 with the scheduler's chain depth 2 (N+2 sent before N is applied; the working tree's
# experimental patch, kept as chain_depth2.patch) against --chain-depth=1 (the code as landed), alternated twice.
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 170 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py 2>&1 | tail -4 | tee /tmp/r/test_gpu.txt
pkill -9 -f pytest; pack; echo "tests after $(( $(date +%s) - T0 )) s"
S() { n=$1; shift; timeout 150 python3 -m bench.serve_bench --gpu --phases c256,c64 --out /tmp/r/serve_$n "$@" > /tmp/r/serve_$n.txt 2>&1
      kill_stack; rm -rf /tmp/r/serve_$n/logs
      echo "[$n]"; grep -E "c64:|c256:|Error|error" /tmp/r/serve_$n.txt | cut -c1-260
      python3 -m bench.forward_timeline /tmp/r/serve_$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A6 "^segment [12]" /tmp/r/fwd_$n.txt; pack
      echo "$n after $(( $(date +%s) - T0 )) s"; }
S depth2a
S depth1a --scheduler-flags=--chain-depth=1
left 420 && S depth2b
left 480 && S depth1b --scheduler-flags=--chain-depth=1
echo "done after $(( $(date +%s) - T0 )) s"
