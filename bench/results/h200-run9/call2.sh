#!/bin/bash
# H200 run 9, call 2: the GPU tests (call 1's tests.txt did not come back: more than 8 files under $OUT), with
# the split-K GEMM's own tests; then bench/gemm_bench.py: cuBLAS against the split-K Triton kernel on the decode
# GEMM shapes (1B at M = 1, 64, 256; tiny at M = 1, 64), and torch.compile max-autotune on the 1B at M = 64.
# Same carry and prologue as call1.sh.
set -x
mkdir -p /tmp/r
T0=$(date +%s)
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
timeout 150 python3 -m pytest -o addopts="" -q tests/worker/test_gpu.py tests/worker/test_gpu_fused.py tests/worker/test_gpu_skinny_gemm.py 2>&1 | grep -v "Warning\|warnings.warn" | tail -15 > /tmp/r/tests.txt
echo "tests after $(( $(date +%s) - T0 )) s"; cat /tmp/r/tests.txt
timeout 200 python3 -m bench.gemm_bench --shape starcoderbase-1b --rows 1,64,256 --out /tmp/r/gemm_1b 2>&1 | tee /tmp/r/gemm_1b.txt
timeout 80 python3 -m bench.gemm_bench --shape tiny_starcoder_py --rows 1,64 --out /tmp/r/gemm_tiny 2>&1 | tee /tmp/r/gemm_tiny.txt
echo "gemm after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
timeout 150 python3 -m bench.gemm_bench --shape starcoderbase-1b --rows 64 --inductor --out /tmp/r/gemm_1b_inductor 2>&1 | grep -v "^AUTOTUNE\|^  \|SingleProcess" | tee /tmp/r/gemm_1b_inductor.txt
echo "inductor after $(( $(date +%s) - T0 )) s"
tar czf $OUT/json.tgz -C /tmp/r .
