#!/bin/bash
# H200 run 11, call 1 (session 9): this checkout has no JIT cache. The GPU tests first (not run since launch
# ahead's third form, the review's fixes and the whole-graph merge): test_gpu.py, test_gpu_fused.py,
# test_gpu_skinny_gemm.py, test_gpu_whole_graph.py; the cache goes back as $OUT/jit.part*. Then, with the time
# left, launch ahead end to end (serve_bench c64,c1, on / off alternated, 1B) -- run 10's call6.sh, never run.
# Carry [".whl"]; prologue as in run 10 (bench/README.md); results packed into $OUT/json.tgz.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
for s in tiny_starcoder_py starcoderbase-1b; do  # the bench shapes' kernels, compiled beside the tests
  timeout 400 python3 -m worker_svc.bench --shape $s --dtype bfloat16 --batches 1,64 --prefill 16 --iters 1 --decode-steps 8 > /tmp/r/warm_$s.txt 2>&1 &
done
python3 -m worker_svc.model.default --shape starcoderbase-1b --dtype bfloat16 --device cuda --out /tmp/codeserve-bench-model > /dev/null 2>&1 &
timeout 400 python3 -m pytest -o addopts="" -q -p no:warnings tests/worker/test_gpu.py tests/worker/test_gpu_fused.py tests/worker/test_gpu_skinny_gemm.py tests/worker/test_gpu_whole_graph.py 2>&1 | tail -30 > /tmp/r/tests.txt
wait
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt; pack
(cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part; ls -la $OUT
S() { timeout 60 python3 -m bench.serve_bench --gpu --out /tmp/sb_$1 --phases c64,c1 --worker-flags="$2" > /tmp/r/serve_$1.txt 2>&1
      pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; cp /tmp/sb_$1/serve_bench.json /tmp/r/serve_$1.json; pack
      grep -h "tok/s\|TTFT" /tmp/r/serve_$1.txt | tail -4; echo "serve $1 after $(( $(date +%s) - T0 )) s"; }
left 470 && S on1 "--launch-ahead"
left 520 && S off1 ""
echo "done after $(( $(date +%s) - T0 )) s"
