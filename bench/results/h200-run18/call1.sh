#!/bin/bash
# H200 run 18 call 1: (1) tests/worker/test_gpu.py on session 15's final code (outbox, request_state move);
# (2) serve_bench 1B c64,c256,c1 with the Forward timeline, the outbox on (default) / off
# (--scheduler-flags=--no-deliver-after-send), alternated twice (the second pair only when time is left).
# Without .jit in the carry the tests compile flashinfer (~280 s) and the cache goes back as $OUT/jit.part*.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
if [ -d .jit ]; then cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"; else NOJIT=1; fi
nproc; lscpu | grep "Model name"
timeout 330 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py 2>&1 | tail -4 | tee /tmp/r/test_gpu.txt
pkill -9 -f pytest; pack; echo "tests after $(( $(date +%s) - T0 )) s"
[ -n "$NOJIT" ] && (cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
S() { n=$1; shift; CODESERVE_FORWARD_LOG=/tmp/r/fwd_$n.tsv timeout 150 python3 -m bench.serve_bench --gpu --phases c64,c256,c1 --c1-requests 5 \
        --out /tmp/r/serve_$n "$@" > /tmp/r/serve_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/serve_$n/logs
      echo "[$n]"; grep -E "c64:|c256:|c1:" /tmp/r/serve_$n.txt | cut -c1-330
      python3 -m bench.forward_timeline /tmp/r/fwd_$n.tsv --json /tmp/r/fwd_$n.json | tail -n +7 | tee /tmp/r/fwd_$n.txt; pack
      echo "$n after $(( $(date +%s) - T0 )) s"; }
S outbox1
S direct1 --scheduler-flags=--no-deliver-after-send
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
left 470 && S outbox2
left 520 && S direct2 --scheduler-flags=--no-deliver-after-send
echo "done after $(( $(date +%s) - T0 )) s"
