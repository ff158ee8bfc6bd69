#!/bin/bash
# H200 run 17 call 2: launch behind (worker_svc/engine.py: Engine._launch_behind). (1) the GPU tests of chained
# Forwards (graphs, built ahead, launched behind); (2) worker_svc.bench chained K = 8 Forwards launched behind / at
# their turn, alternated (1B and tiny, B = 1, 64); (3) serve_bench 1B c64,c1 with the Forward timeline, default
# (launch behind) then --worker-flags=--no-launch-behind.
mkdir -p /tmp/r
T0=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 200 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py -k "chained or multistep or graph" 2>&1 | tail -4 | tee /tmp/r/test_gpu.txt
pkill -9 -f pytest; pack; echo "tests after $(( $(date +%s) - T0 )) s"
for shape in starcoderbase-1b tiny_starcoder_py; do
  timeout 150 python3 -m worker_svc.bench --shape $shape --dtype bfloat16 --batches 1,64 --context 1152 --decode-steps 8 \
    --prefill "" --json-out /tmp/r/w_$shape.json > /tmp/r/w_$shape.txt 2>&1
  grep -E "chained|replay" /tmp/r/w_$shape.txt; pack
done
echo "worker bench after $(( $(date +%s) - T0 )) s"
S() { n=$1; shift; CODESERVE_FORWARD_LOG=/tmp/r/fwd_$n.tsv timeout 150 python3 -m bench.serve_bench --gpu --phases c64,c1 --c1-requests 5 \
        --out /tmp/r/serve_$n "$@" > /tmp/r/serve_$n.txt 2>&1; kill_stack; rm -rf /tmp/r/serve_$n/logs
      echo "[$n]"; grep -E "c64:|c1:" /tmp/r/serve_$n.txt | cut -c1-330
      python3 -m bench.forward_timeline /tmp/r/fwd_$n.tsv --json /tmp/r/fwd_$n.json | tail -n +7 | tee /tmp/r/fwd_$n.txt; pack; }
S behind
S turn --worker-flags=--no-launch-behind
echo "done after $(( $(date +%s) - T0 )) s"
