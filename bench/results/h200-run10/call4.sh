#!/bin/bash
# H200 run 10, call 4: launch ahead (worker_svc/launch_ahead.py: a multi-step decode Forward launches its steps
# before the commit of the one it follows). GPU tests first (test_gpu.py's multi-step / graph tests with the new
# test_forwards_launched_ahead_on_cuda_graphs_equal_the_ordered_run; test_gpu_fused.py), then worker_svc.bench's
# chained Forwards with launch ahead on and off in one process (tiny and 1B, B = 1, 64, 256, K = 8), then
# serve_bench c64,c1 on the 1B with the worker's default and --no-launch-ahead, alternated (on, off, on).
# Same carry and prologue as call1.sh; results packed into $OUT/json.tgz.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null &
timeout 200 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu.py tests/worker/test_gpu_fused.py -k "launched_ahead or multistep or graph or fused or served" 2>&1 | tail -15 > /tmp/r/tests.txt
wait
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt; tar czf $OUT/json.tgz -C /tmp/r .
for s in tiny_starcoder_py starcoderbase-1b; do
  timeout 150 python3 -m worker_svc.bench --shape $s --dtype bfloat16 --context 1152 --decode-steps 8 --batches 1,64,256 --prefill 1024 --iters 6 --json-out /tmp/r/w_$s.json 2>&1 | grep -v Warn | tail -16 > /tmp/r/w_$s.txt
done
tar czf $OUT/json.tgz -C /tmp/r .; echo "worker bench after $(( $(date +%s) - T0 )) s"
S() { timeout 110 python3 -m bench.serve_bench --gpu --out /tmp/sb_$1 --phases c64,c1 --worker-flags="$2" > /tmp/r/serve_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; cp /tmp/sb_$1/serve_bench.json /tmp/r/serve_$1.json; tar czf $OUT/json.tgz -C /tmp/r .; }
S on1 ""; S off1 "--no-launch-ahead"; [ $(( $(date +%s) - T0 )) -lt 430 ] && S on2 ""
echo "serve after $(( $(date +%s) - T0 )) s"
