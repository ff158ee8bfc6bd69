#!/bin/bash
# Run 27 call 2 (session 27; carry [".whl", ".jit"]): on whatever card came (an H100 was offered, no H200): the GPU
# tests in full (run 25's call9.sh: not run on a GPU since session 25's changes) and test_gpu_extend_behind.py (the
# continuation rows launched behind, new this session), then the 1B's 8,192-token eager
# extend profiled (run 25's call8.sh part 1).
mkdir -p /tmp/r; pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1
TS=$(date +%s)
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 440 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu.py tests/worker/test_gpu_whole_graph.py \
  tests/worker/test_gpu_fused.py tests/worker/test_gpu_skinny_gemm.py tests/worker/test_gpu_extend_behind.py > /tmp/r/tests.txt 2>&1; tail -8 /tmp/r/tests.txt
pack; echo "tests after $(( $(date +%s) - TS )) s"
timeout $(( 570 - $(date +%s) + TS )) python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --batches 1 --cuda-graph-max-batch 8 \
  --prefill 8192 --profile /tmp/r/prof > /tmp/r/prefill.txt 2>&1; grep prefill /tmp/r/prefill.txt
for t in /tmp/r/prof/trace-prefill8192*.json; do python3 -m bench.kernel_breakdown $t --steps 1 > $t.breakdown.txt 2>&1; head -16 $t.breakdown.txt; gzip $t; done
pack; echo "done after $(( $(date +%s) - TS )) s"
